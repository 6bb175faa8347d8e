"""Operator-fusion rounds: which operators a model change removed, shrank or added, from profiled runs.

A fusion round is judged like any speed round (unprofiled, paired blocks in one process: the profiler is
process-wide and costs step time). Then each arm trains once more in its own process with a profiler window
(`profile_arms`), so its `profile/op_table.csv` holds ms per step by operator type; the shift between reference
and candidate shows *why* tokens/s moved (e.g. `model.qkv=fused_slice → fused`: StridedSlice/StridedSliceGrad
vanish, Split/Concat appear).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable, Union

import numpy as np
import pandas as pd

from helpers import config as config_mod
from helpers.config import Config
from helpers.run.profile import PROFILE_DIR, PROFILE_JSON, load_profile, with_profiler
from helpers.record import RunRecord, load_run
from helpers.run.outdir import finished_same
from helpers.spawn.runner import launch
from helpers.tune.ledger import RoundError
from helpers.tune.study import base_config

Runs = Union[str, os.PathLike, RunRecord, Iterable[Union[str, os.PathLike, RunRecord]]]
SHIFT_COLUMNS = ["op", "ms/step before", "ms/step after", "delta ms/step", "calls/step before",
                 "calls/step after", "flag"]


# The formulation of commit 7c15080: MindSpore's own LayerNorm/GELU/softmax/BiasAdd kernels and their gradients,
# a per-tensor gradient norm. The new defaults differ in each of these keys (same math, fewer or faster ops).
PLAIN_FORMULATION = {"model.kernels": "mindspore", "model.norm_backward": "mindspore", "model.gelu": "mindspore",
                     "grad_norm": "per_tensor"}


def fusion_base(preset: str, steps: int, corpus: str, qkv: str = "fused_slice",
                formulation: dict | None = None) -> Config:
    """The notebooks' base config (`study.base_config`) with `model.qkv` and the `formulation` keys (default
    PLAIN_FORMULATION, so formulation and kernel rounds have something to beat); unprofiled (see
    `profile_arms`)."""
    changes = {"model.qkv": qkv, **(PLAIN_FORMULATION if formulation is None else formulation)}
    return base_config(preset, steps, corpus, changes)


# What notebook 12 runs instead of a native-kernel round where the library could not be built (no compiler, a
# failed compile): the q,k,v change, which every machine can run.
WITHOUT_NATIVE = {"qkv_fused": {"model.qkv": "fused"}}


def runnable_rounds(rounds: dict[str, dict]) -> tuple[dict[str, dict], str]:
    """`rounds` (name → changes) this machine can run, and a line saying what was set aside and why ('' when
    nothing was): rounds that need `model.kernels=native` without a current native library give way to
    `WITHOUT_NATIVE` (or to nothing, when those are there already)."""
    from helpers.run.kernels import library_problem
    problem = library_problem()
    native = [name for name, changes in rounds.items() if changes.get("model.kernels") == "native"]
    if not problem or not native:
        return rounds, ""
    kept = {name: changes for name, changes in rounds.items() if name not in native}
    added = {name: changes for name, changes in WITHOUT_NATIVE.items() if name not in kept}
    instead = f"; running {', '.join(added)} instead" if added else ""
    return {**kept, **added}, f"round {', '.join(native)} set aside: {problem}{instead}"


def _profiled_dir(result) -> Path:
    return Path(result.rollback).parent / "profiled"


def _reusable(run_dir: Path, cfg: Config) -> RunRecord | None:
    """The finished, profiled record of `cfg` (a profiled config) already in run_dir, else None."""
    record = finished_same(run_dir, config_mod.absolute_paths(cfg))
    return record if record is not None and (run_dir / PROFILE_DIR / PROFILE_JSON).is_file() else None


def _own_profile(runs) -> RunRecord | None:
    """An arm's first record when it finished with a profile of its own (a round run with profile_steps)."""
    if not runs:
        return None
    record = load_run(runs[0])
    return record if record.status == "ok" and (record.path / PROFILE_DIR / PROFILE_JSON).is_file() else None


def profile_arms(result, window: int = 8, progress: bool = True) -> tuple[RunRecord, RunRecord]:
    """(reference, candidate): each arm's profiled record. A paired round run with `profile_steps` profiled both
    arms in its own process (`Workbook.run_round`): those records are returned as they are. Otherwise one more
    run of each arm, each in its own process with a profiler window of up to `window` steady steps
    (`profile.with_profiler`), under `<round>/profiled/`; a finished profiled run of the same config already
    there is reused, so rerunning the notebook trains nothing twice."""
    arms = []
    for role, runs in (("reference", result.reference_runs), ("candidate", result.candidate_runs)):
        if not runs:
            raise RoundError(f"round {result.name!r} has no {role} run (decision {result.decision}); "
                             f"there is no arm to profile")
        own = _own_profile(runs)
        if own is not None:
            arms.append(own)
            continue
        profiled = with_profiler(load_run(runs[0]).config, window)
        run_dir = _profiled_dir(result) / role
        arms.append(_reusable(run_dir, profiled)  # else an earlier, different record there is moved aside
                    or launch(profiled, run_dir, progress, f"profiled {role}", replace=True))
    return arms[0], arms[1]


