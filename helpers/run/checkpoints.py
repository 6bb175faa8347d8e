"""A run's checkpoints: where a resume starts (the checkpoint and the metrics rows up to it), loading one into the
step Cells, and saving one (metrics first, then the file; the last `keep_checkpoints` kept).

A checkpoint is checkpoints/step_000123.ckpt: the parameters and optimizer state after step 123, with the loss scale
(`Stepper.parameters_and_state`), `step` and `run_id` (`run_id`: the run that saved it, as its summary.json names it),
so a file renamed, copied from another run or over another step is refused before a resume writes anything
(`identity_damage`), and a model it cannot fill is refused at load, naming the parameters (`restore`). A run's id
outlives edits of its config.yaml (a corpus moved, a learning rate changed for the rest of the run). It is written to a temp name and renamed, so a killed run never leaves
a half checkpoint; a resume removes the temp file of the attempt that was killed. Beside it, step_000123.ckpt.sha256
holds the SHA-256 of its bytes, so a resume can tell a damaged file (truncated, overwritten, bytes flipped) from an
intact one before anything is written (`damage`), without MindSpore.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import uuid
from pathlib import Path

from helpers.config import Config, ConfigError
from helpers.record import (HISTORY_DIR, METRICS_FILE, SUMMARY_FILE, KeptRows, RecordError, RecordWriter,
                            atomic_write_json, atomic_write_text, kept_rows, write_failure)
from helpers.run.ckpt_file import read_entries
from helpers.run.schedule import LR_PARAMETERS

CHECKPOINTS_DIR = "checkpoints"
DIGEST_SUFFIX = ".sha256"
STEP, RUN = "step", "run_id"  # which step of which run a checkpoint holds (the run id: summary.json's too)


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _layout_damage(path: Path) -> str:
    """Why `path` is not a whole MindSpore checkpoint ("" when it is): its records must end exactly at the end of
    the file, and one of them must be the `step` this tool appends."""
    try:
        entries = read_entries(path)
    except ValueError as exc:
        return f"truncated or not a MindSpore checkpoint: {exc}"
    if STEP not in entries:
        return "not a checkpoint of this tool: it holds no 'step'"
    return ""


def damage(path: str | os.PathLike) -> str:
    """Why the checkpoint file `path` cannot be resumed from, or "" when it is intact: missing or empty, bytes that
    differ from the SHA-256 written when it was saved, or (a checkpoint saved before digests) a protobuf layout that
    is cut short."""
    path = Path(path)
    try:
        if path.stat().st_size == 0:
            return "it is empty"
        digest = path.with_name(path.name + DIGEST_SUFFIX)
        if digest.is_file():
            want = digest.read_text(encoding="ascii", errors="replace").split()[:1]
            return "" if want == [_digest(path)] else \
                "its bytes differ from the SHA-256 written when it was saved (truncated or overwritten)"
        return _layout_damage(path)
    except OSError as exc:
        return f"it cannot be read ({exc.strerror})"


def checkpoint_files(run_dir: str | os.PathLike) -> list[Path]:
    """A run's checkpoint files, oldest first."""
    return sorted((Path(run_dir) / CHECKPOINTS_DIR).glob("step_*.ckpt"))


def resume_hint(run_dir: str | os.PathLike, has_rows: bool, checkpoint_every: int) -> str:
    """What `resume` can do with the run in `run_dir` if it ends now: continue from its last checkpoint, start again
    (no step was recorded: `has_rows` False), or nothing (steps recorded, no checkpoint)."""
    if checkpoint_files(run_dir):
        return f"resume with: python -m helpers resume {run_dir}"
    if not has_rows:
        return f"start it again with: python -m helpers resume {run_dir}"
    if checkpoint_every:
        return (f"no checkpoint to continue from (it ended before its first, checkpoint_every={checkpoint_every}, "
                f"was written whole); train it again with --replace")
    return "no checkpoint to continue from (checkpoint_every=0 saves only at the end); train it again with --replace"


def damaged_line(ckpt: Path, why: str, run_dir: Path, export_to: str | None = None) -> str:
    """The one line refusing a resume (or, with `export_to`, an export into that folder) from the damaged `ckpt`:
    why, and the newest intact checkpoint to use instead (its command), or that none is left."""
    older = [p for p in reversed(checkpoint_files(run_dir)) if checkpoint_step(p) < checkpoint_step(ckpt)]
    intact = next((p for p in older if not damage(p) and not identity_damage(p, run_dir)), None)
    if intact is None:
        way = (f"no intact checkpoint is left in {run_dir}/checkpoints; train it again into another --out folder "
               f"(or with --replace)")
    elif export_to is not None:
        way = (f"the newest intact one is {intact.name} (the model after step {checkpoint_step(intact)}): export "
               f"it with: python -m helpers export {intact} --out {export_to}")
    else:
        way = (f"the newest intact one is {intact.name}: resume from it with: python -m helpers resume {run_dir} "
               f"--checkpoint {intact} (steps {checkpoint_step(intact) + 1}–{checkpoint_step(ckpt)} train again)")
    return f"checkpoint {str(ckpt)!r} is damaged ({why}); nothing was written; {way}"


