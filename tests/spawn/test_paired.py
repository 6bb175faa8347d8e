"""A paired round on a data-parallel best (helpers/spawn/paired.py): both arms in every rank of one real msrun launch
(tiny preset, 2 ranks), its progress lines read from rank 0's log, the ranks merged into each arm's record and
paired.json."""
from __future__ import annotations

import pytest

from helpers.config import with_changes
from helpers.paired import SpeedPlan
from helpers.spawn.live import listen
from helpers.spawn.paired import launch_pair, show_progress
from helpers.tune.study import base_config
from helpers.wire import (PAIR_REQUEST_FILE, PairDone, PairStart, StepRow, decode_rank_file, encode, encode_row,
                          rank_files)
from tests.conftest import FakeBar


def test_progress_lines_move_the_bar_and_reach_the_listeners():
    bar, heard = FakeBar(), []
    arms = {"reference": {"step": 10, "loss": 3.0, "tokens_per_s": 900.0},
            "candidate": {"step": 10, "loss": None, "tokens_per_s": 950.0}}
    with listen(lambda label, row: heard.append((label, row))):
        show_progress(bar, "fusion", encode(PairStart("candidate")))
        assert bar.postfix == {"building": "candidate"} and heard == []
        show_progress(bar, "fusion", encode(PairDone(3, 8, arms)))
        for line in ("[WARNING] ME(123): a log line", encode_row(StepRow(1, 2.0, 3.0, 4.0)), "{broken"):
            show_progress(bar, "fusion", line)  # not a paired process's message: ignored
    assert heard == [("fusion reference", arms["reference"]), ("fusion candidate", arms["candidate"])]
    assert bar.n == 3 and bar.refreshed == 1
    show_progress(None, "fusion", encode(PairDone(4, 8, arms)))  # no bar: the listeners only, nothing raised


@pytest.mark.slow
def test_both_arms_in_each_rank_of_one_msrun_launch(tmp_path, small_corpus):
    ref = base_config("debug", 12, str(small_corpus), {"steady_after": 2, "eval_every": 0, "eval_batches": 2,
                                                      "batch_size": 8, "parallel.data_parallel": 2,
                                                      "parallel.comm_profile_steps": 0})
    cand = with_changes(ref, {"parallel.comm_fusion": "size"})
    plan = SpeedPlan(block_steps=2, looks=(2,), alphas=(0.01,), interleave="steps").to_dict()
    folder, heard = tmp_path / "round", []
    with listen(lambda label, row: heard.append(label)):
        reference, candidate, raw, error = launch_pair(ref, cand, folder, plan, progress=False, desc="fusion")
    assert error == "" and raw["status"] == "ok", (error, raw and raw["reason"])
    # every rank ran the plan's only look; each block step is the slower rank's
    assert raw["ranks_merged"] == 2 and len(raw["pairs"]) == 2
    assert [len(block) for pair in raw["pairs"] for block in pair] == [2, 2, 2, 2]
    assert heard == ["fusion reference", "fusion candidate", "fusion candidate", "fusion reference"]  # ABBA
    for record, fusion in ((reference, "none"), (candidate, "size")):
        assert record.status == "ok" and len(record.metrics) == 12  # completed after the measurement
        assert record.config.parallel.comm_fusion == fusion and record.summary["ranks_merged"] == 2
        ranks = [decode_rank_file(p.read_text()) for p in rank_files(record.path)]
        assert [(r.rank, r.size, len(r.rows)) for r in ranks] == [(0, 2, 12), (1, 2, 12)]
        assert (record.path / "ranks" / "rank_1" / "summary.json").is_file()  # rank 1 keeps its own record
    assert not (folder / PAIR_REQUEST_FILE).exists() and not list(folder.glob(".*.yaml"))  # the request is gone
    assert (folder / "msrun_logs" / "worker_0.log").is_file()
