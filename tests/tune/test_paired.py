"""The paired estimator's arithmetic pinned to hand-computed values: block statistic, pair ratio, trimmed-mean
interval, exact t quantile, looks and stopping; plus the per-variable measurement path table."""
from __future__ import annotations

import math

import numpy as np
import pytest

from helpers.config import all_keys, from_dict
from helpers.tune import paired
from helpers.tune.paired import (SpeedPlan, block_stat, conclude, decide, look_at, pair_log_ratio, should_stop,
                                 t_quantile, trimmed_interval)
from helpers.tune.rules import t975
from helpers.tune.speed_path import PAIRED, PROCESSES, path_of, speed_path, table


def test_exact_t_quantile_replaces_the_normal_shortcut():
    # tables: t_0.975(2) = 4.3027, t_0.995(9) = 3.2498, t_0.975(40) = 2.0211 (the old code said 1.96 above 30 dof)
    assert t_quantile(0.975, 2) == pytest.approx(4.302653, abs=1e-6)
    assert t_quantile(0.995, 9) == pytest.approx(3.249836, abs=1e-6)
    assert t975(40) == pytest.approx(2.021075, abs=1e-6) and t975(40) > 1.96
    assert t975(31) == pytest.approx(2.039513, abs=1e-6)
    with pytest.raises(ValueError, match="dof >= 1"):
        t_quantile(0.975, 0)


def test_block_statistic_and_pair_ratio_in_tokens_per_second():
    assert block_stat([5.0, 3.0, 4.0, 9.0], rank=2) == 4.0  # the second fastest
    assert block_stat([5.0, 3.0, 4.0, 9.0], rank=1) == 3.0
    with pytest.raises(ValueError, match="no 2-th fastest"):
        block_stat([5.0], rank=2)
    assert pair_log_ratio(100.0, 50.0, 10, 10) == pytest.approx(math.log(2))  # twice as fast per step
    # same ms per step but twice the tokens per step (a batch round): twice the tokens/s
    assert pair_log_ratio(100.0, 100.0, 10, 20) == pytest.approx(math.log(2))
    assert pair_log_ratio(100.0, 200.0, 10, 20) == pytest.approx(0.0)


def test_trimmed_interval_by_hand():
    # n = 5, trim 20% → g = 1, h = 3; kept 0.02, 0.03, 0.04 (mean 0.03); winsorized 0.02, 0.02, 0.03, 0.04, 0.04
    # has variance 0.0004/4 = 1e-4; SE² = (n−1)·s_w²/(h(h−1)) = 4e-4/6; t_0.995(2) = 9.924843
    iv = trimmed_interval([0.10, 0.01, 0.03, 0.02, 0.04], alpha=0.01, trim=0.2)
    assert (iv.pairs, iv.trimmed, iv.dof) == (5, 1, 2)
    assert iv.estimate == pytest.approx(0.03)
    assert iv.t == pytest.approx(9.924843, abs=1e-6)
    assert iv.low == pytest.approx(-0.051036, abs=1e-6) and iv.high == pytest.approx(0.111036, abs=1e-6)
    assert iv.half_width == pytest.approx(math.expm1(0.081036), abs=1e-6)
    # nothing trimmed (n = 3): the ordinary t interval, 2 ± 4.302653/√3
    iv = trimmed_interval([1.0, 2.0, 3.0], alpha=0.05, trim=0.2)
    assert iv.trimmed == 0 and iv.low == pytest.approx(-0.484138, abs=1e-6) and iv.high == pytest.approx(4.484138,
                                                                                                          abs=1e-6)
    # one wild pair moves a trimmed mean far less than a mean
    calm = [0.01, 0.012, 0.008, 0.011, 0.009, 0.010, 0.011, 0.009, 0.010, 0.010]
    assert abs(trimmed_interval(calm[:-1] + [0.5], 0.01).estimate - 0.01) < 0.002


def test_thresholds_keep_reject_no_change_and_undecided():
    f = math.log1p(0.01)

    def iv(low, high):
        return paired.Interval((low + high) / 2, low, high, 8, 1, 5, 5.0, 0.999)
    assert decide(iv(f + 0.001, 0.08), 0.01) == "keep"
    assert decide(iv(-0.08, -f - 0.001), 0.01) == "reject"
    assert decide(iv(-f + 0.001, f - 0.001), 0.01) == "no change"
    assert decide(iv(-0.02, 0.03), 0.01) is None  # straddles a threshold: go on measuring
    assert decide(iv(0.005, 0.03), 0.01) is None   # above zero but not surely above the 1% floor


def test_looks_and_stopping():
    plan = SpeedPlan(block_steps=8, looks=(8, 12, 16), alphas=(0.001, 0.002, 0.007))
    faster = [0.05 + 0.002 * (-1) ** i for i in range(16)]  # +5%, steady
    assert not should_stop(faster[:7], plan) and look_at(faster[:7], plan) is None  # between looks
    assert should_stop(faster[:8], plan)
    out = conclude(faster, plan)
    assert (out.decision, out.look.pairs, out.budget_spent, len(out.looks)) == ("keep", 8, False, 1)
    noisy_aa = [0.02 * (-1) ** i for i in range(16)]  # mean 0, ±2%: the interval straddles ±1% at every look
    assert not should_stop(noisy_aa[:8], plan) and not should_stop(noisy_aa[:12], plan)
    assert should_stop(noisy_aa, plan)  # the last look ends it
    out = conclude(noisy_aa, plan)
    assert (out.decision, out.look.pairs, out.budget_spent) == ("no change", 16, True)
    assert [look.alpha for look in out.looks] == [0.001, 0.002, 0.007]
    quiet_aa = [0.001 * (-1) ** i for i in range(16)]
    out = conclude(quiet_aa, plan)
    assert (out.decision, out.look.pairs, out.budget_spent) == ("no change", 8, False)  # inside ±1%: stop early
    with pytest.raises(ValueError, match="first look needs 8"):
        conclude(faster[:5], plan)


