"""Time to quality: the objective's arithmetic against hand-computed values, then real tiny runs that end at a
target or a time cap, a time-to-target round, and the auto-tuner's time-to-target mode."""
from __future__ import annotations

import math
import time
from pathlib import Path

import pytest

from helpers.config import ConfigError, from_dict, load_config, with_changes
from helpers.record import RunRecord, load_run
from helpers.paths import REPO_ROOT
from helpers.tune.autotune import BUDGET_MARGIN, AutotuneError
from helpers.tune.convergence import RECIPE, seed_band, seed_times_text, time_figures, time_to_target
from helpers.tune.rules import judge_time_to_target
from helpers.tune.rounds import RoundError, Workbook
from helpers.tune.ttq_search import (CAP_MARGIN, DEFAULT_OVERHEAD_S, autotune_time_to_target, loss_at_time,
                                    recipe_arms, time_to_beat)
from helpers.spawn.runner import launch
from helpers.book.report import time_to_target_before_after, time_to_target_table
from tests.conftest import run_cli

MIB = 2 ** 20


def curve(name: str, evals: dict[float, float], seed: int = 1, step_ms: float = 100.0) -> RunRecord:
    """A record whose validation passes sit at the given wall seconds (elapsed_s) with the given losses, one eval
    every 10 steps (arithmetic only; nothing trains)."""
    rows = []
    for k, (elapsed, loss) in enumerate(sorted(evals.items()), 1):
        rows += [{"step": 10 * (k - 1) + s, "tokens": 100, "step_time_ms": step_ms, "val_loss": None,
                  "elapsed_s": None} for s in range(1, 10)]
        rows.append({"step": 10 * k, "tokens": 100, "step_time_ms": step_ms, "val_loss": loss, "elapsed_s": elapsed})
    summary = {"status": "ok", "peak_memory_bytes": 500 * MIB, "tokens_per_s": 1000.0}
    return RunRecord(Path(name), from_dict({"seed": seed}), rows, summary, {})


def test_time_to_target_interpolates_on_wall_seconds_since_process_start():
    run = curve("r", {10.0: 3.0, 20.0: 2.0, 30.0: 1.8})
    # elapsed_s (start-up and evaluation included), not the step times' sum (1 s per 10 steps here)
    assert time_to_target(run, 2.5) == pytest.approx(15.0)  # half-way from 10 s (3.0) to 20 s (2.0)
    assert time_to_target(run, 2.2) == pytest.approx(18.0)  # 0.8 of the way
    assert time_to_target(run, 1.9) == pytest.approx(25.0)  # between 20 s (2.0) and 30 s (1.8)
    assert time_to_target(run, 2.0) == pytest.approx(20.0)  # reached exactly at a pass
    assert time_to_target(run, 3.5) == pytest.approx(10.0)  # below at the first pass: no earlier point
    assert time_to_target(run, 1.7) is None  # did not reach: no time at all


def test_loss_at_wall_time_interpolates_and_averages_the_runs():
    a, b = curve("a", {10.0: 3.0, 20.0: 2.0}), curve("b", {10.0: 2.0, 30.0: 1.0})
    assert loss_at_time([a], 12.5) == pytest.approx(2.75)
    assert loss_at_time([a, b], 20.0) == pytest.approx((2.0 + 1.5) / 2)
    assert loss_at_time([a], 50.0) == pytest.approx(2.0)  # after the last pass: its value


