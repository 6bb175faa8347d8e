"""The run record: one directory per run, the only thing notebooks, reports and comparisons read.

Layout: config.yaml, metrics.csv (one row per step), summary.json, env.json, tokenizer.json, checkpoints/.
metrics.csv is appended to, a block of rows at a time, and never rewritten; readers take it up to its last complete
line, so a kill inside an append costs no row written before it. Every other file is written whole to a temp name
and renamed, so a killed run never leaves a half file; a run that died while `status` was still `running` is
reported as `interrupted` by `load_run`.
"""
from __future__ import annotations

import csv
import errno
import io
import itertools
import json
import math
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any


from helpers import folder_lock
from helpers.config import Config, load_written

if TYPE_CHECKING:
    import numpy as np

CONFIG_FILE, METRICS_FILE, SUMMARY_FILE, ENV_FILE = "config.yaml", "metrics.csv", "summary.json", "env.json"
HISTORY_DIR = "history"  # what a resume replaced: earlier summaries, rows and checkpoints after its checkpoint

METRIC_COLUMNS = ["step", "step_time_ms", "data_wait_ms", "tokens", "tokens_per_s", "loss", "loss_ema",
                  "grad_norm", "loss_scale", "overflow", "lr", "rss_bytes", "device_memory_bytes",
                  "val_loss", "val_ppl", "loss_drop_per_ktok", "elapsed_s", "alarms"]
TEXT_COLUMNS = {"alarms"}  # read back as text, not numbers
NUMBER_COLUMNS = [c for c in METRIC_COLUMNS if c not in TEXT_COLUMNS]
_METRIC_KEYS = frozenset(METRIC_COLUMNS)
# Rows a writer holds between appends at most (~200 bytes each): a loop faster than the flush cadence appends every
# this many rows rather than growing its buffer.
BUFFER_ROWS = 1000
READ_ROWS = 20000  # lines the column reader parses at a time (a few MB of text)
TAIL_BYTES = 1 << 16  # where `load_run` looks for the last row: far longer than any row this tool writes

# 2: the bottleneck is `bottleneck` (was `verdict`), comm shares have a name per quantity, `record_version` itself.
RECORD_VERSION = 2
SUMMARY_KEYS = ["record_version", "status", "status_reason", "steps", "tokens_per_s", "step_time_ms", "step_time_ms_p10",
                "step_time_ms_p90", "warmup_steps", "compile_s", "data_wait_share", "peak_memory_bytes",
                "mfu", "peak_flops", "mfu_hardware", "peak_flops_hardware", "loss_first", "loss_last", "val_loss", "val_ppl", "grad_norm_max",
                "comm_step_share"]
# Where the headline figures come from: what `python -m helpers show` prints after SUMMARY_KEYS.
SUMMARY_DETAIL_KEYS = ["memory_source", "peak_rss_bytes", "peak_device_memory_bytes", "peak_flops_name",
                       "peak_flops_measured_at", "peak_flops_load_avg", "peak_flops_source",
                       "peak_flops_hardware_arithmetic", "mfu_error", "n_params", "bottleneck"]
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


# Derived figures, one home each: every reader (summary, diagnosis, profile, paired parts, suggestions, reports)
# calls these rather than working them out again.

# How a data-wait share that was not measured reads in a report: in sink mode (config `dataset_sink`) the device
# pulls its own batch inside the step (run/loop.py), so no step's data wait is seen.
DATA_WAIT_UNMEASURED = "n/a (sink mode)"


def data_wait_share(step_ms: Iterable[float | None], wait_ms: Iterable[float | None]) -> float | None:
    """Σ data wait ÷ Σ step time over the timed steps (a finite step_ms; each step's wait in the same position).

    None (unknown, never 0.0) when no step is timed, their time adds up to nothing, or any timed step's wait was
    not measured (None or NaN: sink mode, where the wait is inside the step)."""
    import numpy as np  # here, not at the top: a command that refuses its arguments imports no numpy
    times, waits = (np.asarray(v if isinstance(v, (np.ndarray, list, tuple)) else list(v),
                               dtype=np.float64).reshape(-1) for v in (step_ms, wait_ms))  # None → NaN
    if times.size != waits.size:
        raise ValueError(f"{times.size} step times but {waits.size} data waits")
    timed = np.isfinite(times)
    total = float(times[timed].sum())
    if total <= 0 or not np.isfinite(waits[timed]).all():
        return None
    return float(waits[timed].sum()) / total


