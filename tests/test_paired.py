"""The speed estimator's arithmetic (helpers/paired.py) pinned to hand-computed values: the ratio of throughputs
over every measured step and its paired delta-method interval, trimming by outside load only, the parts (fast
end, stalls, data waits), the exact t quantile, looks and stopping; and simulated arms whose own stalls the
estimator must count."""
from __future__ import annotations

import math

import numpy as np
import pytest

from helpers import paired
from helpers.paired import (Measurement, SpeedPlan, conclude, decide, fast_end, kept_pairs, look_at, parts,
                            ratio_interval, should_stop, t_quantile)


def blocks(ref_ms, cand_ms, k=8, tokens=(10, 10), foreign=None, waits=None) -> Measurement:
    """A Measurement whose pair i has k steps of ref_ms[i] and of cand_ms[i] (ms)."""
    pairs = [([r] * k, [c] * k) for r, c in zip(ref_ms, cand_ms)]
    return Measurement(pairs, tokens, waits, foreign)


def test_exact_t_quantile_replaces_the_normal_shortcut():
    # tables: t_0.975(2) = 4.3027, t_0.995(9) = 3.2498, t_0.975(1) = 12.7062
    assert t_quantile(0.975, 2) == pytest.approx(4.302653, abs=1e-6)
    assert t_quantile(0.995, 9) == pytest.approx(3.249836, abs=1e-6)
    assert t_quantile(0.975, 1) == pytest.approx(12.706205, abs=1e-6)
    with pytest.raises(ValueError, match="dof >= 1"):
        t_quantile(0.975, 0)


def test_fast_end_is_the_rank_th_fastest_step():
    assert fast_end([5.0, 3.0, 4.0, 9.0], rank=2) == 4.0
    assert fast_end([5.0, 3.0, 4.0, 9.0], rank=1) == 3.0
    assert fast_end([5.0], rank=2) == 5.0  # a block shorter than the rank: its slowest


def test_ratio_interval_by_hand():
    # pair means ref [10, 12], cand [10, 10] ms: R = (11 / 10) → ln 1.1 = 0.0953102; d = [10/11 − 1, 12/11 − 1]
    # = ±0.0909091, sd 0.1285649, SE = sd/√2 = 0.0909091; t_0.975(1) = 12.706205 → half-width 1.155109
    iv = ratio_interval([10.0, 12.0], [10.0, 10.0], (10, 10), alpha=0.05)
    assert iv.estimate == pytest.approx(math.log(1.1), abs=1e-9)
    assert (iv.pairs, iv.trimmed, iv.dof) == (2, 0, 1)
    assert iv.high - iv.estimate == pytest.approx(1.155109, abs=1e-5)
    assert iv.estimate - iv.low == pytest.approx(1.155109, abs=1e-5)
    # twice the tokens per step at the same ms per step (a batch round): twice the tokens/s
    iv = ratio_interval([10.0, 12.0], [10.0, 12.0], (10, 20), alpha=0.05)
    assert iv.ratio == pytest.approx(2.0) and iv.half_width == pytest.approx(0.0, abs=1e-12)
    # the ratio is of total time, not of per-pair ratios: a candidate 2× slower in one pair of two and equal in
    # the other loses a third of its throughput (mean 15 ms against 10), not ×(1 + 0.5)/2
    assert ratio_interval([10.0, 10.0], [20.0, 10.0], (1, 1), 0.05).ratio == pytest.approx(10 / 15)


