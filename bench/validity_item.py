"""`make bench` item `validity`: do speed verdicts measure what the user pays? Rounds on effects whose true ratio is
known from long runs measured apart from the round's own statistic, stop rule and length.

The effects (nano preset; the workbook's default config, `base_config`, unless said):
- A/A on the default path (two arm processes taking turns), once on the default config (the path of a model,
  batch or precision round) and once on the slow-storage demo below (the path of a data or threads round), and
  on whole runs (`aa_check(path="runs")`, what is left for the compile cache, msrun and the profiler): true ratio
  1, the arms being the same config;
- uniform +5%: `model.ballast`, an in-graph MatMul in every step, sized to +5% of the step;
- intermittent +5%: `model.ballast`, with `model.ballast_every` = INTERMITTENT_EVERY in both arms: the MatMul
  outside the graph in every 5th step only, sized to +5% of the mean step (a real cost, not a sleep; the blocks'
  2nd-fastest steps never saw it);
- op threads 1 → 2.

The true ratio of each effect with a change: long measurements of TRUTH_STEPS steps per arm after the warm-up,
the two arms' processes taking turns step by step (as a round's do: on this machine only that cancels the
drift of its speed, which moved separate 200-step runs of one config by a CV of 4.6%), each counted as the ratio
of the arms' tokens ÷ the wall time of all their steps — no looks, no stop, no trimming, five times a round's
longest measurement. One is taken before the first trial and another every TRUTH_EVERY trials, so that a truth
spans the hours its trials span (one measurement of threads 1 → 2 read ×1.015 where its rounds and separate runs
read ×1.04–×1.06: on this shared host a second op thread's worth drifts); the truth is their geometric mean, and
the record keeps each. Beside it, a cross-check free of taking turns: STANDALONE_PAIRS ABBA pairs of separate runs of
STANDALONE_STEPS steps (each run its own process), the ratio of the arms' mean tokens/s after the warm-up, with
its 95% t interval over the pairs; its width shows what such runs can resolve here. The ballast widths are sized
beforehand from one long measurement of a probe width (the cost taken as linear in width). Then `trials` rounds
per effect with default settings, the effects interleaved (trial i of every effect, then trial i + 1) so that drift
in the machine lands on all of them; every interval is kept. A kept round is rolled back, so each trial compares
against the same pinned baseline.

`validity_stalls` holds the large effects with stalls (STALL_EFFECTS): notebook 02's slow storage at 18 ms a sample
removed (×3–5 on this machine), one more map worker on notebook 02's demo (BPE on the fly, 10 ms a sample; ×2 on
the Intel host, ×1.6 on an AMD one) and one more map worker on 6 ms storage (about +30%). Their truth is long
separate runs (TRUTH_RUN_PAIRS ABBA pairs of TRUTH_RUN_STEPS steps, each run its own process, stalls included, timed
after the batches it banks early), measured before the first trial, every TRUTH_EVERY trials and after the last: a
stall-bound arm waits on its storage whatever the machine's speed, so the turns that cancel the machine's drift for
two compute-bound arms cancel it only in part here, and the truth must be what a run of its own pays, at the hour
of the trial (`truth_at`).

Resumable: the workbooks, truths and trials live in `--validity-dir` (default bench/results/validity_work, not
kept in git); a run with the same settings goes on where the last one stopped.
"""
from __future__ import annotations

import json
import math
import os
import statistics
import time
from pathlib import Path

from helpers.config import speed_measured, with_changes
from helpers.paired import Measurement, SpeedPlan, t_quantile
from helpers.spawn.runner import launch_or_reuse
from helpers.run.profile import warmup_steps
from helpers.spawn.stepped import launch_stepped
from helpers.tune.rounds import Workbook
from helpers.tune.study import base_config
from provenance import LoadSampler
from registry import GOAL, INVALID, MET, MISSED, MUST, NOT_MEASURED, Check, Item, Judgement, positive

