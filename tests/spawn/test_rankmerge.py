"""Merging a data-parallel run's ranks (helpers/spawn/rankmerge.py): rank files into the run's one record, and the
ranks' block times of a paired round into paired.json. The rank files are written through helpers/wire.py, as
every msrun rank writes them (spawn/dp_worker.py)."""
from __future__ import annotations

import json
import shutil

import pytest

from helpers.record import load_run
from helpers.spawn.rankmerge import merge_pairs, merge_ranks
from helpers.wire import PAIRED_FILE, RankFile, encode_rank_file, paired_rank_file, rank_file
from tests.conftest import REPO

RECORD = REPO / "tests" / "data" / "record_7c15080"  # a 12-step record of one process: rank 0's own


def _write(run_dir, rank: RankFile) -> None:
    path = rank_file(run_dir, rank.rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(encode_rank_file(rank))


def _rows(run, scale: float, loss_shift: float, drop=()):
    return [{"step": r["step"], "step_time_ms": r["step_time_ms"] * scale, "data_wait_ms": r["data_wait_ms"] * scale,
             "loss": r["loss"] + loss_shift, "grad_norm": r["grad_norm"]} for r in run.metrics if r["step"] not in drop]


def test_two_ranks_merge_into_the_slowest_time_and_the_mean_loss_per_step(tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(RECORD, run_dir)
    run = load_run(run_dir)
    comm = {"first_step": 4, "steps": 5, "comm_ms_per_step": 2.0, "allreduce_calls_per_step": 1.0,
            "op_ms_per_step": 1.5}
    _write(run_dir, RankFile(0, 2, "ok", 1, 30.0, 700 * 2 ** 20, _rows(run, 1.0, 0.0), comm))
    _write(run_dir, RankFile(1, 2, "ok", 1, 31.0, 650 * 2 ** 20, _rows(run, 1.5, 0.2, drop=(12,)),
                             {**comm, "comm_ms_per_step": 4.0}))
    summary = merge_ranks(run_dir)
    merged = load_run(run_dir)
    # step 12 is missing from rank 1: only the steps every rank finished are kept
    assert [r["step"] for r in merged.metrics] == list(range(1, 12))
    for mine, before in zip(merged.metrics, run.metrics):
        assert mine["step_time_ms"] == pytest.approx(1.5 * before["step_time_ms"])  # the slower rank's
        assert mine["data_wait_ms"] == pytest.approx(1.5 * before["data_wait_ms"])
        assert mine["loss"] == pytest.approx(before["loss"] + 0.1)  # the mean of the shards' losses
        assert mine["tokens_per_s"] == pytest.approx(before["tokens"] / (mine["step_time_ms"] / 1000.0))
    assert merged.metrics[0]["loss_ema"] == pytest.approx(merged.metrics[0]["loss"])  # recomputed from the merge
    window = [r["step_time_ms"] for r in merged.metrics if 4 <= r["step"] < 9]
    assert summary["comm_ms_per_step"] == 3.0 and summary["comm_window"] == [4, 8]
    assert summary["comm_step_share"] == pytest.approx(3.0 / (sum(window) / len(window)))
    assert (summary["ranks_merged"], summary["rank_status"]) == (2, ["ok", "ok"])
    assert summary["peak_memory_bytes"] == 700 * 2 ** 20 and summary["peak_memory_bytes_all_ranks"] == 1350 * 2 ** 20
    written = merged.summary  # what merge_ranks returned is what summary.json now says
    assert (written["ranks_merged"], written["comm_ms_per_step"]) == (2, 3.0)
    assert written["step_time_source"] == "per step, the slowest rank's time (median over the steady window)"
    assert merge_ranks(tmp_path / "no_ranks_here") is None


def test_a_rank_without_a_profile_leaves_the_comm_share_unmeasured(tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(RECORD, run_dir)
    run = load_run(run_dir)
    for rank in (0, 1):
        _write(run_dir, RankFile(rank, 2, "ok", 1, 30.0, 2 ** 30, _rows(run, 1.0, 0.0), None))
    summary = merge_ranks(run_dir)
    assert summary["comm_step_share"] is None and "not measured" in summary["comm_source"]


def test_paired_rank_times_merge_to_the_slowest_rank_per_step(tmp_path):
    base = {"block_steps": 2, "first_in_pair": ["reference", "candidate", "reference"], "status": "ok",
            "reason": ""}
    (tmp_path / paired_rank_file(0)).write_text(json.dumps(
        {**base, "pairs": [[[10, 12], [20, 21]], [[11, 9], [19, 30]], [[5, 5], [5, 5]]]}))
    (tmp_path / paired_rank_file(1)).write_text(json.dumps(
        {**base, "pairs": [[[13, 11], [18, 22]], [[10, 10], [25, 20]]], "status": "ended", "reason": "nan"}))
    merged = merge_pairs(tmp_path)
    # the pairs every rank finished, each step the slower rank's; the worse status wins
    assert merged["pairs"] == [[[13, 12], [20, 22]], [[11, 10], [25, 30]]]
    assert merged["first_in_pair"] == ["reference", "candidate"] and merged["ranks_merged"] == 2
    assert (merged["status"], merged["reason"]) == ("ended", "nan")
    assert json.loads((tmp_path / PAIRED_FILE).read_text()) == merged
    assert merge_pairs(tmp_path / "nothing") is None
