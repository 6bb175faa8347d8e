"""`python -m helpers tensorboard`: event files that TensorBoard's own reader loads back, with the expected tags."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from helpers.config import from_dict
from helpers.record import load_run
from helpers.tune.rounds import Workbook
from tests.conftest import REPO, run_cli

RECORD = REPO / "tests" / "data" / "record_7c15080"  # a real tiny run (see its README)


def _accumulator(logdir: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def _texts(acc) -> set[str]:
    # tensorboardX stores add_text(tag) as the tensor tag "<tag>/text_summary"
    return {t.removesuffix("/text_summary") for t in acc.Tags()["tensors"]}


def test_a_run_exports_per_step_scalars_that_tensorboard_reads_back(tmp_path):
    proc = run_cli("tensorboard", str(RECORD), "--out", str(tmp_path / "tb"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"tensorboard --logdir {tmp_path / 'tb'}" in proc.stdout
    acc = _accumulator(tmp_path / "tb" / RECORD.name)
    tags = set(acc.Tags()["scalars"])
    assert {"train/loss", "train/lr", "speed/tokens_per_s", "speed/step_time_ms", "memory/rss_MiB"} <= tags
    assert "memory/device_MiB" not in tags  # a CPU run has no device memory: nothing is made up
    metrics = load_run(RECORD).metrics
    loss = acc.Scalars("train/loss")
    assert [e.step for e in loss] == [r["step"] for r in metrics]
    assert [e.value for e in loss] == pytest.approx([r["loss"] for r in metrics], rel=1e-6)
    assert _texts(acc) == {"run/summary"}


def test_without_tensorboardx_the_command_says_so_in_one_line(tmp_path):
    code = ("import sys; sys.modules['tensorboardX'] = None; from helpers.cli import main; "
            f"sys.exit(main(['tensorboard', {str(RECORD)!r}, '--out', {str(tmp_path / 'tb')!r}]))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert proc.stderr.startswith("error: python -m helpers tensorboard needs tensorboardX") and "pip install" in proc.stderr
    assert not (tmp_path / "tb").exists()


def test_a_folder_that_is_no_run_is_refused_before_writing(tmp_path):
    proc = run_cli("tensorboard", str(RECORD), str(tmp_path), "--out", str(tmp_path / "tb"))
    assert proc.returncode == 2 and "neither a run folder" in proc.stderr and not (tmp_path / "tb").exists()


@pytest.mark.slow
def test_a_workbook_exports_each_rounds_runs_as_separate_runs(tmp_path, small_corpus):
    cfg = from_dict({"model": {"preset": "debug"}, "data": {"corpus": [str(small_corpus)]}, "batch_size": 4,
                     "steps": 6, "warmup": 0, "eval_every": 0, "eval_batches": 2, "steady_after": 2, "threads": 1})
    wb = Workbook.create(tmp_path / "wb", cfg, repeats=2)
    wb.baseline(progress=False)
    result = wb.run_round("batch", {"batch_size": 8}, progress=False)
    proc = run_cli("tensorboard", str(wb.path), "--out", str(tmp_path / "tb"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    root = tmp_path / "tb" / "wb"
    runs = sorted(str(p.parent.relative_to(root)) for p in root.rglob("events.out.tfevents.*"))
    round_dir = result.candidate_runs[0].parent.name
    arms = [*result.candidate_runs, *result.reference_runs]  # the round's own run folders, however it measured
    assert runs == sorted(["baseline/run_1", "baseline/run_2"] + [f"rounds/{round_dir}/{p.name}" for p in arms])
    acc = _accumulator(root / "rounds" / round_dir / result.candidate_runs[0].name)
    assert [e.step for e in acc.Scalars("speed/tokens_per_s")] == list(range(1, 7))
    assert _texts(acc) == {"run/summary", "round/verdict"}
    assert _texts(_accumulator(root / "baseline" / "run_1")) == {"run/summary"}


def test_a_long_run_is_written_as_buckets_that_keep_a_spike(tmp_path):
    import shutil

    from helpers.book.tensorboard import TB_POINTS
    from helpers.record import RecordWriter
    from tests.test_record_append import _rows
    run = tmp_path / "long"
    shutil.copytree(RECORD, run)
    (run / "metrics.csv").unlink()
    rows = _rows(3 * TB_POINTS)
    rows[2024]["loss"] = 40.0
    writer = RecordWriter(run)
    for row in rows:
        writer.add(row, now=0.0)
    writer.flush()
    proc = run_cli("tensorboard", str(run), "--out", str(tmp_path / "tb"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    acc = _accumulator(tmp_path / "tb" / "long")
    assert {"train/loss", "train/loss_min", "train/loss_max", "eval/val_loss"} <= set(acc.Tags()["scalars"])
    loss, top = acc.Scalars("train/loss"), acc.Scalars("train/loss_max")
    assert len(loss) == len(top) == TB_POINTS and max(e.value for e in loss) < 20.0  # the mean of 3 steps
    assert max(e.value for e in top) == 40.0 and [e.step for e in top] == [e.step for e in loss]
    assert len(acc.Scalars("eval/val_loss")) == len(rows) // 500  # few points: each one written as it is
    assert "eval/val_loss_max" not in acc.Tags()["scalars"]
