"""No command overwrites a run record: training again into the --out of a finished run is refused in one
line before any file is touched; --replace moves the old record aside whole; a config whose arrays cannot fit in
memory is refused before MindSpore is imported."""
from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from helpers.config import from_dict, with_changes
from helpers.record import RecordError, load_run
from helpers.run.footprint import need_bytes
from helpers.run.outdir import claim
from tests.conftest import REPO, run_cli, snapshot, tiny_args

pytestmark = pytest.mark.slow


def train(out, corpus, steps, *extra) -> subprocess.CompletedProcess:
    return run_cli("train", *tiny_args(corpus, steps), *extra, "--out", str(out), "--progress", "none")


@pytest.fixture(scope="module")
def finished(tmp_path_factory, small_corpus):
    """A finished 10-step run (the issue's `--set steps=10`, of the debug preset here) and its bytes."""
    out = tmp_path_factory.mktemp("finished") / "R"
    proc = train(out, small_corpus, 10)
    assert proc.returncode == 0, proc.stderr[-2000:]
    before = snapshot(out)
    assert {"metrics.csv", "config.yaml", "summary.json", "checkpoints/step_000010.ckpt"} <= set(before)
    return out, before


def assert_refused(proc, out, before) -> str:
    """Exit 2, one line on stderr, and the old record byte for byte as it was (nothing added either)."""
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert snapshot(out) == before
    return lines[0]


def test_training_again_into_a_finished_run_is_refused(finished, small_corpus):
    """Issue case 1: the same --out with steps=12 used to overwrite metrics.csv and config.yaml."""
    out, before = finished
    line = assert_refused(train(out, small_corpus, 12), out, before)
    assert line == (f"error: '{out}' already holds a finished run (status ok, 10 steps); train into another --out "
                    f"folder, or train it further with: python -m helpers resume {out} --steps N (N > 10); "
                    f"--replace (replace=True in Python) moves the old record aside first. Nothing was written")


def test_a_run_that_would_fail_at_once_is_refused_too(finished, small_corpus, tmp_path):
    """Issue case 2: a typo'd corpus path used to rewrite the finished record as failed and cut its metrics."""
    out, before = finished
    line = assert_refused(train(out, tmp_path / "tinyshakespear.txt", 12), out, before)
    assert "already holds a finished run" in line


def test_replace_moves_the_whole_old_record_aside(finished, small_corpus, tmp_path):
    out = tmp_path / "R"
    shutil.copytree(finished[0], out)
    before = snapshot(out)
    proc = train(out, small_corpus, 12, "--replace")
    assert proc.returncode == 0, proc.stderr[-2000:]
    (aside,) = [p for p in tmp_path.iterdir() if p.name.startswith("R.replaced-")]
    assert snapshot(aside) == before  # whole, byte for byte
    assert (f"moved the earlier run in {out} (status ok; its config differs in steps) aside to {aside}; {out} holds "
            f"only the new run") in proc.stderr
    new = load_run(out)  # alone in --out: its rows, its checkpoint, no earlier summary in history/
    assert new.status == "ok" and [r["step"] for r in new.metrics] == list(range(1, 13))
    assert [p.name for p in new.checkpoints()] == ["step_000012.ckpt"] and not (out / "history").exists()


def test_a_run_resumed_into_its_own_folder_is_let_through(finished, tmp_path):
    """`resume` (and resume_from=<the --out itself>) continues the record in place; resuming into another folder
    that holds a record is refused like any other run."""
    out, before = finished
    record = load_run(out)
    for source in (out, record.checkpoints()[-1]):
        assert claim(out, with_changes(record.config, {"resume_from": str(source), "steps": 12})) is None
    other = tmp_path / "other"
    shutil.copytree(out, other)
    with pytest.raises(RecordError, match="already holds a finished run"):
        claim(other, with_changes(record.config, {"resume_from": str(out), "steps": 12}))
    assert snapshot(out) == before


def test_seq_len_beyond_memory_is_refused_before_mindspore_is_imported(tmp_path):
    """Issue case 3: model.seq_len=100000 on tinyshakespeare used to reach numpy's 'Unable to allocate 37.3 GiB'
    after the MindSpore import."""
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "helpers", "train", "--set", "model.preset=tiny",
                           "--set", "data.corpus=tinyshakespeare", "--set", "model.seq_len=100000", "--out", str(out)],
                          capture_output=True, text=True, cwd=REPO, timeout=60)
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if not line.startswith("import time:")]
    assert len(lines) == 1 and lines[0].startswith("error: model.seq_len=100000 cannot fit in memory: "), lines
    imported = {line.split("|")[-1].strip().split(".")[0] for line in proc.stderr.splitlines()
                if line.startswith("import time:")}
    assert "helpers" in imported and imported.isdisjoint({"mindspore", "numpy"}), imported
    assert not out.exists()


def test_the_memory_estimate_is_below_what_a_run_takes(finished, small_corpus, tmp_path):
    """The count is a lower bound: going from seq_len 32 to 512 adds at least as much peak RSS as it estimates."""
    out = tmp_path / "long"
    assert train(out, small_corpus, 6, "--set", "model.seq_len=512").returncode == 0
    small, long = load_run(finished[0]), load_run(out)
    measured = long.summary["peak_memory_bytes"] - small.summary["peak_memory_bytes"]
    estimated = need_bytes(long.config) - need_bytes(small.config)
    assert 0 < estimated <= measured, (estimated, measured)
    assert need_bytes(from_dict({"model": {"preset": "debug", "seq_len": 100000}})) > 100 * 2 ** 30
