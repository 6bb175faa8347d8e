"""How the baseline and a round are measured: the baseline's repeats, seed pairs of whole runs (convergence, time
to target), and speed the way the variable allows (`speed_path`): two arm processes taking turns step by step,
both arms in each rank of one msrun launch, or ABBA pairs of whole runs. A round's measurement returns (candidate
records, reference records, error text, …); a speed measurement also writes the round folder's speed.json."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from helpers import config as config_mod
from helpers.config import Config
from helpers.paired import DP_PAIRED_PLAN, PROCESS_PLAN, RUNS_PLAN, Measurement, SpeedPlan, should_stop, stop_rule
from helpers.record import RunRecord, atomic_write_json
from helpers.spawn.paired import launch_pair
from helpers.spawn.runner import launch
from helpers.spawn.stepped import launch_stepped
from helpers.tune.ledger import RoundError
from helpers.tune.speed_path import PAIRED, PROCESSES, RUNS, speed_path

SPEED_FILE = "speed.json"  # a speed round's measurement: path, plan, per-pair step times, looks, outcome
PLANS = {PAIRED: DP_PAIRED_PLAN, PROCESSES: PROCESS_PLAN, RUNS: RUNS_PLAN}
# what a speed.json keeps of the pairs record (paired.json) of two arm processes or of an msrun launch
RAW_KEYS = ("pairs", "waits", "foreign_cores", "setup_s", "measure_s", "status", "reason")

AfterPair = Callable[[dict[str, list[RunRecord]]], bool]  # runs so far by role → stop after this pair?


def launch_run(cfg: Config, run_dir: Path, desc: str, progress: bool) -> tuple[RunRecord | None, str]:
    """One run in its own process; (record, "") or (None, why) when the process left no record."""
    try:
        return launch(cfg, run_dir, progress=progress, desc=desc), ""
    except RuntimeError as exc:
        return None, f"{run_dir.name} left no record ({str(exc).splitlines()[0]})"


def train_baseline(cfg: Config, folder: Path, repeats: int, progress: bool) -> list[RunRecord]:
    """The baseline's `repeats` runs (run_1, run_2, … in `folder`), each in its own process; RoundError (one line)
    at the first that leaves no record or does not end 'ok'."""
    records, cfg = [], config_mod.speed_measured(cfg)
    for k in range(1, repeats + 1):
        record, error = launch_run(cfg, folder / f"run_{k}", f"baseline {k}/{repeats}", progress)
        if record is not None and record.status != "ok":
            error = (f"{record.path.name} ended '{record.status}': "
                     f"{(record.summary.get('status_reason') or '').splitlines()[0]}")
        if error:
            raise RoundError(f"baseline not pinned: {error}; fix the config and create the workbook again")
        records.append(record)
    return records


def measure_runs(cand_cfg: Config, ref_cfg: Config, folder: Path, label: str, progress: bool, count: int,
                 seeds: list[int] | None = None, after_pair: AfterPair | None = None):
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
            record, error = launch_run(cfg, folder / f"{role}_{k}", f"{label} {role} {k}/{count}", progress)
            if error:
                return runs["candidate"], runs["reference"], f"{role} {error}"
            runs[role].append(record)
            if record.status != "ok":
                return runs["candidate"], runs["reference"], ""
        if after_pair is not None and after_pair(runs):
            break
    return runs["candidate"], runs["reference"], ""


def measure_speed(cand_cfg: Config, ref_cfg: Config, changes: dict, folder: Path, label: str, progress: bool,
                  profile_steps: int = 0,
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
    cand_cfg, ref_cfg = (config_mod.speed_measured(c, changes) for c in (cand_cfg, ref_cfg))
    if path == PAIRED and ref_cfg.parallel.data_parallel == 1:
        raise RoundError("path='paired' measures a data-parallel best inside its msrun ranks; this best is one "
                         "process: use path='processes' (the default) or 'runs'")
    plan = PLANS[path]
    t0 = time.perf_counter()
    speed = {"path": path, "why": why, "plan": plan.to_dict(),
             "tokens_per_step": {"reference": ref_cfg.tokens_per_step, "candidate": cand_cfg.tokens_per_step}}
    if path == RUNS:
        cands, refs, error, m = run_pairs(cand_cfg, ref_cfg, folder, label, progress, plan)
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
            speed.update({k: raw.get(k) for k in RAW_KEYS})
    speed["wall_s"] = time.perf_counter() - t0
    atomic_write_json(folder / SPEED_FILE, speed)
    return cands, refs, error, speed


def run_pairs(cand_cfg: Config, ref_cfg: Config, folder: Path, label: str, progress: bool, plan: SpeedPlan):
    """Pairs of whole runs in separate processes (`measure_runs`): each pair's blocks are the two runs' steady
    windows (every steady step, stalls included; profiled steps left out), until `should_stop`. Returns
    (candidates, references, error, the Measurement)."""
    m = Measurement([], (ref_cfg.tokens_per_step, cand_cfg.tokens_per_step), [], None)

    def after_pair(runs: dict[str, list[RunRecord]]) -> bool:
        ref, cand = (runs[r][-1].speed_rows() for r in ("reference", "candidate"))
        m.pairs.append(([r["step_time_ms"] for r in ref], [r["step_time_ms"] for r in cand]))
        m.waits.append(tuple([r.get("data_wait_ms") for r in rows] for rows in (ref, cand)))
        return should_stop(m, plan)
    return (*measure_runs(cand_cfg, ref_cfg, folder, label, progress, plan.max_pairs, after_pair=after_pair), m)
