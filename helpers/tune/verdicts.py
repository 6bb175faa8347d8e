"""How a measured round is judged: which rule (speed, convergence, time to target; helpers/tune/rules.py) applies to
its records, and which failures end it as "failed" (a run without a record, a seed that did not finish, curves that
cannot be compared, a speed measurement that ended before its first look)."""
from __future__ import annotations

import dataclasses
from pathlib import Path

from helpers.paired import Measurement, SpeedPlan, conclude
from helpers.config import Config
from helpers.record import RunRecord, atomic_write_json
from helpers.tune.convergence import TIME_TO_TARGET, reference_level
from helpers.tune.measure import SPEED_FILE, measure_speed
from helpers.tune.round_spec import RoundSpec
from helpers.tune.rules import (Verdict, failed, judge, judge_convergence, judge_time_to_target, loss_gate_for,
                                unfinished)


def verdict(candidates: list[RunRecord], references: list[RunRecord], error: str, baseline: list[RunRecord],
            loss_gate: float, memory_limit_bytes: int, objective: str = "speed", target: float | None = None,
            speed: dict | None = None) -> Verdict:
    """The round's verdict. error: why the measurement ended without its records ("" when it did not); baseline:
    the pinned baseline's records (their spread widens the loss gate); loss_gate: allowed relative loss drift;
    memory_limit_bytes: the peak memory limit; target: a time-to-target round's val loss (nats/token); speed: a
    speed round's speed.json dict, to which its looks, decision, budget and parts are added."""
    gate = loss_gate_for(baseline, loss_gate)
    if error:
        return failed(error, gate, memory_limit_bytes)
    why = unfinished(references, candidates)
    if why:  # a run (a seed) that ended nan/failed: the same reporting for every objective
        return failed(why, gate, memory_limit_bytes)
    if objective != "speed":
        try:
            if objective == TIME_TO_TARGET:
                return judge_time_to_target(references, candidates, memory_limit_bytes, target)
            return judge_convergence(references, candidates, memory_limit_bytes, target)
        except ValueError as exc:  # e.g. eval points that share no token count: recorded, not lost
            return failed(f"validation curves cannot be compared: {exc}", gate, memory_limit_bytes)
    plan = SpeedPlan.from_dict(speed["plan"])
    try:
        outcome = conclude(Measurement.from_raw({"pairs": [], **speed}), plan)
    except ValueError as exc:  # the measurement ended before its first look: a failed round, recorded
        return failed(f"speed measurement incomplete ({speed.get('reason') or exc})", gate, memory_limit_bytes)
    speed["looks"] = [look.to_dict() for look in outcome.looks]
    speed["decision"], speed["budget_spent"] = outcome.decision, outcome.budget_spent
    speed["parts"] = outcome.parts.to_dict()
    return judge(references, candidates, baseline, outcome, plan, speed["path"], loss_gate, memory_limit_bytes)


def judged_speed(cand_cfg: Config, ref_cfg: Config, changes: dict, folder: Path, label: str, progress: bool,
                 baseline: list[RunRecord], loss_gate: float, memory_limit_bytes: int,
                 path: str | None = None) -> tuple[list[RunRecord], list[RunRecord], Verdict]:
    """Two configs measured for speed (`measure.measure_speed`) and judged by `verdict`, the verdict written into
    the folder's speed.json: an A/A check's and a cumulative measurement's one step. (candidates, references,
    verdict)."""
    records, references, error, speed = measure_speed(cand_cfg, ref_cfg, changes, folder, label, progress, path=path)
    v = verdict(records, references, error, baseline, loss_gate, memory_limit_bytes, speed=speed)
    atomic_write_json(folder / SPEED_FILE, {**speed, "verdict": v.to_dict()})
    return records, references, v


def judge_round(spec: RoundSpec, candidates: list[RunRecord], references: list[RunRecord], error: str,
                baseline: list[RunRecord], loss_gate: float, memory_limit_bytes: int,
                speed: dict | None) -> tuple[Verdict, float | None, str]:
    """A round's verdict, its reason led by how the target and the learning rate were set; and the target it was
    judged at with where that came from ("given", or "reference seeds": a time-to-target round without a target
    takes the level every reference seed reached at its last step)."""
    target, target_from = spec.target, "given"
    if spec.objective == TIME_TO_TARGET and target is None:
        target_from = "reference seeds"
        if references and not error:
            target = reference_level(references)
    v = verdict(candidates, references, error, baseline, loss_gate, memory_limit_bytes, spec.objective, target,
                speed)
    if target_from == "reference seeds":
        v = dataclasses.replace(v, reason=f"target = the level every reference seed reached at its last step; "
                                          f"{v.reason}")
    if spec.scaling is not None:
        v = dataclasses.replace(v, reason=f"{spec.scaling.text()}; {v.reason}")
    return v, target, target_from
