"""TensorBoard event files from run records: `python -m helpers tensorboard RUN_OR_WORKBOOK… --out DIR`.

A run becomes one TensorBoard run (`DIR/<run name>/`) with a scalar per metrics column per step and its summary as
text. A workbook becomes one TensorBoard run per run record, named by its place in the workbook
(`DIR/<workbook>/baseline/run_1`, `DIR/<workbook>/rounds/01_batch/candidate_1`, …), so each round shows as its
own group and the round's verdict is attached as text. Then: `tensorboard --logdir DIR`.

A scalar of more than TB_POINTS steps is written as TB_POINTS buckets (`plots.bucketed`): TensorBoard keeps 1,000
points of a scalar by default, a random sample that can drop a spike, and writing every step of a million-step run
took minutes. The bucket's mean goes under the scalar's tag, its extremes under `<tag>_min` and `<tag>_max`.

tensorboardX writes the files (an optional extra: `pip install -e '.[tensorboard]'`); nothing else needs it.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np

from helpers.book.plots import bucketed
from helpers.record import SUMMARY_FILE, RecordError, RunRecord, load_run, memory_label
from helpers.tune.rounds import MARKER, Workbook
from helpers.units import MIB

# metrics.csv column → (TensorBoard tag, scale). Memory in MiB: RSS on CPU, the device allocator's peak off it.
SCALARS = {
    "loss": ("train/loss", 1.0), "loss_ema": ("train/loss_ema", 1.0), "grad_norm": ("train/grad_norm", 1.0),
    "lr": ("train/lr", 1.0), "loss_scale": ("train/loss_scale", 1.0),
    "val_loss": ("eval/val_loss", 1.0), "val_ppl": ("eval/val_ppl", 1.0),
    "tokens_per_s": ("speed/tokens_per_s", 1.0), "step_time_ms": ("speed/step_time_ms", 1.0),
    "data_wait_ms": ("speed/data_wait_ms", 1.0),
    "rss_bytes": ("memory/rss_MiB", 1 / MIB), "device_memory_bytes": ("memory/device_MiB", 1 / MIB),
}
SUMMARY_TEXT = ("status", "steps", "tokens_per_s", "step_time_ms", "mfu", "peak_memory_bytes", "memory_source",
                "loss_last", "val_loss", "bottleneck")
INSTALL = "pip install 'tensorboardX==2.6.5' (or pip install -e '.[tensorboard]')"
TB_POINTS = 1000  # TensorBoard's default sample of a scalar: every point written stays on screen


class TensorBoardError(RuntimeError):
    """The export cannot run (tensorboardX missing); one actionable line."""


def _writer_class():
    try:
        from tensorboardX import SummaryWriter
    except ImportError:
        raise TensorBoardError(f"python -m helpers tensorboard needs tensorboardX, an optional extra that is not "
                               f"installed; {INSTALL}") from None
    return SummaryWriter


def _summary_markdown(record: RunRecord, steps: int) -> str:
    s = record.summary
    rows = [f"| {key if key != 'peak_memory_bytes' else memory_label(s)} | {s.get(key)} |"
            for key in SUMMARY_TEXT if key in s]
    bucketed_note = ([f"{steps:,} steps, written as at most {TB_POINTS:,} points per scalar: a longer scalar's "
                      f"bucket means, their extremes as `<tag>_min` / `<tag>_max`", ""] if steps > TB_POINTS else [])
    return "\n".join([f"run `{record.path}`", "", *bucketed_note, "| key | value |", "|---|---|", *rows])


def write_run(record: RunRecord, logdir: Path, note: str | None = None) -> list[str]:
    """One TensorBoard run at `logdir` from a record; returns the scalar tags written (steps on the x axis)."""
    writer = _writer_class()(logdir=str(logdir))
    cols = record.columns("step", *SCALARS)
    tags = set()
    try:
        for column, (tag, scale) in SCALARS.items():
            curve = bucketed(cols["step"], cols[column] * scale, TB_POINTS)
            series = {tag: curve.y}
            if np.isfinite(cols[column]).sum() > TB_POINTS:
                series.update({f"{tag}_min": curve.lo, f"{tag}_max": curve.hi})
            steps = curve.x.astype(np.int64).tolist()
            for name, values in series.items():
                for step, value in zip(steps, values.tolist()):
                    writer.add_scalar(name, value, step)
                    tags.add(name)
        writer.add_text("run/summary", _summary_markdown(record, len(cols)), 0)
        if note:
            writer.add_text("round/verdict", note, 0)
    finally:
        writer.close()
    return sorted(tags)


def _workbook_runs(path: Path) -> list[tuple[RunRecord, str | None]]:
    """(record, verdict text or None) of a workbook's baseline and every round, oldest first."""
    wb = Workbook.open(path)
    out = [(r, None) for r in wb.baseline_runs()]
    for rnd in wb.rounds():
        note = f"round {rnd.index} {rnd.name}: {rnd.decision} — {rnd.verdict.reason}"
        out += [(r, note) for r in wb.load_runs([*rnd.reference_runs, *rnd.candidate_runs])]
    return out


def export_tensorboard(sources: list[str | Path], out: str | Path,
                       before_writing: Callable[[], None] | None = None) -> list[Path]:
    """Write event files for each run or workbook folder in `sources` under `out`; returns the run folders written.

    A source is a run folder (has summary.json) or a workbook folder (has workbook.json). A missing or foreign
    folder raises RecordError (one line) before anything is written; without tensorboardX, TensorBoardError.
    before_writing(): called once every source is read, before the first write (the CLI claims `out` there).
    """
    _writer_class()
    out = Path(out)
    plan: list[tuple[RunRecord, Path, str | None]] = []
    for src in map(Path, sources):
        if (src / MARKER).is_file():
            plan += [(r, out / src.name / r.path.relative_to(src), note) for r, note in _workbook_runs(src)]
        elif (src / SUMMARY_FILE).is_file():
            plan.append((load_run(src), out / src.name, None))
        elif not src.exists():
            raise RecordError(f"{str(src)!r} does not exist; pass run or workbook folders")
        else:
            raise RecordError(f"{str(src)!r} is neither a run folder (summary.json) nor a workbook (workbook.json); "
                              f"pass run or workbook folders")
    names = [str(p) for _, p, _ in plan]
    clash = next((n for n in names if names.count(n) > 1), None)
    if clash:
        raise RecordError(f"two sources would both write {clash!r}; pass folders with different names")
    if before_writing is not None:
        before_writing()
    for record, logdir, note in plan:
        write_run(record, logdir, note)
    return [p for _, p, _ in plan]
