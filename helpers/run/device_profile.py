"""Op tables from MindSpore's profiler output on every device, in the CPU parser's columns (profile.OP_COLUMNS).

Where each device's op-type table lies under `<run>/profile/<host>_<pid>_<ts>_ascend_ms/` (newest first wins):

- Ascend: `ASCEND_PROFILER_OUTPUT/op_statistic.csv`, MindSpore's copy of CANN msprof's op_statistic (columns
  Device_id, [Model Name], OP Type, Core Type, Count, Total Time(us), Min/Avg/Max Time(us), Ratio(%)); one op type
  can have a row per core type (e.g. Cast on AI_CORE and AI_VECTOR_CORE), summed here. Without it,
  `ASCEND_PROFILER_OUTPUT/kernel_details.csv` (one row per kernel launch: [Step Id], Name, Type, Accelerator Core,
  Start Time(us), Duration(us), ...) is grouped by Type.
- GPU: `gpu_op_type_info_<device>.csv` (op_type, type_occurrences, total_time(us), total_proportion, avg_time(us);
  the header as it is in MindSpore 2.10's libmindspore_profiler.so), wherever under the run folder it was written.
- CPU: `FRAMEWORK/cpu_op_type_info_<device>.csv` (op_type, type_occurrences, execution_frequency(per-step),
  total_compute_time (ms), avg_time(ms), percent).

The Ascend and GPU layouts follow the documented schemas (CANN "op_statistic" and Ascend PyTorch Profiler
"kernel_details" field tables; MindSpore's shipped header strings); they have not been checked against a real
device run of this workbook.
"""
from __future__ import annotations

import csv
from collections import defaultdict
from pathlib import Path

from helpers.record import RecordError

# (kind, glob under profile/, what its times are) in the order a device run prefers them.
SOURCES = [
    ("ascend_op_statistic", "*/ASCEND_PROFILER_OUTPUT/op_statistic.csv", "Ascend device kernel time (op_statistic)"),
    ("ascend_kernel_details", "*/ASCEND_PROFILER_OUTPUT/kernel_details.csv",
     "Ascend device kernel time (kernel_details, grouped by Type)"),
    ("gpu_op_type", "**/gpu_op_type_info_*.csv", "GPU kernel time (gpu_op_type_info)"),
    ("cpu_op_type", "*/FRAMEWORK/cpu_op_type_info_*.csv", "host kernel time (cpu_op_type_info)"),
]
DESCRIPTIONS = {kind: what for kind, _, what in SOURCES}


def find_op_source(profile_dir: Path) -> tuple[str, Path]:
    """(kind, csv path) of the op-type table to read under `<run>/profile/`: a device table before the host one
    (an Ascend run profiled with CPU+NPU activities writes both), the newest file of that kind."""
    for kind, pattern, _ in SOURCES:
        found = sorted(Path(profile_dir).glob(pattern), key=lambda p: p.stat().st_mtime)
        if found:
            return kind, found[-1]
    raise RecordError(f"{str(profile_dir.parent)!r} has no profiler output (looked for ASCEND_PROFILER_OUTPUT/"
                      f"op_statistic.csv, kernel_details.csv, gpu_op_type_info_*.csv and FRAMEWORK/"
                      f"cpu_op_type_info_*.csv under profile/); train with monitor.profile_steps > 0 or "
                      f"`python -m helpers profile`")


def raw_dir_of(kind: str, path: Path) -> Path:
    """The profiler's run folder (`*_ascend_ms`) a table of `kind` lies in."""
    if kind == "gpu_op_type":
        return next((p for p in path.parents if p.name.endswith("_ascend_ms")), path.parent)
    return path.parent.parent


def _read(path: Path) -> list[dict]:
    # utf-8-sig: CANN's csv files may start with a byte-order mark, which would rename the first column
    with open(path, encoding="utf-8-sig", newline="") as fh:
        return [{(k or "").strip(): (v or "").strip() for k, v in row.items()} for row in csv.DictReader(fh)]


def _need(rows: list[dict], path: Path, columns: tuple[str, ...]) -> None:
    missing = [c for c in columns if rows and c not in rows[0]]
    if missing:
        raise RecordError(f"{str(path)!r} lacks the column(s) {', '.join(missing)} (it has {', '.join(rows[0])}); "
                          f"this MindSpore/CANN version writes another layout — report it with the file's header")


def _number(text: str) -> float:
    # kernel_details writes start times with a trailing tab ("1750…027\t") so spreadsheets keep the digits
    return float(text.strip().rstrip("\t") or 0.0)


def _table(totals: dict[str, list[float]], steps: int) -> list[dict]:
    """OP_COLUMNS rows from {name: [calls, total_ms]}, largest first; share of all op time."""
    everything = sum(ms for _, ms in totals.values())
    ops = [{"name": name, "calls": int(calls), "calls_per_step": calls / steps,
            "avg_us": total_ms * 1000.0 / calls if calls else 0.0, "total_ms": total_ms,
            "ms_per_step": total_ms / steps, "share": total_ms / everything if everything else 0.0}
           for name, (calls, total_ms) in totals.items()]
    return sorted(ops, key=lambda op: op["total_ms"], reverse=True)


# kind → (op name column, calls column or None = one launch per row, total-time column, ms per unit of it)
LAYOUTS = {
    "ascend_op_statistic": ("OP Type", "Count", "Total Time(us)", 1e-3),
    "ascend_kernel_details": ("Type", None, "Duration(us)", 1e-3),
    "gpu_op_type": ("op_type", "type_occurrences", "total_time(us)", 1e-3),
    "cpu_op_type": ("op_type", "type_occurrences", "total_compute_time", 1.0),
}


def read_ops(kind: str, path: Path, steps: int) -> list[dict]:
    """One profiler table of `kind` (see LAYOUTS) → OP_COLUMNS rows over `steps` steps, largest total first.

    Rows of one op name are summed: op_statistic has a row per core type (Cast on AI_CORE and AI_VECTOR_CORE),
    kernel_details a row per launch (grouped by Type; a launch without a Type keeps its Name).
    """
    name, calls, total, to_ms = LAYOUTS[kind]
    rows = _read(path)
    _need(rows, path, tuple(c for c in (name, calls, total) if c))
    totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for r in rows:
        entry = totals[r[name] if r[name] not in ("", "N/A") else r.get("Name", "?")]
        entry[0] += _number(r[calls]) if calls else 1.0
        entry[1] += _number(r[total]) * to_ms
    return _table(totals, steps)


def read_op_table(profile_dir: Path, steps: int) -> tuple[list[dict], str, Path]:
    """(OP_COLUMNS rows, what their times are, the profiler's run folder) for the best table under profile/."""
    kind, path = find_op_source(Path(profile_dir))
    return read_ops(kind, path, steps), DESCRIPTIONS[kind], raw_dir_of(kind, path)


def activities(device_target: str) -> list:
    """MindSpore profiler activities for a device: host ops always, plus the device's kernels off CPU."""
    from mindspore.profiler import ProfilerActivity
    extra = {"Ascend": [ProfilerActivity.NPU], "GPU": [ProfilerActivity.GPU]}.get(device_target, [])
    return [ProfilerActivity.CPU, *extra]