REPO = Path(__file__).resolve().parent.parent
WORK = REPO / "bench" / "results" / "validity_work"
TRUTH_STEPS = 400  # per arm, taking turns (50 pairs of 8)
TRUTH_EVERY = 5  # trials between two truth measurements of an effect
CALIBRATION_STEPS = 200
STANDALONE_PAIRS, STANDALONE_STEPS = 6, 200
INTERMITTENT_EVERY = 5
PROBES = {"uniform": 1024, "intermittent": 4096}  # ballast widths: ~+10% of a nano step either way
TARGET = 0.05  # the ballasts' size: +5% of the mean step
QUIET_MARGIN = 0.5  # "nothing else running": the 1-minute load ≤ cores + this at every sample (power's rule)
FOREIGN_QUIET = 0.1  # cores of other processes' CPU during a trial's pairs (median) still "nothing else running"
DEMO = {"data.tokenize": "on_the_fly", "data.tokenizer": "bpe", "data.source_delay_ms": 10.0,
        "data.shuffle_buffer": 16}
# effect → (baseline changes, steps of the workbook's runs, round changes (a ballast name: its sized width;
# None: A/A), A/A path, expected decision)
EFFECTS = {
    "A/A (processes)": ({}, 50, None, None, "no change"),
    "A/A (processes, slow data)": (DEMO, 12, None, None, "no change"),
    "A/A (runs)": ({}, 50, None, "runs", "no change"),
    "uniform +5%": ({}, 50, "uniform", None, "reject"),
    "intermittent +5%": ({"model.ballast_every": INTERMITTENT_EVERY}, 50, "intermittent", None, "reject"),
    "threads 1→2": ({"threads": 1}, 50, {"threads": 2}, None, "keep"),
}
# Large effects with stalls (`validity_stalls`): slow storage removed (×3–5 here), one more map worker on the demo
# (×2 here) and one more on milder slow storage (about +30%). Their true ratio is what long runs of their own pay:
# a stall-bound arm (its storage latency) does not slow with the machine while a compute-bound one does, so two arms
# taking turns agree with a run of its own only as far as the machine's speed held.
STALL_EFFECTS = {
    "slow storage removed": ({**DEMO, "data.source_delay_ms": 18.0}, 12, {"data.source_delay_ms": 0.0}, None, "keep"),
    "data workers 1→2, ×2": (DEMO, 12, {"data.num_parallel_workers": 2}, None, "keep"),
    "data workers 1→2, +30%": ({**DEMO, "data.source_delay_ms": 6.0}, 12, {"data.num_parallel_workers": 2}, None,
                               "keep"),
}
LONG_RUN_TRUTHS = frozenset(STALL_EFFECTS)  # effects whose truth is separate long runs, not turns
# A long-run truth: ABBA pairs of separate runs of this many steps, timed after TRUTH_RUN_STEADY_AFTER: a stall-bound
# arm in a run of its own waits for no batch in its first ~50-100 steps and then on every step (one more worker on
# 6 ms storage: none in steps 5-80, 4-6 ms a step from ~100; the data demo likewise, docs/data/2026-12-02-data-demo-
# waits.json), where a round's arm waits from its first: a bank read ahead early (while the first step compiles,
# most likely: a round's arm gates that, run/loop.py), which a run of weeks pays once. The truth is what comes after.
TRUTH_RUN_PAIRS, TRUTH_RUN_STEPS, TRUTH_RUN_STEADY_AFTER = 3, 250, 100
STALLS_WORK = REPO / "bench" / "results" / "validity_stalls_work"
COVERAGE, CALLS, AA_CALLS = 18, 19, 19  # of 20 trials, scaled to the trials run
LEAN_LIMIT, HALF_WIDTH_LIMIT = 0.003, 0.025
PROCESS_HALF_WIDTH_LIMIT, PROCESS_WALL_LIMIT_S = 0.05, 60.0
# the process-wide variables' rounds whose width is the path's resolution (the data round decides at its first look)
PROCESS_EFFECTS = ("A/A (processes, slow data)", "threads 1→2")


