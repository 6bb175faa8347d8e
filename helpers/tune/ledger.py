"""A workbook's journal and lock: the append-only `ledger.jsonl`, the flock'd `.lock` file, and `stamped`, which
signs every entry with who made it and when."""
from __future__ import annotations

import errno
import fcntl
import getpass
import json
import os
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Iterator

from helpers.record import json_safe, write_failure


class RoundError(ValueError):
    """A workbook operation that cannot proceed; the message is one actionable line."""


def now() -> str:
    """The local time with its offset, to the second (ISO 8601): every entry's `when`."""
    return datetime.now().astimezone().isoformat(timespec="seconds")


def user() -> str:
    """This process's user name ("unknown" where the system has none): an entry's `who` when none is given."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


def stamped(entry: dict, who: str | None, why: str = "", reasoning: dict | None = None) -> dict:
    """`entry` signed: who (default: this process's user), when (now), and, only those given, why (one paragraph,
    whitespace collapsed) and reasoning (data, e.g. the auto-tuner's diagnosis)."""
    return {**entry, "who": who or user(), "when": now(), **({"why": " ".join(why.split())} if why else {}),
            **({"reasoning": reasoning} if reasoning else {})}


class Ledger:
    """ledger.jsonl: one JSON object per line, only ever appended (never rewritten)."""

    def __init__(self, path: Path):
        self.path = Path(path)

    def append(self, entry: dict) -> None:
        """Append one entry as a single write, then fsync so it survives a crash.

        A write the disk refuses part-way (full, over a size limit) is cut back off, so the ledger never
        ends in half a line; raises `record.write_failure`'s one-line RecordError.
        """
        data = (json.dumps(json_safe(entry), ensure_ascii=False, sort_keys=False) + "\n").encode("utf-8")
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        size = os.fstat(fd).st_size
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        except OSError as exc:
            os.ftruncate(fd, size)
            raise write_failure(self.path, exc) from None
        finally:
            os.close(fd)

    def entries(self) -> list[dict]:
        """All entries, oldest first ([] before the first one)."""
        if not self.path.is_file():
            return []
        out = []
        for number, line in enumerate(self.path.read_text(encoding="utf-8").splitlines(), 1):
            try:
                out.append(json.loads(line))
            except ValueError:
                raise RoundError(f"{self.path} line {number} is not JSON; the ledger was edited by hand — "
                                 f"restore that line from a backup") from None
        return out


class WorkbookLock:
    """An exclusive fcntl.flock on `.lock`, re-entrant within one holder object; the file names the holder pid.

    Held only while an operation writes (baseline, round, A/A check, decision, rollback), so a kernel can
    keep a Workbook open while another process reads it; a second writer is refused, not queued.
    """

    def __init__(self, path: Path, activity: str = "runs a round"):
        self.path = Path(path)
        self.activity = activity  # what the holder is doing, for the refusal message
        self._fd: int | None = None
        self._depth = 0

    @contextmanager
    def hold(self) -> Iterator[None]:
        """Take the lock (or raise RoundError naming the holder) for the duration of the block."""
        if self._depth == 0:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "(pid not yet written)"
                os.close(fd)
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                raise RoundError(f"workbook {str(self.path.parent)!r} is busy: process {holder} holds "
                                 f"{self.path.name} while it {self.activity}; wait for it to finish and retry") \
                    from None
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode(), 0)
            self._fd = fd
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            if self._depth == 0:
                os.ftruncate(self._fd, 0)
                fcntl.flock(self._fd, fcntl.LOCK_UN)
                os.close(self._fd)
                self._fd = None
