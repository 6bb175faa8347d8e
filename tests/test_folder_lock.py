"""The writer lock of a folder (helpers/folder_lock.py): one live holder, named to a second writer, dropped by the
kernel when the holder dies, not held by its forked children, and what a reader makes of a 'running' record."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from helpers import folder_lock
from helpers.record import load_run
from tests.conftest import REPO, wait_for

HOLD = """
import os, sys, time
from helpers import folder_lock
folder_lock.hold(sys.argv[1])
if len(sys.argv) > 2:  # a forked child outlives its parent: it must not keep the lock
    if os.fork() == 0:
        time.sleep(30)
        os._exit(0)
print("held", flush=True)
time.sleep(30)
"""


def _holder_process(folder, *extra) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(folder), *extra], cwd=REPO, stdout=subprocess.PIPE,
                            text=True, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_writer_is_refused_naming_the_live_one_and_the_lock_ends_with_it(tmp_path):
    proc = _holder_process(tmp_path / "run")
    try:
        assert folder_lock.holder(tmp_path / "run") == proc.pid
        with pytest.raises(folder_lock.FolderBusy) as busy:
            folder_lock.hold(tmp_path / "run")
        assert f"pid {proc.pid}" in str(busy.value) and "Nothing was written" in str(busy.value)
        assert "\n" not in str(busy.value)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert wait_for(lambda: folder_lock.holder(tmp_path / "run") is None, 10)  # the kernel dropped it
    folder_lock.hold(tmp_path / "run")
    try:
        assert folder_lock.holder(tmp_path / "run") == os.getpid()
        assert (tmp_path / "run" / folder_lock.LOCK_FILE).read_bytes() == b""  # no byte of a record changes
    finally:
        folder_lock.release(tmp_path / "run")


def test_a_forked_child_does_not_keep_its_parents_lock(tmp_path):
    proc = _holder_process(tmp_path / "run", "fork")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert wait_for(lambda: folder_lock.holder(tmp_path / "run") is None, 10)


def _running_record(folder, pid: int) -> None:
    folder.mkdir()
    (folder / "config.yaml").write_text("steps: 10\n")
    (folder / "summary.json").write_text(json.dumps({"status": "running", "pid": pid}))


def test_a_running_record_whose_writer_is_gone_reads_interrupted_even_if_its_pid_is_reused(tmp_path):
    # the pid in the summary is alive (this test's own), but nobody holds the lock: its writer is gone
    run = tmp_path / "run"
    _running_record(run, os.getpid())
    (run / folder_lock.LOCK_FILE).touch()
    record = load_run(run)
    assert record.status == "interrupted"
    assert "before its first step; start it again with: python -m helpers resume" in record.summary["status_reason"]


def test_an_interrupted_run_without_checkpoint_says_resume_cannot_continue_it(tmp_path):
    run = tmp_path / "run"
    _running_record(run, 2 ** 22 + 7)  # no such process
    (run / "metrics.csv").write_text("step,loss\n1,3.5\n2,3.4\n")
    reason = load_run(run).summary["status_reason"]
    assert "after 2 steps and left no checkpoint to continue from" in reason and "--replace" in reason
    assert "resume with" not in reason


def test_a_record_of_a_live_writer_reads_running(tmp_path):
    proc = _holder_process(tmp_path / "run")
    try:
        (tmp_path / "run" / "config.yaml").write_text("steps: 10\n")
        (tmp_path / "run" / "summary.json").write_text(json.dumps({"status": "running", "pid": proc.pid}))
        assert load_run(tmp_path / "run").status == "running"
    finally:
        proc.kill()
        proc.wait()
    assert wait_for(lambda: load_run(tmp_path / "run").status == "interrupted", 10)


def test_launch_into_a_folder_another_process_writes_raises_the_childs_refusal(tmp_path, monkeypatch):
    from helpers.config import from_dict
    from helpers.spawn.runner import launch
    monkeypatch.setenv("WORKBOOK_ZYGOTE", "0")  # a fresh child: refused before it imports MindSpore
    folder_lock.hold(tmp_path / "run")
    try:
        with pytest.raises(RuntimeError, match=r"refused the run: .* is being written by another process \(pid "):
            launch(from_dict({"model": {"preset": "debug"}, "steps": 10}), tmp_path / "run", progress=False)
    finally:
        folder_lock.release(tmp_path / "run")
    assert not (tmp_path / "run" / "summary.json").exists()