def data_wait_text(share: float | None, sink: bool = False) -> str:
    """A data-wait share as report text: '12.3%', DATA_WAIT_UNMEASURED in sink mode, 'n/a' otherwise unknown."""
    if share is not None:
        return f"{share:.1%}"
    return DATA_WAIT_UNMEASURED if sink else "n/a"


def steady_mask(steps: np.ndarray, first: int, profiled: Sequence[int] | None = None) -> np.ndarray:
    """Which of `steps` measure speed: from `first` on (the compile and warm-up steps before it left out; a
    process that starts at step s with steady_after k: first = s + k), without the steps inside the profiler
    window `profiled` = (first, last) step, which carry the profiler's own cost. The one steady-window rule of
    the summary (run/metrics.py), a record's speed rows (`RunRecord.speed_columns`), rankmerge and the profile's
    baseline."""
    lo, hi = profiled or (0, -1)
    return (steps >= first) & ~((steps >= lo) & (steps <= hi))


@dataclass(frozen=True)
class MemoryFraction:
    """A run's peak memory as a share of the memory it is judged against: peak RSS ÷ the machine's RAM on CPU,
    peak device memory ÷ the device's memory elsewhere (`memory_source`). `fraction` is None when either is
    unknown; `label` ('peak RSS' / 'peak device memory') and `of` ('RAM' / 'device memory') name them."""
    peak: int | None
    total: int | None
    label: str
    of: str

    @property
    def fraction(self) -> float | None:
        return self.peak / self.total if (self.peak and self.total) else None

    def text(self) -> str:
        """e.g. 'peak RSS is 41% of RAM', or that the share is not known."""
        if self.fraction is None:
            return f"{self.label} as a share of {self.of} is not known"
        return f"{self.label} is {self.fraction:.0%} of {self.of}"


def memory_fraction(summary: dict, env: dict) -> MemoryFraction:
    """The peak the memory gate judges (summary `peak_memory_bytes`) over the memory it lives in: the machine's
    (env `memory_total_bytes`) for RSS, the device's (summary `device_memory_total_bytes`) for device memory."""
    label = memory_label(summary)
    device = label == memory_label(DEVICE)
    total = summary.get("device_memory_total_bytes") if device else env.get("memory_total_bytes")
    return MemoryFraction(summary.get("peak_memory_bytes"), total, label, "device memory" if device else "RAM")


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


def disk_full(exc: BaseException) -> bool:
    """Whether a write error is the disk (or its quota) filling: an OSError's errno, or the words of the libraries
    whose errors name no errno (safetensors: "No space left on device (os error 28)"; MindSpore's MindRecord
    writer: "No free disk to be used while writing mindrecord files")."""
    if getattr(exc, "errno", None) in (errno.ENOSPC, errno.EDQUOT):
        return True
    words = str(exc).lower()
    return any(w in words for w in ("no space left", "os error 28", "no free disk", "disk quota"))


