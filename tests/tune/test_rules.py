"""The speed rule's verdict on hand-made records and a hand-made paired outcome (arithmetic only: real runs are in
test_rounds): what decides, in which order, and what the reason prints."""
from pathlib import Path

import pytest

from helpers.config import from_dict
from helpers.record import RunRecord
from helpers.paired import Measurement, SpeedPlan, conclude
from helpers.tune.rules import judge, unfinished

PLAN = SpeedPlan()


def _run(name: str, losses: list[float], peak: int = 100 * 2**20, status: str = "ok", reason: str = "",
         resident: int | None = None) -> RunRecord:
    rows = [{"step": i + 1, "tokens": 10, "loss": v} for i, v in enumerate(losses)]
    summary = {"status": status, "status_reason": reason, "peak_memory_bytes": peak, "memory_source": "process RSS",
               "resident_memory_bytes": resident}
    return RunRecord(path=Path(name), config=from_dict({}), metrics=rows, summary=summary, env={})


BASE = [_run("b1", [2.0, 1.0]), _run("b2", [2.0, 1.0])]
# +5% at the first look: 8-step blocks, the reference at 100 ms a step, the candidate at 100/1.05 ± 0.2%
FASTER = conclude(Measurement([([100.0] * 8, [100 / 1.05 * (1 + 0.002 * (-1) ** i)] * 8) for i in range(16)],
                              (10, 10)), PLAN)


def test_a_clear_gain_is_kept_and_the_reason_prints_estimator_interval_pairs_and_path():
    v = judge([_run("r", [2.0, 1.0])], [_run("c", [2.0, 1.0])], BASE, FASTER, PLAN, "paired", 0.02, 2**30)
    assert v.decision == "keep" and v.pairs == 8 and v.path == "paired" and v.level == pytest.approx(0.997)  # the first look: α 0.003
    assert v.interval[0] > 1.01 and v.speedup == pytest.approx(1.05, abs=1e-6)
    assert "tokens/s ×1.050 (+5.0%), 99.7% interval ×1.04" in v.reason and "after 8 pairs (paired;" in v.reason
    assert "tokens ÷ wall time of every measured step" in v.reason and "why: compute ×1.050" in v.reason
    assert "stalls 0.0% → 0.0% of the mean step" in v.reason and v.parts["compute_ratio"] == pytest.approx(1.05, abs=0.003)
    assert v.reason.endswith("→ keep") and "looks after 8 pairs at 99.70%" in v.rule


def test_loss_and_memory_gates_override_the_speed_decision_and_each_verdict_names_its_gate():
    from helpers.book.report import decision_figures
    worse = [_run("c", [2.2, 1.1])]
    v = judge([_run("r", [2.0, 1.0])], worse, BASE, FASTER, PLAN, "paired", 0.02, 2**30)
    assert v.decision == "reject" and "(loss worse at equal tokens)" in v.reason and "beyond gate 2.0%" in v.reason
    assert v.gate == "loss gate" and decision_figures(v).startswith("by loss gate: tokens/s ×")
    v = judge([_run("r", [2.0, 1.0])], [_run("c", [2.0, 1.0], peak=2**31)], BASE, FASTER, PLAN, "paired", 0.02,
              2**30)
    assert v.decision == "reject" and "over the memory limit" in v.reason and v.gate == "memory limit"
    v = judge([_run("r", [2.0, 1.0])], [_run("c", [2.0, 1.0])], BASE, FASTER, PLAN, "paired", 0.02, 2**30)
    assert v.decision == "keep" and v.gate == "speed interval"


def test_paired_memory_ratio_uses_resident_memory_of_both_arms():
    ref = [_run("r", [2.0, 1.0], peak=900, resident=500)]
    cand = [_run("c", [2.0, 1.0], peak=1000, resident=550)]
    v = judge(ref, cand, BASE, FASTER, PLAN, "paired", 0.02, 2**30)
    assert v.memory_ratio == pytest.approx(1.1) and "1.10× (resident after warm-up)" in v.reason


def test_an_unfinished_run_fails_the_round_naming_the_arm_that_ended_first():
    nan = _run("candidate", [2.0], status="nan", reason="loss became non-finite at step 2")
    stopped = _run("reference", [2.0], status="stopped", reason="the candidate arm ended first")
    assert unfinished([stopped], [nan]).startswith("candidate run 1 (candidate) ended 'nan'")
    assert unfinished([nan], [stopped]).startswith("reference run 1 (candidate) ended 'nan'")
    v = judge([stopped], [nan], BASE, FASTER, PLAN, "paired", 0.02, 2**30)
    assert v.decision == "failed" and v.reason.endswith("→ failed") and v.interval is None


def test_a_verdict_carries_its_objective_and_units_and_old_ledger_entries_read_back():
    from helpers.tune.rules import CONVERGENCE_UNITS, SPEED_UNITS, Verdict
    old_speed = {"decision": "no change", "reason": "r", "speedup": 1.01, "noise_band": 0.05, "loss_drift": 0.0,
                 "memory_ratio": 1.0, "rule": "keep only if the median tokens/s gain exceeds the measured noise band"}
    v = Verdict.from_dict(old_speed)
    assert v.objective == "speed" and v.units == SPEED_UNITS and v.interval is None
    old_conv = {**old_speed, "rule": "keep only if ... by more than the seed band (95% Student-t ...)"}
    assert Verdict.from_dict(old_conv).units == CONVERGENCE_UNITS
    assert Verdict.from_dict(Verdict.from_dict(old_conv).to_dict()) == Verdict.from_dict(old_conv)