def test_every_step_counts_stalls_and_waits_included():
    """The slow steps of an arm are what the user pays: a reference waiting 40 ms for data on every second step
    (a 50 ms step) against a candidate that never waits is ×1.4 faster, not "no change" (which the blocks' 2nd
    fastest steps said, ×1.0)."""
    rng = np.random.default_rng(3)
    pairs, waits = [], []
    for _ in range(12):
        ref = [50.0 + rng.normal(0, 0.5) + (40.0 if j % 2 else 0.0) for j in range(8)]
        cand = [50.0 + rng.normal(0, 0.5) for _ in range(8)]
        pairs.append((ref, cand))
        waits.append(([40.0 if j % 2 else 0.1 for j in range(8)], [0.1] * 8))
    m = Measurement(pairs, (100, 100), waits, [0.0] * 12)
    out = conclude(m, paired.PROCESS_PLAN)
    assert out.decision == "keep" and out.look.interval.ratio == pytest.approx(70 / 50, rel=0.01)
    p = out.parts
    assert p.compute_ratio == pytest.approx(1.0, abs=0.03)  # the work of a step is the same: the waits differ
    assert p.reference.data_wait_share == pytest.approx(20.05 / 70, abs=0.01) and p.candidate.data_wait_share < 0.01
    assert p.reference.stall_share < 0.03 and p.candidate.stall_share < 0.03
    assert "compute ×" in p.text() and "data wait 28." in p.text()
    # unmeasured waits: the same slow steps count as stalls
    bare = parts(Measurement(pairs, (100, 100)), paired.PROCESS_PLAN)
    assert bare.reference.data_wait_share is None and bare.reference.stall_share == pytest.approx(20 / 70, abs=0.02)


def test_an_intermittent_cost_is_seen():
    """Extra work in every 5th step only (+25% of a step there, +5% on average): the round says reject, and
    its interval holds the true ratio 1/1.05."""
    rng = np.random.default_rng(5)
    steps = {"r": 0, "c": 0}
    pairs = []
    for _ in range(24):
        block = {}
        for arm, extra in (("r", 0.0), ("c", 12.5)):
            times = []
            for _ in range(8):
                steps[arm] += 1
                times.append(50.0 + rng.normal(0, 0.3) + (extra if steps[arm] % 5 == 0 else 0.0))
            block[arm] = times
        pairs.append((block["r"], block["c"]))
    out = conclude(Measurement(pairs, (1, 1)), paired.PROCESS_PLAN)
    assert out.decision == "reject"
    assert out.look.interval.ratio_low <= 1 / 1.05 <= out.look.interval.ratio_high


def test_trimming_looks_only_at_outside_load():
    # at most ⌊0.2·10⌋ = 2 pairs go, the busiest above 0.1 cores; unmeasured load drops nothing
    foreign = [0.0, 0.5, 0.05, 0.9, 0.3, 0.0, None, 0.0, 0.0, 0.0]
    assert kept_pairs(foreign, 10, 0.2, 0.1) == [True, False, True, False, True, True, True, True, True, True]
    assert kept_pairs(None, 4, 0.2, 0.1) == [True] * 4
    assert kept_pairs([0.05] * 10, 10, 0.2, 0.1) == [True] * 10  # a quiet machine keeps every pair
    # a pair whose own candidate stalled badly stays when nothing else ran; a pair a neighbour hit goes
    ref = [10.0] * 10
    cand = [10.0] * 9 + [30.0]
    m = blocks(ref, cand, foreign=[0.0] * 10)
    assert look_at(m.head(10), SpeedPlan(looks=(10,), alphas=(0.01,))).interval.trimmed == 0
    busy = blocks(ref, [10.0] * 8 + [30.0, 10.0], foreign=[0.0] * 8 + [1.5, 0.0])
    iv = look_at(busy, SpeedPlan(looks=(10,), alphas=(0.01,))).interval
    assert (iv.pairs, iv.trimmed) == (10, 1) and iv.ratio == pytest.approx(1.0)


