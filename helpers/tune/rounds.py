"""Tuning rounds against a pinned baseline: one change per round, a measured verdict, an append-only ledger.

A workbook folder:
    workbook.json            marks the folder; the rule's settings and the pinned baseline config
    baseline/run_K/          the baseline's `repeats` run records
    rounds/NN_name/          a round: candidate/ and reference/ (two arm processes, or one msrun launch; paired.json) or
                             candidate_K/ and reference_K/ runs (separate processes), speed.json, rollback/ point
    aa/NN/                   A/A checks: the current best as candidate_K/ and reference_K/
    ledger.jsonl             the journal, one fsync'd JSON line per event, never rewritten: the source of truth
    best.yaml                the current best config (a mirror of the ledger, rewritten atomically)
    .lock                    flock'd while an operation writes (see `ledger.WorkbookLock`)
    interrupted/             run folders of operations that died before their ledger entry, moved aside

Every entry carries `best_round`: the round whose config is the current best after it (0 = the baseline).
Replaying the ledger gives the state, so a workbook can be reopened, or read by another process, at any time.
"""
from __future__ import annotations

import dataclasses
import getpass
import json
import re
import shutil
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Iterator

from helpers import config as config_mod
from helpers.config import Config
from helpers.paths import absolute
from helpers.tune.convergence import (CONVERGENCE_VARIABLES, OBJECTIVES, RECIPE, TIME_TO_TARGET, reference_level,
                                      time_to_target, ttq_arms)
from helpers.tune.lr_rule import DEFAULT_LR_RULE, SCALED, check_rule, moves_global_batch, scale_lr
from helpers.tune.ledger import Ledger, RoundError, WorkbookLock
from helpers.record import (SUMMARY_FILE, RecordError, RunRecord, atomic_write_json, atomic_write_text, load_run,
                            median_summary, memory_label, write_summary)
from helpers.run.memory import default_memory_limit
from helpers.paired import (DP_PAIRED_PLAN, PROCESS_PLAN, RUNS_PLAN, Measurement, SpeedPlan, conclude, should_stop,
                            stop_rule)
from helpers.spawn.paired import launch_pair
from helpers.spawn.runner import launch
from helpers.spawn.stepped import launch_stepped
from helpers.tune.rules import (Verdict, failed, judge, judge_convergence, judge_time_to_target, loss_gate_for,
                                unfinished)
from helpers.tune.speed_path import PAIRED, PROCESSES, RUNS, speed_path

SPEED_FILE = "speed.json"  # a speed round's measurement: path, plan, per-pair log ratios, looks, outcome

__all__ = ["FIXED", "GROUPS", "RoundError", "RoundResult", "Verdict", "Workbook", "load_runs"]

FORMAT = "mindspore-tuning-workbook"
VERSION = 1
MARKER = "workbook.json"
# What adopted baseline runs may differ in from the baseline config: their seed, when a run ends (a run that
# trained past the target reached it at the same second as one that stops there), and the profiler's window (a
# data-parallel run's record carries the window that measured its all-reduces; profiled steps are left out of
# its speed, and the profiler changes no arithmetic).
ADOPTABLE = ("seed", "target_val_loss", "max_time_s", "monitor.profile_steps", "monitor.profile_start")

# Variables that only make sense changed together; any other round changes exactly one variable.
GROUPS = (
    # Same tokens per optimizer step, different memory/speed trade: changing only one changes the recipe.
    frozenset({"batch_size", "grad_accum_steps"}),
    # fp16 without loss scaling underflows gradients; enabling AMP and its scaler is one decision.
    frozenset({"amp_level", "loss_scale"}),
    # The low-precision dtype means nothing at O0, so a level and its dtype are chosen together.
    frozenset({"amp_level", "amp_dtype"}),
    # jit_level means the compile level in graph mode but "wrap the step in ms.jit or not" in PyNative.
    frozenset({"mode", "jit_level"}),
)
# Held fixed so candidate and reference runs cover the same steps, data order and steady window.
FIXED = ("steps", "seed", "steady_after", "resume_from")
OVERRIDE_DECISIONS = ("keep", "reject", "no change")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,47}$")


@dataclass
class RoundResult:
    """One round as recorded in the ledger (paths absolute)."""
    index: int
    name: str
    changes: dict[str, tuple]
    reference_runs: list[Path]
    candidate_runs: list[Path]
    verdict: Verdict
    override: dict | None
    rollback: Path
    objective: str = "speed"  # "speed" (tokens/s rule), "convergence" (val loss at equal tokens, seeds) or
    # "time_to_target" (wall seconds to a val loss, seeds)
    target: float | None = None  # a time-to-target round's validation loss (nats/token)

    @property
    def decision(self) -> str:
        """The person's override decision if any, else the verdict's."""
        return self.override["decision"] if self.override else self.verdict.decision


def _now() -> str:
    return datetime.now().astimezone().isoformat(timespec="seconds")


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


def _reasons(why: str, reasoning: dict | None) -> dict:
    """Ledger fields saying why an entry was made (only those given)."""
    return {**({"why": " ".join(why.split())} if why else {}), **({"reasoning": reasoning} if reasoning else {})}