def free_bytes(folder: str | os.PathLike) -> int:
    """Free space on the disk of `folder` (bytes)."""
    return shutil.disk_usage(folder).free


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write data to path via a temp file in the same folder + fsync + os.replace (never a half file).

    A write the disk refuses raises `write_failure`'s RecordError; the previous file stays whole.
    """
    atomic_write_chunks(path, [data])


def atomic_write_chunks(path: Path, chunks: Iterable[bytes]) -> int:
    """`atomic_write_bytes` of data that comes in chunks (one held at a time); returns the bytes written."""
    path = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise write_failure(path, exc) from None
    try:
        with os.fdopen(fd, "wb") as fh:
            size = sum(fh.write(chunk) for chunk in chunks)
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
    return size


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
    """CSV text of rows: the header, then a line per row; missing values are empty cells. A key that is no column
    raises RecordError (`_refuse_unknown`)."""
    buf = io.StringIO()
    out = csv.writer(buf, lineterminator="\n")
    out.writerow(columns)
    known = frozenset(columns)
    for row in rows:
        _refuse_unknown(row, known, columns)
        out.writerow([row.get(c) for c in columns])
    return buf.getvalue()


def _refuse_unknown(row: dict, known: frozenset, columns: list[str]) -> None:
    """RecordError naming the keys of `row` that are none of `columns` (`known`: the same as a set): a figure the
    file has no column for would be lost without a word."""
    unknown = row.keys() - known
    if unknown:
        at = f" of step {row['step']}" if "step" in row else ""
        raise RecordError(f"a row{at} has {', '.join(sorted(map(repr, unknown)))}, which its file has no column for "
                          f"({', '.join(columns)}); add the column (metrics.csv: METRIC_COLUMNS in helpers/record.py) "
                          f"or leave the key out")


def _complete_lines(fh) -> Iterator[str]:
    """The lines of `fh` up to the last one that ends in a newline: a writer killed inside an append may leave its
    last line cut short, and that is no row."""
    for line in fh:
        if not line.endswith("\n"):
            return
        yield line


def _unreadable(path: Path, exc: Exception) -> RecordError:
    return RecordError(f"{str(path)!r} is unreadable ({(str(exc).splitlines() or [type(exc).__name__])[0]}); it was "
                       f"not written by this tool or was edited: restore it from history/ or train again")


def _row_of(raw: dict) -> dict:
    row = {k: (None if v in ("", None) else v if k in TEXT_COLUMNS else float(v)) for k, v in raw.items()}
    row["step"] = int(row["step"])
    return row


def read_metric_rows(path: Path) -> list[dict]:
    """metrics.csv → list of dicts with floats (empty cells → None, 'step' → int), its complete lines only;
    RecordError (one line) when a row does not parse."""
    with open(path, encoding="utf-8", newline="") as fh:
        try:
            return [_row_of(raw) for raw in csv.DictReader(_complete_lines(fh))]
        except (ValueError, KeyError, TypeError) as exc:
            raise _unreadable(path, exc) from None


@dataclass(frozen=True)
class MetricColumns:
    """Metric rows as columns: a float64 array per number column. An empty cell is NaN in `values` and False in
    `filled`, so a NaN loss (a value) is told from a missing one."""
    values: dict[str, np.ndarray]
    filled: dict[str, np.ndarray]

    def __getitem__(self, name: str) -> np.ndarray:
        return self.values[name]

    def __len__(self) -> int:
        return len(next(iter(self.values.values()), ()))

    def where(self, keep: np.ndarray) -> MetricColumns:
        """The rows where the boolean array `keep` is True."""
        return MetricColumns({k: v[keep] for k, v in self.values.items()}, {k: v[keep] for k, v in self.filled.items()})

    @classmethod
    def of_rows(cls, rows: Sequence[dict], names: Sequence[str] = NUMBER_COLUMNS) -> MetricColumns:
        """Columns `names` of row dicts (a key a row lacks, or None, is an empty cell)."""
        import numpy as np  # here, not at the top: a command that refuses its arguments imports no numpy
        cells = {n: [r.get(n) for r in rows] for n in names}
        return cls({n: np.array(c, dtype=np.float64).reshape(-1) for n, c in cells.items()},
                   {n: np.array([v is not None for v in c], dtype=bool) for n, c in cells.items()})


def read_metric_columns(path: Path, names: Sequence[str] = NUMBER_COLUMNS) -> MetricColumns:
    """Number columns `names` of a metrics.csv (its complete lines), READ_ROWS lines at a time, without a dict per
    row (a million rows: ~2 s for a few columns, ~5 s for all). A column the file lacks (an older record) is empty;
    RecordError (one line) when a row does not parse."""
    import numpy as np  # here, not at the top: a command that refuses its arguments imports no numpy
    values: dict[str, list] = {n: [] for n in names}
    filled: dict[str, list] = {n: [] for n in names}
    with open(path, encoding="utf-8", newline="") as fh:
        lines = _complete_lines(fh)
        header = next(csv.reader([next(lines, "")]), [])
        at = {n: header.index(n) if n in header else None for n in names}
        try:
            for block in iter(lambda: list(itertools.islice(lines, READ_ROWS)), []):
                rows = list(csv.reader(block))
                for name, i in at.items():
                    cells = [r[i] for r in rows] if i is not None else [""] * len(rows)
                    values[name].append(np.array([c or "nan" for c in cells], dtype=np.float64))
                    filled[name].append(np.fromiter(map(bool, cells), bool, len(cells)))
        except (ValueError, IndexError) as exc:
            raise _unreadable(path, exc) from None
    return MetricColumns({n: np.concatenate(v) if v else np.empty(0) for n, v in values.items()},
                         {n: np.concatenate(v) if v else np.empty(0, bool) for n, v in filled.items()})


class MetricRows(Sequence):
    """The rows of a record's metrics.csv as a list of dicts, read on first use (a reader of the summary alone pays
    nothing for a long record); `columns` reads number columns without the dicts."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._rows: list[dict] | None = None
        self._columns: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._count: int | None = None

    def _loaded(self) -> list[dict]:
        if self._rows is None:
            self._rows = read_metric_rows(self.path) if self.path.is_file() else []
        return self._rows

    def __getitem__(self, index):
        return self._loaded()[index]

    def __iter__(self) -> Iterator[dict]:
        return iter(self._loaded())

    def __reversed__(self) -> Iterator[dict]:
        return reversed(self._loaded())

    def __len__(self) -> int:
        """Rows counted by their newlines (without parsing them) until they are read."""
        if self._rows is not None:
            return len(self._rows)
        if self._count is None:
            newlines = 0
            if self.path.is_file():
                with open(self.path, "rb") as fh:
                    newlines = sum(block.count(b"\n") for block in iter(lambda: fh.read(1 << 20), b""))
            self._count = max(0, newlines - 1)  # the header is no row
        return self._count

    def __eq__(self, other) -> bool:
        return self._loaded() == (other._loaded() if isinstance(other, MetricRows) else other)

    __hash__ = None  # as a list

    def __repr__(self) -> str:
        return f"MetricRows({str(self.path)!r})"

    def columns(self, names: Sequence[str]) -> MetricColumns:
        """Number columns `names` (`read_metric_columns`; each column read once, then kept)."""
        if self._rows is not None:
            return MetricColumns.of_rows(self._rows, names)
        missing = [n for n in dict.fromkeys(names) if n not in self._columns]
        if missing:
            read = (read_metric_columns(self.path, missing) if self.path.is_file()
                    else MetricColumns.of_rows([], missing))
            self._columns.update({n: (read.values[n], read.filled[n]) for n in missing})
        return MetricColumns({n: self._columns[n][0] for n in names}, {n: self._columns[n][1] for n in names})

    def check(self) -> None:
        """RecordError (one line) unless the header and the last complete row parse: a cheap look at a long file;
        a bad row elsewhere is named by the reader that meets it."""
        if not self.path.is_file():
            return
        with open(self.path, "rb") as fh:
            header = fh.readline()
            size = fh.seek(0, os.SEEK_END)
            fh.seek(max(len(header), size - TAIL_BYTES))
            tail = fh.read()
        lines = tail[:tail.rfind(b"\n") + 1].splitlines(keepends=True)
        try:
            text = [line.decode("utf-8") for line in (header, *lines[-1:])]
            for raw in csv.DictReader(text):
                _row_of(raw)
        except (ValueError, KeyError, TypeError) as exc:
            raise _unreadable(self.path, exc) from None


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
    """A loaded run: config, per-step metrics (dict rows: `load_run` gives MetricRows, read on first use; columns
    through `columns`), summary, environment."""
    path: Path
    config: Config
    metrics: Sequence[dict]
    summary: dict
    env: dict
    extra: dict = field(default_factory=dict)

    @property
    def status(self) -> str:
        return self.summary.get("status", "unknown")

    def frame(self):
        """Metrics as a pandas DataFrame (imported lazily: plotting code wants it, the trainer does not)."""
        import pandas as pd
        return pd.DataFrame(list(self.metrics), columns=METRIC_COLUMNS)

    def columns(self, *names: str) -> MetricColumns:
        """Number columns `names` (default: every one) of the metrics as arrays, without a dict per row."""
        names = names or tuple(NUMBER_COLUMNS)
        rows = self.metrics
        return rows.columns(names) if isinstance(rows, MetricRows) else MetricColumns.of_rows(rows, names)

    def checkpoints(self) -> list[Path]:
        """Checkpoint files, oldest first."""
        return sorted((self.path / "checkpoints").glob("step_*.ckpt"))

    def _speed_mask(self, cols: MetricColumns) -> np.ndarray:
        window = self.summary.get("steady_window")
        first = window[0] if window else self.config.steady_after + 1
        return steady_mask(cols["step"], first, self.summary.get("profiled_steps")) & cols.filled["step_time_ms"]

    def speed_columns(self, *names: str) -> MetricColumns:
        """Columns `names` (with step and step_time_ms) of the rows its speed figures come from: the steady window
        (from the summary's `steady_window`, else after `steady_after`), the profiler's window (`profiled_steps`)
        left out, timed steps only."""
        cols = self.columns("step", "step_time_ms", *names)
        return cols.where(self._speed_mask(cols))

    def speed_rows(self) -> list[dict]:
        """The rows of `speed_columns`, as dicts."""
        keep = self._speed_mask(self.columns("step", "step_time_ms"))
        return [row for row, kept in zip(self.metrics, keep) if kept]


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
    """Read a run directory (its metrics rows on first use, `MetricRows`; their header and last row are checked
    now). A run whose process died mid-way reads as status 'interrupted'."""
    path = Path(run_dir)
    if not path.is_dir():
        raise RecordError(f"run directory {str(path)!r} does not exist; pass the --out folder of a training run")
    missing = [n for n in (CONFIG_FILE, SUMMARY_FILE) if not (path / n).is_file()]
    if missing:
        raise RecordError(f"{str(path)!r} is not a run record (missing {', '.join(missing)}); "
                          f"pass the --out folder of a training run")
    config = _record_config(path)
    summary = _record_json(path, SUMMARY_FILE)
    env = _record_json(path, ENV_FILE) if (path / ENV_FILE).is_file() else {}
    metrics = MetricRows(path / METRICS_FILE)
    metrics.check()
    summary = upgrade_summary(summary)
    if summary.get("status") == "running" and not _writer_alive(path, summary.get("pid")):
        summary = {**summary, "status": "interrupted", "status_reason": _ended_reason(path, summary, metrics,
                                                                                      config.checkpoint_every)}
    return RunRecord(path=path, config=config, metrics=metrics, summary=summary, env=env)