def checkpoint_step(path: Path) -> int:
    """The step a checkpoint file was taken after, from its name step_000123.ckpt."""
    return int(Path(path).stem.split("_")[-1])


def resume_source(resume_from: str) -> tuple[Path, Path]:
    """(run_dir, checkpoint file) from a run directory or a .ckpt path; ConfigError (one line) when it has none."""
    src = Path(resume_from)
    if src.is_file() and src.suffix == ".ckpt":
        return src.parent.parent, src
    ckpts = checkpoint_files(src) if src.is_dir() else []
    if not ckpts:
        raise ConfigError(f"resume_from={resume_from!r} has no checkpoint (looked for {src}/checkpoints/"
                          f"step_*.ckpt); pass a run directory with checkpoint_every > 0 or a .ckpt file")
    return src, ckpts[-1]


def run_id(cfg: Config, run_dir: Path) -> str:
    """The id of the run `cfg` trains into `run_dir`, for its summary and checkpoints: the id of the run it continues
    in that same folder (a resume), else a new one. A run resumed from another folder's checkpoint is a new run."""
    if cfg.resume_from:
        src = resume_source(cfg.resume_from)[0]
        if src.resolve() == Path(run_dir).resolve():
            return recorded_run_id(src) or uuid.uuid4().hex
    return uuid.uuid4().hex


def recorded_run_id(run_dir: Path) -> str | None:
    """The run id in `run_dir`'s summary.json; None for a record written before run ids (or unreadable)."""
    try:
        return json.loads((run_dir / SUMMARY_FILE).read_text(encoding="utf-8")).get(RUN)
    except (OSError, ValueError, AttributeError):
        return None


def identity_damage(ckpt: Path, run_dir: Path) -> str:
    """Why `ckpt` is not what its name and folder say ("" when it is): the step it holds differs from its name's,
    or the run that saved it is not the run of `run_dir` (its summary's run id). A checkpoint or record written
    before run ids is checked by its step only."""
    try:
        entries = read_entries(ckpt, frozenset({STEP, RUN}))
    except ValueError as exc:
        return f"truncated or not a MindSpore checkpoint: {exc}"
    held, named = entries[STEP].integer() if STEP in entries else None, checkpoint_step(ckpt)
    if held is None:
        return "not a checkpoint of this tool: it holds no 'step'"
    if held != named:
        return (f"it holds the state after step {held}, not step {named} as its name says (renamed or copied over "
                f"another checkpoint)")
    saved_by, own = entries[RUN].text() if RUN in entries else None, recorded_run_id(run_dir)
    if saved_by is not None and own is not None and saved_by != own:
        return (f"it was saved by another run (run id {saved_by[:12]}…, this folder's run is {own[:12]}…): copied "
                f"in from another folder")
    return ""


def check_resumable(cfg: Config) -> None:
    """Refuse, before anything is written, a resume from a damaged checkpoint (`damaged_line`), from one whose
    step or run is not what its name and folder say (`identity_damage`), or from one already at or past `steps`
    (training would get zero batches)."""
    if not cfg.resume_from:
        return
    src, ckpt = resume_source(cfg.resume_from)
    why = damage(ckpt) or identity_damage(ckpt, src)
    if why:
        raise ConfigError(damaged_line(ckpt, why, src))
    done = checkpoint_step(ckpt)
    if done >= cfg.steps:
        raise ConfigError(f"run {str(src)!r} is finished: its last checkpoint is step {done} of steps={cfg.steps}, "
                          f"so there is nothing to resume (the record is unchanged); to train further pass "
                          f"--steps N (or steps=N) with N > {done}")


def resumed_rows(cfg: Config) -> KeptRows:
    """What the resume of `cfg` keeps of the run's metrics rows: those up to its checkpoint (read before anything is
    written; `record.kept_rows`)."""
    src_dir, ckpt = resume_source(cfg.resume_from)
    return kept_rows(src_dir / METRICS_FILE, checkpoint_step(ckpt))