def load_runs(runs) -> list[RunRecord]:
    """Records of run folders, in order. One policy for every reader of a workbook's runs: a folder that
    holds no record (a run that died before writing one) is skipped; a record that exists but cannot be read
    raises RoundError (one line), because a verdict or a table without it would be silently wrong."""
    out = []
    for p in runs:
        p = Path(p)
        if not (p / SUMMARY_FILE).is_file():
            continue
        try:
            out.append(load_run(p))
        except RecordError as exc:
            raise RoundError(f"a run of this workbook is unreadable: {exc}") from None
    return out


class Workbook:
    """A folder of tuning rounds; see the module docstring for its layout and rules."""

    def __init__(self, path: Path, settings: dict, baseline_config: Config):
        self.path = Path(path)
        self.repeats: int = settings["repeats"]
        self.loss_gate: float = settings["loss_gate"]
        self.memory_limit_bytes: int = settings["memory_limit_bytes"]
        self._baseline_config = baseline_config
        self._ledger = Ledger(self.path / "ledger.jsonl")
        self._lock = WorkbookLock(self.path / ".lock")

    # ----- creating and opening -------------------------------------------------------------------------
    @classmethod
    def create(cls, path, cfg: Config, repeats: int = 2, loss_gate: float = 0.02,
               memory_limit_bytes: int | None = None) -> "Workbook":
        """A new workbook pinned to `cfg`; on an existing workbook with the same baseline and settings, open it.

        repeats: runs per config (≥ 2: one run cannot measure run-to-run noise); loss_gate: allowed relative
        loss drift at equal tokens (0.02 = 2%); memory_limit_bytes: peak memory limit in bytes (default 90% of RAM
        on CPU, where the peak is process RSS; 90% of the device's memory on GPU/Ascend, where it is the device
        allocator's peak).
        A relative `path`, and relative file paths in `cfg`, mean what they mean in the caller's working directory.
        """
        path = absolute(path)
        cfg = config_mod.absolute_paths(cfg)
        if not isinstance(repeats, int) or repeats < 2:
            raise RoundError(f"repeats={repeats!r} cannot measure run-to-run noise; use repeats=2 or more")
        if not 0 < loss_gate < 1:
            raise RoundError(f"loss_gate={loss_gate!r} must be a fraction in (0, 1), e.g. 0.02 for 2%")
        if memory_limit_bytes is None:  # 90% of RAM on CPU, of the device's memory on GPU/Ascend
            memory_limit_bytes = default_memory_limit(cfg.device_target)
            if memory_limit_bytes is None:
                raise RoundError(f"MindSpore reports no memory total for device_target={cfg.device_target}; pass "
                                 f"memory_limit_bytes (bytes of device memory the peak may reach)")
        if memory_limit_bytes <= 0:
            raise RoundError(f"memory_limit_bytes={memory_limit_bytes} must be positive (bytes), or None for "
                             f"90% of this machine's RAM")
        settings = {"repeats": repeats, "loss_gate": loss_gate, "memory_limit_bytes": int(memory_limit_bytes)}
        if (path / MARKER).is_file():
            book = cls.open(path)
            mine = {"repeats": book.repeats, "loss_gate": book.loss_gate,
                    "memory_limit_bytes": book.memory_limit_bytes}
            changed = {**config_mod.diff(book._baseline_config, cfg),
                       **{k: (mine[k], settings[k]) for k in settings if mine[k] != settings[k]}}
            if changed:
                what = ", ".join(f"{k}: {a!r} → {b!r}" for k, (a, b) in list(changed.items())[:3])
                raise RoundError(f"{str(path)!r} already holds a workbook with another baseline or settings "
                                 f"({what}); open it with Workbook.open or choose a new folder")
            return book
        if path.exists() and (not path.is_dir() or any(path.iterdir())):
            raise RoundError(f"{str(path)!r} exists and is not a workbook; choose a new or empty folder")
        if cfg.resume_from:
            raise RoundError(f"the baseline has resume_from={cfg.resume_from!r}; pin a baseline that trains "
                             f"from scratch (resume_from='')")
        path.mkdir(parents=True, exist_ok=True)
        marker = {"format": FORMAT, "version": VERSION, "created_at": _now(), "created_by": _user(),
                  **settings, "baseline_config": config_mod.to_dict(cfg)}
        atomic_write_text(path / "best.yaml", config_mod.dump(cfg))
        atomic_write_json(path / MARKER, marker)
        return cls(path, settings, cfg)

    @classmethod
    def open(cls, path) -> "Workbook":
        """An existing workbook; RoundError (one line) for a missing, foreign or unreadable folder."""
        path = absolute(path)
        if not path.is_dir():
            raise RoundError(f"workbook folder {str(path)!r} does not exist; create it with "
                             f"Workbook.create(path, cfg)")
        if not (path / MARKER).is_file():
            raise RoundError(f"{str(path)!r} is not a workbook (no {MARKER}); open a folder made by "
                             f"Workbook.create, or create one")
        try:
            marker = json.loads((path / MARKER).read_text(encoding="utf-8"))
            if marker.get("format") != FORMAT:
                raise ValueError(f"format {marker.get('format')!r}")
            cfg = config_mod.from_dict(marker["baseline_config"])
            settings = {k: marker[k] for k in ("repeats", "loss_gate", "memory_limit_bytes")}
        except (ValueError, KeyError, TypeError, AttributeError, OSError) as exc:
            raise RoundError(f"{str(path / MARKER)!r} is unreadable ({str(exc).splitlines()[0]}); it was not "
                             f"written by Workbook.create — create a new workbook") from None
        return cls(path, settings, cfg)

    @contextmanager
    def lock(self) -> Iterator[None]:
        """Hold the workbook's lock across several operations (each operation also takes it on its own)."""
        with self._lock.hold():
            yield

    # ----- reading the state ----------------------------------------------------------------------------
    def ledger(self) -> list[dict]:
        """Every ledger entry, oldest first: event, round, changes, verdict, decision, best_round, who, when."""
        return self._ledger.entries()

    def _rel(self, path: Path) -> str:
        return Path(path).relative_to(self.path).as_posix()

    def _best_round(self, entries: list[dict]) -> int:
        return entries[-1]["best_round"] if entries else 0

    def _round_entries(self, entries: list[dict]) -> dict[int, dict]:
        return {e["round"]: e for e in entries if e["event"] == "round"}

    def _source(self, index: int, entries: list[dict]) -> tuple[Config, list[Path]]:
        """(config, run dirs) of round `index`'s candidate, or of the baseline for 0."""
        if index == 0:
            pinned = [e for e in entries if e["event"] == "baseline"]
            runs = [self.path / p for p in pinned[0]["runs"]] if pinned else []
            return self._baseline_config, runs
        entry = self._round_entries(entries)[index]
        cfg = config_mod.load_config(self.path / entry["rollback"] / "config.yaml")
        return cfg, [self.path / p for p in entry["candidate_runs"]]

    load_runs = staticmethod(load_runs)

    def baseline_runs(self) -> list[RunRecord]:
        """The pinned baseline's records ([] before it is pinned; never trains)."""
        return self.load_runs(self._source(0, self.ledger())[1])

    def best_runs(self) -> list[RunRecord]:
        """Records of the current best config: the kept round's candidate runs, or the baseline's."""
        entries = self.ledger()
        return self.load_runs(self._source(self._best_round(entries), entries)[1])

    def best_config(self) -> Config:
        """The current best config (the baseline until a round is kept, overridden or rolled back to)."""
        entries = self.ledger()
        return self._source(self._best_round(entries), entries)[0]

    def rounds(self) -> list[RoundResult]:
        """Every round so far, oldest first, with any override a person recorded."""
        entries = self.ledger()
        overrides: dict[int, dict] = {}
        for e in entries:
            if e["event"] == "decide":
                overrides[e["round"]] = {"decision": e["decision"], "who": e["who"], "why": e["why"],
                                         "at": e["when"]}
        return [RoundResult(index=e["round"], name=e["name"],
                            changes={k: tuple(v) for k, v in e["changes"].items()},
                            reference_runs=[self.path / p for p in e["reference_runs"]],
                            candidate_runs=[self.path / p for p in e["candidate_runs"]],
                            verdict=Verdict.from_dict(e["verdict"]), override=overrides.get(e["round"]),
                            rollback=self.path / e["rollback"], objective=e.get("objective", "speed"),
                            target=e.get("target"))
                for e in entries if e["event"] == "round"]

    # ----- writing ----------------------------------------------------------------------------------------
    def _append(self, entry: dict, best_round: int, entries: list[dict]) -> None:
        """Ledger first (the truth), then the best.yaml mirror if the best moved."""
        self._ledger.append({**entry, "best_round": best_round})
        if best_round != self._best_round(entries):
            cfg, _ = self._source(best_round, [*entries, {**entry, "best_round": best_round}])
            atomic_write_text(self.path / "best.yaml", config_mod.dump(cfg))

    def _fresh(self, folder: Path) -> Path:
        """An empty folder; leftovers of an operation that died before its ledger entry are moved aside."""
        if folder.exists():
            aside = self.path / "interrupted" / f"{self._rel(folder).replace('/', '_')}-{time.time_ns()}"
            aside.parent.mkdir(exist_ok=True)
            folder.rename(aside)
        folder.mkdir(parents=True)
        return folder

    def _launch(self, cfg: Config, run_dir: Path, desc: str, progress: bool) -> tuple[RunRecord | None, str]:
        """One run in its own process; (record, "") or (None, why) when the process left no record."""
        try:
            return launch(cfg, run_dir, progress=progress, desc=desc), ""
        except RuntimeError as exc:
            return None, f"{run_dir.name} left no record ({str(exc).splitlines()[0]})"

    def _measure(self, cand_cfg: Config, ref_cfg: Config, folder: Path, label: str, progress: bool,
                 count: int, seeds: list[int] | None = None, after_pair=None):
        """Up to `count` pairs of runs, each run in its own process, ABBA order (C R, R C, …). With `seeds`, run k
        of both arms uses seeds[k-1] (a convergence round); `after_pair(runs)` → True stops after a pair.

        Load on a shared machine drifts over minutes (here an identical rerun came out +38% against runs of a
        minute before, both repeats agreeing); runs taken side by side see the same drift, and ABBA cancels a
        linear trend. Stops at the first run that does not finish. Returns (candidates, references, error).
        """
        runs: dict[str, list[RunRecord]] = {"candidate": [], "reference": []}
        for k in range(1, count + 1):
            for role in (("candidate", "reference") if k % 2 else ("reference", "candidate")):
                cfg = cand_cfg if role == "candidate" else ref_cfg
                if seeds:
                    cfg = config_mod.with_changes(cfg, {"seed": seeds[k - 1]})
                record, error = self._launch(cfg, folder / f"{role}_{k}", f"{label} {role} {k}/{count}",
                                             progress)
                if error:
                    return runs["candidate"], runs["reference"], f"{role} {error}"
                runs[role].append(record)
                if record.status != "ok":
                    return runs["candidate"], runs["reference"], ""
            if after_pair is not None and after_pair(runs):
                break
        return runs["candidate"], runs["reference"], ""

    def _measure_speed(self, cand_cfg: Config, ref_cfg: Config, changes: dict, folder: Path, label: str,
                       progress: bool, profile_steps: int = 0,
                       path: str | None = None) -> tuple[list[RunRecord], list[RunRecord], str, dict]:
        """Measure a speed round the way its variable allows (`speed_path`, or `path` when given): two processes
        stepping in turns, both arms in each rank of one msrun launch (data parallel), or ABBA pairs of whole runs;
        each adds pairs until a look decides or the budget (the plan's last look) ends. Writes speed.json (path,
        plan, every pair's step times, waits and outside load: the verdict can be recomputed from it); returns
        (candidates, references, error, speed)."""
        auto, why = speed_path(changes, ref_cfg)
        if path is not None and path != auto:
            why = f"{path} asked for (the variable's own path: {auto})"
        path = path or auto
        if path == PAIRED and ref_cfg.parallel.data_parallel == 1:
            raise RoundError("path='paired' measures a data-parallel best inside its msrun ranks; this best is one "
                             "process: use path='processes' (the default) or 'runs'")
        plan = {PAIRED: DP_PAIRED_PLAN, PROCESSES: PROCESS_PLAN, RUNS: RUNS_PLAN}[path]
        t0 = time.perf_counter()
        speed = {"path": path, "why": why, "plan": plan.to_dict(),
                 "tokens_per_step": {"reference": ref_cfg.tokens_per_step, "candidate": cand_cfg.tokens_per_step}}
        if path == RUNS:
            cands, refs, error, m = self._run_pairs(cand_cfg, ref_cfg, folder, label, progress, plan)
            speed.update(pairs=m.pairs, waits=m.waits, foreign_cores=m.foreign_cores)
        else:
            if path == PAIRED:
                ref, cand, raw, error = launch_pair(ref_cfg, cand_cfg, folder, plan.to_dict(), progress, label,
                                                    profile_steps=profile_steps)
            else:
                ref, cand, raw, error = launch_stepped(ref_cfg, cand_cfg, folder, plan.to_dict(), stop_rule(plan),
                                                       progress, label, profile_steps=profile_steps)
            cands, refs = [r for r in [cand] if r], [r for r in [ref] if r]
            if raw is not None:
                speed.update({k: raw.get(k) for k in ("pairs", "waits", "foreign_cores", "setup_s", "measure_s",
                                                      "status", "reason")})
        speed["wall_s"] = time.perf_counter() - t0
        atomic_write_json(folder / SPEED_FILE, speed)
        return cands, refs, error, speed

    def _run_pairs(self, cand_cfg: Config, ref_cfg: Config, folder: Path, label: str, progress: bool,
                   plan: SpeedPlan):
        """Pairs of whole runs in separate processes (`_measure`): each pair's blocks are the two runs' steady
        windows (every steady step, stalls included; profiled steps left out), until `should_stop`. Returns
        (candidates, references, error, the Measurement)."""
        m = Measurement([], (ref_cfg.tokens_per_step, cand_cfg.tokens_per_step), [], None)

        def after_pair(runs: dict[str, list[RunRecord]]) -> bool:
            ref, cand = (runs[r][-1].speed_rows() for r in ("reference", "candidate"))
            m.pairs.append(([r["step_time_ms"] for r in ref], [r["step_time_ms"] for r in cand]))
            m.waits.append(tuple([r.get("data_wait_ms") for r in rows] for rows in (ref, cand)))
            return should_stop(m, plan)
        return (*self._measure(cand_cfg, ref_cfg, folder, label, progress, plan.max_pairs, after_pair=after_pair),
                m)

    def _verdict(self, candidates, references, error: str, baseline: list[RunRecord], objective: str = "speed",
                 target: float | None = None, speed: dict | None = None) -> Verdict:
        gate = loss_gate_for(baseline, self.loss_gate)
        if error:
            return failed(error, gate, self.memory_limit_bytes)
        if objective in ("convergence", TIME_TO_TARGET):
            why = unfinished(references, candidates)
            if why:  # a seed that ended nan/failed: same reporting as a speed round
                return failed(why, gate, self.memory_limit_bytes)
            try:
                if objective == TIME_TO_TARGET:
                    return judge_time_to_target(references, candidates, self.memory_limit_bytes, target)
                return judge_convergence(references, candidates, self.memory_limit_bytes, target)
            except ValueError as exc:  # e.g. eval points that share no token count: recorded, not lost
                return failed(f"validation curves cannot be compared: {exc}", gate, self.memory_limit_bytes)
        why = unfinished(references, candidates)
        if why:
            return failed(why, gate, self.memory_limit_bytes)
        plan = SpeedPlan.from_dict(speed["plan"])
        try:
            outcome = conclude(Measurement.from_raw({"pairs": [], **speed}), plan)
        except ValueError as exc:  # the measurement ended before its first look: a failed round, recorded
            return failed(f"speed measurement incomplete ({speed.get('reason') or exc})", gate,
                          self.memory_limit_bytes)
        speed["looks"] = [look.to_dict() for look in outcome.looks]
        speed["decision"], speed["budget_spent"] = outcome.decision, outcome.budget_spent
        speed["parts"] = outcome.parts.to_dict()
        return judge(references, candidates, baseline, outcome, plan, speed["path"], self.loss_gate,
                     self.memory_limit_bytes)

    def baseline(self, progress: bool = True, who: str | None = None,
                 adopt: list[RunRecord] | None = None) -> list[RunRecord]:
        """The pinned baseline's runs: trained `repeats` times (each in its own process) on the first call.

        adopt: finished runs of the baseline config to pin instead of training it (copied into baseline/), e.g.
        the runs that set a time-to-target bench's target. They may differ from the baseline config only in
        ADOPTABLE keys (the seed, when a run ends, the profiler's window); RoundError (one line) otherwise."""
        with self._lock.hold():
            entries = self.ledger()
            pinned = [e for e in entries if e["event"] == "baseline"]
            if pinned:
                return self.load_runs([self.path / p for p in pinned[0]["runs"]])
            folder = self._fresh(self.path / "baseline")
            if adopt:
                return self._adopt(adopt, folder, who, entries)
            records = []
            for k in range(1, self.repeats + 1):
                record, error = self._launch(self._baseline_config, folder / f"run_{k}",
                                             f"baseline {k}/{self.repeats}", progress)
                if record is not None and record.status != "ok":
                    error = (f"{record.path.name} ended '{record.status}': "
                             f"{(record.summary.get('status_reason') or '').splitlines()[0]}")
                if error:
                    raise RoundError(f"baseline not pinned: {error}; fix the config and create the workbook "
                                     f"again")
                records.append(record)
            self._pin(records, who, entries)
            return records

    def _adopt(self, runs: list[RunRecord], folder: Path, who: str | None, entries: list[dict]) -> list[RunRecord]:
        for run in runs:
            other = {k for k in config_mod.diff(self._baseline_config, run.config) if k not in ADOPTABLE}
            if run.status != "ok" or other:
                why = f"it ended '{run.status}'" if run.status != "ok" else f"it differs in {', '.join(sorted(other))}"
                raise RoundError(f"cannot pin {str(run.path)!r} as the baseline: {why}; pin finished runs of the "
                                 f"baseline config (only {', '.join(ADOPTABLE)} may differ)")
        for k, run in enumerate(runs, 1):
            shutil.copytree(run.path, folder / f"run_{k}")
        records = self.load_runs([folder / f"run_{k}" for k in range(1, len(runs) + 1)])
        self._pin(records, who, entries, adopted_from=[str(r.path) for r in runs])
        return records

    def _pin(self, records: list[RunRecord], who: str | None, entries: list[dict], **extra) -> None:
        """The ledger's baseline entry for `records`."""
        self._append({"event": "baseline", "round": 0, "name": "baseline", "changes": {},
                      "runs": [self._rel(r.path) for r in records], **extra,
                      "tokens_per_s": median_summary(records, "tokens_per_s"), "verdict": None,
                      "decision": "baseline", "who": who or _user(), "when": _now()}, 0, entries)

    def _pinned(self, entries: list[dict]) -> None:
        if not any(e["event"] == "baseline" for e in entries):
            raise RoundError("no baseline pinned yet; call wb.baseline() first")

    def candidate(self, name: str, changes: dict[str, Any],
                  objective: str = "speed") -> tuple[Config, dict[str, tuple]]:
        """The candidate config of a round and its {key: (old, new)} changes; refuses bad rounds (no runs).

        RoundError for a bad name, more than one variable outside a declared group (GROUPS), a fixed key
        (FIXED) or a value equal to the current one; ConfigError for an invalid value. A time-to-target round
        may change any part of the recipe (RECIPE, `steps` included) together: it compares wall seconds to a
        validation loss, not runs of equal length.
        """
        recipe = objective == TIME_TO_TARGET and set(changes) <= set(RECIPE)
        if not isinstance(name, str) or not _NAME.match(name):
            raise RoundError(f"round name {name!r} must be 1-48 letters, digits or _ . + - (it names a folder), "
                             f"e.g. 'batch_size'")
        if not changes:
            raise RoundError(f"round {name!r} changes nothing; pass e.g. {{'batch_size': 24}}")
        keys = list(changes)
        if len(keys) > 1 and frozenset(keys) not in GROUPS and not recipe:
            groups = ", ".join("+".join(sorted(g)) for g in GROUPS)
            raise RoundError(f"round {name!r} changes {len(keys)} variables ({', '.join(keys)}); change one per "
                             f"round, or declare a group such as {groups}")
        fixed = [k for k in keys if k in FIXED and not (recipe and k == "steps")]
        if fixed:
            raise RoundError(f"round {name!r} changes {', '.join(fixed)}; {', '.join(FIXED)} stay fixed so runs "
                             f"compare — create a new workbook to change them")
        best = self.best_config()
        cand = config_mod.with_changes(best, changes)
        moved = config_mod.diff(best, cand)
        same = [k for k in keys if k not in moved]
        if same:
            current = config_mod.flatten(best)
            raise RoundError(f"round {name!r}: {', '.join(f'{k}={current[k]!r}' for k in same)} equals the current "
                             f"best; no change requested — pick a different value")
        return cand, {k: moved[k] for k in keys}

    def run_round(self, name: str, changes: dict[str, Any], progress: bool = True,
                  who: str | None = None, objective: str = "speed", seeds: int = 2,
                  target: float | None = None, why: str = "", reasoning: dict | None = None,
                  time_cap_s: float | None = None, profile_steps: int = 0,
                  lr_rule: str = DEFAULT_LR_RULE) -> RoundResult:
        """Train the current best + `changes` against the current best, judge, record, save a rollback point.

        objective="speed": the candidate against a rerun of the current best, measured the way the variable
        allows (`_measure_speed`: two processes stepping in turns, both arms in each rank of one msrun launch, or
        pairs of whole runs) until the interval decides or the plan's budget ends, judged by `rules.judge`.
        objective="convergence": `seeds` runs per arm, run k of both arms with seed best.seed + k − 1, judged on
        validation loss at equal tokens against the seed band (`rules.judge_convergence`; `target` = the val loss
        for time-to-target, default the level every reference seed reached). objective="time_to_target": `seeds`
        runs per arm as for convergence, each ending at its first validation pass with val loss ≤ `target`
        (default: the best's target_val_loss; when neither is set, both arms train to their last step and the
        target is the level every reference seed reached there), the candidate also at `time_cap_s` wall
        seconds; pairs stop at the first candidate seed that did not reach a given target (it cannot win); judged
        on wall seconds to the target against the seed band (`rules.judge_time_to_target`). The reruns are the
        round's reference_runs. `keep` makes the candidate the best; other decisions leave it. A run that does
        not finish ends the round as "failed" (records kept, remaining runs skipped).
        A round that moves the global batch (batch_size × grad_accum_steps) under the convergence or
        time-to-target objective moves lr and min_lr with it by `lr_rule` ("sqrt", "linear" or "none"; a round
        that sets lr itself overrides it; helpers/tune/lr_rule.py): the verdict says how. A speed round on a
        convergence variable (lr, warmup, ...) or on the global batch warns: tokens/s cannot judge it. `why` (one
        paragraph) and `reasoning` (e.g. the auto-tuner's diagnosis and cost estimate) say why the round was run;
        both go into its ledger entry. profile_steps (speed; two processes or msrun): each arm's record gets a
        profiler window of that many steps, taken in its warm-up before the blocks while the other arm waits
        (`stepped.launch_stepped`, `pair.run_pair`); on whole runs no run is profiled (`fusion.profile_arms` then
        trains profiled ones).
        """
        if objective not in OBJECTIVES:
            raise RoundError(f"objective={objective!r} is not allowed; choose one of {', '.join(OBJECTIVES)}")
        if objective != "speed" and (not isinstance(seeds, int) or seeds < 2):
            raise RoundError(f"seeds={seeds!r} cannot measure seed-to-seed spread; use seeds=2 or more")
        learning = [k for k in changes if k in CONVERGENCE_VARIABLES]
        if objective == "speed" and learning:
            warnings.warn(f"round {name!r} changes {', '.join(learning)}, which moves what the model learns, not "
                          f"tokens/s; judge it with objective='convergence'", stacklevel=2)
        try:
            check_rule(lr_rule)
        except ValueError as exc:
            raise RoundError(str(exc)) from None
        with self._lock.hold():
            entries = self.ledger()
            self._pinned(entries)
            done = self._recorded(name, changes, objective, entries)
            if done is not None:  # a notebook run again: the round is in the ledger already
                print(f"round {done.index} ({name}) is recorded already: {done.decision}; reused, nothing trained "
                      f"(measure it again under another name)")
                return done
            cand, moved = self.candidate(name, changes, objective)
            best_round = self._best_round(entries)
            best, _ = self._source(best_round, entries)
            scaling = None
            if objective != "speed":  # the learning rate follows a moved global batch (lr_rule.py)
                cand, scaling = scale_lr(best, cand, changes, lr_rule)
                moved = {**moved, **{k: v for k, v in config_mod.diff(best, cand).items() if k in SCALED}}
            elif moves_global_batch(best, cand):
                warnings.warn(f"round {name!r} changes the global batch ({best.global_batch} → {cand.global_batch} "
                              f"sequences per step): fewer updates per token, so at an unchanged learning rate its "
                              f"loss at equal tokens is worse whatever its speed; judge it with "
                              f"objective='time_to_target', where the learning rate follows the batch "
                              f"(lr_rule={lr_rule!r})", stacklevel=2)
            arms, after_pair = (cand, best), None
            if objective == TIME_TO_TARGET:  # refused here, before any folder or run exists
                target = target or best.target_val_loss or None
                if target is not None and not (isinstance(target, (int, float)) and target > 0):
                    raise RoundError(f"target={target!r} must be a validation loss in nats/token (e.g. 1.9), or "
                                     f"None for the level every reference seed reaches")
                if time_cap_s is not None and not (isinstance(time_cap_s, (int, float)) and time_cap_s > 0):
                    raise RoundError(f"time_cap_s={time_cap_s!r} must be positive seconds, or None for no cap")
                arms = ttq_arms(cand, best, target, time_cap_s)
                if target is not None:
                    after_pair = lambda runs: time_to_target(runs["candidate"][-1], target) is None  # noqa: E731
            baseline = self.load_runs(self._source(0, entries)[1])
            index = max(self._round_entries(entries), default=0) + 1
            folder = self._fresh(self.path / "rounds" / f"{index:02d}_{name}")
            seed_list = [best.seed + k for k in range(seeds)] if objective != "speed" else None
            speed = None
            if objective != "speed":
                records, references, error = self._measure(*arms, folder, f"round {index} {name}", progress,
                                                           seeds, seed_list, after_pair)
            else:
                records, references, error, speed = self._measure_speed(cand, best, moved, folder,
                                                                        f"round {index} {name}", progress,
                                                                        profile_steps)
            target_from = "given" if objective != TIME_TO_TARGET or target is not None else "reference seeds"
            if target_from == "reference seeds" and references and not error:
                target = reference_level(references)
            verdict = self._verdict(records, references, error, baseline, objective, target, speed)
            if target_from == "reference seeds":
                verdict = dataclasses.replace(verdict, reason=f"target = the level every reference seed reached at "
                                                              f"its last step; {verdict.reason}")
            if scaling is not None:
                verdict = dataclasses.replace(verdict, reason=f"{scaling.text()}; {verdict.reason}")
            if speed is not None:
                atomic_write_json(folder / SPEED_FILE, {**speed, "verdict": verdict.to_dict()})
            rollback = self._save_rollback(folder / "rollback", cand, records)
            self._append({"event": "round", "round": index, "name": name, "objective": objective,
                          **({"seeds": seed_list} if seed_list else {}),
                          **({"target": target, "target_from": target_from, "time_cap_s": time_cap_s}
                             if objective == TIME_TO_TARGET else {}),
                          **({"lr_scaling": scaling.to_dict()} if scaling is not None else {}),
                          "changes": {k: list(v) for k, v in moved.items()}, "reference_round": best_round,
                          "reference_runs": [self._rel(r.path) for r in references],
                          "candidate_runs": [self._rel(r.path) for r in records],
                          "verdict": verdict.to_dict(), "decision": verdict.decision, "rollback": self._rel(rollback),
                          "who": who or _user(), "when": _now(), **_reasons(why, reasoning)},
                         index if verdict.decision == "keep" else best_round, entries)
            return self.rounds()[-1]

    def _recorded(self, name: str, changes: dict[str, Any], objective: str, entries: list[dict]) -> RoundResult | None:
        """The latest recorded round of this name, objective and requested values, if any."""
        for e in reversed(entries):
            if (e["event"] == "round" and e["name"] == name and e.get("objective", "speed") == objective
                    and all(k in e["changes"] and e["changes"][k][1] == v for k, v in changes.items())):
                return next(r for r in self.rounds() if r.index == e["round"])
        return None

    def note(self, name: str, why: str, changes: dict[str, tuple] | None = None, decision: str = "note",
             who: str | None = None, reasoning: dict | None = None) -> None:
        """Record a step that trains nothing (a candidate the config refuses, a stop reason); the best stays.

        changes: {key: (current, requested)}; decision: a short word such as 'skipped' or 'stop'.
        """
        with self._lock.hold():
            entries = self.ledger()
            self._append({"event": "note", "round": None, "name": name,
                          "changes": {k: list(v) for k, v in (changes or {}).items()}, "verdict": None,
                          "decision": decision, "who": who or _user(), "when": _now(), **_reasons(why, reasoning)},
                         self._best_round(entries), entries)

    def run_suggestion(self, suggestion, progress: bool = True, who: str | None = None) -> RoundResult:
        """Run a `suggest.Suggestion` (name, changes, objective) as a round against the current best."""
        return self.run_round(suggestion.name, suggestion.changes, progress=progress, who=who,
                              objective=suggestion.objective)

    def _save_rollback(self, folder: Path, cfg: Config, records: list[RunRecord]) -> Path:
        """config.yaml, the last candidate run's summary.json and its last checkpoint (if it saved one)."""
        folder.mkdir()
        atomic_write_text(folder / "config.yaml", config_mod.dump(cfg))
        if records:
            last = records[-1]
            write_summary(folder, last.summary)
            ckpts = last.checkpoints()
            if ckpts:
                shutil.copy2(ckpts[-1], folder / ckpts[-1].name)
        return folder

    def aa_check(self, progress: bool = True, who: str | None = None, path: str | None = None) -> Verdict:
        """Run the current best as both candidate and reference (interleaved) and judge it by the same rule.

        An honest rule says "no change" here; anything else means the band is too tight for this machine's
        noise right now. path: how to measure (default: the best's own, `speed_path`; "processes": two processes
        stepping in turns; "runs": whole runs; "paired": both in each msrun rank of a data-parallel best), so
        each way a round can measure can be checked. Recorded in the ledger
        (event aa_check, with its path); the best does not move.
        """
        with self._lock.hold():
            entries = self.ledger()
            self._pinned(entries)
            best_round = self._best_round(entries)
            cfg, _ = self._source(best_round, entries)
            baseline = self.load_runs(self._source(0, entries)[1])
            number = sum(e["event"] == "aa_check" for e in entries) + 1
            folder = self._fresh(self.path / "aa" / f"{number:02d}")
            records, references, error, speed = self._measure_speed(cfg, cfg, {}, folder, f"A/A {number}",
                                                                    progress, path=path)
            verdict = self._verdict(records, references, error, baseline, speed=speed)
            atomic_write_json(folder / SPEED_FILE, {**speed, "verdict": verdict.to_dict()})
            self._append({"event": "aa_check", "round": best_round, "name": f"aa_{number:02d}", "changes": {},
                          "reference_runs": [self._rel(r.path) for r in references],
                          "candidate_runs": [self._rel(r.path) for r in records], "verdict": verdict.to_dict(),
                          "decision": verdict.decision, "who": who or _user(), "when": _now()},
                         best_round, entries)
            return verdict

    def decide(self, index: int, decision: str, who: str, why: str) -> RoundResult:
        """Record a person's override of round `index`'s verdict and move the best accordingly.

        keep → that round's config becomes the best; reject / no change → if that round is the current
        best, the best returns to the config it was compared against; otherwise the best stays (use
        `rollback` to go back further explicitly).
        """
        if decision not in OVERRIDE_DECISIONS:
            raise RoundError(f"decision {decision!r} is not allowed; choose one of {', '.join(OVERRIDE_DECISIONS)}")
        if not (isinstance(who, str) and who.strip() and isinstance(why, str) and why.strip()):
            raise RoundError("an override needs who (your name) and why (one sentence); both were not given")
        with self._lock.hold():
            entries = self.ledger()
            entry = self._round(index, entries)
            if decision == "keep" and entry["verdict"]["decision"] == "failed":
                raise RoundError(f"round {index} ({entry['name']}) failed, its config did not finish training; "
                                 f"it cannot be kept — run a new round instead")
            best_round = self._best_round(entries)
            if decision == "keep":
                best_round = index
            elif best_round == index:
                best_round = entry["reference_round"]
            self._append({"event": "decide", "round": index, "name": entry["name"], "changes": entry["changes"],
                          "verdict": entry["verdict"], "decision": decision, "who": who.strip(),
                          "why": " ".join(why.split()), "when": _now()}, best_round, entries)
            return next(r for r in self.rounds() if r.index == index)

    def rollback(self, index: int, who: str | None = None) -> Config:
        """Make round `index`'s config (its rollback point; 0 = the baseline) the current best again."""
        with self._lock.hold():
            entries = self.ledger()
            self._pinned(entries)
            if index != 0:
                entry = self._round(index, entries)
                if entry["verdict"]["decision"] == "failed":
                    raise RoundError(f"round {index} ({entry['name']}) failed, so its rollback point never trained "
                                     f"to the end; roll back to another round or 0 (the baseline)")
            before = self.best_config()
            cfg, _ = self._source(index, entries)
            self._append({"event": "rollback", "round": index, "name": "rollback",
                          "changes": {k: list(v) for k, v in config_mod.diff(before, cfg).items()},
                          "verdict": None, "decision": "rollback", "who": who or _user(), "when": _now()},
                         index, entries)
            return cfg

    def _round(self, index: int, entries: list[dict]) -> dict:
        recorded = self._round_entries(entries)
        if index not in recorded:
            raise RoundError(f"there is no round {index!r}; rounds so far: {sorted(recorded) or 'none'}")
        return recorded[index]

    # ----- the final table --------------------------------------------------------------------------------
    def before_after(self) -> list[dict]:
        """Baseline vs current best, medians over each side's runs: rows of metric, unit, baseline, best, ratio.

        ratio = best ÷ baseline (None where a side has no value); comm share appears only if a run reports it.
        """
        entries = self.ledger()
        self._pinned(entries)
        sides = []
        for index in (0, self._best_round(entries)):
            cfg, runs = self._source(index, entries)
            sides.append((cfg, self.load_runs(runs)))
        (base_cfg, base_runs), (best_cfg, best_runs) = sides
        steps = base_cfg.steps

        def pair(fn) -> tuple:
            return fn(base_cfg, base_runs), fn(best_cfg, best_runs)

        rows = [
            ("model params", "parameters", pair(lambda c, r: median_summary(r, "n_params"))),
            ("data parallel", "processes", pair(lambda c, r: c.parallel.data_parallel)),
            ("global batch", "sequences", pair(lambda c, r: c.global_batch)),
            ("micro-batch per device", "sequences", pair(lambda c, r: c.micro_batch_per_device)),
            ("gradient accumulation", "micro-batches", pair(lambda c, r: c.grad_accum_steps)),
            ("step time", "ms", pair(lambda c, r: median_summary(r, "step_time_ms"))),
            ("throughput", "tokens/s", pair(lambda c, r: median_summary(r, "tokens_per_s"))),
            ("MFU of the matmul peak", "fraction", pair(lambda c, r: median_summary(r, "mfu"))),
            ("MFU of the hardware peak", "fraction", pair(lambda c, r: median_summary(r, "mfu_hardware"))),
            (memory_label(base_runs[0].summary if base_runs else None), "bytes",
             pair(lambda c, r: median_summary(r, "peak_memory_bytes"))),
            ("comm share of step time", "fraction", pair(lambda c, r: median_summary(r, "comm_step_share"))),
            (f"loss after {steps} steps", "nats/token", pair(lambda c, r: median_summary(r, "loss_last"))),
            ("val loss", "nats/token", pair(lambda c, r: median_summary(r, "val_loss"))),
        ]
        return [{"metric": metric, "unit": unit, "baseline": a, "best": b,
                 "ratio": (b / a if a not in (None, 0) and b is not None else None)}
                for metric, unit, (a, b) in rows if not (metric.startswith("comm share") and a is None and b is None)]

    def __repr__(self) -> str:
        return f"Workbook({str(self.path)!r}, repeats={self.repeats})"