def test_parts_by_hand():
    # one pair of 4 steps each. ref [10, 10, 10, 30] ms, no waits: compute = 2nd fastest = 10, mean 15, stalls 1/3;
    # cand [12, 11, 14, 11] ms with waits [1, 0, 1, 0]: work [11, 11, 13, 11] → compute 11, mean 12, data wait
    # 2/48, stalls 1 − 11/12 − 2/48 = 1/24
    m = Measurement([([10.0, 10.0, 10.0, 30.0], [12.0, 11.0, 14.0, 11.0])], (100, 100),
                    [([0.0, 0.0, 0.0, 0.0], [1.0, 0.0, 1.0, 0.0])], None)
    p = parts(m, SpeedPlan(block_steps=4))
    assert (p.reference.mean_ms, p.reference.compute_ms) == (15.0, 10.0)
    assert p.reference.stall_share == pytest.approx(1 / 3) and p.reference.data_wait_share == 0.0
    assert (p.candidate.mean_ms, p.candidate.compute_ms) == (12.0, 11.0)
    assert p.candidate.data_wait_share == pytest.approx(2 / 48) and p.candidate.stall_share == pytest.approx(1 / 24)
    assert p.compute_ratio == pytest.approx(10 / 11)
    assert p.text() == ("compute ×0.909 (fast-end work 10.0 → 11.0 ms a step); stalls 33.3% → 4.2%, data wait "
                        "0.0% → 4.2% of the mean step")


def test_thresholds_keep_reject_no_change_and_undecided():
    f = math.log1p(0.01)

    def iv(low, high):
        return paired.Interval((low + high) / 2, low, high, 8, 1, 5, 5.0, 0.999)
    assert decide(iv(f + 0.001, 0.08), 0.01) == "keep"
    assert decide(iv(-0.08, -f - 0.001), 0.01) == "reject"
    assert decide(iv(-f + 0.001, f - 0.001), 0.01) == "no change"
    assert decide(iv(-0.02, 0.03), 0.01) is None  # straddles a threshold: go on measuring
    assert decide(iv(0.005, 0.03), 0.01) is None   # above zero but not surely above the 1% floor


def _alternating(center: float, spread: float, n: int) -> list[float]:
    return [center * (1 + spread * (-1) ** i) for i in range(n)]


def test_looks_and_stopping():
    plan = SpeedPlan(block_steps=8, looks=(8, 12, 16), alphas=(0.001, 0.002, 0.007))
    ref = [100.0] * 16
    faster = blocks(ref, _alternating(100 / 1.05, 0.002, 16))  # +5%, steady
    assert not should_stop(faster.head(7), plan) and look_at(faster.head(7), plan) is None  # between looks
    assert should_stop(faster.head(8), plan)
    out = conclude(faster, plan)
    assert (out.decision, out.look.pairs, out.budget_spent, len(out.looks)) == ("keep", 8, False, 1)
    noisy_aa = blocks(ref, _alternating(100.0, 0.02, 16))  # ±2%: the interval straddles ±1% at every look
    assert not should_stop(noisy_aa.head(8), plan) and not should_stop(noisy_aa.head(12), plan)
    assert should_stop(noisy_aa, plan)  # the last look ends it
    out = conclude(noisy_aa, plan)
    assert (out.decision, out.look.pairs, out.budget_spent) == ("no change", 16, True)
    assert [look.alpha for look in out.looks] == [0.001, 0.002, 0.007]
    quiet_aa = blocks(ref, _alternating(100.0, 0.001, 16))
    out = conclude(quiet_aa, plan)
    assert (out.decision, out.look.pairs, out.budget_spent) == ("no change", 8, False)  # inside ±1%: stop early
    assert out.parts is not None and out.parts.compute_ratio == pytest.approx(1.0, abs=0.002)
    with pytest.raises(ValueError, match="first look needs 8"):
        conclude(faster.head(5), plan)


