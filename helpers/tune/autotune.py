"""Auto-tuner: walk tuning rounds from a baseline until nothing improves or the time budget is spent.

Each step diagnoses the current best run (`diagnose.diagnose`), orders the search space by that verdict, and
runs the first untried candidate that fits the remaining budget as a normal round (`Workbook.run_round`: the
same ABBA runs, the same keep/reject rule, a rollback point). Its ledger entry carries the reasoning: the
diagnosis verdict and evidence, why this candidate, what comes next, and the cost estimate. Candidates the
config refuses (bf16 on CPU) are recorded as skipped notes, never run; a rejected candidate is never repeated.

Cost of a round before it starts, from measured times (seconds), by the way the round measures (`speed_path`):
    run_s(config)   = overhead + train_s × time_factor + extra_s
    whole runs: RUNS_PLAN's last look in pairs × (run_s(best) + run_s(candidate)) × BUDGET_MARGIN
    paired (one process) or two processes stepping in turns: (overhead + 2 × compile_s + extra_s
                           + (warm-up + block_steps × pairs) × step_s × (1 + time_factor)) × BUDGET_MARGIN
train_s is the best's measured training time (sum of its step times, compile included); compile_s and step_s its
first-step and steady step times; pairs, for a paired round, the plan's look before its last (where a quiet
machine decides; under load a round may go on to the last). overhead is what a run costs outside its steps (process
start, imports, data, evaluation), measured as the wall time of each baseline/round minus its runs' step times
(the largest seen is used). time_factor/extra_s are each candidate's expected slow-down at worst (documented per
candidate). The baseline always runs (nothing is measured before it); its time counts against the budget.
"""
from __future__ import annotations

import json
import math
import os
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from helpers import config as config_mod
from helpers.levers import SPEED_FAMILIES, families_of
from helpers.config import Config, ConfigError
from helpers.tune.diagnose import Diagnosis, diagnose
from helpers.tune.ledger import RoundError
from helpers.record import RunRecord
from helpers.paired import DP_PAIRED_PLAN, PROCESS_PLAN, RUNS_PLAN
from helpers.run.profile import warmup_steps
from helpers.tune.convergence import TIME_TO_TARGET
from helpers.tune.lr_rule import DEFAULT_LR_RULE, SCALED
from helpers.tune.rounds import Workbook, load_runs
from helpers.tune.speed_path import PAIRED, RUNS, speed_path

BUDGET_MARGIN = 1.2  # run times on the shared 2-core machine drift ±20% between minutes
DEFAULT_OVERHEAD_S = 8.0  # per-run cost outside the steps when this call measured none (a reopened workbook)
COMPILE_ALLOWANCE_S = 5.0  # a first graph compile of nano: 2.4–3 s quiet, more under load
TTQ_SEEDS = 2  # seeds per arm of a time-to-target round (a larger global batch)
MAX_BATCH = 64  # batch doubling stops here: beyond it nano's step is compute-bound (facts: bs16→32 +6%)
WHO = "autotune"
FAMILIES = tuple(SPEED_FAMILIES)  # the search order; each family's keys are declared in helpers/levers.py
# Search order per verdict (families not named come after, in FAMILIES order).
ORDER = {
    "data-bound": ("data", "execution", "batch"),
    "memory-bound": ("recompute", "batch", "amp"),
    "communication-bound": ("data_parallel", "batch", "execution"),
    "compute-bound": ("execution", "batch", "threads"),
    "balanced": ("execution", "batch", "threads"),
}
# Words in diagnose's next_rounds → the family that runs that kind of round.
NEXT_ROUND_WORDS = (("data", "data"), ("fusion", "data_parallel"), ("parallel", "data_parallel"),
                    ("recompute", "recompute"), ("batch", "batch"), ("precision", "amp"), ("jit", "execution"),
                    ("graph", "execution"), ("thread", "threads"))


class AutotuneError(ValueError):
    """Bad auto-tuner input (budget, repeats); one actionable line."""