def _interleaved(ref_cfg, cand_cfg, folder: Path, steps: int) -> dict:
    """The true ratio: the arms' processes taking turns for `steps` steps each after their warm-up, tokens ÷ wall
    time of all their steps (no looks, no trimming); kept in `folder` (reused when there). Each arm compiles its
    own graph, as a round's arms do (`speed_measured`): with the cache on, a truth's arm that loaded its graph
    stepped faster than the other that compiled, and the truths moved away from what the rounds measure."""
    done = folder / "truth.json"
    if done.is_file():
        return json.loads(done.read_text(encoding="utf-8"))
    ref_cfg, cand_cfg = speed_measured(ref_cfg), speed_measured(cand_cfg)
    plan = SpeedPlan(block_steps=8, looks=(steps // 8,), alphas=(0.01,), interleave="steps")
    _, _, raw, error = launch_stepped(ref_cfg, cand_cfg, folder, plan.to_dict(), lambda m: False, progress=False)
    if error or raw is None or len(raw["pairs"]) < plan.max_pairs:
        raise RuntimeError(f"truth measurement in {folder} failed: {error or (raw or {}).get('reason')}")
    m = Measurement.from_raw(raw)
    ms = [sum(sum(p[side]) for p in m.pairs) for side in (0, 1)]
    out = {"ratio": (m.tokens[1] / ms[1]) / (m.tokens[0] / ms[0]), "steps": steps,
           "how": "the arms' processes taking turns step by step; tokens ÷ wall time of all their steps"}
    done.write_text(json.dumps(out), encoding="utf-8")
    return out


def _standalone(ref_cfg, cand_cfg, folder: Path, pairs: int, steps: int, steady_after: int | None = None) -> dict:
    """The cross-check: ABBA pairs of separate runs of `steps` steps (each compiling its own graph), each run's
    tokens ÷ wall time of its steps after the warm-up (or after `steady_after`), the ratio of the arms' means and a
    95% t interval of the ratio over the pairs' log ratios.
    A run already in `folder` with the same config is reused (resumable)."""
    rates = {"reference": [], "candidate": []}
    for k in range(pairs):
        for arm in (("reference", "candidate") if k % 2 == 0 else ("candidate", "reference")):
            cfg = with_changes(ref_cfg if arm == "reference" else cand_cfg,
                               {"steps": steps, "eval_every": 0, "checkpoint_every": 0})
            cfg = speed_measured(with_changes(cfg, {"steady_after": steady_after or warmup_steps(cfg)}))
            run = launch_or_reuse(cfg, folder / f"{arm}_{k + 1}", progress=False)
            if run.status != "ok":
                raise RuntimeError(f"standalone run {run.path} ended {run.status}: {run.summary.get('status_reason')}")
            rows = run.speed_rows()
            rates[arm].append(sum(r["tokens"] for r in rows) / (sum(r["step_time_ms"] for r in rows) / 1000.0))
    logs = [math.log(c / r) for r, c in zip(rates["reference"], rates["candidate"])]
    half = t_quantile(0.975, pairs - 1) * statistics.stdev(logs) / math.sqrt(pairs)
    ratio = statistics.fmean(rates["candidate"]) / statistics.fmean(rates["reference"])
    return {**rates, "ratio": ratio, "interval95": [ratio * math.exp(-half), ratio * math.exp(half)],
            "steps": steps, "pairs": pairs}


def _truth(name: str, ref_cfg, cand_cfg, folder: Path) -> dict:
    """One truth measurement of effect `name`: long separate runs (LONG_RUN_TRUTHS) or the arms taking turns."""
    if name not in LONG_RUN_TRUTHS:
        return _interleaved(ref_cfg, cand_cfg, folder, TRUTH_STEPS)
    got = _standalone(ref_cfg, cand_cfg, folder, TRUTH_RUN_PAIRS, TRUTH_RUN_STEPS, TRUTH_RUN_STEADY_AFTER)
    return {"ratio": got["ratio"], "steps": TRUTH_RUN_STEPS, "pairs": TRUTH_RUN_PAIRS, "runs": got,
            "steady_after": TRUTH_RUN_STEADY_AFTER,
            "how": "ABBA pairs of separate runs, each its own process; the ratio of the arms' mean tokens ÷ wall "
                   f"time of their steps after step {TRUTH_RUN_STEADY_AFTER}, stalls included"}


def _sized(name: str, base, work: Path) -> dict:
    """The width of ballast `name` for +TARGET of the mean step, from one long measurement of its probe width."""
    probe = with_changes(base, {"model.ballast": PROBES[name]})
    got = _interleaved(base, probe, work / "calibration" / name, CALIBRATION_STEPS)
    slowdown = 1 / got["ratio"] - 1
    return {"probe_width": PROBES[name], "probe_slowdown": slowdown,
            "width": max(1, round(PROBES[name] * TARGET / slowdown))}


def _setup(work: Path, log, effects: dict = EFFECTS) -> dict:
    """Each effect's baseline, round changes, true ratio and standalone cross-check (state.json in `work`; an
    effect whose truth is separate runs needs no cross-check of that kind)."""
    state_file = work / "state.json"
    if state_file.is_file():
        return json.loads(state_file.read_text(encoding="utf-8"))
    work.mkdir(parents=True, exist_ok=True)
    state = {"_sized": {}}
    for name, (base_changes, steps, changes, path, expected) in effects.items():
        cfg = base_config("nano", steps, changes=base_changes)
        if isinstance(changes, str):
            state["_sized"][changes] = _sized(changes, cfg, work)
            changes = {"model.ballast": state["_sized"][changes]["width"]}
        if changes is None:
            truth, cross = {"ratio": 1.0, "how": "the same config in both arms"}, None
        else:
            cand = with_changes(cfg, changes)
            truth = _truth(name, cfg, cand, work / "truth" / _slug(name))
            cross = None if name in LONG_RUN_TRUTHS else _standalone(cfg, cand, work / "standalone" / _slug(name),
                                                                      STANDALONE_PAIRS, STANDALONE_STEPS)
        state[name] = {"baseline_changes": base_changes, "steps": steps, "changes": changes, "path": path,
                       "expected": expected, "truth": truth, "standalone": cross}
        log(f"  truth {name}: ×{truth['ratio']:.4f}" + ("" if cross is None else
            f" (separate runs: ×{cross['ratio']:.4f}, 95% ×{cross['interval95'][0]:.4f}–×{cross['interval95'][1]:.4f})"))
    state_file.write_text(json.dumps(state, indent=1), encoding="utf-8")
    return state


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name).strip("_")


def _truth_ratios(effect: dict) -> list[float]:
    """Each truth measurement of an effect (a state from before repeated truths holds only the first)."""
    return [t["ratio"] for t in effect.get("truths") or [effect["truth"]]]


def truth_of(effect: dict) -> float:
    """An effect's true ratio: the geometric mean of its truth measurements (1 for an A/A)."""
    return math.exp(statistics.fmean(math.log(r) for r in _truth_ratios(effect)))


def truth_at(effect: dict, trial: int) -> float:
    """The true ratio at the time of trial `trial` (0-based): log-linear by trial index between the truths measured
    before and after its block of TRUTH_EVERY trials (the last one where none came after; 1 for an A/A). A truth of
    long separate runs moves with the machine's speed (a stall-bound arm does not slow with it, a compute-bound one
    does: two such truths 20 minutes apart read ×4.60 and ×3.97), so a trial is held to the truth of its hour."""
    ratios = _truth_ratios(effect)
    block = trial // TRUTH_EVERY
    if block + 1 >= len(ratios):
        return ratios[min(block, len(ratios) - 1)]
    f = (trial - block * TRUTH_EVERY + 0.5) / TRUTH_EVERY
    return math.exp((1 - f) * math.log(ratios[block]) + f * math.log(ratios[block + 1]))


def _more_truths(work: Path, state: dict, i: int, log) -> None:
    """Before trial `i` (a multiple of TRUTH_EVERY after 0; or the trials' count: after the last): one more truth
    measurement of each effect with a change, kept in its own folder (reused when there)."""
    for name, e in state.items():
        if name.startswith("_") or e["changes"] is None:
            continue
        e.setdefault("truths", [e["truth"]])
        if len(e["truths"]) > math.ceil(i / TRUTH_EVERY):
            continue
        cfg = base_config("nano", e["steps"], changes=e["baseline_changes"])
        got = _truth(name, cfg, with_changes(cfg, e["changes"]), work / "truth" / f"{_slug(name)}_{i}")
        e["truths"].append({**got, "before_trial": i})
        log(f"  truth {name} after trial {i}: ×{got['ratio']:.4f} (now ×{truth_of(e):.4f} over "
            f"{len(e['truths'])})")
    (work / "state.json").write_text(json.dumps(state, indent=1), encoding="utf-8")


def _trial(wb: Workbook, name: str, effect: dict, i: int) -> dict:
    t0 = time.perf_counter()
    with LoadSampler() as load:
        if effect["changes"] is None:
            v = wb.aa_check(progress=False, path=effect["path"])
        else:
            r = wb.run_round(f"{_slug(name)}_{i}", effect["changes"], progress=False)
            v = r.verdict
            if r.decision == "keep":  # the next trial compares against the pinned baseline again
                wb.rollback(0)
    truth = truth_of(effect)
    speed = _speed_file(wb, None if effect["changes"] is None else r)
    foreign = (speed or {}).get("foreign_cores") or []
    return {"effect": name, "trial": i, "decision": v.decision, "expected": effect["expected"], "ratio": v.speedup,
            "interval": v.interval, "half_width": v.noise_band, "pairs": v.pairs, "path": v.path,
            "covered": _holds(v.interval, truth), "parts": v.parts, "reason": v.reason,
            "wall_s": time.perf_counter() - t0, "load_1min": load.summary(),
            "foreign_cores_median": statistics.median(foreign) if foreign else None}


def _speed_file(wb: Workbook, r) -> dict | None:
    """The speed.json of the round `r` (None: the workbook's latest A/A check), None when there is none."""
    path = r.rollback.parent / "speed.json" if r is not None else max(
        (wb.path / "aa").glob("*/speed.json"), key=lambda p: p.stat().st_mtime, default=None)
    return json.loads(path.read_text(encoding="utf-8")) if path is not None and path.is_file() else None


def item_validity(trials: int = 20, work: Path = WORK, log=print, effects: dict = EFFECTS) -> dict:
    """The validity bench (module docstring) on `effects`; returns what goes to the record."""
    t_start = time.perf_counter()
    work = Path(work)
    state = _setup(work, log, effects)
    books = {}
    for name in effects:
        e = state[name]
        folder = work / "books" / _slug(name)
        books[name] = Workbook.create(folder, base_config("nano", e["steps"], changes=e["baseline_changes"]))
        books[name].baseline(progress=False)
    done_file = work / "trials.jsonl"
    done = [json.loads(line) for line in done_file.read_text(encoding="utf-8").splitlines()] \
        if done_file.is_file() else []
    have = {(t["effect"], t["trial"]) for t in done}
    for i in range(trials):
        if i and i % TRUTH_EVERY == 0 and any((name, i) not in have for name in effects):
            _more_truths(work, state, i, log)
        for name in effects:
            if (name, i) in have:
                continue
            t = _trial(books[name], name, state[name], i)
            with open(done_file, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(t) + "\n")
            done.append(t)
            log(f"  {name} {i + 1}/{trials}: {t['decision']} ×{t['ratio'] or float('nan'):.4f} "
                f"{'' if t['covered'] else 'NOT '}covering ×{truth_of(state[name]):.4f} "
                f"(±{100 * (t['half_width'] or 0):.1f}%, {t['pairs']} pairs, {t['wall_s']:.0f} s, load "
                f"{t['load_1min']['max']:.1f})")
    _more_truths(work, state, trials, log)  # so that the truths span the trials' hours at both ends
    trials_done = [t for t in done if t["trial"] < trials]
    return {"trials": trials, "effects": {n: state[n] for n in effects}, "sized": state["_sized"],
            "rates": _rates(trials_done, state, effects),
            "trials_detail": trials_done, "load_limit": (os.cpu_count() or 1) + QUIET_MARGIN,
            "wall_s": time.perf_counter() - t_start}


def _holds(interval: list[float] | None, truth: float) -> bool:
    """Whether a trial's interval (None: it gave none) holds `truth`."""
    return interval is not None and interval[0] <= truth <= interval[1]


def _rates(done: list[dict], state: dict, effects: dict = EFFECTS) -> dict:
    out = {}
    for name in effects:
        rows = [t for t in done if t["effect"] == name]
        if not rows:
            continue
        hw = [t["half_width"] for t in rows if t["half_width"] is not None]
        ratios = [t["ratio"] for t in rows if t["ratio"]]
        truth = truth_of(state[name])
        out[name] = {"trials": len(rows), "truth": truth,
                     "truths": _truth_ratios(state[name]),
                     "standalone": (state[name]["standalone"] or {}).get("interval95"),
                     # against the truth over every measurement (a trial recorded its coverage of the truth so far)
                     "covered": sum(_holds(t["interval"], truth) for t in rows),
                     # against the truth of each trial's hour (`truth_at`): the must for long-run truths
                     "covered_at_its_time": sum(_holds(t["interval"], truth_at(state[name], t["trial"]))
                                                for t in rows),
                     "as_expected": sum(t["decision"] == t["expected"] for t in rows),
                     "decisions": {d: sum(t["decision"] == d for t in rows)
                                   for d in ("keep", "reject", "no change", "failed")},
                     "ratio_median": statistics.median(ratios) if ratios else None,
                     "half_width_median": statistics.median(hw) if hw else None,
                     "pairs_median": statistics.median(t["pairs"] or 0 for t in rows),
                     "wall_s_median": statistics.median(t["wall_s"] for t in rows),
                     "load_1min_max": max(t["load_1min"]["max"] for t in rows),
                     # outside load: CPU of other processes during the pairs (the arms' own threads excluded),
                     # where the round measured it; else the load average, which counts the round's own work
                     "foreign_cores_max": max((t["foreign_cores_median"] for t in rows
                                               if t.get("foreign_cores_median") is not None), default=None)}
    return out


def _quiet(r: dict, line: str, hit: bool) -> Judgement:
    """met/missed, or invalid when something else ran: a trial whose pairs met more than FOREIGN_QUIET cores of
    other processes' CPU (median over its pairs), or, for trials without that measure (whole runs), a 1-min load
    above cores + QUIET_MARGIN (the round's own processes count in it: two op threads load two cores)."""
    rates = (r.get("rates") or {}).values()
    foreign = [x["foreign_cores_max"] for x in rates if x.get("foreign_cores_max") is not None]
    loads = [x["load_1min_max"] for x in rates if x.get("foreign_cores_max") is None]
    if foreign and max(foreign) > FOREIGN_QUIET:
        return Judgement(INVALID, f"{line}; but other processes used {max(foreign):.2f} cores during a trial's "
                                  f"pairs (> {FOREIGN_QUIET}): not measured alone")
    if loads and max(loads) > r["load_limit"]:
        return Judgement(INVALID, f"{line}; but the 1-min load reached {max(loads):.1f} > {r['load_limit']:.1f} "
                                  f"(cores + {QUIET_MARGIN}): not measured alone")
    return Judgement(MET if hit else MISSED, line)


def _scaled(of20: int, trials: int) -> int:
    """A count "of 20" for `trials` trials (19 of 20 → 95% of them, rounded up)."""
    return math.ceil(of20 * trials / 20)


def _count_check(label: str, effects: tuple[str, ...], field: str, of20: int, what: str) -> Check:
    def judge(r: dict) -> Judgement:
        rates = r.get("rates") or {}
        got = [(n, rates[n]) for n in effects if n in rates]
        if not got:
            return Judgement(NOT_MEASURED, f"{label}: no trial")
        if any(field not in rate for _, rate in got):
            return Judgement(NOT_MEASURED, f"{label}: the record predates `{field}`")
        lines, hit = [], True
        for n, rate in got:
            need = _scaled(of20, rate["trials"])
            ok = rate[field] >= need
            hit &= ok
            lines.append(f"{n} {rate[field]}/{rate['trials']} ({'≥' if ok else '<'} {need})")
        return _quiet(r, f"{label}: " + ", ".join(lines), hit)
    miss = {"rates": {effects[0]: {field: 0, "trials": 20, "load_1min_max": 0.0}}, "load_limit": 9.0}
    return Check(MUST, f"{what} in ≥ {of20} of 20 trials (nothing else running: other processes' CPU ≤ "
                       f"{FOREIGN_QUIET} cores during the pairs, whole runs' 1-min load ≤ cores + {QUIET_MARGIN}; "
                       f"else invalid)", judge, miss=miss)


def _lean(r: dict, effects: tuple[str, ...]) -> Judgement:
    rates = r.get("rates") or {}
    got = [(n, rates[n]["ratio_median"]) for n in effects if n in rates]
    if not got:
        return Judgement(NOT_MEASURED, "no A/A trial")
    hit = all(abs(x - 1) <= LEAN_LIMIT for _, x in got)
    return _quiet(r, "median A/A estimate " + ", ".join(f"{n} ×{x:.4f}" for n, x in got)
                  + f" ({'within' if hit else 'beyond'} ±{LEAN_LIMIT:.1%})", hit)


def _half_width(r: dict, effect: str, limit: float) -> Judgement:
    rate = (r.get("rates") or {}).get(effect)
    if not rate or rate["half_width_median"] is None:
        return Judgement(NOT_MEASURED, f"no {effect} trial")
    hit = rate["half_width_median"] <= limit
    return _quiet(r, f"{effect} median half-width ±{rate['half_width_median']:.2%} "
                     f"({'≤' if hit else '>'} ±{limit:.1%})", hit)


def _process_rounds(r: dict) -> Judgement:
    rates = r.get("rates") or {}
    got = [(n, rates[n]) for n in PROCESS_EFFECTS if n in rates]
    if not got:
        return Judgement(NOT_MEASURED, "no data or threads round")
    hit = all(x["half_width_median"] <= PROCESS_HALF_WIDTH_LIMIT and x["wall_s_median"] <= PROCESS_WALL_LIMIT_S
              for _, x in got)
    return _quiet(r, ", ".join(f"{n}: median ±{x['half_width_median']:.1%} in {x['wall_s_median']:.0f} s"
                               for n, x in got)
                  + f" ({'within' if hit else 'not within'} ±{PROCESS_HALF_WIDTH_LIMIT:.0%} and "
                    f"{PROCESS_WALL_LIMIT_S:.0f} s)", hit)


def _cross_check(r: dict) -> Judgement:
    rates = r.get("rates") or {}
    got = [(n, x["truth"], x["standalone"]) for n, x in rates.items() if x.get("standalone")]
    if not got:
        return Judgement(NOT_MEASURED, "no effect with separate runs")
    hit = all(low <= truth <= high for _, truth, (low, high) in got)
    return Judgement(MET if hit else MISSED, "; ".join(f"{n}: ×{t:.3f} {'in' if lo <= t <= hi else 'outside'} "
                                                      f"×{lo:.3f}–×{hi:.3f}" for n, t, (lo, hi) in got))


CHECKS = (
    _count_check("coverage", tuple(EFFECTS), "covered", COVERAGE, "every effect: the interval holds the true ratio"),
    _count_check("ballast rejected", ("uniform +5%", "intermittent +5%"), "as_expected", CALLS,
                 "uniform and intermittent +5%: \"reject\""),
    _count_check("A/A no change", ("A/A (processes)", "A/A (processes, slow data)", "A/A (runs)"), "as_expected",
                 AA_CALLS, "A/A on every path: \"no change\""),
    Check(MUST, f"median A/A point estimate within ±{LEAN_LIMIT:.1%} of 1 on the default path, both configs (quiet, "
                f"else invalid)", lambda r: _lean(r, ("A/A (processes)", "A/A (processes, slow data)")),
          miss={"rates": {"A/A (processes)": {"ratio_median": 1.012, "load_1min_max": 0.0}}, "load_limit": 9.0}),
    Check(MUST, f"A/A median half-width ≤ ±{HALF_WIDTH_LIMIT:.1%} on the default path (quiet, else invalid)",
          lambda r: _half_width(r, "A/A (processes)", HALF_WIDTH_LIMIT),
          miss={"rates": {"A/A (processes)": {"half_width_median": 0.05, "load_1min_max": 0.0}}, "load_limit": 9.0}),
    Check(GOAL, f"whole runs: median A/A point estimate within ±{LEAN_LIMIT:.1%} (4 pairs of runs minutes apart)",
          lambda r: _lean(r, ("A/A (runs)",))),
    Check(GOAL, "whole runs: A/A median half-width ≤ ±5%", lambda r: _half_width(r, "A/A (runs)", 0.05)),
    Check(MUST, f"process-wide variables' path (an A/A on the slow-data config, the threads round): median "
                f"half-width ≤ ±{PROCESS_HALF_WIDTH_LIMIT:.0%} in ≤ {PROCESS_WALL_LIMIT_S:.0f} s of round wall time "
                f"(quiet, else invalid)", _process_rounds,
          miss={"rates": {"threads 1→2": {"half_width_median": 0.2, "wall_s_median": 30.0, "load_1min_max": 0.0}},
                "load_limit": 9.0}),
    Check(GOAL, "each true ratio (arms taking turns) inside the 95% interval of separate runs of the same effect",
          _cross_check),
)


def rows(r: dict) -> list[tuple[str, str]]:
    out = []
    for name, rate in r["rates"].items():
        decided = ", ".join(f"{d} {n}" for d, n in rate["decisions"].items() if n)
        cross = rate.get("standalone")
        cross = f"; separate runs ×{cross[0]:.3f}–×{cross[1]:.3f} (95%)" if cross else ""
        truths = rate.get("truths") or []
        spread = f" over {len(truths)}: ×{min(truths):.3f}–×{max(truths):.3f}" if len(truths) > 1 else ""
        out.append((f"validity, nano: {name} (true ×{rate['truth']:.4f}{spread}{cross})",
                    f"interval holds it {rate['covered']}/{rate['trials']}"
                    + (f" (the truth of its hour: {rate['covered_at_its_time']}/{rate['trials']})"
                       if len(truths) > 1 and "covered_at_its_time" in rate else "")
                    + f"; {decided}; median ×"
                    f"{rate['ratio_median']:.4f}, ±{100 * (rate['half_width_median'] or 0):.1f}%, "
                    f"{rate['pairs_median']:.0f} pairs, {rate['wall_s_median']:.0f} s; "
                    + (f"other processes ≤ {rate['foreign_cores_max']:.2f} cores" if rate.get("foreign_cores_max")
                       is not None else f"load ≤ {rate['load_1min_max']:.1f}")))
    return out


STALL_CHECKS = (
    _count_check("coverage", tuple(STALL_EFFECTS), "covered_at_its_time", COVERAGE,
                 "large effects with stalls: the interval holds the long-run true ratio of its hour (`truth_at`: "
                 "between the truths measured before and after its 5 trials)"),
    _count_check("kept", tuple(STALL_EFFECTS), "as_expected", CALLS, "large effects with stalls: \"keep\""),
)

ITEMS = [Item("validity_stalls", "speed verdicts on large effects with stalls, against long runs of their own",
              lambda a: item_validity(a.trials, a.stalls_dir, effects=STALL_EFFECTS), rows, STALL_CHECKS,
              options=((("--trials",), {"type": int, "default": 20,
                                        "help": "trials (aa: A/A checks; power: per kind and condition)"}),
                       (("--stalls-dir",), {"type": Path, "default": STALLS_WORK,
                                            "help": "validity_stalls: where its workbooks, truths and trials live "
                                                    "(resumable)"})),
              check_args=lambda a: positive(a, "trials"), in_all=False),
         Item("validity", "speed verdicts on effects whose true ratio long separate runs measured",
              lambda a: item_validity(a.trials, a.validity_dir), rows, CHECKS,
              options=((("--trials",), {"type": int, "default": 20,
                                        "help": "trials (aa: A/A checks; power: per kind and condition)"}),
                       (("--validity-dir",), {"type": Path, "default": WORK,
                                              "help": "validity: where its workbooks, truths and trials live "
                                                      "(resumable)"})),
              check_args=lambda a: positive(a, "trials"), in_all=False)]