def test_futility_stops_a_small_undecided_interval_before_the_last_look():
    small = [0.01 + 0.004 * (-1) ** i for i in range(16)]  # +1% ± 0.4%: straddles the floor, inside ±3%
    plan = SpeedPlan(looks=(8, 16), alphas=(0.005, 0.005), futility=0.03)
    first = look_at(small[:8], plan)
    assert first.decision is None or first.futile  # undecided by the floor, so only futility can stop it
    assert math.log1p(-0.03) <= first.interval.low and first.interval.high <= math.log1p(0.03)
    assert should_stop(small[:8], plan)
    out = conclude(small, plan)
    assert (out.decision, out.look.pairs, out.look.futile, out.budget_spent) == ("no change", 8, True, False)
    assert out.look.to_dict()["futile"] is True
    without = conclude(small, SpeedPlan(looks=(8, 16), alphas=(0.005, 0.005)))  # no futility: to the last look
    assert (without.decision, without.look.pairs, without.budget_spent) == ("no change", 16, True)
    wide = [0.01 + 0.04 * (-1) ** i for i in range(16)]  # ±4%: not inside ±3%, so it goes on
    assert not should_stop(wide[:8], plan)
    last = conclude(wide, plan)  # the last look is never futile: undecided there is "budget spent"
    assert (last.look.pairs, last.look.futile, last.budget_spent) == (16, False, True)
    with pytest.raises(ValueError, match="futility=0.01 must lie between the floor"):
        SpeedPlan(futility=0.01)
    assert paired.PAIRED_PLAN.futility == 0.03 and paired.PAIRED_PLAN.interleave == "steps"
    assert paired.DP_PAIRED_PLAN.max_pairs == 8  # every data-parallel rank runs the last look's pairs
    assert sum(paired.DP_PAIRED_PLAN.alphas) == pytest.approx(0.01)


def test_sequential_looks_keep_the_aa_false_call_rate_at_most_one_percent():
    """Simulated A/A rounds (no true difference; heavy-tailed pair noise, t with 3 dof): the share called keep or
    reject over all looks must stay ≤ 1% — the union bound over the spent alphas, despite stopping early."""
    rng = np.random.default_rng(7)
    plan = paired.PAIRED_PLAN
    calls = sum(conclude(list(0.02 * rng.standard_t(3, plan.max_pairs)), plan).decision != "no change"
                for _ in range(3000))
    assert calls / 3000 <= 0.01, calls


def test_plan_refuses_an_error_budget_above_one_percent_and_a_floor_above_one_percent():
    with pytest.raises(ValueError, match="sum to <= 0.01"):
        SpeedPlan(looks=(8, 16), alphas=(0.01, 0.01))
    with pytest.raises(ValueError, match="practical floor of at most 1%"):
        SpeedPlan(floor=0.02)
    with pytest.raises(ValueError, match="increasing"):
        SpeedPlan(looks=(12, 8), alphas=(0.005, 0.005))
    with pytest.raises(ValueError, match="interleave='pairs' must be one of blocks, steps"):
        SpeedPlan(interleave="pairs")
    assert SpeedPlan.from_dict(paired.PAIRED_PLAN.to_dict()) == paired.PAIRED_PLAN


def test_every_config_key_has_a_measurement_path():
    paths = table()
    assert set(paths) == set(all_keys()) and set(paths.values()) <= {PAIRED, PROCESSES}
    for key in ("mode", "jit_level", "threads", "compile_cache", "device_target", "parallel.data_parallel",
                "data.num_parallel_workers", "monitor.profile_steps", "memory_optimize"):
        assert path_of(key) == PROCESSES, key
    for key in ("batch_size", "grad_accum_steps", "model.n_layer", "model.kernels", "amp_level", "recompute",
                "grad_norm", "model.ballast"):
        assert path_of(key) == PAIRED, key
    best = from_dict({})
    assert speed_path({"batch_size": 16}, best)[0] == PAIRED
    path, why = speed_path({"mode": "pynative", "jit_level": "none"}, best)
    assert path == PROCESSES and "process-wide" in why
    assert speed_path({"batch_size": 16}, from_dict({"parallel": {"data_parallel": 2}, "batch_size": 8}))[0] \
        == PROCESSES
    dp = from_dict({"parallel": {"data_parallel": 2}, "batch_size": 8})
    path, why = speed_path({"parallel.comm_fusion": "size"}, dp)  # fixed per compiled graph: paired in each rank
    assert path == PAIRED and "msrun launch" in why
    assert speed_path({"parallel.comm_fusion": "size"}, best)[0] == PROCESSES  # no all-reduce without DP
    profiled = from_dict({"steps": 30, "monitor": {"profile_steps": 10}})  # one profiler, one op table per run
    path, why = speed_path({"model.qkv": "fused_slice"}, profiled)
    assert path == PROCESSES and "profiled" in why