def test_futility_stops_a_small_undecided_interval_before_the_last_look():
    small = blocks([100.0] * 16, _alternating(100 / 1.01, 0.004, 16))  # +1% ± 0.4%: straddles the floor
    plan = SpeedPlan(looks=(8, 16), alphas=(0.005, 0.005), futility=0.03)
    first = look_at(small.head(8), plan)
    assert first.decision is None or first.futile
    assert math.log1p(-0.03) <= first.interval.low and first.interval.high <= math.log1p(0.03)
    assert should_stop(small.head(8), plan)
    out = conclude(small, plan)
    assert (out.decision, out.look.pairs, out.look.futile, out.budget_spent) == ("no change", 8, True, False)
    assert out.look.to_dict()["futile"] is True
    without = conclude(small, SpeedPlan(looks=(8, 16), alphas=(0.005, 0.005)))  # no futility: to the last look
    assert (without.decision, without.look.pairs, without.budget_spent) == ("no change", 16, True)
    wide = blocks([100.0] * 16, _alternating(100 / 1.01, 0.04, 16))  # ±4%: not inside ±3%, so it goes on
    assert not should_stop(wide.head(8), plan)
    last = conclude(wide, plan)  # the last look is never futile: undecided there is "budget spent"
    assert (last.look.pairs, last.look.futile, last.budget_spent) == (16, False, True)
    with pytest.raises(ValueError, match="futility=0.01 must lie between the floor"):
        SpeedPlan(futility=0.01)
    assert paired.PROCESS_PLAN.futility == 0.025 and paired.PROCESS_PLAN.interleave == "steps"
    assert paired.DP_PAIRED_PLAN.max_pairs == 8  # every data-parallel rank runs the last look's pairs
    assert sum(paired.DP_PAIRED_PLAN.alphas) == pytest.approx(0.01)


@pytest.mark.parametrize("stall_every", [0, 3])
def test_sequential_looks_keep_the_aa_false_call_rate_at_most_one_percent(stall_every):
    """Simulated A/A rounds (no true difference; heavy-tailed step noise, t with 3 dof, and with stall_every the
    same data stall in both arms every few steps): the share called keep or reject over all looks stays ≤ 1%."""
    rng = np.random.default_rng(7)
    plan = paired.PROCESS_PLAN
    k = plan.block_steps

    def arm(n_pairs: int) -> list[list[float]]:
        out = []
        for i in range(n_pairs):
            steps = 50.0 * (1 + 0.02 * rng.standard_t(3, k))
            if stall_every:
                steps += np.array([20.0 if (i * k + j) % stall_every == 0 else 0.0 for j in range(k)])
            out.append(list(np.maximum(steps, 1.0)))
        return out
    calls = 0
    for _ in range(1500):
        m = Measurement(list(zip(arm(plan.max_pairs), arm(plan.max_pairs))), (1, 1))
        calls += conclude(m, plan).decision != "no change"
    assert calls / 1500 <= 0.01, calls


def test_plan_refuses_an_error_budget_above_one_percent_and_a_floor_above_one_percent():
    with pytest.raises(ValueError, match="sum to <= 0.01"):
        SpeedPlan(looks=(8, 16), alphas=(0.01, 0.01))
    with pytest.raises(ValueError, match="practical floor of at most 1%"):
        SpeedPlan(floor=0.02)
    with pytest.raises(ValueError, match="increasing"):
        SpeedPlan(looks=(12, 8), alphas=(0.005, 0.005))
    with pytest.raises(ValueError, match="interleave='pairs' must be one of blocks, steps"):
        SpeedPlan(interleave="pairs")
    assert SpeedPlan.from_dict(paired.PROCESS_PLAN.to_dict()) == paired.PROCESS_PLAN
    # a plan stored before trimming by outside load (its "trim" meant trimming by value) still reads
    assert SpeedPlan.from_dict({**paired.PROCESS_PLAN.to_dict(), "old_key": 1}) == paired.PROCESS_PLAN


def test_measurement_from_a_paired_file():
    raw = {"pairs": [[[1.0, 2.0], [3.0, 4.0]]], "tokens_per_step": {"reference": 5, "candidate": 6},
           "waits": [[[0.0, 0.0], [0.1, 0.1]]], "foreign_cores": [0.2]}
    m = Measurement.from_raw(raw)
    assert m.tokens == (5, 6) and m.pairs == [([1.0, 2.0], [3.0, 4.0])] and m.foreign_cores == [0.2]
    assert len(m.head(0)) == 0


