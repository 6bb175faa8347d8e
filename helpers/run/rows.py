"""Where a step's metrics row goes after the train loop builds it: the step-sink protocol.

A sink is any callable `sink(row, total_steps)`. The record writer keeps every row; progress sinks show it
(a bar, a log line per 10%, or one JSON line on stdout for a parent process to read back: `wire.StepRow`).
"""
from __future__ import annotations

import sys
from typing import Callable, Protocol

from helpers.wire import StepRow, encode_row

PROGRESS_KINDS = ("bar", "json", "log", "none")


class StepSink(Protocol):
    def __call__(self, row: dict, total: int) -> None: ...


def fan_out(*sinks: StepSink | None) -> StepSink:
    """One sink that hands each row to every given sink, in order (None entries are skipped)."""
    live = [s for s in sinks if s is not None]

    def send(row: dict, total: int) -> None:
        for sink in live:
            sink(row, total)
    return send


def progress_sink(kind: str) -> StepSink | None:
    """A progress sink: 'bar' (tqdm on stderr), 'json' (wire.encode_row on stdout), 'log' (a line per 10%),
    'none'."""
    if kind == "none":
        return None
    if kind == "json":
        return lambda row, total: print(encode_row(StepRow.of(row)), flush=True)
    if kind == "bar":
        return _bar_sink()

    def log(row: dict, total: int) -> None:
        if row["step"] == total or row["step"] % max(1, total // 10) == 0:
            print(f"step {row['step']}/{total} loss {row['loss']:.4f} {row['tokens_per_s']:.0f} tokens/s",
                  file=sys.stderr, flush=True)
    return log


def _bar_sink() -> Callable[[dict, int], None]:
    from tqdm import tqdm
    bar = {}

    def update(row: dict, total: int) -> None:
        if "bar" not in bar:
            bar["bar"] = tqdm(total=total, initial=row["step"] - 1, unit="step", file=sys.stderr)
        bar["bar"].update(1)
        bar["bar"].set_postfix(loss=f"{row['loss']:.3f}", tok_s=f"{row['tokens_per_s']:.0f}", refresh=False)
        if row["step"] == total:
            bar["bar"].close()
    return update