def test_time_verdict_band_keep_and_no_change_by_hand():
    ref = [curve("r1", {10.0: 2.2, 12.0: 2.0}), curve("r2", {12.0: 2.2, 14.0: 1.9})]  # both reach 2.0 at 12 s
    # each arm's times: reference 12 s, 12 s + 2 s × (0.2/0.3) = 13.333 s; candidate 6 s and 7 s
    cand = [curve("c1", {6.0: 2.0}), curve("c2", {7.0: 1.95})]
    f = time_figures(ref, cand, 2.0)
    assert f.reference_times == pytest.approx([12.0, 12.0 + 2.0 * 0.2 / 0.3])
    assert f.candidate_times == pytest.approx([6.0, 7.0])
    # variances (1 dof each): reference ((−0.6667)² + 0.6667²) = 0.8889, candidate 0.5; pooled over 2 dof
    assert f.band == pytest.approx(4.3027 * math.sqrt((0.8889 + 0.5) / 2 * (1 / 2 + 1 / 2)), rel=1e-3)
    assert f.band == pytest.approx(seed_band(f.reference_times, f.candidate_times))
    verdict = judge_time_to_target(ref, cand, 1000 * MIB, 2.0)
    delta = 6.5 - (12.0 + 13.3333) / 2  # −6.17 s, band 3.59 s → keep
    assert f.delta == pytest.approx(delta, rel=1e-4) and -delta > f.band
    assert verdict.decision == "keep" and verdict.speedup == pytest.approx(12.6667 / 6.5, rel=1e-4)
    assert verdict.noise_band == pytest.approx(f.band) and "below the seed band" in verdict.reason
    # a candidate one second quicker on average is inside that band
    close = [curve("c1", {11.0: 2.0}), curve("c2", {12.0: 2.0})]
    assert judge_time_to_target(ref, close, 1000 * MIB, 2.0).decision == "no change"


def test_an_arm_that_did_not_reach_gets_no_time():
    ref = [curve("r1", {10.0: 1.9}), curve("r2", {11.0: 1.9})]
    short = [curve("c1", {5.0: 1.95}), curve("c2", {4.0: 1.9})]  # seed 1 stops above the target
    verdict = judge_time_to_target(ref, short, 1000 * MIB, 1.9)
    assert verdict.decision == "reject" and verdict.speedup is None and verdict.noise_band is None
    assert verdict.gate == "target not reached by the candidate"  # the decision line names it, not the memory ratio
    assert "candidate did not reach (did not reach, 4.0 s)" in verdict.reason  # no mean for that arm
    assert "reference mean 10.5 s" in verdict.reason
    # the other way round: every candidate seed reached it, one reference seed did not. That miss alone is no
    # evidence: counted at its last pass (5 s, a lower bound) the reference is ≥ 4.5 s against the candidate's 10.5 s
    partial = judge_time_to_target(short, ref, 1000 * MIB, 1.9)
    assert partial.decision == "no change" and "(≥ 4.5 s): +6.0 s, above the seed band" in partial.reason, \
        partial.reason
    # a candidate sooner than that lower bound by more than the band is kept; one no reference seed matched, too
    quick = [curve("q1", {2.0: 1.9}), curve("q2", {2.2: 1.85})]
    slow = [curve("s1", {9.0: 1.9}), curve("s2", {9.5: 1.95})]  # s2 ended at 9.5 s without reaching it
    assert judge_time_to_target(slow, quick, 1000 * MIB, 1.9).decision == "keep"
    never = [curve("n1", {9.0: 1.95}), curve("n2", {9.5: 1.99})]
    assert "no reference seed did" in judge_time_to_target(never, ref, 1000 * MIB, 1.9).reason
    assert judge_time_to_target(short, short, 1000 * MIB, 1.9).decision == "no change"
    over = judge_time_to_target(ref, ref, 400 * MIB, 1.9)  # the memory gate still applies
    assert over.decision == "reject" and "over the memory limit" in over.reason


def test_times_text_gives_a_mean_only_of_two_or_more_runs_that_all_reached():
    assert seed_times_text([6.14]) == "6.1 s (one run)"  # a baseline pinned with one run
    assert seed_times_text([4.0, 3.6]) == "mean 3.8 s (4.0 s, 3.6 s)"
    assert seed_times_text([4.0, None]) == "did not reach (4.0 s, did not reach)"
    assert seed_times_text([None]) == "did not reach (did not reach)"


def test_recipe_grid_changes_the_recipe_together():
    nanogpt = with_changes(load_config(REPO_ROOT / "configs" / "nano.yaml"), {"steps": 2000})
    arms = {a.name: a.changes for a in recipe_arms(nanogpt)}
    assert len(arms) == 8 and list(arms)[0] == "recipe_lr0.003_s1000_b16"  # soonest-finishing first
    # lr ×3 over half the schedule at batch ×4/3: warm-up and min_lr scaled with them
    assert arms["recipe_lr0.003_s1000_b16"] == {"lr": 0.003, "min_lr": 0.0003, "steps": 1000, "warmup": 50,
                                                "batch_size": 16}
    assert arms["recipe_lr0.002_s1300_b12"] == {"lr": 0.002, "min_lr": 0.0002, "steps": 1300, "warmup": 65}