def _record_fix(path: Path, name: str) -> str:
    """The way out of a run record whose file `name` was edited or cut: put the file back, or train anew."""
    return (f"restore {name} (the run's own copy, e.g. from a backup or history/), or train the run again with "
            f"`python -m helpers train ... --out {path} --replace`")


def _record_config(path: Path) -> Config:
    """The run's config.yaml as written; a file edited by hand (a key or value the config refuses) or not YAML is
    one RecordError line naming the file, what is wrong and the fix."""
    from helpers.config import ConfigError
    file = path / CONFIG_FILE
    try:
        return load_written(file)
    except ConfigError as exc:
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if why.startswith(repr(str(file))):  # load_written's own line (not YAML, unreadable): it names the file
            why = why[len(repr(str(file))):].split(";")[0].strip()
        raise RecordError(f"{str(file)!r} of run record {str(path)!r} was edited or damaged ({why}); "
                          f"{_record_fix(path, CONFIG_FILE)}") from None


def _record_json(path: Path, name: str) -> dict:
    """One JSON object file of a run record (summary.json, env.json); a file cut short, not JSON, not UTF-8 or not
    an object is one RecordError line naming the file, the line and the fix."""
    file = path / name
    try:
        text = file.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        why = "is not UTF-8 text"
    except OSError as exc:
        why = f"cannot be read ({exc.strerror or type(exc).__name__})"
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            end = exc.pos >= len(text.rstrip()) or exc.msg.startswith("Unterminated string")
            why = (f"is unreadable: cut short (its JSON stops at line {exc.lineno})" if end or not text.strip() else
                   f"is unreadable: not JSON at line {exc.lineno} column {exc.colno} ({exc.msg})")
        else:
            if isinstance(data, dict):
                return data
            why = f"is not a JSON object (a JSON {type(data).__name__})"
    raise RecordError(f"{str(file)!r} of run record {str(path)!r} {why}; {_record_fix(path, name)}")


