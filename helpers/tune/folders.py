"""A workbook folder's lifecycle: the marker that makes a folder a workbook (its settings and pinned baseline), the
settings' checks, fresh folders for an operation (an earlier attempt's leftovers moved aside), rollback points and
adopted baseline runs."""
from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from helpers import config as config_mod
from helpers.config import Config
from helpers.record import RunRecord, atomic_write_json, atomic_write_text, write_summary
from helpers.run.devices import check_device
from helpers.run.memory import default_memory_limit
from helpers.tune.ledger import RoundError, now, user

FORMAT = "mindspore-tuning-workbook"
VERSION = 1
MARKER = "workbook.json"
BEST_FILE = "best.yaml"  # the current best config: a mirror of the ledger, rewritten atomically
SETTINGS = ("repeats", "loss_gate", "memory_limit_bytes")
# What adopted baseline runs may differ in from the baseline config: their seed, when a run ends (a run that
# trained past the target reached it at the same second as one that stops there), and the profiler's window (a
# data-parallel run's record carries the window that measured its all-reduces; profiled steps are left out of
# its speed, and the profiler changes no arithmetic).
ADOPTABLE = ("seed", "target_val_loss", "max_time_s", "monitor.profile_steps", "monitor.profile_start")


def checked_settings(cfg: Config, repeats: int, loss_gate: float, memory_limit_bytes: int | None) -> dict:
    """The settings of a new workbook (SETTINGS), each checked (RoundError, one line); memory_limit_bytes None:
    90% of RAM on CPU, of the device's memory on GPU/Ascend."""
    if not isinstance(repeats, int) or isinstance(repeats, bool) or repeats < 1:
        raise RoundError(f"repeats={repeats!r} is not a count of baseline runs; use repeats=1 (a pin: one run) or "
                         f"2 or more (the runs' loss spread widens the loss gate)")
    if not 0 < loss_gate < 1:
        raise RoundError(f"loss_gate={loss_gate!r} must be a fraction in (0, 1), e.g. 0.02 for 2%")
    if memory_limit_bytes is None:  # 90% of RAM on CPU, of the device's memory on GPU/Ascend
        check_device(cfg)  # a device that is not here has no memory total to ask MindSpore for
        memory_limit_bytes = default_memory_limit(cfg.device_target)
        if memory_limit_bytes is None:
            raise RoundError(f"MindSpore reports no memory total for device_target={cfg.device_target}; pass "
                             f"memory_limit_bytes (bytes of device memory the peak may reach)")
    if memory_limit_bytes <= 0:
        raise RoundError(f"memory_limit_bytes={memory_limit_bytes} must be positive (bytes), or None for "
                         f"90% of this machine's RAM")
    return {"repeats": repeats, "loss_gate": loss_gate, "memory_limit_bytes": int(memory_limit_bytes)}


def require_same(path: Path, baseline: Config, settings: dict, cfg: Config, wanted: dict) -> None:
    """RoundError when the workbook at `path` (its `baseline` and `settings`) is not the one asked for (`cfg`,
    `wanted` settings): it names up to three differences."""
    changed = {**config_mod.diff(baseline, cfg),
               **{k: (settings[k], wanted[k]) for k in SETTINGS if settings[k] != wanted[k]}}
    if changed:
        what = ", ".join(f"{k}: {a!r} → {b!r}" for k, (a, b) in list(changed.items())[:3])
        raise RoundError(f"{str(path)!r} already holds a workbook with another baseline or settings "
                         f"({what}); open it with Workbook.open or choose a new folder")


