"""One arm of a round: a long-lived training process that steps when its parent says so.

Each arm of a speed round is a process of its own (helpers/spawn/stepped.py): its own MindSpore context (so the
arms may differ in process-wide settings: op threads, execution mode, the dataset engine's), its own memory (its
peak is its own), and no other model in it. Two arms built in one process ran differently by the order they were
compiled in: an A/A round leaned toward the arm compiled first (docs/explanation/speed-rule.md). While one
arm steps, the other waits on its socket, frozen by its parent, its input pipeline held by its data gate
(data.DataGate) so it reads no batch ahead that a run of its own would have had to wait for.

Protocol (helpers/wire.py, one JSON line per message over a TCP socket on localhost): the arm connects, builds,
sends ArmReady; then answers each StepRequest (the first one its warm-up, with a validation pass after it) with a
StepResult until a FinishRequest, which completes (or stops) its record and ends the process.
"""
from __future__ import annotations

import os
import socket
from pathlib import Path

from helpers.config import Config
from helpers.run.data import DataGate
from helpers.run.lifeline import die_with_parent
from helpers.run.metrics import rss_bytes
from helpers.run.train import Trainer, Turns
from helpers.wire import ArmReady, FinishRequest, StepRequest, StepResult, decode, encode


def serve(cfg: Config, run_dir: Path, arm: str, address: tuple[str, int], extra_steps: int) -> int:
    """Build `cfg` into the record `run_dir`, then step on request; returns the exit code (0 ok, 1 when the record
    failed)."""
    die_with_parent()  # it freezes this process between steps: a frozen orphan would wait forever
    trainer = Trainer(cfg, run_dir, turns=Turns(DataGate(), extra_steps))
    with socket.create_connection(address) as sock, sock.makefile("rw", encoding="utf-8") as chan:
        def send(message) -> None:
            chan.write(encode(message) + "\n")
            chan.flush()

        try:
            trainer.start()
        except Exception as exc:  # the record says failed (the Trainer recorded it)
            send(ArmReady(arm, os.getpid(), "failed", f"{type(exc).__name__}: {str(exc).splitlines()[0]}"))
            return 1
        send(ArmReady(arm, os.getpid(), "ok"))
        for line in chan:
            message = decode(line)
            if isinstance(message, StepRequest):
                try:
                    send(_step(trainer, message))
                except Exception as exc:  # recorded as failed by the Trainer; the parent reads why
                    send(StepResult([], [], None, f"failed: {type(exc).__name__}: {str(exc).splitlines()[0]}"))
                    return 1
            elif isinstance(message, FinishRequest):
                return _finish(trainer, message)
        return _finish(trainer, FinishRequest(False, "the round's parent process went away"))


def _step(trainer: Trainer, message: StepRequest) -> StepResult:
    """The requested steps (a warm-up: then one validation pass, which compiles the eval graph, so the arm's
    memory high-water includes everything a run of it allocates)."""
    times, waits = trainer.measure_block(message.steps)
    if message.warm and (trainer.outcome is None or trainer.outcome.status == "ok"):
        trainer.evaluate()
    ended = trainer.outcome.status if trainer.outcome is not None else ""
    return StepResult(times, waits, trainer.last_loss, ended, rss_bytes())


def _finish(trainer: Trainer, message: FinishRequest) -> int:
    """Complete the record (train to its last step) or stop it where it is, and write its summary."""
    try:
        while message.complete and trainer.outcome is None:
            trainer.step_block(trainer.cfg.steps)
        trainer.finish(message.reason)
    except Exception:  # recorded as failed by the Trainer
        return 1
    return 0 if trainer.outcome.status in ("ok", "stopped") else 1
