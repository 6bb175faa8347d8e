"""Time in collective communication per step, measured with MindSpore's profiler over a window of steps.

The CPU profiler lists AllReduce (and other collectives) as ops; their time includes waiting for the
slowest peer, which is what a step pays for the collective.
"""
from __future__ import annotations

import csv
from dataclasses import asdict, dataclass
from pathlib import Path

COMM_OPS = ("AllReduce", "AllGather", "ReduceScatter", "Broadcast", "AllToAll", "Send", "Receive")


@dataclass
class CommStats:
    """Collective ops measured over `steps` profiled steps (ms per step, calls per step)."""
    steps: int
    first_step: int
    comm_ms_per_step: float
    allreduce_calls_per_step: float
    op_ms_per_step: float
    by_op: dict

    def to_dict(self) -> dict:
        return asdict(self)


def read_op_table(profile_dir: str | Path) -> list[dict]:
    """Rows of the newest cpu_op_type_info_*.csv under a profiler output folder (op_type, occurrences, ms)."""
    tables = sorted(Path(profile_dir).rglob("cpu_op_type_info_*.csv"), key=lambda p: p.stat().st_mtime)
    if not tables:
        raise FileNotFoundError(f"no cpu_op_type_info_*.csv under {profile_dir}; the profiler wrote no op table")
    with open(tables[-1], encoding="utf-8", newline="") as fh:
        rows = list(csv.DictReader(fh))
    return [{"op_type": r["op_type"], "occurrences": int(float(r["type_occurrences"])),
             "total_ms": float(r["total_compute_time"])} for r in rows]


def comm_stats(rows: list[dict], steps: int, first_step: int) -> CommStats:
    """Per-step collective time and AllReduce count from op-table rows of `steps` profiled steps."""
    comm = {r["op_type"]: r for r in rows if r["op_type"] in COMM_OPS}
    allreduce = comm.get("AllReduce", {"occurrences": 0})
    return CommStats(steps=steps, first_step=first_step,
                     comm_ms_per_step=sum(r["total_ms"] for r in comm.values()) / steps,
                     allreduce_calls_per_step=allreduce["occurrences"] / steps,
                     op_ms_per_step=sum(r["total_ms"] for r in rows) / steps,
                     by_op={k: {"calls_per_step": r["occurrences"] / steps, "ms_per_step": r["total_ms"] / steps}
                            for k, r in comm.items()})


class CommWindow:
    """Profiles steps [first_step, first_step + steps) when `after_step(step)` is called after every step."""

    def __init__(self, out_dir: str | Path, first_step: int, steps: int):
        self.out_dir, self.first_step, self.steps = Path(out_dir), first_step, steps
        self.prof = None
        self.stats: CommStats | None = None

    def after_step(self, step: int) -> None:
        """Start profiling after step first_step-1; stop and read the op table after the window's last step."""
        if self.steps and step == self.first_step - 1:
            from mindspore.profiler import ProfilerActivity, profile, tensorboard_trace_handler
            self.out_dir.mkdir(parents=True, exist_ok=True)
            self.prof = profile(activities=[ProfilerActivity.CPU],
                                on_trace_ready=tensorboard_trace_handler(str(self.out_dir)))
            self.prof.start()
        elif self.prof is not None and step == self.first_step + self.steps - 1:
            self.prof.stop()
            self.prof = None
            self.stats = comm_stats(read_op_table(self.out_dir), self.steps, self.first_step)