def _writer_alive(path: Path, pid: int | None) -> bool:
    """Whether the process writing a 'running' record lives: its writer lock is held (`folder_lock`); a record of
    a writer that took no lock (written before the lock existed) by its pid."""
    if not folder_lock.has_lock_file(path):
        return _pid_alive(pid)
    held_by = folder_lock.holder(path)
    # this process holds it to write the folder anew: the record's own writer is then another, gone process
    return held_by is not None and (held_by != os.getpid() or pid == os.getpid())


def _ended_reason(path: Path, summary: dict, metrics: Sequence[dict], every: int) -> str:
    """Why a 'running' record whose writer is gone reads as interrupted, and what `resume` can do with it
    (`every`: its checkpoint_every)."""
    gone = f"the training process (pid {summary.get('pid')}) ended without finishing"
    if any((path / "checkpoints").glob("step_*.ckpt")):
        return f"{gone}; resume with: python -m helpers resume {path}"
    if not metrics:
        return f"{gone} before its first step; start it again with: python -m helpers resume {path}"
    if every:
        return (f"{gone} after {len(metrics)} steps, before its first checkpoint (checkpoint_every={every}) was "
                f"written whole, so there is none to continue from; train it again with --replace")
    return (f"{gone} after {len(metrics)} steps and left no checkpoint to continue from (checkpoint_every=0 saves only "
            f"at the end); train it again with --replace, or set checkpoint_every=N to make runs resumable")