def test_a_large_change_ends_at_the_first_look_and_a_small_one_goes_on():
    """The process plan's early look (6 pairs at 99.9%) decides a −20% change; a −3% change needs the later looks."""
    rng = np.random.default_rng(3)
    plan = paired.PROCESS_PLAN
    k = plan.block_steps

    def blocks_of(step_ms: float, n: int) -> list[list[float]]:
        return [list(step_ms * (1 + 0.03 * rng.standard_normal(k))) for _ in range(n)]
    big = Measurement(list(zip(blocks_of(80.0, plan.max_pairs), blocks_of(100.0, plan.max_pairs))), (1, 1))
    out = conclude(big, plan)
    assert (out.decision, out.look.pairs, out.look.alpha) == ("reject", plan.looks[0], 0.001)
    assert should_stop(big.head(plan.looks[0]), plan)
    small = Measurement(list(zip(blocks_of(100.0, plan.max_pairs), blocks_of(103.0, plan.max_pairs))), (1, 1))
    assert not should_stop(small.head(plan.looks[0]), plan) and conclude(small, plan).look.pairs > plan.looks[0]


def test_a_faster_arm_takes_turns_as_long_as_one_step_of_the_slower():
    from helpers.paired import MAX_TURN_STEPS, turn_steps
    assert turn_steps({"reference": [220.0, 215.0, 224.0], "candidate": [59.0, 47.0, 48.0]}) == {
        "reference": 1, "candidate": 5}  # 220 / 48 = 4.6
    assert turn_steps({"reference": [50.0] * 3, "candidate": [110.0] * 3}) == {"reference": 2, "candidate": 1}
    assert turn_steps({"reference": [60.0] * 3, "candidate": [41.0] * 3}) == {"reference": 1, "candidate": 1}
    assert turn_steps({"reference": [1000.0], "candidate": [10.0]})["candidate"] == MAX_TURN_STEPS
    assert turn_steps({"reference": [100.0], "candidate": []}) == {"reference": 1, "candidate": 1}


def test_the_compute_part_takes_the_same_quantile_of_a_longer_block():
    """A faster arm's block holds K steps per step of its turn: its fast end is the rank-th fastest per K steps."""
    plan = SpeedPlan(block_steps=4, looks=(2,), alphas=(0.01,))
    ref = [[100.0, 101.0, 102.0, 103.0]] * 2
    cand = [[10.0, 20.0, 21.0, 22.0, 23.0, 24.0, 25.0, 26.0]] * 2  # turns of 2 steps: 8 steps a block
    got = paired.parts(Measurement(list(zip(ref, cand)), (1, 1)), plan)
    assert got.reference.compute_ms == 101.0 and got.candidate.compute_ms == 22.0  # 2nd and 4th fastest


def test_both_measuring_paths_take_their_pairs_in_one_order_and_record_them_one_way():
    from helpers.paired import add_pair, live_tokens_per_s, measurement_record, pair_order, woven
    assert [pair_order(i) for i in range(3)] == [("reference", "candidate"), ("candidate", "reference"),
                                                 ("reference", "candidate")]
    assert woven(("candidate", "reference"), 3) == ["candidate", "reference", "reference", "candidate", "candidate",
                                                    "reference"]
    record = measurement_record("processes", 3, "steps", 8, 6, {"candidate": 20, "reference": 10})
    m = add_pair(record, ("candidate", "reference"), {"reference": [2.0, 2.0, 2.0], "candidate": [1.0, 1.0, 1.0]},
                 {"reference": [0.0] * 3, "candidate": [None] * 3}, 0.1)
    assert record["pairs"] == [([2.0, 2.0, 2.0], [1.0, 1.0, 1.0])] and record["first_in_pair"] == ["candidate"]
    assert m.tokens == (10, 20) and m.waits == [([0.0] * 3, [None] * 3)] and m.foreign_cores == [0.1]
    assert live_tokens_per_s(10, [1.0, 4.0, 2.0, 3.0]) == 10 * 1000.0 / 2.5  # the median, the same on both paths