@dataclass
class Candidate:
    """One round the tuner may run: its name, changes, why, and its expected cost relative to the best."""
    name: str
    family: str
    changes: dict[str, Any]
    why: str
    time_factor: float = 1.0  # candidate training time ÷ the best's, at worst
    extra_s: float = 0.0  # extra seconds per candidate run (e.g. msrun start-up)
    objective: str = "speed"  # a larger global batch is judged by time to target, its lr scaled (lr_rule.py)

    def __post_init__(self):
        undeclared = [k for k in self.changes if self.family not in families_of(k)]
        if undeclared:
            raise ValueError(f"candidate {self.name!r} of family {self.family!r} changes {', '.join(undeclared)}, "
                             f"which helpers/levers.py does not declare for that family")

    def key(self) -> frozenset:
        return _key(self.changes)


@dataclass
class AutotuneResult:
    """What a call did: rounds run (ledger index, name, decision, speed-up, estimate vs actual s), notes, why
    it stopped, wall seconds against the budget, and best ÷ baseline tokens/s."""
    path: Path
    rounds: list[dict] = field(default_factory=list)
    skipped: list[dict] = field(default_factory=list)
    stop_reason: str = ""
    elapsed_s: float = 0.0
    budget_s: float = 0.0
    speedup: float | None = None  # speed: best ÷ baseline tokens/s; time_to_target: baseline ÷ best seconds
    objective: str = "speed"

    def text(self) -> str:
        """One line per round, then the stop reason and the overall speed-up."""
        lines = [f"round {r['round']:>2} {r['name']:<20} {r['decision']:<9} ×{r['speedup'] or float('nan'):.2f} "
                 f"(estimated {r['estimate_s']:.0f} s, took {r['actual_s']:.0f} s)" for r in self.rounds]
        lines += [f"skipped {s['name']}: {s['why']}" for s in self.skipped]
        ratio = "n/a" if self.speedup is None else f"×{self.speedup:.2f}"
        lines.append(f"stopped: {self.stop_reason}")
        what = "baseline ÷ best seconds to target" if self.objective != "speed" else "best ÷ baseline tokens/s"
        lines.append(f"{what} {ratio}; {self.elapsed_s:.0f} s of {self.budget_s:.0f} s budget "
                     f"→ {self.path}")
        return "\n".join(lines)


def _key(changes: dict[str, Any]) -> frozenset:
    """Identity of a candidate: the values it sets (a rejected value is never tried again)."""
    return frozenset((k, json.dumps(v)) for k, v in changes.items())


def tried_changes(entries: list[dict]) -> set[frozenset]:
    """Candidates already run as rounds or recorded as skipped (refused by the config), and the values a kept
    round moved away from (going back would undo a measured win)."""
    tried = set()
    for e in entries:
        # the lr a round scaled by its rule is not part of what was asked for (lr_rule.py)
        derived = SCALED if e.get("lr_scaling") and not e["lr_scaling"].get("overridden") else ()
        changes = {k: v for k, v in e["changes"].items() if k not in derived}
        # screened arms of the time-to-target search are tried too (helpers/tune/ttq_search.py)
        if e["event"] == "round" or (e["event"] == "note" and e["decision"] in ("skipped", "dropped", "promoted",
                                                                               "not run")):
            tried.add(_key({k: v[1] for k, v in changes.items()}))
        if e["event"] == "round" and e["decision"] == "keep":
            tried.add(_key({k: v[0] for k, v in changes.items()}))
    return tried


# ------------------------------------------------------------------------------------------ search space

def _execution(cfg: Config) -> list[Candidate]:
    if cfg.mode == "pynative":
        eager = cfg.jit_level == "none"
        out = [Candidate("graph_mode", "execution", {"mode": "graph", "jit_level": "O0"},
                         f"mode=pynative{' with jit_level=none (eager)' if eager else ''}: operators are "
                         "dispatched from Python one at a time; graph mode compiles the whole train step into one "
                         "graph",
                         # ≥ 6× faster per step as measured; at worst 2×, plus the one-off compile
                         time_factor=0.5 if eager else 1.0, extra_s=COMPILE_ALLOWANCE_S)]
        if eager:
            out.append(Candidate("pynative_jit", "execution", {"jit_level": "O0"},
                                 "stays in PyNative but wraps the step Cells in ms.jit, compiling them",
                                 time_factor=0.75,
                                 extra_s=COMPILE_ALLOWANCE_S))
        return out
    out = []
    if cfg.jit_level not in ("O1", "O2"):
        out.append(Candidate("jit_O1", "execution", {"jit_level": "O1"},
                             "jit_level O1 adds MindSpore's graph-level fusion passes over O0; costs a longer "
                             "compile", time_factor=1.2))
    return out + _ascend_execution(cfg)