@dataclass(frozen=True)
class KeptRows:
    """What a resume keeps of the record it continues: the rows of `source` (a metrics.csv) up to `step`, which the
    resumed writer copies into its own metrics.csv at its first row; `last`: the last of them (None: none);
    `after`: whether `source` has rows after `step` (they go, kept only in history/)."""
    source: Path
    step: int
    last: dict | None
    after: bool


def _step_of(line: str) -> int:
    return int(line[:line.find(",")])  # step is every metrics.csv's first column


@contextmanager
def _row_lines(source: Path) -> Iterator[tuple[str, Iterator[str]]]:
    """(header line, its complete row lines) of a metrics.csv, whose first column must be step."""
    with open(source, encoding="utf-8", newline="") as fh:
        lines = _complete_lines(fh)
        header = next(lines, "")
        if not header.startswith("step,"):
            raise _unreadable(source, ValueError("its first column is not step"))
        yield header, lines


def kept_rows(source: Path, step: int) -> KeptRows:
    """What a resume from the checkpoint after `step` keeps of the metrics.csv `source` (its rows are in step
    order; read once, a row held at a time)."""
    if not source.is_file():
        return KeptRows(source, step, None, False)
    last, after = None, False
    with _row_lines(source) as (header, lines):
        try:
            for line in lines:
                if _step_of(line) > step:
                    after = True
                    break
                last = line
            row = next(map(_row_of, csv.DictReader([header, last]))) if last is not None else None
        except (ValueError, KeyError, TypeError) as exc:
            raise _unreadable(source, exc) from None
    return KeptRows(source, step, row, after)


def _kept_lines(kept: KeptRows) -> Iterator[str]:
    """The kept rows as lines of today's metrics.csv: copied as they are, or from an older record's columns
    re-encoded (a column it lacks stays empty)."""
    with _row_lines(kept.source) as (header, lines):
        rows = itertools.takewhile(lambda line: _step_of(line) <= kept.step, lines)
        columns = next(csv.reader([header]))
        if columns == METRIC_COLUMNS:
            yield from rows
            return
        buf = io.StringIO()
        out = csv.writer(buf, lineterminator="\n")
        for raw in csv.DictReader(rows, fieldnames=columns):
            _refuse_unknown(raw, _METRIC_KEYS, METRIC_COLUMNS)
            out.writerow([raw.get(c) for c in METRIC_COLUMNS])
            yield buf.getvalue()
            buf.seek(0)
            buf.truncate()