def test_bad_time_to_target_input_fails_in_one_line_before_training(tmp_path):
    with pytest.raises(ConfigError, match="eval_every=0 evaluates only at the end"):
        from_dict({"target_val_loss": 1.9, "eval_every": 0})
    with pytest.raises(ConfigError, match="max_time_s"):
        from_dict({"max_time_s": -1})
    for bad in (None, 0, -1.0, float("nan"), "1.9"):
        with pytest.raises(AutotuneError, match="must be a positive validation loss"):
            autotune_time_to_target(from_dict({}), tmp_path / "wb", 1.0, bad)
    with pytest.raises(AutotuneError, match="budget_min"):
        autotune_time_to_target(from_dict({}), tmp_path / "wb", 0, 1.9)
    with pytest.raises(ConfigError, match="eval_every=0"):
        autotune_time_to_target(from_dict({"eval_every": 0}), tmp_path / "wb", 1.0, 1.9)
    assert not (tmp_path / "wb").exists()
    done = run_cli("autotune", "--budget-min", "1", "--out", str(tmp_path / "cli"), "--target-val-loss", "1.9")
    assert done.returncode == 2 and "is for --objective time_to_target" in done.stderr
    assert not (tmp_path / "cli").exists()


def tiny(corpus: Path, **changes) -> dict:
    return {"model": {"preset": "debug"}, "data": {"corpus": [str(corpus)]}, "batch_size": 8, "steps": 120,
            "warmup": 10, "eval_every": 10, "eval_batches": 2, "steady_after": 3, "threads": 1, **changes}


@pytest.mark.slow
def test_a_run_ends_at_its_target_or_its_time_cap(tmp_path, small_corpus):
    run = launch(from_dict(tiny(small_corpus, target_val_loss=2.6)), tmp_path / "target", progress=False)
    evals = [r for r in run.metrics if r["val_loss"] is not None]
    assert run.status == "ok" and run.summary["status_reason"].startswith("reached target_val_loss=2.6")
    assert evals[-1]["val_loss"] <= 2.6 < evals[-2]["val_loss"] and run.metrics[-1] is evals[-1]
    assert len(run.metrics) < 120 and run.checkpoints()  # ended early, a checkpoint to resume from
    elapsed = [r["elapsed_s"] for r in run.metrics]
    # from process creation: the first step already carries the start-up (imports, data, build, compile)
    assert elapsed == sorted(elapsed) and elapsed[0] >= run.summary["fixed_cost_s"]["import"]
    # a schedule far longer than the cap (a warm compile cache makes this run start sooner than the first)
    cap = elapsed[-1]
    capped = launch(from_dict(tiny(small_corpus, max_time_s=cap, steps=3000)), tmp_path / "cap", progress=False)
    assert capped.status == "ok" and capped.summary["status_reason"].startswith("time cap max_time_s=")
    last = capped.metrics[-1]  # a validation pass made where it stopped
    assert last["val_loss"] is not None and last["elapsed_s"] >= cap and last["step"] < 3000


