"""Messages between processes: one dataclass per message, one encoder (`encode`) and one decoder (`decode`).

A message travels as one line of JSON: {"kind": <the class's KIND>, ...its fields}. `decode` of a line that is
not a message (a log line, a warning) returns None, so a reader can share a pipe with other output.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields


@dataclass
class ArmReady:
    """An arm process of a stepped round, built (model, optimizer, pipeline; nothing compiled yet) or failed
    doing so, to its parent: status "ok", or "failed" with `reason`."""
    KIND = "arm_ready"
    arm: str
    pid: int
    status: str
    reason: str = ""


@dataclass
class StepRequest:
    """Parent → arm: take `steps` more steps now (the arm's data gate is open meanwhile); warm=True: they are
    its warm-up (compile included), followed by one validation pass that compiles the eval graph."""
    KIND = "step"
    steps: int
    warm: bool = False


@dataclass
class StepResult:
    """Arm → parent: the steps' times and data waits (ms), the record's latest loss (None before its first row),
    its status once the record ended ("" while it goes on, "ok" once finished, "nan", "stopped", "failed", ...)
    and its resident memory after the steps (bytes)."""
    KIND = "stepped"
    times_ms: list[float]
    waits_ms: list[float | None]
    loss: float | None = None
    ended: str = ""
    rss_bytes: int = 0


@dataclass
class FinishRequest:
    """Parent → arm: the measurement is over. complete=True trains the record to its last step first; False stops
    it where it is (status 'stopped', with `reason`)."""
    KIND = "finish"
    complete: bool
    reason: str = ""


MESSAGES = {cls.KIND: cls for cls in (ArmReady, StepRequest, StepResult, FinishRequest)}


def encode(message) -> str:
    """One JSON line (no newline) for any message class of this module."""
    return json.dumps({"kind": message.KIND, **asdict(message)})


def decode(line: str):
    """The message in one line, or None when the line is not one of this module's messages."""
    line = line.strip()
    if not line.startswith("{"):
        return None
    try:
        data = json.loads(line)
    except ValueError:
        return None
    cls = MESSAGES.get(data.get("kind")) if isinstance(data, dict) else None
    if cls is None:
        return None
    names = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in data.items() if k in names})
