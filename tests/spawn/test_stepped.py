"""A speed round's two arm processes taking turns (helpers/spawn/stepped.py): real arm processes of the debug preset,
woven step by step in ABBA pairs, each completing its own record; an arm that cannot be built ends the round."""
from __future__ import annotations

import json

import pytest

from helpers.config import with_changes
from helpers.paired import Measurement, SpeedPlan, turn_steps
from helpers.run.profile import warmup_steps
from helpers.spawn.stepped import launch_stepped
from helpers.tune.study import base_config
from helpers.wire import PAIRED_FILE

# 2 steps per arm per pair, at most 3 pairs: a round of seconds
PLAN = SpeedPlan(block_steps=2, looks=(2, 3), alphas=(0.005, 0.005), interleave="steps").to_dict()


def _tiny(corpus, **changes):
    # the warm-up is steady_after = 6 steps; 10 steps then end the record inside the second pair, so the third
    # pair's steps are measurement-only
    return base_config("debug", 10, str(corpus), {"steady_after": 6, "eval_every": 0, "eval_batches": 2,
                                                 "threads": 1, **changes})


def test_the_warm_up_covers_steady_after_and_the_profiler_window(small_corpus):
    cfg = _tiny(small_corpus)
    assert warmup_steps(cfg) == 6
    assert warmup_steps(with_changes(cfg, {"steady_after": 9})) == 9
    profiled = with_changes(cfg, {"steps": 30, "monitor.profile_steps": 4, "monitor.profile_start": 8})
    assert warmup_steps(profiled) == 11  # the window's last step


@pytest.mark.slow
def test_two_arm_processes_take_turns_step_by_step_and_complete_their_records(tmp_path, small_corpus):
    ref, cand = _tiny(small_corpus), _tiny(small_corpus, **{"model.n_layer": 2})
    looked = []

    def stop(m: Measurement) -> bool:
        looked.append((len(m), m.tokens))
        return False  # the plan's last look ends it: 3 pairs
    reference, candidate, out, error = launch_stepped(ref, cand, tmp_path / "round", PLAN, stop, progress=False,
                                                      desc="round 1 layers")
    assert error == "" and out["status"] == "ok", out["reason"]
    assert looked == [(1, (ref.tokens_per_step, cand.tokens_per_step)), (2, looked[0][1]), (3, looked[0][1])]
    # each arm's block: 2 turns, every pair; a turn is as long as one step of the slower arm (sized alone)
    assert all(len(out["sizing_ms"][arm]) == 3 for arm in ("reference", "candidate"))
    assert out["turn_steps"] == turn_steps(out["sizing_ms"])
    assert [len(r) for pair in out["pairs"] for r in pair] == [2 * out["turn_steps"]["reference"],
                                                               2 * out["turn_steps"]["candidate"]] * 3
    assert out["first_in_pair"] == ["reference", "candidate", "reference"]  # ABBA over the pairs
    assert len(out["waits"]) == len(out["foreign_cores"]) == 3 and out["warmup_steps"] == 6
    assert all(len(out["warmup_ms"][arm]) == 6 for arm in ("reference", "candidate"))
    assert json.loads((tmp_path / "round" / PAIRED_FILE).read_text())["pairs"] == [
        [list(r), list(c)] for r, c in out["pairs"]]
    for record, layers in ((reference, 1), (candidate, 2)):
        assert record.status == "ok" and len(record.metrics) == 10  # its own steps, not the measurement-only ones
        # each keeps the compile cache: the measurement-only steps are outside the graph, the arms' graphs differ
        assert record.config.model.n_layer == layers and record.config.compile_cache is True
        assert "compile_cache_off" not in record.summary
        assert record.summary["process_start"] == "fresh"  # an arm is a process of its own
        assert (record.path / "train.log").is_file()
    assert not list((tmp_path / "round").glob(".*.yaml"))  # the arms' request files are removed


@pytest.mark.slow
def test_a_stop_rule_ends_the_measurement_and_the_records_are_still_completed(tmp_path, small_corpus):
    cfg = _tiny(small_corpus)
    reference, candidate, out, error = launch_stepped(cfg, cfg, tmp_path / "aa", PLAN, lambda m: len(m) == 1,
                                                      progress=False)
    assert error == "" and out["status"] == "ok" and len(out["pairs"]) == 1
    assert reference.status == candidate.status == "ok"
    assert len(reference.metrics) == len(candidate.metrics) == 10  # trained to the end after the measurement


@pytest.mark.slow
def test_an_arm_that_cannot_be_built_fails_the_round_and_stops_the_other(tmp_path, small_corpus):
    ref, bad = _tiny(small_corpus), _tiny(small_corpus, **{"model.vocab_size": 8})  # below the tokenizer's
    reference, candidate, out, error = launch_stepped(ref, bad, tmp_path / "round", PLAN, lambda m: False,
                                                      progress=False)
    assert out["status"] == "failed" and out["pairs"] == []
    assert out["reason"].startswith("the candidate arm could not be built: DataError: the tokenizer (char) has 30 "
                                    "tokens and the model's vocabulary model.vocab_size=8 is smaller"), out["reason"]
    assert candidate.status == "failed" and "model.vocab_size=8" in candidate.summary["status_reason"]
    # the reference stops where it is: told so, or (not yet built when the other failed) by its closed socket; a
    # reference killed before it could say it was built reads as interrupted. The candidate fails in its data
    # check, within a second: a reference that had not yet connected by then never began a record, and the round
    # says so.
    if reference is None:
        assert error.startswith("the reference arm left no record (the candidate arm could not be built"), error
    else:
        assert error == "" and reference.status in ("stopped", "interrupted") and reference.metrics == []


@pytest.mark.slow
def test_under_a_shared_zygote_the_arms_are_forked_from_it_in_groups_of_their_own(tmp_path, small_corpus):
    from helpers.spawn import zygote
    from helpers.spawn.runner import child_env
    cfg = _tiny(small_corpus)
    with zygote.shared(child_env()):
        reference, candidate, out, error = launch_stepped(cfg, cfg, tmp_path / "aa", PLAN, lambda m: len(m) == 2,
                                                          progress=False)
    assert error == "" and out["status"] == "ok" and len(out["pairs"]) == 2  # frozen and woken, pair after pair
    for record in (reference, candidate):
        assert record.status == "ok" and len(record.metrics) == 10
        assert record.summary["process_start"] == "forked"
        assert record.summary["fixed_cost_s"]["import"] < 0.5  # MindSpore came imported (fresh: ~3 s here)
