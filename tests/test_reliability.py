"""Faults with real processes: kill -9 mid-run, unusable output folders, bad corpora."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from helpers.record import load_run
from tests.conftest import REPO, run_cli, tiny_args, wait_for

pytestmark = pytest.mark.slow



def test_kill_9_mid_run_leaves_readable_record_and_resume_continues(tmp_path, small_corpus):
    run = tmp_path / "run"
    args = tiny_args(small_corpus, 2000, "checkpoint_every=10", "keep_checkpoints=2")
    env = dict(os.environ, GLOG_v="3", PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, "-m", "helpers", "train", *args, "--out", str(run),
                             "--progress", "none"], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert wait_for(lambda: len(list((run / "checkpoints").glob("step_*.ckpt"))) >= 2, 120)
        assert wait_for(lambda: (run / "metrics.csv").is_file(), 30)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    record = load_run(run)
    assert record.status == "interrupted" and "helpers resume" in record.summary["status_reason"]
    assert record.metrics and [r["step"] for r in record.metrics] == list(range(1, len(record.metrics) + 1))
    # records are written whole or not at all (loaded above); a kill inside a write may leave its temp file
    # a kill inside a checkpoint write may leave its partial file; it is never taken for a checkpoint
    assert all(p.name.startswith("step_") for p in record.checkpoints())
    last_ckpt = int(record.checkpoints()[-1].stem.split("_")[1])

    (run / "checkpoints" / f".tmp_step_{last_ckpt + 10:06d}.tmp").write_bytes(b"partial")  # as a kill mid-write
    (run / ".metrics.csv.k1ll3d.tmp").write_text("step,partial")  # as a kill inside a record's write

    proc = run_cli("resume", str(run), "--steps", str(last_ckpt + 5), "--progress", "none")
    assert proc.returncode == 0, proc.stderr[-2000:]
    resumed = load_run(run)
    assert resumed.status == "ok" and resumed.summary["resumed_from"].endswith(f"step_{last_ckpt:06d}.ckpt")
    assert [r["step"] for r in resumed.metrics] == list(range(1, last_ckpt + 6))
    assert list((run / "history").glob("summary_*.json"))  # the interrupted attempt's summary is kept
    assert not list((run / "checkpoints").glob(".tmp*"))  # resume swept the killed attempt's partial writes
    assert not list(run.glob(".*.tmp"))


def test_unusable_output_folder_is_one_line_error(tmp_path, small_corpus):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    proc = run_cli("train", *tiny_args(small_corpus, 5), "--out", str(blocker / "run"))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "choose a writable --out folder" in lines[0]


@pytest.mark.parametrize("content, words", [
    (None, ["does not exist"]),
    (b"", ["empty"]),
    (bytes(range(256)) * 40, ["UTF-8"]),
    (b"short text", ["seq_len"]),
])
def test_bad_corpus_fails_before_training_with_one_line(tmp_path, content, words):
    corpus = tmp_path / "corpus.txt"
    if content is not None:
        corpus.write_bytes(content)
    proc = run_cli("train", *tiny_args(corpus, 5), "--out", str(tmp_path / "run"), "--progress", "none")
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    for word in words:
        assert word in lines[0]
    record = load_run(tmp_path / "run")
    assert record.status == "failed" and record.metrics == []


def test_resume_of_a_finished_run_refuses_and_changes_nothing(tmp_path, small_corpus):
    run = tmp_path / "run"
    assert run_cli("train", *tiny_args(small_corpus, 6), "--out", str(run), "--progress", "none").returncode == 0
    before = {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()}
    proc = run_cli("resume", str(run), "--progress", "none")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "is finished" in lines[0] and "N > 6" in lines[0], proc.stderr
    assert {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()} == before
    assert load_run(run).status == "ok"