def best_profile(results: list, arms: list[tuple[RunRecord, RunRecord]]) -> RunRecord:
    """The profiled run of the best after `results` (rounds in order, `arms` their `profile_arms`): the last
    round's candidate if it was kept, else its reference (the best it was measured against)."""
    if not results:
        raise RoundError("no fusion round was run, so there is no profiled best; add a round to fusion_rounds")
    return arms[-1][1] if results[-1].decision == "keep" else arms[-1][0]


def _paths(runs: Runs) -> list:
    if isinstance(runs, (str, os.PathLike, RunRecord)):
        runs = [runs]
    return [r.path if isinstance(r, RunRecord) else r for r in runs]


def op_ms_per_step(runs: Runs) -> pd.DataFrame:
    """ms/step and calls/step by operator type, median over the runs' profiles (an op missing in a run
    counts 0 there). RecordError (one line) if a run has no profile."""
    tables = []
    for path in _paths(runs):
        frame = load_profile(path).frame().set_index("name")[["ms_per_step", "calls_per_step"]]
        tables.append(frame)
    names = sorted(set().union(*(t.index for t in tables)))
    stacked = np.stack([t.reindex(names).fillna(0.0).to_numpy() for t in tables])
    return pd.DataFrame(np.median(stacked, axis=0), index=names, columns=["ms_per_step", "calls_per_step"])


def op_table_shift(ref_runs: Runs, cand_runs: Runs, min_ms: float = 0.0) -> pd.DataFrame:
    """Operator by operator, ms/step before (reference) and after (candidate), the delta and a flag:
    'vanished' (absent after), 'new' (absent before), 'shrank' / 'grew' (by more than 10%), else ''.

    Runs: a run folder, a RunRecord or a list of them (medians over the list). Rows: vanished and new ops
    first (what the change removed or added: structural, immune to load), then by |delta| (timings move
    with machine load too); ops under `min_ms` ms/step on both sides left out.
    """
    before, after = op_ms_per_step(ref_runs), op_ms_per_step(cand_runs)
    names = sorted(set(before.index) | set(after.index))
    before, after = before.reindex(names).fillna(0.0), after.reindex(names).fillna(0.0)
    rows = []
    for name in names:
        b, a = before.at[name, "ms_per_step"], after.at[name, "ms_per_step"]
        if max(a, b) < min_ms:
            continue
        if before.at[name, "calls_per_step"] and not after.at[name, "calls_per_step"]:
            flag = "vanished"
        elif after.at[name, "calls_per_step"] and not before.at[name, "calls_per_step"]:
            flag = "new"
        elif a < 0.9 * b:
            flag = "shrank"
        elif a > 1.1 * b:
            flag = "grew"
        else:
            flag = ""
        rows.append([name, round(b, 3), round(a, 3), round(a - b, 3), before.at[name, "calls_per_step"],
                     after.at[name, "calls_per_step"], flag])
    frame = pd.DataFrame(rows, columns=SHIFT_COLUMNS)
    order = sorted(frame.index, key=lambda i: (frame.at[i, "flag"] not in ("vanished", "new"),
                                               -abs(frame.at[i, "delta ms/step"])))
    return frame.loc[order].reset_index(drop=True)


def round_op_shift(result, min_ms: float = 0.0) -> pd.DataFrame:
    """`op_table_shift` of a round: its profiled reference (before) against its profiled candidate (after), as
    `profile_arms(result)` returns them (the round's own records, or its runs under `profiled/`); RoundError (one
    line) when it has neither."""
    own = [_own_profile(runs) for runs in (result.reference_runs, result.candidate_runs)]
    if None not in own:
        return op_table_shift(own[0].path, own[1].path, min_ms)
    folder = _profiled_dir(result)
    if not all((folder / role).is_dir() for role in ("reference", "candidate")):
        raise RoundError(f"round {result.name!r} has no profiled arms in {str(folder)!r}; run "
                         f"profile_arms(result) first (one profiled run of each arm)")
    return op_table_shift(folder / "reference", folder / "candidate", min_ms)


def shift_summary(shift: pd.DataFrame) -> str:
    """One line: op time per step before → after, and which ops vanished or are new."""
    total_b, total_a = shift["ms/step before"].sum(), shift["ms/step after"].sum()
    gone = ", ".join(shift.loc[shift["flag"] == "vanished", "op"]) or "none"
    new = ", ".join(shift.loc[shift["flag"] == "new", "op"]) or "none"
    return (f"op time {total_b:.1f} → {total_a:.1f} ms/step ({total_a - total_b:+.1f}); vanished: {gone}; "
            f"new: {new}")


def fusion_config(preset: str = "", steps: int = 0, corpus: str = "", config: str | os.PathLike = "") -> Config:
    """Notebook 12's base: `fusion_base` on `base_config(..., config)` (24 steps without a config): the
    fused-slice q,k,v and the plain formulation (PLAIN_FORMULATION) on top, so its rounds have something
    to beat."""
    return base_config(preset, steps, corpus, {"model.qkv": "fused_slice", **PLAIN_FORMULATION}, config,
                       defaults={"steps": 24})