def make_folder(path: Path, cfg: Config, settings: dict) -> None:
    """A new workbook in `path` (new or empty): best.yaml and the marker; RoundError for a folder that holds
    something else or a baseline that resumes another run."""
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise RoundError(f"{str(path)!r} exists and is not a workbook; choose a new or empty folder")
    if cfg.resume_from:
        raise RoundError(f"the baseline has resume_from={cfg.resume_from!r}; pin a baseline that trains "
                         f"from scratch (resume_from='')")
    path.mkdir(parents=True, exist_ok=True)
    marker = {"format": FORMAT, "version": VERSION, "created_at": now(), "created_by": user(),
              **settings, "baseline_config": config_mod.to_dict(cfg)}
    write_best(path, cfg)
    atomic_write_json(path / MARKER, marker)


def read_marker(path: Path) -> tuple[dict, Config]:
    """(settings, baseline config) of the workbook at `path`; RoundError (one line) for a missing, foreign or
    unreadable folder."""
    if not path.is_dir():
        raise RoundError(f"workbook folder {str(path)!r} does not exist; create it with "
                         f"Workbook.create(path, cfg)")
    if not (path / MARKER).is_file():
        raise RoundError(f"{str(path)!r} is not a workbook (no {MARKER}); open a folder made by "
                         f"Workbook.create, or create one")
    try:
        marker = json.loads((path / MARKER).read_text(encoding="utf-8"))
        if marker.get("format") != FORMAT:
            raise ValueError(f"format {marker.get('format')!r}")
        cfg = config_mod.as_written(marker["baseline_config"])
        settings = {k: marker[k] for k in SETTINGS}
    except (ValueError, KeyError, TypeError, AttributeError, OSError) as exc:
        raise RoundError(f"{str(path / MARKER)!r} is unreadable ({str(exc).splitlines()[0]}); it was not "
                         f"written by Workbook.create — create a new workbook") from None
    return settings, cfg


def write_best(path: Path, cfg: Config) -> None:
    """best.yaml of the workbook at `path`: the current best config."""
    atomic_write_text(path / BEST_FILE, config_mod.dump(cfg))


def relative(path: Path, root: Path) -> str:
    """`path` as the ledger names it: relative to the workbook folder `root`, with forward slashes."""
    return Path(path).relative_to(root).as_posix()


def fresh(root: Path, folder: Path) -> Path:
    """An empty `folder` inside the workbook `root`; leftovers of an operation that died before its ledger entry
    are moved aside into root/interrupted/."""
    if folder.exists():
        aside = root / "interrupted" / f"{relative(folder, root).replace('/', '_')}-{time.time_ns()}"
        aside.parent.mkdir(exist_ok=True)
        folder.rename(aside)
    folder.mkdir(parents=True)
    return folder


def save_rollback(folder: Path, cfg: Config, records: list[RunRecord]) -> Path:
    """A rollback point: config.yaml, the last candidate run's summary.json and its last checkpoint (if it saved
    one)."""
    folder.mkdir()
    atomic_write_text(folder / "config.yaml", config_mod.dump(cfg))
    if records:
        last = records[-1]
        write_summary(folder, last.summary)
        ckpts = last.checkpoints()
        if ckpts:
            shutil.copy2(ckpts[-1], folder / ckpts[-1].name)
    return folder


def copy_adopted(runs: list[RunRecord], baseline: Config, folder: Path) -> list[Path]:
    """Copy finished runs of the baseline config into `folder` as run_1, run_2, …; RoundError for a run that did
    not finish or differs in more than ADOPTABLE. Returns the copies' folders."""
    for run in runs:
        other = {k for k in config_mod.diff(baseline, run.config) if k not in ADOPTABLE}
        if run.status != "ok" or other:
            why = f"it ended '{run.status}'" if run.status != "ok" else f"it differs in {', '.join(sorted(other))}"
            raise RoundError(f"cannot pin {str(run.path)!r} as the baseline: {why}; pin finished runs of the "
                             f"baseline config (only {', '.join(ADOPTABLE)} may differ)")
    copies = [folder / f"run_{k}" for k in range(1, len(runs) + 1)]
    for run, copy in zip(runs, copies):
        shutil.copytree(run.path, copy)
    return copies