class RecordWriter:
    """Writes a run record as training goes. metrics.csv is created at the first row (header, then the rows a resume
    keeps) and then appended to, BUFFER_ROWS rows or `flush_every_s` at most apart; every other file is written
    atomically. A resumed run's start is written with its first new row (`start_later`): until then the record it
    continues stays byte for byte as it was. It holds no list of rows, only the newest (`last_row`)."""

    def __init__(self, run_dir: str | os.PathLike, flush_every_s: float = 5.0):
        self.path = Path(run_dir)
        self.flush_every_s = flush_every_s
        self.last_row: dict | None = None  # the record's newest row (a resume's last kept one until its first)
        self._last_flush = 0.0
        self._pending: tuple | None = None
        self._kept: KeptRows | None = None
        self._buffer = io.StringIO()  # rows taken since the last append, as CSV lines
        self._csv = csv.writer(self._buffer, lineterminator="\n")
        self._buffered = 0
        self._size: int | None = None  # bytes of metrics.csv that hold whole rows; None until it is created
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

    def start_later(self, cfg_yaml: str, env: dict, summary: dict, kept: KeptRows, before=None) -> None:
        """`start` deferred to the first `add` (a resume): then before() runs (`supersede`), the record starts and
        its metrics.csv is made of the `kept` rows and the new ones."""
        self._pending = (cfg_yaml, env, summary, before)
        self._kept, self.last_row = kept, kept.last

    @property
    def started(self) -> bool:
        """Whether the record's start is written (False only for a resume before its first new row)."""
        return self._pending is None

    def write_summary(self, summary: dict) -> None:
        write_summary(self.path, summary)

    def __call__(self, row: dict, total: int) -> None:
        """The record as a step sink (`run.rows.StepSink`)."""
        self.add(row, time.perf_counter())

    def add(self, row: dict, now: float) -> None:
        """Take one step's row (RecordError naming a key metrics.csv has no column for); flush at the first row and
        every `flush_every_s` of `now` (perf_counter seconds), append without fsync every BUFFER_ROWS rows."""
        _refuse_unknown(row, _METRIC_KEYS, METRIC_COLUMNS)
        first = self._pending is not None
        if first:
            cfg_yaml, env, summary, before = self._pending
            if before is not None:
                before()
            self.start(cfg_yaml, env, summary)
            self._pending = None
        self._csv.writerow([row.get(c) for c in METRIC_COLUMNS])
        self._buffered += 1
        self.last_row = row
        if first or now - self._last_flush >= self.flush_every_s:
            self.flush(now)
        elif self._buffered >= BUFFER_ROWS:
            self._append(sync=False)

    def flush(self, now: float = 0.0) -> None:
        """Append the rows taken since the last append and fsync metrics.csv; `now`: when (perf_counter seconds)."""
        self._append(sync=True)
        self._last_flush = now

    def columns(self) -> MetricColumns:
        """Every row of the record so far (flushed first) as columns: one read of metrics.csv."""
        self.flush()
        return read_metric_columns(self.path / METRICS_FILE)

    def _append(self, sync: bool) -> None:
        """Write the buffered rows at the end of the whole rows, creating metrics.csv first if it is not yet. A
        write the disk refuses raises `write_failure`'s RecordError and keeps the rows for the next append, which
        writes over whatever part of them reached the file."""
        path = self.path / METRICS_FILE
        if self._size is None:
            head = itertools.chain([",".join(METRIC_COLUMNS) + "\n"],
                                   _kept_lines(self._kept) if self._kept and self._kept.last else ())
            self._size = atomic_write_chunks(path, (line.encode("utf-8") for line in head))
        data = self._buffer.getvalue().encode("utf-8")
        try:
            with open(path, "r+b") as fh:
                fh.seek(self._size)
                fh.write(data)
                fh.truncate()
                if sync:
                    fh.flush()
                    os.fsync(fh.fileno())
        except OSError as exc:
            raise write_failure(path, exc) from None
        self._size += len(data)
        self._buffer.seek(0)
        self._buffer.truncate()
        self._buffered = 0
