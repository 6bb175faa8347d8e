"""Faults of real training processes that must never lose or mix a record: two writers raced into one folder,
Ctrl-C at a random step (and before the first), Ctrl-C in a notebook kernel that launched the run, and a resume
from a damaged newest checkpoint or one that fails before its first step.

Every run is a fresh `python -m helpers` process, as a user starts it from a shell.
"""
from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.record import load_run, read_metric_rows
from tests.conftest import REPO, make_text, run_cli, snapshot, stderr_lines, tiny_args, wait_for

pytestmark = pytest.mark.slow

STEPS = 120  # debug preset, ~4 ms a step: Ctrl-C lands inside the steps, not after them


def _env() -> dict:
    return dict(os.environ, GLOG_v="3", PYTHONPATH=str(REPO))


def _start(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "helpers", *args], cwd=REPO, env=_env(), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)



@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("faults") / "corpus.txt"
    path.write_text(make_text(20000), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory):
    """The uninterrupted run every interrupted one must end equal to: its metrics rows."""
    out = tmp_path_factory.mktemp("reference") / "run"
    proc = run_cli("train", *tiny_args(corpus, STEPS), "--out", str(out), "--progress", "none")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return read_metric_rows(out / "metrics.csv")


# ------------------------------------------------------------------------------------------ one writer

def test_two_writers_raced_twenty_times_one_wins_and_the_record_is_its(corpus, tmp_path):
    for trial in range(20):
        out = tmp_path / f"race_{trial}"
        procs = {seed: _start("train", *tiny_args(corpus, 4, f"seed={seed}"), "--out", str(out), "--progress",
                              "none") for seed in (1, 2)}
        done = {seed: (p.wait(timeout=120), p.stderr.read()) for seed, p in procs.items()}
        winners = [seed for seed, (code, _) in done.items() if code == 0]
        assert len(winners) == 1, (trial, done)
        loser = 3 - winners[0]
        code, err = done[loser]
        assert code == 2, (trial, err)
        line, = stderr_lines(err)
        assert "is being written by another process (pid " in line or "already holds a finished run" in line, line
        record = load_run(out)  # one run's record: its config, all its rows, its checkpoint, nothing of the other
        assert record.status == "ok" and record.config.seed == winners[0]
        assert [r["step"] for r in record.metrics] == [1, 2, 3, 4]
        assert [p.name for p in record.checkpoints()] == ["step_000004.ckpt"]
        assert not (out / "history").exists()


def test_resume_of_a_run_still_training_is_refused(corpus, tmp_path):
    out = tmp_path / "run"
    train = _start("train", *tiny_args(corpus, 20000, "checkpoint_every=20"), "--out", str(out), "--progress",
                   "none")
    try:
        assert wait_for(lambda: len(list((out / "checkpoints").glob("step_*.ckpt"))) >= 1, 120)
        resume = run_cli("resume", str(out), "--steps", "30000")
        line, = stderr_lines(resume.stderr)
        assert resume.returncode == 2 and f"pid {train.pid}" in line and "being written by another process" in line
        prepare = run_cli("prepare", "--to", "mindrecord", "--out", str(out))  # nor another command into it
        assert prepare.returncode == 2 and "holds a run record" in prepare.stderr
    finally:
        train.send_signal(signal.SIGINT)
        train.wait(timeout=120)
    assert train.returncode == 130 and load_run(out).status == "interrupted"


# --------------------------------------------------------------------------------------------- Ctrl-C

def _interrupt_at(corpus: Path, out: Path, step: int) -> tuple[int, str]:
    """Train STEPS steps into `out`, Ctrl-C once the row of `step` is printed; (exit code, stderr)."""
    proc = _start("train", *tiny_args(corpus, STEPS), "--out", str(out), "--progress", "json")
    for line in proc.stdout:
        if json.loads(line)["step"] >= step:
            proc.send_signal(signal.SIGINT)
            break
    proc.stdout.read()
    return proc.wait(timeout=120), proc.stderr.read()


