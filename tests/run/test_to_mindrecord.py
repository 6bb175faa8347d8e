"""`prepare --to mindrecord` writes a set chunk by chunk into a temp folder moved into place when whole: a killed or
failed prepare, or a full disk, leaves nothing a run takes for a set."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from helpers.config import from_dict
from helpers.run.mindrecord import PARTIAL, TRAIN_FILE, MindRecordError, locate_set
from helpers.run import to_mindrecord
from helpers.run.to_mindrecord import window_chunks, write_corpus
from tests.conftest import REPO, make_text, run_cli, small_tmpfs, wait_for


def cfg_of(corpus, seq_len: int = 32):
    return from_dict({"model": {"preset": "debug", "seq_len": seq_len}, "data": {"corpus": [str(corpus)]}})


def test_windows_come_in_chunks_that_join_into_the_windows_of_the_whole():
    tokens = np.arange(1000, dtype=np.uint16)  # a token file's ids, as a memory map holds them
    chunks = list(window_chunks(tokens, 8, rows=30))
    whole = np.stack([tokens[s:s + 9] for s in range(0, 1000 - 8, 8)]).astype(np.int32)
    assert [len(c) for c in chunks] == [30, 30, 30, 30, 4] and all(c.dtype == np.int32 for c in chunks)
    assert np.array_equal(np.concatenate(chunks), whole)


def test_a_killed_prepare_leaves_no_set_and_the_next_one_writes_it(tmp_path):
    corpus = tmp_path / "big.txt"
    corpus.write_text(make_text(400_000), encoding="utf-8")  # ≈ 2.3 MB: ≈ 70,000 windows, about a second of writing
    out = tmp_path / "set"
    env = dict(os.environ, GLOG_v="3", PYTHONPATH=str(REPO), WORKBOOK_DATA_CACHE=str(tmp_path / "cache"))
    args = [sys.executable, "-m", "helpers", "prepare", "--to", "mindrecord", "--set", f"data.corpus={corpus}",
            "--set", "model.preset=debug", "--out", str(out)]
    proc = subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert wait_for(lambda: (out / PARTIAL / TRAIN_FILE).exists() or proc.poll() is not None, 120, 0.005)
        proc.send_signal(signal.SIGKILL)  # while FileWriter writes the train windows
    finally:
        proc.kill()
        proc.wait()
    assert (out / PARTIAL).is_dir() and not (out / TRAIN_FILE).exists()
    with pytest.raises(MindRecordError, match="a MindRecord set that `prepare` did not finish.*--replace"):
        locate_set(str(out))
    again = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    assert not (out / PARTIAL).exists() and locate_set(str(out)).val is not None


@pytest.fixture
def small_disk(tmp_path, monkeypatch):
    """A 16 MB tmpfs (MindSpore stops writing MindRecord below about 10 MB free); the token cache elsewhere. Skips
    where mount is refused."""
    monkeypatch.setenv("WORKBOOK_DATA_CACHE", str(tmp_path / "cache"))
    with small_tmpfs(tmp_path / "disk", "16m") as mnt:
        yield mnt


@pytest.mark.ci_required  # needs root to mount the tmpfs: CI runs as root, so a skip there is a failure
def test_a_full_disk_is_one_line_saying_how_much_the_set_needs_and_leaves_no_set(small_disk, tmp_path,
                                                                                  monkeypatch):
    corpus = tmp_path / "c.txt"
    corpus.write_text(make_text(200_000), encoding="utf-8")  # 1 MB: 128,000 windows of 9 chars, 11 MB on disk
    out = small_disk / "set"
    cfg = cfg_of(corpus, seq_len=8)
    with pytest.raises(MindRecordError, match=r"^no room for the MindRecord set on the disk of .*\(disk full: 17 MB "
                                              r"were free, the set needs about \d+ MB and MindSpore's writer 10 MB "
                                              r"more\); free disk space or pass an --out folder"):
        write_corpus(cfg, out)  # refused before writing
    assert list(out.iterdir()) == []
    # the check before writing passed (as where free space is misreported): the writes themselves fill the disk
    told = iter([1 << 40])
    monkeypatch.setattr(to_mindrecord, "free_bytes", lambda folder, real=to_mindrecord.free_bytes:
                        next(told, None) or real(folder))
    with pytest.raises(MindRecordError, match=r"^no room for the MindRecord set .*disk full: .*needs about \d+ MB"):
        write_corpus(cfg, out)
    assert list(out.iterdir()) == []
    proc = run_cli("prepare", "--to", "mindrecord", "--set", f"data.corpus={corpus}", "--set", "model.preset=debug",
                   "--set", "model.seq_len=8", "--out", str(small_disk / "cli"))
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and "disk full" in lines[0], proc.stderr[-2000:]
    assert not (small_disk / "cli").exists()  # the folder the command made for the set is gone again