@pytest.mark.slow
def test_time_to_target_round_stops_an_arm_that_cannot_beat_the_best_and_the_tuner_skips_a_stale_arm(tmp_path,
                                                                                                   small_corpus):
    wb = Workbook.create(tmp_path / "wb", from_dict(tiny(small_corpus, target_val_loss=2.6)))
    wb.baseline(progress=False)
    with pytest.raises(RoundError, match="changes steps; steps"):  # a speed round may not change the schedule length
        wb.run_round("short", {"steps": 60}, progress=False)
    with pytest.raises(RoundError, match="time_cap_s"):
        wb.run_round("short", {"lr": 3e-3, "steps": 60}, objective="time_to_target", time_cap_s=-1)
    # a cap below the start-up: the candidate cannot get there, so the round stops after its first pair
    done = wb.run_round("short", {"lr": 3e-3, "steps": 60}, objective="time_to_target", time_cap_s=0.1,
                        progress=False)
    assert done.decision == "reject" and "candidate did not reach" in done.verdict.reason
    assert len(done.candidate_runs) == len(done.reference_runs) == 1
    entry = [e for e in wb.ledger() if e["event"] == "round"][-1]
    assert entry["objective"] == "time_to_target" and entry["target"] == 2.6 and entry["time_cap_s"] == 0.1
    assert entry["changes"] == {"lr": [1e-3, 3e-3], "steps": [120, 60]}
    groups = {"reference": [load_run(p) for p in done.reference_runs],
              "candidate": [load_run(p) for p in done.candidate_runs]}
    table = time_to_target_table(groups, 2.6)
    assert table["reached"].tolist() == [True, False] and table["ended"].tolist() == ["target reached", "time cap"]
    assert math.isnan(table["s to val loss 2.6000"].iloc[1])  # no time for the arm that did not reach
    assert time_to_target_before_after(wb)["baseline ÷ best"].iloc[0] == pytest.approx(1.0)  # best = baseline
    # finished runs pinned as another workbook's baseline (a bench's target runs): copied, with where from
    other = Workbook.create(tmp_path / "adopting", from_dict(tiny(small_corpus)))
    with pytest.raises(RoundError, match=r"differs in lr, steps; pin finished runs of the baseline config"):
        other.baseline(adopt=groups["candidate"])
    assert not other.baseline_runs()  # nothing pinned by the refusal
    pinned = other.baseline(adopt=wb.baseline_runs())  # differs only in target_val_loss: how a run ends
    assert [r.path.name for r in pinned] == ["run_1", "run_2"] and pinned[0].path.parent == other.path / "baseline"
    assert [r.metrics for r in pinned] == [r.metrics for r in wb.baseline_runs()]
    assert other.ledger()[0]["adopted_from"] == [str(r.path) for r in wb.baseline_runs()]
    # the tuner from pinned runs (the ttq bench's way): no baseline trained, its budget planned without them
    tuned = autotune_time_to_target(from_dict(tiny(small_corpus, target_val_loss=2.6)), tmp_path / "tuner", 0.02,
                                    2.6, baseline_runs=groups["reference"], log=lambda _: None)
    assert tuned.stop_reason.startswith("budget") and not tuned.rounds
    tuner = Workbook.open(tmp_path / "tuner")
    assert tuner.ledger()[0]["adopted_from"] == [str(r.path) for r in groups["reference"]]
    # a promoted arm that no longer changes the best (a kept round took it to the arm's lr) is noted, not run
    from helpers.tune.autotune import AutotuneResult, Candidate
    from helpers.tune.ttq_search import _Plan, _run_promoted, _Search
    best = tuner.best_config()
    same_lr = Candidate("recipe_same_lr", "recipe", {"lr": best.lr, "steps": best.steps // 2}, "test")
    ctx = _Search(tuner, AutotuneResult(path=tuner.path, budget_s=1e6, objective="time_to_target"), time.monotonic(),
                  2.6, 2, 3, False, lambda _: None)
    plan = _Plan(9, best, tuner.best_runs(), 5.0, "", 5.5, 3.0, 1e6, 1.0, 1.0, [same_lr], 0)
    _run_promoted(ctx, plan, [same_lr])
    note = tuner.ledger()[-1]
    assert note["name"] == "recipe_same_lr" and note["decision"] == "not run" and not ctx.result.rounds
    assert note["why"].startswith("promoted but not run: the best moved since its screen: ") and "equals" in note["why"]


@pytest.mark.slow
def test_autotune_time_to_target_explains_every_arm(tmp_path, small_corpus):
    cfg = from_dict(tiny(small_corpus, steps=150, target_val_loss=2.7))
    base = Workbook.create(tmp_path / "base", cfg).baseline(progress=False)
    # the budget from the baseline's pace on this host (a fixed one left a slow CI host no screen): what the
    # tuner's plan estimates (ttq_search._plan, its default overhead for pinned runs) for a round and 2.5
    # screening runs, so at least two arms race
    cap, overhead = time_to_beat(base, 2.7)[0] * CAP_MARGIN, DEFAULT_OVERHEAD_S
    ref_s = sum(r.metrics[-1]["elapsed_s"] for r in base) / len(base) + overhead
    budget_s = (2 * (ref_s + cap + overhead) + 2.5 * (cap + overhead)) * BUDGET_MARGIN
    result = autotune_time_to_target(cfg, tmp_path / "wb", budget_s / 60, 2.7, baseline_runs=base,
                                     log=lambda _: None)
    entries = Workbook.open(tmp_path / "wb").ledger()
    arms = [e for e in entries if e["event"] == "note" and e["decision"] in ("promoted", "dropped")]
    assert arms, [e["name"] for e in entries]
    for e in arms:  # every screened arm: why, its numbers, no time unless it reached the target
        assert e["who"] == "autotune" and e["why"].startswith("Screened in bracket") and e["changes"]
        r = e["reasoning"]
        assert r["reached"] == (r["time_to_target_s"] is not None)
        assert ("did not reach" in e["why"]) != r["reached"]
        assert e["decision"] == "dropped" or r["reached"] and r["time_to_target_s"] < r["best_time_s"]
    fastest = {}  # the race: once an arm reached the target, the next arms of its bracket stop at its time ×margin
    recipe_reached = {}  # and an arm that leaves the recipe alone runs on the fastest recipe arm so far
    for e in arms:
        r = e["reasoning"]
        if r["bracket"] in fastest:
            assert r["screen_cap_s"] <= round(fastest[r["bracket"]] * CAP_MARGIN, 2)
        touches_recipe = bool(set(e["changes"]) & set(RECIPE))
        if recipe_reached.get(r["bracket"]) and not touches_recipe:
            assert r["screened_on"] == min(recipe_reached[r["bracket"]])[1], e["why"]
            assert f"on top of {r['screened_on']}" in e["why"]
        else:
            assert r["screened_on"] is None
        if r["reached"]:
            fastest[r["bracket"]] = min(fastest.get(r["bracket"], math.inf), r["time_to_target_s"])
            if touches_recipe:
                recipe_reached.setdefault(r["bracket"], []).append((r["time_to_target_s"], e["name"]))
    plans = [e for e in entries if e["name"].startswith("bracket_")]
    assert plans and all("cannot beat it" in e["why"] and e["reasoning"]["cap_s"] > 0 for e in plans)
    for e in (e for e in entries if e["event"] == "round"):
        assert e["objective"] == "time_to_target" and e["why"].startswith("Round for ")
    assert entries[-1]["decision"] == "stop" and result.stop_reason in entries[-1]["why"]
    assert result.elapsed_s <= budget_s * 1.5  # plans only what fits; one run may overrun its estimate


def test_the_speed_record_levers_are_tuner_arms_each_one_declared_group(small_corpus):
    from helpers.tune.round_spec import candidate
    from helpers.tune.ttq_levers import LEVERS, lever_arms
    cfg = from_dict(tiny(small_corpus))
    arms = lever_arms(cfg)
    assert [a.name for a in arms] == [name for name, *_ in LEVERS]
    assert {a.family for a in arms} == {"optimizer", "architecture", "recipe"}
    for arm in arms:  # each is a valid time-to-target round on the best, refused nowhere on this CPU
        cand, moved = candidate(cfg, arm.name, arm.changes, "time_to_target")
        assert set(moved) == set(arm.changes) and arm.why
    with_rope = from_dict(tiny(small_corpus, **{"model": {"preset": "debug", "positions": "rope"}}))
    assert "positions_rope" not in [a.name for a in lever_arms(with_rope)]  # already in the best: not an arm


def test_a_lever_is_named_by_its_ttq_levers_name_and_a_wrong_name_lists_the_choices():
    from helpers import lever_changes
    changes, why = lever_changes("optimizer_muon")
    assert changes == {"optimizer": "muon"} and "Newton–Schulz" in why
    with pytest.raises(ValueError, match=r"lever='muon' is not a speed-record lever; choose one of optimizer_muon, "):
        lever_changes("muon")