def test_ctrl_c_at_a_random_step_ten_times_resumes_to_the_uninterrupted_losses(corpus, reference, tmp_path):
    rng = random.Random(20261205)
    for trial in range(10):
        out, at = tmp_path / f"run_{trial}", rng.randrange(3, STEPS - 20)
        code, err = _interrupt_at(corpus, out, at)
        assert code == 130, err[-2000:]
        line, = stderr_lines(err)
        record = load_run(out)
        stopped = record.metrics[-1]["step"]
        assert line.startswith("interrupted: interrupted by Ctrl-C after step ") and \
            f"resume with: python -m helpers resume {out}" in line, line
        assert record.status == "interrupted" and at <= stopped < STEPS
        assert [r["step"] for r in record.metrics] == list(range(1, stopped + 1))  # every row flushed
        assert record.checkpoints()[-1].name == f"step_{stopped:06d}.ckpt"  # the step it stopped at
        resumed = run_cli("resume", str(out), "--progress", "none")
        assert resumed.returncode == 0, resumed.stderr[-2000:]
        rows = load_run(out).metrics
        assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
        assert [r["loss"] for r in rows] == [r["loss"] for r in reference], (trial, at)
        assert rows[-1]["val_loss"] == reference[-1]["val_loss"]


def test_ctrl_c_before_the_first_step_records_it_and_resume_starts_it_again(corpus, reference, tmp_path):
    out = tmp_path / "run"
    proc = _start("train", *tiny_args(corpus, STEPS), "--out", str(out), "--progress", "none")
    assert wait_for(lambda: (out / "summary.json").is_file(), 60, poll_s=0.01)  # the record's start is written
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    line, = stderr_lines(err)
    assert "before its first step" in line and f"start it again with: python -m helpers resume {out}" in line
    assert load_run(out).status == "interrupted" and load_run(out).metrics == []
    resumed = run_cli("resume", str(out), "--progress", "none")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert [r["loss"] for r in load_run(out).metrics] == [r["loss"] for r in reference]


NOTEBOOK_CELL = """
import _thread, sys, threading, time
from helpers.config import from_dict
from helpers.spawn.runner import launch
cfg = from_dict({{}}, {sets!r})
threading.Timer({after}, _thread.interrupt_main).start()  # the kernel's Interrupt button
try:
    launch(cfg, {out!r}, progress=False)
except KeyboardInterrupt:
    print("KeyboardInterrupt reached the cell", flush=True)
"""


def test_interrupting_the_kernel_stops_its_training_child_saved(corpus, tmp_path):
    out = tmp_path / "run"
    sets = [s for s in tiny_args(corpus, 200000, "checkpoint_every=0") if s != "--set"]
    script = tmp_path / "cell.py"
    script.write_text(NOTEBOOK_CELL.format(sets=sets, out=str(out), after=6.0))
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=_env(), capture_output=True, text=True,
                          timeout=180)
    assert "KeyboardInterrupt reached the cell" in proc.stdout, proc.stderr[-2000:]
    record = load_run(out)
    assert record.status == "interrupted" and "after step" in record.summary["status_reason"]
    stopped = record.metrics[-1]["step"]
    assert stopped > 0 and record.checkpoints()[-1].name == f"step_{stopped:06d}.ckpt"


# --------------------------------------------------------------------------- resume never harms a record

@pytest.fixture(scope="module")
def finished(corpus, tmp_path_factory) -> Path:
    """A finished 20-step run with checkpoints after steps 15 and 20."""
    out = tmp_path_factory.mktemp("finished") / "run"
    proc = run_cli("train", *tiny_args(corpus, 20, "checkpoint_every=5"), "--out", str(out), "--progress", "none")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert [p.name for p in load_run(out).checkpoints()] == ["step_000015.ckpt", "step_000020.ckpt"]
    return out


def _truncate(p: Path) -> None:
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])


