"""The run record: one directory per run, the only thing notebooks, reports and comparisons read.

Layout: config.yaml, metrics.csv (one row per step), summary.json, env.json, tokenizer.json, checkpoints/.
Every file is written whole to a temp name and renamed, so a killed run never leaves a half file; a run
that died while `status` was still `running` is reported as `interrupted` by `load_run`.
"""
from __future__ import annotations

import csv
import errno
import io
import json
import math
import os
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from helpers import folder_lock
from helpers.config import Config, load_written

CONFIG_FILE, METRICS_FILE, SUMMARY_FILE, ENV_FILE = "config.yaml", "metrics.csv", "summary.json", "env.json"
HISTORY_DIR = "history"  # what a resume replaced: earlier summaries, rows and checkpoints after its checkpoint

METRIC_COLUMNS = ["step", "step_time_ms", "data_wait_ms", "tokens", "tokens_per_s", "loss", "loss_ema",
                  "grad_norm", "loss_scale", "overflow", "lr", "rss_bytes", "device_memory_bytes",
                  "val_loss", "val_ppl", "loss_drop_per_ktok", "elapsed_s", "alarms"]
TEXT_COLUMNS = {"alarms"}  # read back as text, not numbers

# 2: the bottleneck is `bottleneck` (was `verdict`), comm shares have a name per quantity, `record_version` itself.
RECORD_VERSION = 2
SUMMARY_KEYS = ["record_version", "status", "status_reason", "steps", "tokens_per_s", "step_time_ms", "step_time_ms_p10",
                "step_time_ms_p90", "warmup_steps", "compile_s", "data_wait_share", "peak_memory_bytes",
                "mfu", "peak_flops", "mfu_hardware", "peak_flops_hardware", "loss_first", "loss_last", "val_loss", "val_ppl", "grad_norm_max",
                "comm_step_share"]
# Keys renamed since version 1 (old → new): one name per quantity.
RENAMED_KEYS = (("verdict", "bottleneck"), ("verdict_evidence", "bottleneck_evidence"),
                # comm time ÷ merged step time (rankmerge); 0.0 for one process
                ("comm_share", "comm_step_share"),
                # comm ops' time ÷ all op time in the profiler window (profile.py)
                ("profile_comm_share", "profile_comm_op_share"))


# Which memory a summary's peak_memory_bytes is (its `memory_source`): process RSS on CPU, where MindSpore's
# allocator counters are always 0; the device allocator's peak on GPU/Ascend (helpers/run/memory.py reads it).
RSS = "process RSS"
DEVICE = "device memory (ms.runtime.max_memory_allocated)"


def memory_source(device_target: str) -> str:
    """The memory a run on `device_target` reports as peak_memory_bytes: RSS on CPU, the device allocator elsewhere."""
    return RSS if device_target == "CPU" else DEVICE


def memory_label(summary_or_source: dict | str | None) -> str:
    """Short column label for a peak-memory figure: 'peak RSS' or 'peak device memory'.

    Takes a summary dict (its `memory_source`) or a source string; records written before the key existed were
    all CPU runs, so a missing source reads as RSS.
    """
    source = (summary_or_source.get("memory_source") if isinstance(summary_or_source, dict)
              else summary_or_source) or RSS
    return "peak device memory" if source == DEVICE else "peak RSS"


class RecordError(ValueError):
    """A run directory that cannot be read or written; one actionable line."""


_WRITE_FIXES = {errno.ENOSPC: "free disk space", errno.EDQUOT: "free disk space (quota)",
                errno.EFBIG: "raise the file-size limit (ulimit -f)", errno.EROFS: "remount it read-write",
                errno.EACCES: "make it writable", errno.EPERM: "make it writable (chattr -i if immutable)"}


def write_failure(path: str | os.PathLike, exc: BaseException) -> RecordError:
    """A one-line RecordError for a write the disk refused (full, read-only, over a size limit), naming the fix."""
    why = getattr(exc, "strerror", None) or (str(exc).splitlines() or [type(exc).__name__])[0]
    fix = _WRITE_FIXES.get(getattr(exc, "errno", None), "check the disk")
    error = RecordError(f"cannot write {str(path)!r} ({why}); {fix} or choose another --out folder")
    error.strerror = why  # callers that word their own message (the corpus cache) reuse the reason
    return error


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write data to path via a temp file in the same folder + fsync + os.replace (never a half file).

    A write the disk refuses raises `write_failure`'s RecordError; the previous file stays whole.
    """
    path = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise write_failure(path, exc) from None
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; records are meant to be shared
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise write_failure(path, exc) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    """UTF-8 text via `atomic_write_bytes` (newlines written as given)."""
    atomic_write_bytes(path, text.encode("utf-8"))


def json_safe(value: Any) -> Any:
    """`value` with NaN/Inf as None and NumPy scalars as Python numbers, so JSON can hold it."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if hasattr(value, "item"):
        return json_safe(value.item())
    return value


