"""A profiler window over K steady steps with MindSpore's own profiler, and the table made from it.

Raw output stays in `<run>/profile/<host>_<pid>_<ts>_ascend_ms/` (open it in MindStudio Insight, or
`ASCEND_PROFILER_OUTPUT/trace_view.json` in a Chrome-trace viewer). `analyse` turns the CPU op-type csv
into `profile/op_table.csv` and writes `profile/profile.json`: shares, data-pipeline and communication
share, and the profiler's own overhead (window vs unprofiled steady steps of the same run).
"""
from __future__ import annotations

import csv
import json
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from helpers.config import Config, ConfigError, with_changes
from helpers.record import (MetricColumns, RecordError, atomic_write_json, atomic_write_text, data_wait_share,
                            rows_to_csv, steady_mask)
from helpers.run import parser_processes
from helpers.run.device_profile import activities, read_op_table

PROFILE_DIR, OP_TABLE, PROFILE_JSON = "profile", "op_table.csv", "profile.json"
OP_COLUMNS = ["name", "calls", "calls_per_step", "avg_us", "total_ms", "ms_per_step", "share"]
COMM_OP = re.compile(r"^(hcom_?)?(allreduce|allgather|reducescatter|alltoallv?|broadcast|send|receive|recv|"
                     r"barrier|reduce)$", re.IGNORECASE)
NOT_ON_CPU = {
    "device_memory": "not produced on CPU: MindSpore's profiler records no memory there; see rss_bytes in "
                     "metrics.csv",
    "ai_core_metrics": "not produced on CPU (Ascend AI Core counters only)",
    "device_kernel_time": "not produced on CPU: op times are host kernel times",
}


def window_steps(cfg: Config) -> tuple[int, int] | None:
    """(first, last) profiled step, or None when profiling is off."""
    k = cfg.monitor.profile_steps
    if not k:
        return None
    first = cfg.monitor.profile_start or cfg.steady_after + 1
    return first, first + k - 1


def warmup_steps(cfg: Config) -> int:
    """Steps an arm of a round takes before it is timed (both measuring paths, run/pair.py and spawn/stepped.py):
    its steady_after and its profiler window, so no profiled step falls inside a block."""
    return max(cfg.steady_after, (window_steps(cfg) or (0, 0))[1])