def _overwrite_middle(p: Path) -> None:
    data = bytearray(p.read_bytes())
    data[len(data) // 2: len(data) // 2 + 64] = bytes(64)
    p.write_bytes(bytes(data))


def _truncate_without_digest(p: Path) -> None:
    _truncate(p)
    p.with_name(p.name + ".sha256").unlink()


def _empty(p: Path) -> None:
    p.write_bytes(b"")


@pytest.mark.parametrize("damage", [_truncate, _overwrite_middle, _truncate_without_digest, _empty])
def test_resume_from_a_damaged_newest_checkpoint_names_the_intact_one_and_changes_nothing(finished, tmp_path,
                                                                                          damage):
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    newest = run / "checkpoints" / "step_000020.ckpt"
    newest.chmod(0o644)
    damage(newest)
    before = snapshot(run)
    proc = run_cli("resume", str(run), "--steps", "30", "--progress", "none")
    line, = stderr_lines(proc.stderr)
    assert proc.returncode == 2 and "step_000020.ckpt' is damaged" in line and "nothing was written" in line
    intact = run / "checkpoints" / "step_000015.ckpt"
    way = f"python -m helpers resume {run} --checkpoint {intact}"
    assert f"the newest intact one is step_000015.ckpt: resume from it with: {way}" in line, line
    assert snapshot(run) == before and load_run(run).status == "ok"
    again = run_cli(*way.split()[3:], "--steps", "30", "--progress", "none")  # the way it names works
    assert again.returncode == 0, again.stderr[-2000:]
    record = load_run(run)
    assert record.status == "ok" and [r["step"] for r in record.metrics] == list(range(1, 31))
    old_rows = read_metric_rows(finished / "metrics.csv")
    assert record.metrics[:15] == old_rows[:15]
    aside, = (run / "history").glob("after_step_000015_*")  # what the resume replaced is kept, not lost
    assert read_metric_rows(aside / "metrics.csv") == old_rows and (aside / "step_000020.ckpt").is_file()


def test_resume_with_every_checkpoint_damaged_says_none_is_left(finished, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    for ckpt in (run / "checkpoints").glob("step_*.ckpt"):
        ckpt.chmod(0o644)
        _truncate(ckpt)
    before = snapshot(run)
    proc = run_cli("resume", str(run), "--steps", "30")
    line, = stderr_lines(proc.stderr)
    assert proc.returncode == 2 and "no intact checkpoint is left" in line and snapshot(run) == before


def test_a_resume_that_fails_before_its_first_step_leaves_the_finished_record_byte_identical(finished, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    corpus = Path(load_run(run).config.data.corpus[0])
    cfg = (run / "config.yaml").read_text().replace(str(corpus), str(tmp_path / "gone.txt"))
    (run / "config.yaml").write_text(cfg)  # the corpus the run trained on is gone
    before = snapshot(run)
    proc = run_cli("resume", str(run), "--steps", "30", "--progress", "none")
    line, = stderr_lines(proc.stderr)
    assert proc.returncode == 1 and "does not exist" in line
    assert f"the record in {run} is unchanged (status ok)" in line
    after = snapshot(run)
    note, = [k for k in after if k.startswith("history/resume_")]
    assert {k: v for k, v in after.items() if k != note} == before
    assert json.loads(after[note])["status"] == "failed"


def test_ctrl_c_in_a_run_from_hugging_face_weights_saves_and_exits_130(corpus, tmp_path):
    """preflight reads the weights' headers with numpy before MindSpore starts: a thread numpy's BLAS made then
    must not take Ctrl-C into MindSpore's handler (which answers with SIGTERM, exit -15, nothing saved)."""
    from helpers.run.hf_weights import model_settings
    weights = REPO / "tests" / "data" / "hf_fixtures" / "llama_gqa"
    sets = [f"{k}={v}" for k, v in model_settings(weights).items()]
    out = tmp_path / "run"
    proc = _start("train", *tiny_args(corpus, 100000, f"init_from={weights}", "model.seq_len=32", *sets),
                  "--out", str(out), "--progress", "none")
    assert wait_for(lambda: (out / "metrics.csv").is_file(), 120)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    assert load_run(out).status == "interrupted" and "interrupted by Ctrl-C" in stderr_lines(err)[-1]
