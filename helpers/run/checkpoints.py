"""A run's checkpoints: where a resume starts (the checkpoint and the metrics rows up to it), loading one into the
step Cells, and saving one (metrics first, then the file; the last `keep_checkpoints` kept).

A checkpoint is checkpoints/step_000123.ckpt: the parameters and optimizer state after step 123, with `step` and the
loss scale (`Stepper.parameters_and_state`). It is written to a temp name and renamed, so a killed run never leaves
a half checkpoint; a resume removes the temp file of the attempt that was killed.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

from helpers.config import Config, ConfigError
from helpers.record import METRICS_FILE, RecordWriter, read_metric_rows, write_failure
from helpers.run.schedule import LR_PARAMETERS

CHECKPOINTS_DIR = "checkpoints"


def checkpoint_step(path: Path) -> int:
    """The step a checkpoint file was taken after, from its name step_000123.ckpt."""
    return int(Path(path).stem.split("_")[-1])


def resume_source(resume_from: str) -> tuple[Path, Path]:
    """(run_dir, checkpoint file) from a run directory or a .ckpt path; ConfigError (one line) when it has none."""
    src = Path(resume_from)
    if src.is_file() and src.suffix == ".ckpt":
        return src.parent.parent, src
    ckpts = sorted((src / CHECKPOINTS_DIR).glob("step_*.ckpt")) if src.is_dir() else []
    if not ckpts:
        raise ConfigError(f"resume_from={resume_from!r} has no checkpoint (looked for {src}/checkpoints/"
                          f"step_*.ckpt); pass a run directory with checkpoint_every > 0 or a .ckpt file")
    return src, ckpts[-1]


def check_resumable(cfg: Config) -> None:
    """Refuse, before anything is written, a resume whose checkpoint is already at or past `steps`: training would
    get zero batches and rewrite a finished record as failed."""
    if not cfg.resume_from:
        return
    src, ckpt = resume_source(cfg.resume_from)
    done = checkpoint_step(ckpt)
    if done >= cfg.steps:
        raise ConfigError(f"run {str(src)!r} is finished: its last checkpoint is step {done} of steps={cfg.steps}, "
                          f"so there is nothing to resume (the record is unchanged); to train further pass "
                          f"--steps N (or steps=N) with N > {done}")


def previous_rows(cfg: Config) -> list[dict]:
    """Metrics rows of the run being resumed, up to its checkpoint (read before anything is written)."""
    src_dir, ckpt = resume_source(cfg.resume_from)
    metrics = src_dir / METRICS_FILE
    step = checkpoint_step(ckpt)
    return [r for r in read_metric_rows(metrics) if r["step"] <= step] if metrics.is_file() else []


def restore(cfg: Config, cells: list) -> int:
    """Load the resume checkpoint of `cfg` into the step Cells; return the last finished step."""
    import mindspore as ms
    _, ckpt = resume_source(cfg.resume_from)
    for part in ckpt.parent.glob(".tmp_step_*"):  # a partial write of the killed attempt, never a checkpoint
        part.unlink(missing_ok=True)
    params = ms.load_checkpoint(str(ckpt))
    step = int(params.pop("step").asnumpy())
    for name in LR_PARAMETERS:  # the host sets them (run/schedule.py); an older checkpoint holds a per-step list
        params.pop(name, None)
    for cell in cells:
        ms.load_param_into_net(cell, params, strict_load=False)
    return step


def save_checkpoint(run_dir: Path, writer: RecordWriter, parameters: list, step: int, keep: int) -> None:
    """Metrics first, then the checkpoint of `parameters` after `step`: a resume never finds a checkpoint newer
    than its rows. Keeps the newest `keep` checkpoints; a write the disk refuses raises `record.write_failure`."""
    import mindspore as ms
    writer.flush(time.perf_counter())
    folder = Path(run_dir) / CHECKPOINTS_DIR
    final = folder / f"step_{step:06d}.ckpt"
    tmp = folder / f".tmp_step_{step:06d}.ckpt"
    try:
        ms.save_checkpoint(parameters, str(tmp), append_dict={"step": step})
        os.replace(tmp, final)
    except (OSError, RuntimeError) as exc:  # MindSpore leaves its partial file (.tmp) behind: remove it
        for part in folder.glob(f".tmp_step_{step:06d}.*"):
            part.unlink(missing_ok=True)
        raise write_failure(final, exc) from None
    for old in sorted(folder.glob("step_*.ckpt"))[:-keep]:
        old.unlink(missing_ok=True)