def with_profiler(cfg: Config, window: int) -> Config:
    """`cfg` with a profiler window of up to `window` steady steps: at most half of them, so unprofiled steps
    remain to measure speed (and the profiler's overhead against)."""
    window = max(1, min(window, (cfg.steps - cfg.steady_after) // 2))
    return with_changes(cfg, {"monitor.profile_steps": window, "monitor.profile_start": 0})


def check_path(run_dir) -> None:
    """Raise ConfigError if MindSpore's profiler would reject the run directory's path."""
    if re.search(r"[=,]", str(Path(run_dir).resolve())):
        raise ConfigError(f"the run directory {str(run_dir)!r} contains '=' or ',', which MindSpore's "
                          f"profiler rejects; choose another --out")


class ProfileWindow:
    """Starts MindSpore's profiler before the window's first step, steps it after each step, and stops it
    after the last; outside the window it costs one integer comparison per step."""

    def __init__(self, cfg: Config, run_dir: Path):
        self.window = window_steps(cfg)
        self.out = Path(run_dir) / PROFILE_DIR
        self.device_target = cfg.device_target
        self.prof = None
        self.step_call_ms: list[float] = []
        self.export_s: float | None = None
        if self.window:
            check_path(run_dir)
            parser_processes.start()

    def before_step(self, step: int) -> None:
        """Start the profiler when `step` is the window's first."""
        if self.window and step == self.window[0]:
            from mindspore.profiler import profile, schedule, tensorboard_trace_handler
            self.out.mkdir(parents=True, exist_ok=True)
            k = self.window[1] - self.window[0] + 1
            self.prof = profile(activities=activities(self.device_target),
                                schedule=schedule(wait=0, warmup=0, active=k, repeat=1),
                                on_trace_ready=tensorboard_trace_handler(str(self.out)))
            self.prof.start()

    def after_step(self, step: int) -> None:
        """Advance the profiler's schedule; after the window's last step it writes its output and stops."""
        if self.prof is None:
            return
        if step >= self.window[1]:
            self._stop()
        else:
            t0 = time.perf_counter()
            self.prof.step()
            self.step_call_ms.append((time.perf_counter() - t0) * 1000.0)

    def close(self) -> None:
        """Stop a profiler left running by a run that ended inside the window."""
        if self.prof is not None:
            self._stop(step_first=False)

    def _stop(self, step_first: bool = True) -> None:
        """Close the schedule (after the window's last step), then write the output; export_s in seconds."""
        t0 = time.perf_counter()
        with parser_processes.unforked():
            if step_first:
                self.prof.step()
            self.prof.stop()
        self.prof = None
        self.export_s = time.perf_counter() - t0


@dataclass
class ProfileReport:
    """What `profile.json` holds, plus the op table (list of dicts, OP_COLUMNS, largest first)."""
    window: list[int]
    steps_profiled: int
    raw_dir: str
    trace_file: str | None
    op_time_ms_per_step: float
    window_step_ms: float | None
    baseline_step_ms: float | None
    baseline_steps: int
    overhead_pct: float | None
    overhead_note: str
    data_wait_share: float | None  # in the window (`record.data_wait_share`): None in sink mode
    comm_op_share: float | str  # communication ops' time ÷ all op time in the window (not of step time)
    comm_ops: list[str]
    profiler_step_call_ms: float | None
    export_s: float | None
    not_produced_on_cpu: dict
    ops: list[dict] = field(default_factory=list, repr=False)
    op_source: str = "host kernel time (cpu_op_type_info)"  # which profiler table the op times come from

    def frame(self, top: int | None = None):
        """The op table as a pandas DataFrame (top rows only if `top`)."""
        import pandas as pd
        return pd.DataFrame(self.ops[:top] if top else self.ops, columns=OP_COLUMNS)

    def table_text(self, top: int = 10) -> str:
        """The top operators as aligned text."""
        lines = [f"{'operator':<36} {'calls/step':>10} {'avg µs':>9} {'ms/step':>8} {'share':>7}"]
        for op in self.ops[:top]:
            lines.append(f"{op['name']:<36} {op['calls_per_step']:>10.1f} {op['avg_us']:>9.1f} "
                         f"{op['ms_per_step']:>8.2f} {op['share']:>7.1%}")
        return "\n".join(lines)

    def overhead_text(self) -> str:
        """One line on the profiler's own cost."""
        if self.overhead_pct is None:
            return f"profiler overhead: {self.overhead_note}"
        return (f"profiler overhead: {self.overhead_pct:+.1f}% (median {self.window_step_ms:.2f} ms/step in the "
                f"{self.steps_profiled}-step window vs {self.baseline_step_ms:.2f} ms/step over "
                f"{self.baseline_steps} unprofiled steady steps; {self.overhead_note})")


def _median(values) -> float | None:
    arr = np.array([v for v in values if v is not None], dtype=np.float64)
    return float(np.median(arr)) if arr.size else None


def _step_times(rows: MetricColumns) -> np.ndarray:
    return rows["step_time_ms"][rows.filled["step_time_ms"]]


def _spread_text(rows: MetricColumns) -> str:
    """p10 and p90 of the rows' step times relative to their median, e.g. '-4.1%/+9.8%' (the run's own noise)."""
    times = _step_times(rows)
    median = float(np.median(times))
    return f"{np.percentile(times, 10) / median - 1:+.1%}/{np.percentile(times, 90) / median - 1:+.1%} (p10/p90)"


def analyse(run_dir: Path, rows: MetricColumns, cfg: Config, window: ProfileWindow | None = None) -> ProfileReport:
    """Build the op table and profile.json from the raw profiler output and the run's metric rows."""
    run_dir = Path(run_dir)
    first, last = window_steps(cfg)
    inside = (rows["step"] >= first) & (rows["step"] <= last)
    in_window = rows.where(inside)
    steps = len(in_window) or (last - first + 1)
    ops, op_source, raw = read_op_table(run_dir / PROFILE_DIR, steps)  # device table first (device_profile.py)
    baseline = rows.where(steady_mask(rows["step"], cfg.steady_after + 1, (first, last)))
    win_ms, base_ms = _median(_step_times(in_window)), _median(_step_times(baseline))
    overhead = (win_ms / base_ms - 1.0) * 100.0 if (win_ms and base_ms) else None
    note = (f"the unprofiled steps themselves spread {_spread_text(baseline)} around their median, so an "
            f"overhead inside that is not resolved" if overhead is not None
            else "not measured: no unprofiled steady steps; raise steps beyond the window")
    comm = [op for op in ops if COMM_OP.match(op["name"])]
    comm_op_share: float | str = (sum(op["share"] for op in comm) if comm else
                               "not applicable: single process, no communication operators recorded"
                               if cfg.parallel.data_parallel == 1 else
                               "no communication operators recorded on this rank")
    trace = next(raw.glob("ASCEND_PROFILER_OUTPUT/trace_view.json"), None)
    report = ProfileReport(
        window=[first, last], steps_profiled=steps, raw_dir=str(raw.relative_to(run_dir)),
        trace_file=str(trace.relative_to(run_dir)) if trace else None,
        op_time_ms_per_step=sum(op["ms_per_step"] for op in ops), window_step_ms=win_ms, baseline_step_ms=base_ms,
        baseline_steps=len(baseline), overhead_pct=overhead, overhead_note=note,
        data_wait_share=data_wait_share(in_window["step_time_ms"], in_window["data_wait_ms"]),
        comm_op_share=comm_op_share, comm_ops=[op["name"] for op in comm],
        profiler_step_call_ms=_median(window.step_call_ms) if window else None,
        export_s=window.export_s if window else None, not_produced_on_cpu=dict(NOT_ON_CPU), ops=ops,
        op_source=op_source)
    out = run_dir / PROFILE_DIR
    atomic_write_text(out / OP_TABLE, rows_to_csv(ops, OP_COLUMNS))
    data = asdict(report)
    data.pop("ops")
    data["top_ops"] = ops[:10]
    atomic_write_json(out / PROFILE_JSON, data)
    return report


def load_profile(run_dir) -> ProfileReport:
    """Read `<run>/profile/profile.json` and `op_table.csv` back into a ProfileReport."""
    out = Path(run_dir) / PROFILE_DIR
    if not (out / PROFILE_JSON).is_file():
        raise RecordError(f"{str(run_dir)!r} has no profile/profile.json; run `python -m helpers profile` "
                          f"or train with monitor.profile_steps > 0")
    data = json.loads((out / PROFILE_JSON).read_text(encoding="utf-8"))
    data.pop("top_ops", None)
    if "comm_share" in data:  # profile.json written before the rename
        data["comm_op_share"] = data.pop("comm_share")
    with open(out / OP_TABLE, encoding="utf-8", newline="") as fh:
        ops = [{k: (v if k == "name" else float(v)) for k, v in r.items()} for r in csv.DictReader(fh)]
    return ProfileReport(**data, ops=ops)


def comm_per_step(report: ProfileReport) -> dict:
    """Collective ops of a profiled window: ms/step (includes waiting for the slower peer), AllReduce
    calls/step, all op time ms/step, and the window it covers."""
    comm = [op for op in report.ops if COMM_OP.match(op["name"])]
    allreduce = [op["calls_per_step"] for op in comm if op["name"].lower().endswith("allreduce")]
    return {"first_step": report.window[0], "steps": report.steps_profiled,
            "comm_ms_per_step": sum(op["ms_per_step"] for op in comm),
            "allreduce_calls_per_step": sum(allreduce), "op_ms_per_step": report.op_time_ms_per_step,
            "by_op": {op["name"]: {"calls_per_step": op["calls_per_step"], "ms_per_step": op["ms_per_step"]}
                      for op in comm}}


def summary_keys(report: ProfileReport) -> dict:
    """The few profile figures copied into summary.json."""
    top = report.ops[0] if report.ops else {}
    return {"profile_top_op": top.get("name"), "profile_top_op_share": top.get("share"),
            "profile_overhead_pct": report.overhead_pct, "profile_comm_op_share": report.comm_op_share}
