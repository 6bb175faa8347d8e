"""Whether a folder may take a new run: a run record is never overwritten, nor mixed with another run's.

A folder holds a record when any file of one is in it (config.yaml, summary.json, metrics.csv, env.json, a
checkpoint): a finished run, a failed or interrupted one, or one still training. `claim` refuses such a folder in
one line that names the ways on (another --out; `resume` for an unfinished run), unless the run resumes into its
own folder. Asked to replace it, `claim` first renames the whole folder, in one rename (atomic on one file system),
to <folder>.replaced-<YYYYmmdd-HHMMSS> beside it. `finished_same` finds a finished run of the same config, for
notebook cells that train into fixed folders and may run twice. Nothing here imports numpy or MindSpore: the CLI
calls it on its fast path.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

from helpers import config as config_mod
from helpers import folder_lock
from helpers.config import Config
from helpers.record import CONFIG_FILE, ENV_FILE, METRICS_FILE, SUMMARY_FILE, RecordError, RunRecord, load_run

RECORD_FILES = (CONFIG_FILE, SUMMARY_FILE, METRICS_FILE, ENV_FILE)
ASIDE = "replaced"  # <folder>.replaced-<time>: where --replace moves an old record
FINISHED = "ok"  # the one status `resume` has nothing left to do for (without a larger --steps)


def record_files(folder: str | os.PathLike) -> list[str]:
    """The run-record files already in `folder`, relative to it; [] for a missing, empty or foreign folder."""
    folder = Path(folder)
    found = [name for name in RECORD_FILES if (folder / name).is_file()]
    return found + [f"checkpoints/{p.name}" for p in sorted((folder / "checkpoints").glob("step_*.ckpt"))]


def resumes_into(folder: str | os.PathLike, resume_from: str) -> bool:
    """Whether `resume_from` (a run folder, or one of its checkpoints/step_N.ckpt) is `folder` itself: a resumed
    run continues its own record there."""
    if not resume_from:
        return False
    source = Path(resume_from)
    source = source.parent.parent if source.suffix == ".ckpt" else source
    return source.resolve() == Path(folder).resolve()


def _state(folder: Path) -> tuple[RunRecord | None, str, int | None]:
    """(the record or None when it cannot be read, its status, the step of its last checkpoint or None)."""
    ckpts = sorted((folder / "checkpoints").glob("step_*.ckpt"))
    last = int(ckpts[-1].stem.split("_")[-1]) if ckpts else None
    try:
        record = load_run(folder)
    except RecordError:
        return None, "incomplete", last
    return record, record.status, last


def refusal(folder: str | os.PathLike) -> str:
    """The one line that refuses a new run in `folder`, which holds a record: what is there, and the ways on."""
    folder = Path(folder)
    if folder_lock.holder(folder) not in (None, os.getpid()):  # its writer is at work, whatever its files read now
        return folder_lock.busy_line(folder)
    record, status, last = _state(folder)
    replace = "--replace (replace=True in Python) moves the old record aside first"
    if status == "running":
        return (f"{str(folder)!r} holds a run that is still training (pid {record.summary.get('pid')}); train into "
                f"another --out folder, or wait for it to end. Nothing was written")
    if status == FINISHED:
        steps = record.summary.get("steps")
        return (f"{str(folder)!r} already holds a finished run (status ok, {steps} steps); train into another "
                f"--out folder, or train it further with: python -m helpers resume {folder} --steps N "
                f"(N > {steps}); {replace}. Nothing was written")
    if last is None:
        return (f"{str(folder)!r} already holds an unfinished run (status {status}, no checkpoint to resume "
                f"from); train into another --out folder; {replace}. Nothing was written")
    return (f"{str(folder)!r} already holds an unfinished run (status {status}, last checkpoint step {last}); "
            f"continue it with: python -m helpers resume {folder}, or train into another --out folder; "
            f"{replace}. Nothing was written")


def move_aside(folder: str | os.PathLike) -> Path:
    """Rename `folder`, whole, to <folder>.replaced-<time> beside it (one rename); returns the new path."""
    folder = Path(folder)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    aside, n = folder.with_name(f"{folder.name}.{ASIDE}-{stamp}"), 1
    while aside.exists():  # two replacements within one second
        n += 1
        aside = folder.with_name(f"{folder.name}.{ASIDE}-{stamp}-{n}")
    try:
        os.rename(folder, aside)
    except OSError as exc:
        raise RecordError(f"cannot move {str(folder)!r} aside to {str(aside)!r} ({exc.strerror}); move it "
                          f"yourself or train into another --out folder") from None
    return aside


def claim(folder: str | os.PathLike, cfg: Config, replace: bool = False) -> str | None:
    """Make `folder` ready for a new run of `cfg`, before anything is written there.

    An empty, missing or foreign folder, or the folder `cfg` resumes from, is taken as it is (None). A folder with
    a record raises RecordError (`refusal`), or with `replace` is moved aside whole (`move_aside`; never a run that
    is still training): the returned line says where it went and why it differed.
    """
    folder = Path(folder)
    if not record_files(folder) or resumes_into(folder, cfg.resume_from):
        return None
    record, status, _ = _state(folder)
    if not replace or status == "running":
        raise RecordError(refusal(folder))
    why = f"status {status}"
    if record is not None:
        changed = config_mod.diff(record.config, cfg)
        why += f"; its config differs in {', '.join(changed)}" if changed else "; same config"
    aside = move_aside(folder)
    return f"moved the earlier run in {folder} ({why}) aside to {aside}; {folder} holds only the new run"


def claim_locked(folder: str | os.PathLike, cfg: Config, replace: bool = False) -> str | None:
    """`claim` by the folder's one writer: its lock is taken first and held for the life of this process
    (`folder_lock.hold`; FolderBusy, one line naming the live writer, when another process has it), and a folder
    moved aside by `replace` leaves the lock with it: the new folder is locked again."""
    if not replace:
        claim(folder, cfg)  # a refusal before the lock file is made writes nothing
    folder_lock.hold(folder)
    moved = claim(folder, cfg, replace)  # again as the folder's one writer
    if moved:
        folder_lock.release(folder)
        folder_lock.hold(folder)
    return moved


def finished_same(folder: str | os.PathLike, cfg: Config) -> RunRecord | None:
    """The finished record (status ok) in `folder` whose config.yaml is `cfg`'s (give cfg with absolute paths, as
    `launch` writes it), else None."""
    record, status, _ = _state(Path(folder))
    if record is None or status != FINISHED:
        return None
    return record if config_mod.dump(record.config) == config_mod.dump(cfg) else None
