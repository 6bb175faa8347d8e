"""A checkpoint proves what it is: the step and the run it holds are read from the file (without MindSpore) before
a resume writes anything, a model it cannot fill is refused naming the parameters, and no resume writes a step twice
into metrics.csv.

Every case copies the file the way a user would (`cp` of the checkpoint and its .sha256), so the digest still
matches and only the identity can tell.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from helpers.record import load_run, read_metric_rows
from helpers.run.checkpoints import RUN, STEP
from helpers.run.ckpt_file import read_entries
from tests.conftest import make_text, run_cli, snapshot, stderr_lines, tiny_args

pytestmark = pytest.mark.slow



@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("identity") / "corpus.txt"
    path.write_text(make_text(20000), encoding="utf-8")
    return path


def _train(corpus: Path, out: Path, *extra: str) -> Path:
    proc = run_cli("train", *tiny_args(corpus, 20, "checkpoint_every=5", "keep_checkpoints=4", *extra),
                   "--out", str(out), "--progress", "none")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out


@pytest.fixture(scope="module")
def finished(corpus, tmp_path_factory) -> Path:
    return _train(corpus, tmp_path_factory.mktemp("finished") / "run")


@pytest.fixture(scope="module")
def two_blocks(corpus, tmp_path_factory) -> Path:
    """Another run of another model (two blocks where `finished` has one)."""
    return _train(corpus, tmp_path_factory.mktemp("other") / "run", "model.n_layer=2")


def _copy_over(src: Path, dst: Path) -> None:
    for suffix in ("", ".sha256"):
        target = Path(str(dst) + suffix)
        if target.exists():
            target.chmod(0o644)
        shutil.copyfile(str(src) + suffix, target)


def _own(run: Path, step: int) -> Path:
    return run / "checkpoints" / f"step_{step:06d}.ckpt"


def test_a_checkpoint_holds_its_step_and_its_runs_id_which_a_resume_in_its_folder_keeps(finished, tmp_path):
    entries = read_entries(_own(finished, 20), frozenset({STEP, RUN}))
    run_id = load_run(finished).summary[RUN]
    assert entries[STEP].integer() == 20 and entries[RUN].text() == run_id and len(run_id) == 32
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    (run / "config.yaml").write_text((run / "config.yaml").read_text().replace("\nlr: ", "\nlr: 0.0005  # was "))
    proc = run_cli("resume", str(run), "--steps", "25", "--progress", "none")  # an edited config is the same run
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert load_run(run).summary[RUN] == run_id and read_entries(_own(run, 25), frozenset({RUN}))[RUN].text() == run_id


@pytest.mark.parametrize("source", ["own step 10", "another run's step 15", "another model's step 15"])
def test_resume_refuses_a_checkpoint_that_is_not_what_its_name_and_folder_say(finished, two_blocks, corpus, tmp_path,
                                                                             source):
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    other = {"own step 10": _own(run, 10),
             "another run's step 15": _own(_train(corpus, tmp_path / "seed", "seed=7"), 15),
             "another model's step 15": _own(two_blocks, 15)}[source]
    _copy_over(other, _own(run, 15))
    before = snapshot(run)
    proc = run_cli("resume", str(run), "--checkpoint", "step_000015.ckpt", "--steps", "30", "--progress", "none")
    line, = stderr_lines(proc.stderr)
    assert proc.returncode == 2, proc.stderr[-2000:]
    why = "it holds the state after step 10, not step 15" if source == "own step 10" else \
        "it was saved by another run"
    assert why in line and "nothing was written" in line, line
    assert f"the newest intact one is step_000010.ckpt: resume from it with: python -m helpers resume {run} " \
           f"--checkpoint {_own(run, 10)}" in line, line
    assert snapshot(run) == before


def test_a_model_the_checkpoint_cannot_fill_is_refused_naming_its_parameters(two_blocks, corpus, tmp_path):
    out = tmp_path / "continued"
    proc = run_cli("train", *tiny_args(corpus, 30, f"resume_from={_own(two_blocks, 15)}"), "--out", str(out),
                   "--progress", "none")
    assert proc.returncode != 0
    line = stderr_lines(proc.stderr)[-1]
    assert "holds another model" in line and "parameters this model has not" in line and "blocks.1." in line, line
    assert "no step was trained" in line and not (out / "metrics.csv").exists()


def test_a_resume_from_an_older_checkpoint_writes_each_step_once(finished, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    proc = run_cli("resume", str(run), "--checkpoint", "step_000010.ckpt", "--steps", "25", "--progress", "none")
    assert proc.returncode == 0, proc.stderr[-2000:]
    steps = [r["step"] for r in read_metric_rows(run / "metrics.csv")]
    assert steps == list(range(1, 26))


def test_a_run_killed_before_its_first_checkpoint_names_its_checkpoint_every(finished, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    shutil.rmtree(run / "checkpoints")  # as if killed while its first checkpoint (step 5) was being written
    rows = (run / "metrics.csv").read_text().splitlines(keepends=True)
    (run / "metrics.csv").write_text("".join(rows[:6]))
    summary = json.loads((run / "summary.json").read_text())
    (run / "summary.json").write_text(json.dumps({**summary, "status": "running", "pid": 2 ** 22 + 17}))
    reason = load_run(run).summary["status_reason"]
    assert "before its first checkpoint (checkpoint_every=5) was written whole" in reason, reason
    assert "checkpoint_every=0" not in reason