def json_text(data: Any) -> str:
    """The text of every JSON file of a record: indented, NaN/Inf as null, one newline at the end."""
    return json.dumps(json_safe(data), indent=2, sort_keys=False) + "\n"


def atomic_write_json(path: Path, data: Any) -> None:
    """JSON (`json_text`) via atomic_write_text."""
    atomic_write_text(path, json_text(data))


def rows_to_csv(rows: list[dict], columns: list[str] = METRIC_COLUMNS) -> str:
    """CSV text of metric rows; missing values are empty cells."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: ("" if v is None else v) for k, v in row.items()})
    return buf.getvalue()


def read_metric_rows(path: Path) -> list[dict]:
    """metrics.csv → list of dicts with floats (empty cells → None, 'step' → int)."""
    rows = []
    with open(path, encoding="utf-8", newline="") as fh:
        for raw in csv.DictReader(fh):
            row = {k: (None if v in ("", None) else v if k in TEXT_COLUMNS else float(v)) for k, v in raw.items()}
            row["step"] = int(row["step"])
            rows.append(row)
    return rows


def _pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass
class RunRecord:
    """A loaded run: config, per-step metrics (list of dict rows), summary, environment."""
    path: Path
    config: Config
    metrics: list[dict]
    summary: dict
    env: dict
    extra: dict = field(default_factory=dict)

    @property
    def status(self) -> str:
        return self.summary.get("status", "unknown")

    def frame(self):
        """Metrics as a pandas DataFrame (imported lazily: plotting code wants it, the trainer does not)."""
        import pandas as pd
        return pd.DataFrame(self.metrics, columns=METRIC_COLUMNS)

    def checkpoints(self) -> list[Path]:
        """Checkpoint files, oldest first."""
        return sorted((self.path / "checkpoints").glob("step_*.ckpt"))

    def speed_rows(self) -> list[dict]:
        """The rows its speed figures come from: the steady window (from the summary's `steady_window`, else
        after `steady_after`), the profiler's window (`profiled_steps`) left out, timed steps only."""
        window = self.summary.get("steady_window")
        first = window[0] if window else self.config.steady_after + 1
        skip = self.summary.get("profiled_steps") or (0, -1)
        return [r for r in self.metrics if r["step"] >= first and not skip[0] <= r["step"] <= skip[1]
                and r.get("step_time_ms") is not None]


def median_summary(records: list[RunRecord], key: str) -> float | None:
    """Median of a summary.json key over runs that have it (units of that key); None when none do."""
    values = [r.summary[key] for r in records if r.summary.get(key) is not None]
    return float(statistics.median(values)) if values else None


def upgrade_summary(summary: dict) -> dict:
    """A summary.json of any earlier record version, read with today's key names (the file is not touched)."""
    if summary.get("record_version", 1) >= RECORD_VERSION:
        return summary
    out = dict(summary)
    for old, new in RENAMED_KEYS:
        if old in out:
            out.setdefault(new, out.pop(old))
    return {**out, "record_version": RECORD_VERSION, "upgraded_from": summary.get("record_version", 1)}


def write_summary(run_dir: str | os.PathLike, summary: dict) -> None:
    """The one writer of summary.json: the SUMMARY_KEYS first (in order), then the rest; atomic."""
    summary = {**summary, "record_version": RECORD_VERSION}
    ordered = {k: summary.get(k) for k in SUMMARY_KEYS}
    atomic_write_json(Path(run_dir) / SUMMARY_FILE, {**ordered, **summary})


def update_summary(run_dir: str | os.PathLike, keys: dict) -> dict:
    """Add or replace `keys` in a run's summary.json (through `write_summary`); returns the new summary."""
    path = Path(run_dir) / SUMMARY_FILE
    summary = {**upgrade_summary(json.loads(path.read_text(encoding="utf-8"))), **keys}
    write_summary(run_dir, summary)
    return summary


def load_run(run_dir: str | os.PathLike) -> RunRecord:
    """Read a run directory. A run whose process died mid-way reads as status 'interrupted'."""
    path = Path(run_dir)
    if not path.is_dir():
        raise RecordError(f"run directory {str(path)!r} does not exist; pass the --out folder of a training run")
    missing = [n for n in (CONFIG_FILE, SUMMARY_FILE) if not (path / n).is_file()]
    if missing:
        raise RecordError(f"{str(path)!r} is not a run record (missing {', '.join(missing)}); "
                          f"pass the --out folder of a training run")
    try:
        config = load_written(path / CONFIG_FILE)
        summary = json.loads((path / SUMMARY_FILE).read_text(encoding="utf-8"))
        env = json.loads((path / ENV_FILE).read_text(encoding="utf-8")) if (path / ENV_FILE).is_file() else {}
    except (ValueError, yaml.YAMLError) as exc:
        raise RecordError(f"run record {str(path)!r} is unreadable ({exc}); it was not written by this tool") \
            from None
    try:
        metrics = read_metric_rows(path / METRICS_FILE) if (path / METRICS_FILE).is_file() else []
    except (ValueError, KeyError, TypeError) as exc:
        raise RecordError(f"{str(path / METRICS_FILE)!r} is unreadable ({str(exc).splitlines()[0]}); it was not "
                          f"written by this tool or was edited: restore it from history/ or train again") from None
    if not isinstance(summary, dict):
        raise RecordError(f"{str(path / SUMMARY_FILE)!r} is not a JSON object; it was not written by this tool")
    summary = upgrade_summary(summary)
    if summary.get("status") == "running" and not _writer_alive(path, summary.get("pid")):
        summary = {**summary, "status": "interrupted", "status_reason": _ended_reason(path, summary, metrics)}
    return RunRecord(path=path, config=config, metrics=metrics, summary=summary, env=env)