def supersede(cfg: Config, rows_after: bool) -> None:
    """What a resume from an older checkpoint than the run's last replaces, kept under history/ when its first
    step is written: the metrics rows after that checkpoint (`rows_after`: there are some; the whole old
    metrics.csv is kept) and the newer checkpoints, which would otherwise be taken as the newest again."""
    src, ckpt = resume_source(cfg.resume_from)
    step, stamp = checkpoint_step(ckpt), time.strftime("%Y%m%d-%H%M%S")
    history = src / HISTORY_DIR
    newer = [p for p in checkpoint_files(src) if checkpoint_step(p) > step]
    if not newer and not rows_after:
        return
    aside = history / f"after_step_{step:06d}_{stamp}"
    aside.mkdir(parents=True, exist_ok=True)
    if rows_after:  # a copy: the resumed run's first row makes metrics.csv anew from the rows up to `step`
        shutil.copy2(src / METRICS_FILE, aside / METRICS_FILE)
    for p in newer:
        os.replace(p, aside / p.name)
        digest = p.with_name(p.name + DIGEST_SUFFIX)
        if digest.is_file():
            os.replace(digest, aside / digest.name)


def note_attempt(run_dir: str | os.PathLike, note: dict) -> Path:
    """Keep what became of a resume that ended before its first new step (its status, reason, traceback) in
    history/resume_<time>.json, the record it continues untouched; returns the note's path."""
    history = Path(run_dir) / HISTORY_DIR
    history.mkdir(exist_ok=True)
    path = history / f"resume_{time.strftime('%Y%m%d-%H%M%S')}_{os.getpid()}.json"
    atomic_write_json(path, {**note, "at": time.strftime("%Y-%m-%dT%H:%M:%S")})
    return path


def restore(cfg: Config, cells: list) -> int:
    """Load the resume checkpoint of `cfg` into the step Cells; return the last finished step."""
    import mindspore as ms
    _, ckpt = resume_source(cfg.resume_from)
    for part in ckpt.parent.glob(".tmp_step_*"):  # a partial write of the killed attempt, never a checkpoint
        part.unlink(missing_ok=True)
    params = ms.load_checkpoint(str(ckpt))
    step = int(params.pop(STEP).asnumpy())
    params.pop(RUN, None)
    for name in LR_PARAMETERS:  # the host sets them (run/schedule.py); an older checkpoint holds a per-step list
        params.pop(name, None)
    unfilled = _unfilled(params, cells)
    if unfilled:
        raise ConfigError(f"checkpoint {str(ckpt)!r} holds another model: {unfilled}; no step was trained; resume "
                          f"from a checkpoint this config saved, or train with this config into another --out folder")
    for cell in cells:
        ms.load_param_into_net(cell, params, strict_load=False)
    return step


def _unfilled(params: dict, cells: list, shown: int = 3) -> str:
    """What of the step Cells' parameters `params` (a loaded checkpoint) cannot fill, and what it holds that they
    lack, named ("" when it fills them exactly)."""
    wanted = {p.name: tuple(p.shape) for cell in cells for p in cell.get_parameters() if p.name not in LR_PARAMETERS}
    missing = sorted(set(wanted) - set(params))
    shaped = sorted(f"{n} {tuple(params[n].shape)} in the file, {wanted[n]} in the model"
                    for n in set(wanted) & set(params) if tuple(params[n].shape) != wanted[n])
    extra = sorted(set(params) - set(wanted))
    parts = [f"{len(found)} {what} (first: {', '.join(found[:shown])})"
             for what, found in (("parameters it lacks", missing), ("of another shape", shaped),
                                 ("parameters this model has not", extra)) if found]
    return "; ".join(parts)


def save_checkpoint(run_dir: Path, writer: RecordWriter, parameters: list, step: int, keep: int,
                    identity: str) -> None:
    """Metrics first, then the checkpoint of `parameters` after `step` of the run `identity` (`run_id`): a
    resume never finds a checkpoint newer than its rows. Keeps the newest `keep` checkpoints; a write the disk
    refuses raises `record.write_failure`."""
    import mindspore as ms
    writer.flush(time.perf_counter())
    folder = Path(run_dir) / CHECKPOINTS_DIR
    final = folder / f"step_{step:06d}.ckpt"
    tmp = folder / f".tmp_step_{step:06d}.ckpt"
    digest = final.with_name(final.name + DIGEST_SUFFIX)
    try:
        ms.save_checkpoint(parameters, str(tmp), append_dict={STEP: step, RUN: identity})
        atomic_write_text(digest, f"{_digest(tmp)}  {final.name}\n")  # before the rename: no checkpoint without it
        os.replace(tmp, final)
    except (OSError, RuntimeError, RecordError) as exc:  # MindSpore leaves its partial file (.tmp) behind
        for part in folder.glob(f".tmp_step_{step:06d}.*"):
            part.unlink(missing_ok=True)
        raise exc if isinstance(exc, RecordError) else write_failure(final, exc) from None
    for old in checkpoint_files(run_dir)[:-keep]:
        old.unlink(missing_ok=True)
        old.with_name(old.name + DIGEST_SUFFIX).unlink(missing_ok=True)
