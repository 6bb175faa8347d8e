"""Faults with real processes: a kernel killed inside a notebook, a second workbook run on the same folder,
a full disk, a read-only output folder, a round's candidate or the round's own process killed mid-way, and a
ledger append the disk refuses part-way.

(A NaN mid-round is tests/tune/test_rounds.py::test_diverging_candidate_is_failed_and_recorded; kill -9 of a plain
training run and its resume are in tests/test_reliability.py.)
"""
from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from helpers.config import from_dict
from helpers.tune.ledger import Ledger
from helpers.record import load_run, read_metric_rows
from helpers.tune.rounds import Workbook
from tests.conftest import REPO, run_cli, small_tmpfs, tiny_args, wait_for

pytestmark = pytest.mark.slow
PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h



def _notebook(path: Path, *sources: str) -> None:
    nb = new_notebook(cells=[new_code_cell(s) for s in sources],
                      metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})
    nbformat.write(nb, str(path))


def _leftovers(folder: Path) -> list[Path]:
    """Half-written files: atomic-write temps and MindSpore's partial checkpoints."""
    return [p for p in folder.rglob(".*") if p.is_file() and (".tmp" in p.name or p.name.endswith(".part"))]


# ----------------------------------------------------------------------------------- workbook run faults

@pytest.fixture(scope="module")
def faulty_run(tmp_path_factory):
    """One real workbook run (its own process) over three notebooks: the first waits until the test has tried
    a second run into the same folder; the second kills its own kernel; the third must still run."""
    tmp = tmp_path_factory.mktemp("faulty")
    books, out, go = tmp / "notebooks", tmp / "report", tmp / "go"
    books.mkdir()
    _notebook(books / "00_wait.ipynb", f"import os, time\nwhile not os.path.exists({str(go)!r}):\n    time.sleep(0.1)")
    _notebook(books / "01_killed.ipynb", "print('before the kill', flush=True)",
              "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)", "print('never runs')")
    _notebook(books / "02_after.ipynb", "print('the run went on')")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    cmd = [sys.executable, "-m", "helpers", "workbook", "--notebooks", str(books), "--out", str(out)]
    first = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_for(lambda: (out / ".run.lock").is_file() and (out / ".run.lock").read_text().strip(), 60)
        second = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
        go.touch()
        stdout, stderr = first.communicate(timeout=120)
    finally:
        go.touch()
        if first.poll() is None:
            first.kill()
            first.wait()
    return {"out": out, "first_code": first.returncode, "first_out": stdout + stderr, "second": second,
            "holder": first.pid}


def test_killed_kernel_keeps_its_notebook_and_the_run_goes_on(faulty_run):
    out = faulty_run["out"]
    assert faulty_run["first_code"] == 1, faulty_run["first_out"]  # one notebook failed
    log = faulty_run["first_out"]
    assert "01_killed" in log and "DeadKernelError: Kernel died while running cell 2" in log
    assert "02_after" in log.split("01_killed")[1] and "1 notebook(s) failed: 01_killed" in log
    killed = nbformat.read(str(out / "01_killed.ipynb"), as_version=4)
    assert "before the kill" in killed.cells[0].outputs[0].text
    errors = [o for o in killed.cells[1].outputs if o.output_type == "error"]
    assert errors and errors[0].ename == "DeadKernelError" and "signal or out of memory" in errors[0].evalue
    assert killed.cells[2].outputs == []
    after = nbformat.read(str(out / "02_after.ipynb"), as_version=4)
    assert "the run went on" in after.cells[0].outputs[0].text
    index = (out / "index.html").read_text()
    assert '<tr class="failed"><td>01_killed</td>' in index and "2 of 3 notebooks ran; 1 failed" in index


def test_second_workbook_run_on_the_same_folder_is_refused(faulty_run):
    second = faulty_run["second"]
    assert second.returncode == 2
    assert second.stderr.strip().splitlines() == [
        f"error: workbook {str(faulty_run['out'])!r} is busy: process {faulty_run['holder']} holds .run.lock while "
        f"it runs the workbook into it; wait for it to finish and retry"]
    assert (faulty_run["out"] / "00_wait.ipynb").is_file()  # the first run's output, untouched by the second


# ------------------------------------------------------------------------------------------ disk faults

@pytest.fixture
def small_disk(tmp_path):
    """A 1.5 MB tmpfs: room for one tiny-preset checkpoint (1.25 MB), not two. Skips where mount is refused."""
    with small_tmpfs(tmp_path / "disk", "1500k") as mnt:
        yield mnt