def _writer_alive(path: Path, pid: int | None) -> bool:
    """Whether the process writing a 'running' record lives: its writer lock is held (`folder_lock`); a record of
    a writer that took no lock (written before the lock existed) by its pid."""
    if not folder_lock.has_lock_file(path):
        return _pid_alive(pid)
    held_by = folder_lock.holder(path)
    # this process holds it to write the folder anew: the record's own writer is then another, gone process
    return held_by is not None and (held_by != os.getpid() or pid == os.getpid())


def _ended_reason(path: Path, summary: dict, metrics: list[dict]) -> str:
    """Why a 'running' record whose writer is gone reads as interrupted, and what `resume` can do with it."""
    gone = f"the training process (pid {summary.get('pid')}) ended without finishing"
    if any((path / "checkpoints").glob("step_*.ckpt")):
        return f"{gone}; resume with: python -m helpers resume {path}"
    if not metrics:
        return f"{gone} before its first step; start it again with: python -m helpers resume {path}"
    return (f"{gone} after {len(metrics)} steps and left no checkpoint to continue from (checkpoint_every=0 saves only "
            f"at the end); train it again with --replace, or set checkpoint_every=N to make runs resumable")


class RecordWriter:
    """Writes a run record as training goes; every write is atomic. A resumed run's start is written with its
    first new row (`start_later`): until then the record it continues stays byte for byte as it was."""

    def __init__(self, run_dir: str | os.PathLike, flush_every_s: float = 5.0):
        self.path = Path(run_dir)
        self.rows: list[dict] = []
        self.flush_every_s = flush_every_s
        self._last_flush = 0.0
        self._pending: tuple | None = None
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            (self.path / "checkpoints").mkdir(exist_ok=True)
        except OSError as exc:
            raise RecordError(f"cannot create run directory {str(self.path)!r} ({exc.strerror}); "
                              f"choose a writable --out folder") from None
        if not os.access(self.path, os.W_OK):
            raise RecordError(f"run directory {str(self.path)!r} is not writable; choose a writable --out folder")

    def start(self, cfg_yaml: str, env: dict, summary: dict) -> None:
        """Write config, env and a 'running' summary; an earlier attempt's summary moves to history/, and the temp
        files of its writes that a kill cut short (`atomic_write_bytes`) are removed."""
        for name in (CONFIG_FILE, METRICS_FILE, SUMMARY_FILE, ENV_FILE):
            for part in self.path.glob(f".{name}.*.tmp"):
                part.unlink(missing_ok=True)
        old = self.path / SUMMARY_FILE
        if old.is_file():
            history = self.path / HISTORY_DIR
            history.mkdir(exist_ok=True)
            os.replace(old, history / f"summary_{int(old.stat().st_mtime * 1000)}.json")
        atomic_write_text(self.path / CONFIG_FILE, cfg_yaml)
        atomic_write_json(self.path / ENV_FILE, env)
        self.write_summary(summary)

    def start_later(self, cfg_yaml: str, env: dict, summary: dict, before=None) -> None:
        """`start` deferred to the first `add` (a resume); before(): what runs just before it (`supersede`)."""
        self._pending = (cfg_yaml, env, summary, before)

    @property
    def started(self) -> bool:
        """Whether the record's start is written (False only for a resume before its first new row)."""
        return self._pending is None

    def write_summary(self, summary: dict) -> None:
        write_summary(self.path, summary)

    def __call__(self, row: dict, total: int) -> None:
        """The record as a step sink (`run.rows.StepSink`): keep the row, flushing every `flush_every_s`."""
        self.add(row, time.perf_counter())

    def add(self, row: dict, now: float) -> None:
        first = self._pending is not None
        if first:
            cfg_yaml, env, summary, before = self._pending
            if before is not None:
                before()
            self.start(cfg_yaml, env, summary)
            self._pending = None
        self.rows.append(row)
        if first or now - self._last_flush >= self.flush_every_s:
            self.flush(now)

    def flush(self, now: float = 0.0) -> None:
        atomic_write_text(self.path / METRICS_FILE, rows_to_csv(self.rows))
        self._last_flush = now