def _ascend_execution(cfg: Config) -> list[Candidate]:
    """Ascend-only levers of the step itself (the config refuses them on CPU/GPU)."""
    if cfg.device_target != "Ascend":
        return []
    out = []
    if cfg.jit_level != "O2":
        out.append(Candidate("jit_O2", "execution", {"jit_level": "O2"},
                             "jit_level O2 sinks the whole graph to the device (GE), removing per-kernel host "
                             "launches; the longest compile", time_factor=1.2, extra_s=2 * COMPILE_ALLOWANCE_S))
    m = cfg.model
    if m.attention != "flash" and cfg.amp_level != "O0" and not (m.d_model // m.n_head) % 16 and m.dropout == 0:
        out.append(Candidate("flash_attention", "execution", {"model.attention": "flash"},
                             "ops.flash_attention_score fuses scale, causal mask, softmax and the value mix into "
                             "one kernel and never stores the seq×seq scores", time_factor=1.2))
    return out


def _batch(cfg: Config, verdict: str, keep_global_batch: bool) -> tuple[list[Candidate], str]:
    b, g = cfg.batch_size, cfg.grad_accum_steps
    if verdict == "memory-bound":
        if b < 2 or b % 2:
            return [], f"batch_size={b} cannot be halved evenly"
        return [Candidate(f"micro_batch_{b // 2}", "batch", {"batch_size": b // 2, "grad_accum_steps": 2 * g},
                          "memory-bound: half the micro-batch halves activation memory; twice the accumulation "
                          "keeps the global batch", time_factor=1.5)], ""
    why = ("a larger micro-batch amortises the per-step fixed cost (Python, kernel launches, the optimizer "
           "update) over more tokens")
    if keep_global_batch:
        if g < 2 or g % 2:
            return [], (f"keep_global_batch: grad_accum_steps={g} leaves no accumulation to trade for a larger "
                        f"micro-batch")
        return [Candidate(f"micro_batch_{2 * b}", "batch", {"batch_size": 2 * b, "grad_accum_steps": g // 2},
                          f"{why}; half the accumulation keeps the global batch", time_factor=1.2)], ""
    if 2 * b > MAX_BATCH:
        return [], f"batch_size={b}: doubling passes the search cap {MAX_BATCH}"
    return [Candidate(f"batch_size_{2 * b}", "batch", {"batch_size": 2 * b},
                      f"{why}; a larger global batch makes fewer updates per token, so it is judged by time to "
                      f"target with the learning rate scaled by the {DEFAULT_LR_RULE} rule", time_factor=2.0,
                      objective=TIME_TO_TARGET)], ""


def _data(cfg: Config, diag: Diagnosis, cores: int) -> list[Candidate]:
    share = diag.evidence.get("data_wait_share")
    seen = f"data_wait_share {share:.1%}" if isinstance(share, float) else "data wait not measured"
    out = []
    if cfg.data.num_parallel_workers < cores:
        out.append(Candidate(f"data_workers_{cores}", "data", {"data.num_parallel_workers": cores},
                             f"{seen}; more map workers prepare batches in parallel (one per core at most)",
                             time_factor=1.1))
    if not cfg.data.autotune:
        out.append(Candidate("data_autotune", "data", {"data.autotune": True},
                             f"{seen}; MindSpore's dataset autotune sets workers and prefetch itself while the run "
                             f"trains, next to the hand-set workers", time_factor=1.1))
    if cfg.device_target in ("Ascend", "GPU") and not cfg.dataset_sink and cfg.grad_accum_steps == 1:
        out.append(Candidate("dataset_sink", "data", {"dataset_sink": True},
                             f"{seen}; sink mode lets the device pull its batches, taking the host out of each "
                             f"step's input", time_factor=1.1))
    other = "map_first" if cfg.data.order == "shuffle_first" else "shuffle_first"
    out.append(Candidate(f"data_order_{other}", "data", {"data.order": other},
                         f"{seen}; order {other} changes where the shuffle buffer sits in the pipeline",
                         time_factor=1.1))
    return out


def _threads(cfg: Config, cores: int) -> list[Candidate]:
    if cfg.device_target != "CPU" or cores < 2:
        return []
    if cfg.threads == 0:
        return [Candidate(f"threads_{cores // 2}", "threads", {"threads": cores // 2},
                          f"fewer op threads ({cores // 2} of {cores} cores) can win when ops are too small to "
                          "split and Python/the data pipeline need a core",
                          time_factor=1.6)]
    return [Candidate("threads_default", "threads", {"threads": 0},
                      f"threads={cfg.threads}: MindSpore's default uses every core for op kernels")]


def _amp(cfg: Config) -> list[Candidate]:
    if cfg.amp_level != "O0":
        return []
    return [Candidate("amp_O2_bf16", "amp", {"amp_level": "O2", "amp_dtype": "bf16"},
                      "bf16 halves matmul and activation bytes without loss scaling (the win on Ascend)"),
            Candidate("amp_O2_fp16", "amp", {"amp_level": "O2", "loss_scale": "dynamic"},
                      "fp16 with dynamic loss scaling halves matmul bytes; a CPU has no fp16 matmul units, so "
                      "only the round's own runs can say whether the casts pay", time_factor=3.0)]


def _recompute(cfg: Config, verdict: str) -> list[Candidate]:
    why = ("memory-bound: recomputing each block's activations in backward trades time for memory"
           if verdict == "memory-bound" else
           "recompute trades time for activation memory; worth it only when memory limits the batch")
    out = ([Candidate("recompute_blocks", "recompute", {"recompute": "blocks"}, why, time_factor=1.5)]
           if cfg.recompute == "none" else [])
    if cfg.device_target == "Ascend" and cfg.memory_optimize == "O0":
        out.append(Candidate("memory_optimize_O1", "recompute", {"memory_optimize": "O1"},
                             "ms.runtime.set_memory(optimize_level='O1') reuses device memory harder (memory over "
                             "speed); judged like recompute", time_factor=1.2))
    return out


def _data_parallel(cfg: Config, verdict: str, cores: int) -> tuple[list[Candidate], str]:
    p = cfg.parallel
    if p.data_parallel > 1:
        if p.comm_fusion == "none":
            return [Candidate("comm_fusion_size", "data_parallel", {"parallel.comm_fusion": "size"},
                              "one all-reduce per gradient tensor → size buckets: fewer, larger all-reduces",
                              extra_s=15.0)], ""
        return [], "data parallel already fused"
    if cfg.device_target == "CPU" and cores < 2:
        return [], "one core: no room for a second process"
    if cfg.batch_size % 2:
        return [], f"batch_size={cfg.batch_size} does not split over 2 processes"
    return [Candidate("data_parallel_2", "data_parallel", {"parallel.data_parallel": 2},
                      f"two msrun processes each take half the global batch; on {cores} CPU cores they share the "
                      f"cores a single process already uses, so it is tried last (the win needs a device per "
                      f"process)", time_factor=2.0, extra_s=15.0)], ""


def family_order(diag: Diagnosis, cfg: Config) -> list[str]:
    """Families to try, most promising first: an uncompiled step first (Python dispatch dominates whatever the
    verdict, unless memory-bound), then what diagnose's next_rounds names, then the verdict's order. On CPU, AMP
    goes just before data parallel unless memory-bound: fp16 kernels are measured slower there, so it costs a
    round that is expected to be rejected."""
    order = ["execution"] if cfg.mode == "pynative" and diag.bottleneck != "memory-bound" else []
    for text in diag.next_rounds:
        order += [fam for word, fam in NEXT_ROUND_WORDS if word in text.lower()]
    order = list(dict.fromkeys([*order, *ORDER.get(diag.bottleneck, ()), *FAMILIES]))
    if cfg.device_target == "CPU" and diag.bottleneck != "memory-bound":
        order.remove("amp")
        order.insert(order.index("data_parallel"), "amp")
    return order


def candidates(cfg: Config, diag: Diagnosis, cores: int | None = None,
               keep_global_batch: bool = False) -> tuple[list[Candidate], dict[str, str]]:
    """The search space for `cfg` ordered by the diagnosis, and {family: why it offers nothing now}."""
    cores = cores or os.cpu_count() or 1
    batch, batch_none = _batch(cfg, diag.bottleneck, keep_global_batch)
    dp, dp_none = _data_parallel(cfg, diag.bottleneck, cores)
    by_family = {"execution": _execution(cfg), "batch": batch, "data": _data(cfg, diag, cores),
                 "threads": _threads(cfg, cores), "amp": _amp(cfg), "recompute": _recompute(cfg, diag.bottleneck),
                 "data_parallel": dp}
    empty = {k: v for k, v in {"batch": batch_none, "data_parallel": dp_none}.items() if v}
    return [c for fam in family_order(diag, cfg) for c in by_family[fam]], empty


# -------------------------------------------------------------------------------------------- costs

def train_s(record: RunRecord) -> float:
    """Seconds a run spent in its steps (sum of step times, the compiling first step included)."""
    return sum(r["step_time_ms"] or 0.0 for r in record.metrics) / 1000.0


def overhead_s(wall_s: float, records: list[RunRecord]) -> float:
    """Per-run seconds outside the steps: (operation wall time − its runs' step time) ÷ runs."""
    return max(0.0, (wall_s - sum(train_s(r) for r in records)) / max(1, len(records)))


def estimate_s(cand: Candidate, best: list[RunRecord], best_cfg: Config, overhead: float) -> tuple[float, str]:
    """(round estimate in seconds, how it was reckoned, in words); see the module docstring."""
    path, _ = speed_path(cand.changes, best_cfg)
    base = statistics.median(train_s(r) for r in best)
    if cand.objective == TIME_TO_TARGET:  # TTQ_SEEDS runs of each arm, every one compiled cold
        ref = overhead + base + COMPILE_ALLOWANCE_S
        run = overhead + base * cand.time_factor + cand.extra_s + COMPILE_ALLOWANCE_S
        return TTQ_SEEDS * (ref + run) * BUDGET_MARGIN, (f"{TTQ_SEEDS} seeds of each arm, cold compiles: "
                                                          f"{TTQ_SEEDS}×({ref:.0f} s reference + {run:.0f} s "
                                                          f"candidate)×{BUDGET_MARGIN}")
    if path == RUNS:
        pairs = RUNS_PLAN.max_pairs
        ref, run = overhead + base, overhead + base * cand.time_factor + cand.extra_s
        return pairs * (ref + run) * BUDGET_MARGIN, (f"up to {pairs} pairs of separate runs: {pairs}×({ref:.0f} s "
                                                      f"reference + {run:.0f} s candidate)×{BUDGET_MARGIN}")
    plan = DP_PAIRED_PLAN if path == PAIRED else PROCESS_PLAN
    pairs = plan.looks[max(0, len(plan.looks) - 2)]  # the look before the last: where most undecided rounds end
    steps = (best_cfg.steady_after if path == PAIRED else warmup_steps(best_cfg)) + plan.block_steps * pairs
    step_s = statistics.median(r.summary.get("step_time_ms") or 0.0 for r in best) / 1000.0
    compile_s = statistics.median(r.summary.get("compile_s") or 0.0 for r in best)
    est = (overhead + 2 * compile_s + cand.extra_s + steps * step_s * (1 + cand.time_factor)) * BUDGET_MARGIN
    where = "both arms in one msrun launch" if path == PAIRED else "two processes stepping in turns"
    return est, (f"{where}: ({overhead:.0f} s start + 2 compiles of {compile_s:.1f} s + {steps} steps "
                 f"per arm at {1000 * step_s:.0f} ms × (1 + {cand.time_factor:g}), to {pairs} pairs)×{BUDGET_MARGIN}")


# ---------------------------------------------------------------------------------------------- the loop

def median_run(records: list[RunRecord]) -> RunRecord:
    """The run with the median tokens/s (of an even count, the lower middle one): the run a diagnosis reads."""
    ranked = sorted(records, key=lambda r: r.summary.get("tokens_per_s") or 0.0)
    return ranked[(len(ranked) - 1) // 2]


def _diagnosis_fields(diag: Diagnosis, run: str) -> dict:
    return {"run": run, "bottleneck": diag.bottleneck, "reasons": diag.reasons, "evidence": diag.evidence,
            "next_rounds": diag.next_rounds}


def _speedup(wb: Workbook) -> float | None:
    row = next((r for r in wb.before_after() if r["metric"] == "throughput"), None)
    return row["ratio"] if row else None


def check_budget(budget_min: Any) -> float:
    """The budget in seconds, or a one-line AutotuneError."""
    if isinstance(budget_min, bool) or not isinstance(budget_min, (int, float)) or not math.isfinite(budget_min) \
            or budget_min <= 0:
        raise AutotuneError(f"budget_min={budget_min!r} must be a positive number of minutes, e.g. "
                            f"--budget-min 15")
    return float(budget_min) * 60.0


def autotune(cfg: Config, out: str | os.PathLike, budget_min: float, repeats: int = 2,
             keep_global_batch: bool = False, progress: bool = False, max_rounds: int | None = None,
             log: Callable[[str], None] = print) -> AutotuneResult:
    """Tune `cfg` round by round into the workbook at `out` within `budget_min` minutes of wall time.

    An existing workbook with the same baseline is continued (its tried candidates are not repeated).
    keep_global_batch: batch rounds trade accumulation for micro-batch instead of growing the global batch.
    max_rounds: stop after this many rounds in this call (None = only the budget and the search space stop it).
    The time-to-target mode is `ttq_search.autotune_time_to_target`.
    """
    budget = check_budget(budget_min)
    if max_rounds is not None and (isinstance(max_rounds, bool) or not isinstance(max_rounds, int) or max_rounds < 1):
        raise AutotuneError(f"max_rounds={max_rounds!r} must be a whole number >= 1, or None for no limit")
    start = time.monotonic()
    wb = Workbook.create(out, cfg, repeats=repeats)
    result = AutotuneResult(path=wb.path, budget_s=budget)
    pinned = any(e["event"] == "baseline" for e in wb.ledger())
    t = time.monotonic()
    base = wb.baseline(progress=progress, who=WHO)
    overheads = [] if pinned else [overhead_s(time.monotonic() - t, base)]
    log(f"baseline: {statistics.median(r.summary['tokens_per_s'] for r in base):,.0f} tokens/s "
        f"({time.monotonic() - start:.0f} s)")
    while True:
        if max_rounds is not None and len(result.rounds) >= max_rounds:
            result.stop_reason = f"max_rounds: {max_rounds} round(s) run, as asked"
            break
        left = budget - (time.monotonic() - start)
        overhead = max(overheads) if overheads else DEFAULT_OVERHEAD_S
        chosen = _next_round(wb, result, left, overhead, keep_global_batch, log)
        if isinstance(chosen, str):
            result.stop_reason = chosen
            break
        _run_round(wb, result, chosen, progress, overheads, log)
    result.elapsed_s = time.monotonic() - start
    result.speedup = _speedup(wb)
    actuals = ", ".join(f"{r['name']} {r['estimate_s']:.0f}/{r['actual_s']:.0f} s" for r in result.rounds)
    wb.note("autotune_stop", f"Stopped: {result.stop_reason}. Wall time {result.elapsed_s:.0f} s of "
            f"{budget:.0f} s; rounds estimated/actual: {actuals or 'none'}; best ÷ baseline tokens/s "
            f"{'n/a' if result.speedup is None else f'×{result.speedup:.2f}'}.", decision="stop", who=WHO,
            reasoning={"elapsed_s": round(result.elapsed_s, 1), "budget_s": budget, "speedup": result.speedup})
    return result


@dataclass
class _Chosen:
    """The round the tuner runs next: its candidate, its estimate (seconds) and its ledger why and reasoning."""
    cand: Candidate
    est: float
    why: str
    reasoning: dict


def _next_round(wb: Workbook, result: AutotuneResult, left: float, overhead: float, keep_global_batch: bool,
                log: Callable[[str], None]) -> _Chosen | str:
    """The first untried candidate for the current best's diagnosis that the config accepts and `left` seconds
    fit, with its reasoning; or, when there is none, why the tuner stops."""
    best_cfg = wb.best_config()
    best = wb.best_runs()
    run = median_run(best)
    diag = diagnose(run)
    run_name = Path(run.path).relative_to(wb.path).as_posix()
    queue, empty = candidates(best_cfg, diag, keep_global_batch=keep_global_batch)
    tried = tried_changes(wb.ledger())
    queue = [c for c in queue if c.key() not in tried]
    chosen, too_long = _first_fitting(wb, queue, best, best_cfg, overhead, left, result, log)
    if chosen is None and too_long:
        names = ", ".join(f"{c.name} (~{e:.0f} s)" for c, e in too_long)
        return f"budget: {left:.0f} s of {result.budget_s:.0f} s left, and no remaining candidate fits: {names}"
    if chosen is None:
        return (f"nothing left to try for a {diag.bottleneck} run: every candidate was run, kept or refused"
                + (f" ({'; '.join(empty.values())})" if empty else ""))
    cand, est, how, after = chosen
    tok = run.summary.get("tokens_per_s") or 0.0
    why = (f"Diagnosis of the current best ({run_name}, {tok:,.0f} tokens/s): {diag.bottleneck} — "
           f"{'; '.join(diag.reasons)}. Search order for it: {', '.join(family_order(diag, best_cfg))}. "
           f"Chosen: {cand.name} ({', '.join(f'{k}={v}' for k, v in cand.changes.items())}) because "
           f"{cand.why}. Next in line: {', '.join(after) or 'nothing'}. Estimated {est:.0f} s ({how}) of "
           f"{left:.0f} s left.")
    reasoning = {"diagnosis": _diagnosis_fields(diag, run_name), "family": cand.family,
                 "candidate_why": cand.why, "next_in_line": after, "estimate_s": round(est, 1),
                 "budget_left_s": round(left, 1), "overhead_s": round(overhead, 2)}
    return _Chosen(cand, est, why, reasoning)


def _first_fitting(wb: Workbook, queue: list[Candidate], best: list[RunRecord], best_cfg: Config, overhead: float,
                   left: float, result: AutotuneResult,
                   log: Callable[[str], None]) -> tuple[tuple | None, list[tuple[Candidate, float]]]:
    """((candidate, estimate s, how reckoned, the names after it) for the first of `queue` the config accepts and
    `left` seconds fit, or None; and the (candidate, estimate s) passed over as too long. A refused candidate is
    a skipped note."""
    too_long = []
    for i, cand in enumerate(queue):
        try:
            wb.candidate(cand.name, cand.changes)
        except (ConfigError, RoundError) as exc:
            note_refused(wb, cand, best_cfg, exc, result, log)
            continue
        est, how = estimate_s(cand, best, best_cfg, overhead)
        if est > left:
            too_long.append((cand, est))
            continue
        return (cand, est, how, [c.name for c in queue[i + 1:]]), too_long
    return None, too_long


def note_refused(wb: Workbook, cand: Candidate, best_cfg: Config, exc: Exception, result: AutotuneResult,
                 log: Callable[[str], None]) -> None:
    """Record a candidate the config refuses (`exc`) as a skipped note: it is never run, nor tried again."""
    current = config_mod.flatten(best_cfg)
    wb.note(cand.name, f"not run: the config refuses it — {exc}. It was considered because {cand.why}",
            {k: (current[k], v) for k, v in cand.changes.items()}, decision="skipped", who=WHO)
    result.skipped.append({"name": cand.name, "why": str(exc)})
    log(f"skipped {cand.name}: {exc}")


def _run_round(wb: Workbook, result: AutotuneResult, chosen: _Chosen, progress: bool, overheads: list[float],
               log: Callable[[str], None]) -> None:
    """Run the chosen round; its outcome goes to the result and the log, the per-run overhead it measured to
    `overheads`."""
    cand = chosen.cand
    t = time.monotonic()
    done = wb.run_round(cand.name, cand.changes, progress=progress, who=WHO, why=chosen.why,
                        reasoning=chosen.reasoning, objective=cand.objective, seeds=TTQ_SEEDS)
    actual = time.monotonic() - t
    runs = [*load_runs(done.candidate_runs), *load_runs(done.reference_runs)]
    overheads.append(overhead_s(actual, runs))
    result.rounds.append({"round": done.index, "name": done.name, "decision": done.decision,
                          "speedup": done.verdict.speedup, "estimate_s": chosen.est, "actual_s": actual,
                          "reason": done.verdict.reason})
    log(f"round {done.index} {done.name}: {done.decision} (×{done.verdict.speedup or float('nan'):.2f}; "
        f"estimated {chosen.est:.0f} s, took {actual:.0f} s)")