@pytest.mark.ci_required  # needs root to mount the tmpfs: CI runs as root, so a skip there is a failure
def test_full_disk_is_one_line_and_keeps_the_record_whole(small_disk, small_corpus, tmp_path):
    run = small_disk / "run"
    # the tiny preset: the disk is sized to its checkpoint
    proc = run_cli("train", *tiny_args(small_corpus, 200, "checkpoint_every=20", "keep_checkpoints=5",
                                       "model.preset=tiny"),
                   "--out", str(run), "--progress", "none")
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]  # MindSpore logs its own CRITICAL line before ours
    assert last.startswith(f"error: cannot write '{run}/checkpoints/step_000040.ckpt' (No space left on device); "
                           f"free disk space or choose another --out folder"), last
    assert last.endswith(f"after fixing it: python -m helpers resume {run})")
    assert _leftovers(run) == []  # MindSpore's partial checkpoint was removed
    record = load_run(run)
    assert record.status == "failed" and "No space left on device" in record.summary["status_reason"]
    assert [r["step"] for r in read_metric_rows(run / "metrics.csv")] == list(range(1, 41))
    assert [p.name for p in record.checkpoints()] == ["step_000020.ckpt"]
    # Whole: after "freeing space" (a copy elsewhere), resume continues from the kept checkpoint.
    moved = tmp_path / "moved"
    shutil.copytree(run, moved)
    proc = run_cli("resume", str(moved), "--steps", "24", "--progress", "none")
    assert proc.returncode == 0, proc.stderr[-2000:]
    resumed = load_run(moved)
    assert resumed.status == "ok" and [r["step"] for r in resumed.metrics] == list(range(1, 25))


