"""One arm of a stepped round: a long-lived training process that steps when its parent says so.

Variables that are process-wide in MindSpore (op threads, execution mode, the data pipeline's process settings)
cannot differ between two arms of one process, and whole runs in separate processes are measured minutes apart.
So each arm is a process of its own, built and warmed up once, and the two take turns step by step
(helpers/spawn/stepped.py): while one steps, the other waits on its socket, its input pipeline held by its data
gate (data.DataGate), so it reads no batch ahead that a run of its own would have had to wait for.

Protocol (helpers/wire.py, one JSON line per message over a TCP socket on localhost): the arm connects, builds,
warms up (`warmup` steps and one validation pass), sends ArmReady; then answers each StepRequest with a
StepResult until a FinishRequest, which completes (or stops) its record and ends the process.
"""
from __future__ import annotations

import os
import signal
import socket
from pathlib import Path

from helpers.config import Config
from helpers.run.data import DataGate
from helpers.run.metrics import rss_bytes
from helpers.run.train import Trainer
from helpers.wire import ArmReady, FinishRequest, StepRequest, StepResult, decode, encode


def serve(cfg: Config, run_dir: Path, arm: str, address: tuple[str, int], warmup: int, extra_steps: int) -> int:
    """Build and warm up `cfg` into the record `run_dir`, then step on request; returns the exit code (0 ok,
    1 when the record failed)."""
    _die_with_parent()
    trainer = Trainer(cfg, run_dir)
    trainer.gate, trainer.extra_steps = DataGate(), extra_steps
    with socket.create_connection(address) as sock, sock.makefile("rw", encoding="utf-8") as chan:
        def send(message) -> None:
            chan.write(encode(message) + "\n")
            chan.flush()

        try:
            trainer.start()
            warm = trainer.step_block(warmup)
            if trainer.outcome is None or trainer.outcome.status == "ok":
                trainer.evaluate()  # compiles the eval graph, so the arm's memory high-water includes it
        except Exception as exc:  # the record says failed (Trainer._fail)
            send(ArmReady(arm, os.getpid(), "failed", f"{type(exc).__name__}: {str(exc).splitlines()[0]}"))
            return 1
        status = trainer.outcome.status if trainer.outcome is not None and trainer.outcome.status != "ok" else "ok"
        send(ArmReady(arm, os.getpid(), status, trainer.outcome.reason if status != "ok" else "", warm, rss_bytes()))
        for line in chan:
            message = decode(line)
            if isinstance(message, StepRequest):
                times, waits = trainer.measure_block(message.steps)
                rows = trainer.writer.rows
                send(StepResult(times, waits, rows[-1]["loss"] if rows else None,
                                trainer.outcome.status if trainer.outcome is not None else ""))
            elif isinstance(message, FinishRequest):
                return _finish(trainer, message)
        return _finish(trainer, FinishRequest(False, "the round's parent process went away"))


def _die_with_parent() -> None:
    """Linux: be killed when the parent goes (it freezes this process between steps, and a frozen orphan would
    wait forever); its record then reads as interrupted."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:  # the parent died before the call
        os._exit(1)


def _finish(trainer: Trainer, message: FinishRequest) -> int:
    """Complete the record (train to its last step) or stop it where it is, and write its summary."""
    try:
        while message.complete and trainer.outcome is None:
            trainer.step_block(trainer.cfg.steps)
        trainer.finish(message.reason)
    except Exception:  # recorded as failed by Trainer._fail
        return 1
    return 0 if trainer.outcome.status in ("ok", "stopped") else 1
