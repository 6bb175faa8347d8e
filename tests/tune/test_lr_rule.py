"""Rounds that move the global batch move the learning rate by a stated rule (helpers/tune/lr_rule.py) and are
judged by time to target; a speed round on them warns."""
from __future__ import annotations

import math
from pathlib import Path

import pytest

from helpers.config import from_dict, with_changes
from helpers.record import load_run
from helpers.tune.autotune import candidates
from helpers.tune.diagnose import Diagnosis
from helpers.tune.lr_rule import moves_global_batch, scale_lr
from helpers.tune.rounds import RoundError, Workbook


def test_rules_scale_lr_and_min_lr_with_the_global_batch():
    best = from_dict({"batch_size": 12, "lr": 1e-3, "min_lr": 1e-4})
    cand = with_changes(best, {"batch_size": 24})
    scaled, how = scale_lr(best, cand, {"batch_size": 24}, "sqrt")
    assert scaled.lr == pytest.approx(1e-3 * math.sqrt(2)) and scaled.min_lr == pytest.approx(1e-4 * math.sqrt(2))
    assert how.factor == pytest.approx(math.sqrt(2)) and how.global_batch == (12, 24) and not how.overridden
    assert how.text() == ("lr 0.001 → 0.001414, min_lr 0.0001 → 0.0001414 by the sqrt rule (×1.414 for global "
                          "batch 12 → 24)")
    assert scale_lr(best, cand, {"batch_size": 24}, "linear")[0].lr == pytest.approx(2e-3)
    assert scale_lr(best, cand, {"batch_size": 24}, "none")[0].lr == pytest.approx(1e-3)
    # accumulation moves the global batch too; a micro-batch traded for accumulation does not
    assert moves_global_batch(best, with_changes(best, {"grad_accum_steps": 2}))
    same = with_changes(best, {"batch_size": 6, "grad_accum_steps": 2})
    assert scale_lr(best, same, {"batch_size": 6, "grad_accum_steps": 2}, "sqrt") == (same, None)
    # a round that sets lr itself overrides the rule, and says so
    own = with_changes(best, {"batch_size": 24, "lr": 5e-3})
    kept, how = scale_lr(best, own, {"batch_size": 24, "lr": 5e-3}, "sqrt")
    assert kept.lr == 5e-3 and how.overridden and "as the round set it" in how.text()
    with pytest.raises(ValueError, match="lr_rule='cubic' is not a rule; choose one of sqrt, linear, none"):
        scale_lr(best, cand, {"batch_size": 24}, "cubic")


def test_the_tuner_judges_a_larger_global_batch_by_time_to_target():
    diag = Diagnosis(bottleneck="balanced", reasons=["test"], evidence={}, thresholds={}, next_rounds=[],
                     findings=["balanced"])
    batch = [c for c in candidates(from_dict({"batch_size": 4}), diag, cores=2)[0] if c.family == "batch"]
    assert batch[0].changes == {"batch_size": 8} and batch[0].objective == "time_to_target"
    kept = [c for c in candidates(from_dict({"batch_size": 4, "grad_accum_steps": 2}), diag, cores=2,
                                  keep_global_batch=True)[0] if c.family == "batch"]
    assert kept[0].objective == "speed"  # the same global batch: a speed question


@pytest.mark.slow
def test_a_batch_round_by_time_to_target_scales_lr_and_says_which_rule(tmp_path, small_corpus):
    cfg = from_dict({"model": {"preset": "debug"}, "data": {"corpus": [str(small_corpus)]}, "batch_size": 4,
                     "steps": 40, "warmup": 4, "eval_every": 8, "eval_batches": 2, "steady_after": 3, "threads": 1})
    wb = Workbook.create(tmp_path / "wb", cfg)
    wb.baseline(progress=False)
    class Stop(Exception):
        pass

    def stop(*args, **kwargs):
        raise Stop()
    with pytest.MonkeyPatch.context() as mp:  # the warning only: stop before the speed round measures
        mp.setattr("helpers.tune.rounds.measure_speed", stop)
        with pytest.warns(UserWarning, match=r"changes the global batch \(4 → 8 sequences per step\).*"
                                             r"objective='time_to_target'"), pytest.raises(Stop):
            wb.run_round("speed", {"batch_size": 8}, progress=False)
    with pytest.raises(RoundError, match="lr_rule='x' is not a rule"):
        wb.run_round("batch", {"batch_size": 8}, objective="time_to_target", lr_rule="x", progress=False)
    r = wb.run_round("batch", {"batch_size": 8}, objective="time_to_target", progress=False)
    assert r.changes["batch_size"] == (4, 8)
    assert r.changes["lr"] == pytest.approx((1e-3, 1e-3 * math.sqrt(2)))
    assert r.verdict.reason.startswith("lr 0.001 → 0.001414, min_lr 0.0001 → 0.0001414 by the sqrt rule (×1.414 "
                                       "for global batch 4 → 8); target = the level every reference seed reached")
    entry = [e for e in wb.ledger() if e["event"] == "round"][-1]
    assert entry["lr_scaling"]["rule"] == "sqrt" and entry["target_from"] == "reference seeds"
    refs = [load_run(p) for p in r.reference_runs]
    # no target was given: every arm trained to its last step, the target is the worst reference seed's end
    assert all(run.config.target_val_loss == 0 and len(run.metrics) == 40 for run in refs)
    assert entry["target"] == pytest.approx(max(run.metrics[-1]["val_loss"] for run in refs))
    cand = load_run(r.candidate_runs[0])
    assert cand.config.lr == pytest.approx(1e-3 * math.sqrt(2)) and cand.config.batch_size == 8
    assert Path(r.rollback / "config.yaml").is_file()