@pytest.mark.ci_required  # needs chattr (root-proof read-only folder)
def test_read_only_output_folder_is_one_line_before_training(tmp_path, small_corpus):
    out = tmp_path / "frozen"
    out.mkdir()
    # As root, chmod does not stop writes; the immutable attribute does.
    if subprocess.run(["chattr", "+i", str(out)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not available on this file system (root-proof read-only folder)")
    try:
        proc = run_cli("train", *tiny_args(small_corpus, 5), "--out", str(out), "--progress", "none")
    finally:
        subprocess.run(["chattr", "-i", str(out)], check=True)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"error: cannot create or write '{out}' (Operation not permitted); choose a writable --out folder"]
    assert list(out.iterdir()) == []


# ------------------------------------------------------------------------------------------ round faults

@pytest.fixture(scope="module")
def pinned(tmp_path_factory, small_corpus):
    """A workbook with its baseline pinned (two tiny runs); tests work on copies."""
    # shuffle_buffer 1: a slow-storage candidate's first batch waits for one sample, not for the 4096-sample
    # shuffle buffer (or all its samples) to fill
    cfg = from_dict({"model": {"preset": "debug"}, "data": {"corpus": [str(small_corpus)], "shuffle_buffer": 1},
                     "batch_size": 8, "steps": 12, "warmup": 0, "eval_every": 0, "eval_batches": 2,
                     "steady_after": 3, "threads": 1})
    wb = Workbook.create(tmp_path_factory.mktemp("pinned") / "book", cfg, repeats=2)
    wb.baseline(progress=False)
    return wb


def _copy(wb: Workbook, dest: Path) -> Workbook:
    shutil.copytree(wb.path, dest)
    return Workbook.open(dest)


# 40 ms of simulated storage per sample makes a candidate's 12 steps last ~4 s: time to kill it mid-way.
SLOW = {"data.source_delay_ms": 40.0}


def test_killing_a_rounds_candidate_fails_the_round_and_keeps_the_ledger_whole(pinned, tmp_path):
    wb = _copy(pinned, tmp_path / "book")
    before = (wb.path / "ledger.jsonl").read_text()
    result = {}
    worker = threading.Thread(target=lambda: result.update(r=wb.run_round("slow_storage", SLOW, progress=False)))
    worker.start()
    cand = wb.path / "rounds" / "01_slow_storage" / "candidate"  # the arms take turns, a process each
    try:
        assert wait_for(lambda: (cand / "metrics.csv").is_file(), 120), "the candidate never started training"
        pid = json.loads((cand / "summary.json").read_text())["pid"]
        os.kill(pid, signal.SIGKILL)
    finally:
        worker.join(timeout=120)
    r = result["r"]
    assert r.decision == "failed" and r.verdict.decision == "failed"
    assert f"candidate run 1 (candidate) ended 'interrupted': the training process (pid {pid}) ended" \
           in r.verdict.reason
    assert [p.name for p in r.candidate_runs] == ["candidate"]
    killed = load_run(cand)
    assert killed.status == "interrupted" and 1 <= len(killed.metrics) < 12
    text = (wb.path / "ledger.jsonl").read_text()
    assert text.startswith(before) and len(text.splitlines()) == len(before.splitlines()) + 1
    assert [json.loads(line)["event"] for line in text.splitlines()] == ["baseline", "round"]
    assert wb.best_config() == pinned.best_config() and _leftovers(wb.path) == []


def test_killing_the_round_process_leaves_no_entry_and_the_rerun_moves_leftovers_aside(pinned, tmp_path):
    wb = _copy(pinned, tmp_path / "book")
    before = (wb.path / "ledger.jsonl").read_text()
    script = ("import sys\nfrom helpers.tune.rounds import Workbook\n"
              f"Workbook.open(sys.argv[1]).run_round('r', {SLOW!r}, progress=False)\n")
    # The killed orchestrator's training child (forked by its zygote, helpers/spawn/zygote.py) is orphaned; as a
    # subreaper this process inherits and reaps it (PID 1 here does not), so it does not linger as a zombie that
    # still reads as 'running'.
    libc = ctypes.CDLL(None)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    orchestrator = subprocess.Popen([sys.executable, "-c", script, str(wb.path)], cwd=REPO,
                                    env=dict(os.environ, PYTHONPATH=str(REPO)), start_new_session=True)
    cand = wb.path / "rounds" / "01_r" / "candidate"
    child = None
    try:
        assert wait_for(lambda: (cand / "metrics.csv").is_file(), 120), "the candidate never started training"
        child = json.loads((cand / "summary.json").read_text())["pid"]
    finally:
        os.killpg(orchestrator.pid, signal.SIGKILL)  # the orchestrator, its zygote and training child, mid-round
        orchestrator.wait()
        try:
            if child is not None:
                _reap_orphan(child)
        finally:
            libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
    assert (wb.path / "ledger.jsonl").read_text() == before  # the round never happened, as far as it knows
    reopened = Workbook.open(wb.path)
    assert reopened.rounds() == [] and reopened.best_config() == pinned.best_config()
    assert load_run(cand).status == "interrupted"
    # Rerunning the round (here with a corpus that fails at once, to stay quick) moves the leftovers aside.
    r = reopened.run_round("r", {"data.corpus": [str(tmp_path / "missing.txt")]}, progress=False)
    assert r.index == 1 and r.decision == "failed" and "does not exist" in r.verdict.reason
    (aside,) = (wb.path / "interrupted").iterdir()
    assert aside.name.startswith("rounds_01_r-") and load_run(aside / "candidate").status == "interrupted"
    assert len((wb.path / "ledger.jsonl").read_text().splitlines()) == len(before.splitlines()) + 1


def _reap_orphan(pid: int, timeout_s: float = 30.0) -> None:
    """Wait for `pid` once it is ours: it comes to this subreaper only when its parent (the zygote) has finished
    exiting, which can be just after the orchestrator's wait returns."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            os.waitpid(pid, 0)
            break
        except ChildProcessError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def test_ledger_append_refused_by_the_disk_leaves_no_half_line(tmp_path):
    ledger = tmp_path / "ledger.jsonl"
    Ledger(ledger).append({"event": "baseline", "round": 0})
    before = ledger.read_bytes()
    # A file-size limit just above the ledger makes the next append fail part-way (EFBIG), as a full disk does.
    script = ("import resource, signal, sys\nfrom helpers.tune.ledger import Ledger\nfrom helpers.record import RecordError\n"
              "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
              f"resource.setrlimit(resource.RLIMIT_FSIZE, ({len(before) + 10}, resource.RLIM_INFINITY))\n"
              "try:\n    Ledger(sys.argv[1]).append({'event': 'round', 'round': 1, 'name': 'x' * 200})\n"
              "except RecordError as exc:\n    print(exc)\n    sys.exit(2)\n")
    proc = subprocess.run([sys.executable, "-c", script, str(ledger)], capture_output=True, text=True, cwd=REPO,
                          env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout.strip().splitlines() == [
        f"cannot write '{ledger}' (File too large); raise the file-size limit (ulimit -f) or choose another --out "
        f"folder"]
    assert ledger.read_bytes() == before and Ledger(ledger).entries() == [{"event": "baseline", "round": 0}]
