"""One writer per folder: a run record, a MindRecord set or an export is written by one process at a time.

The writer takes an exclusive POSIX lock (fcntl) on `<folder>/.writer.lock` before its first write and holds it
for the rest of its life; the kernel drops it when the process ends, however it ends (kill -9 included), so a
lock is never stale. A POSIX lock belongs to the process: forked children (data workers) do not hold it, so it
ends with the writer. Readers ask who holds it (F_GETLK) without taking it, so a `show` never blocks a writer.
The lock file stays empty, so taking the lock changes no byte of a record; a second writer's refusal line names the
holder (pid, command, start time) from the kernel.

Ground floor: imports nothing of ours.
"""
from __future__ import annotations

import errno
import fcntl
import os
import struct
import time
from pathlib import Path

LOCK_FILE = ".writer.lock"  # empty: the lock is the point; who holds it is asked of the kernel
_FLOCK = "hhqqi4x"  # struct flock on Linux/x86-64 and aarch64: type, whence, start, len, pid (+ padding)

# Folders this process holds, by resolved path: the open descriptor is the lock (closing any descriptor of the
# file would drop a POSIX lock, so the file is never opened again while held).
_held: dict[Path, int] = {}


class LockError(Exception):
    """A folder this process cannot become the writer of; the message is one actionable line."""


class FolderBusy(LockError):
    """Another live process writes the folder."""


def _path(folder: str | os.PathLike) -> Path:
    return Path(folder).resolve() / LOCK_FILE


def hold(folder: str | os.PathLike) -> None:
    """Take `folder`'s writer lock for the life of this process (the folder made if missing; a no-op when this
    process holds it already). FolderBusy names the live holder; LockError when the folder cannot be made or
    written."""
    lock = _path(folder)
    if lock in _held:
        return
    try:
        lock.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise LockError(f"cannot create or write {str(folder)!r} ({exc.strerror}); choose a writable --out "
                        f"folder") from None
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno not in (errno.EACCES, errno.EAGAIN):
            raise LockError(f"cannot lock {str(lock)!r} ({exc.strerror}); write into a folder on a local disk") \
                from None
        raise FolderBusy(busy_line(folder)) from None
    _held[lock] = fd


def release(folder: str | os.PathLike) -> None:
    """Drop this process's lock on `folder` (a folder moved aside, a test); nothing when it holds none."""
    fd = _held.pop(_path(folder), None)
    if fd is not None:
        os.close(fd)


def holds(folder: str | os.PathLike) -> bool:
    """Whether this process holds `folder`'s writer lock."""
    return _path(folder) in _held


def holder(folder: str | os.PathLike) -> int | None:
    """The pid of the live process that holds `folder`'s writer lock (this one's included), else None (no lock
    file, or nobody holds it: its last writer has ended)."""
    lock = _path(folder)
    if lock in _held:
        return os.getpid()
    try:
        fd = os.open(lock, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        probe = struct.pack(_FLOCK, fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
        kind, _, _, _, pid = struct.unpack(_FLOCK, fcntl.fcntl(fd, fcntl.F_GETLK, probe))
    except OSError:
        return None
    finally:
        os.close(fd)
    return pid if kind != fcntl.F_UNLCK else None


def has_lock_file(folder: str | os.PathLike) -> bool:
    """Whether a writer of this tool ever locked `folder` (records written before the lock existed have none)."""
    return _path(folder).is_file()


def busy_line(folder: str | os.PathLike) -> str:
    """The one line that refuses a second writer of `folder`: who writes it (pid, command, since when) and the
    ways on."""
    pid = holder(folder)
    who = f"pid {pid}" if pid else "a process that just ended"
    try:
        import psutil
        proc = psutil.Process(pid)
        argv = proc.cmdline()
        command = " ".join(["python -m helpers", *argv[argv.index("helpers") + 1:][:1]] if "helpers" in argv
                           else argv[:2])
        if command.endswith(" zygote"):  # a fork keeps its parent's command line
            command = f"a run forked by {command}"
        who += f", {command}, since {time.strftime('%H:%M:%S', time.localtime(proc.create_time()))}"
    except Exception:  # noqa: BLE001  gone meanwhile, or not ours to look at: the pid alone
        pass
    return (f"{str(folder)!r} is being written by another process ({who}); wait for it to end or stop it "
            f"(Ctrl-C saves a resumable checkpoint), or write into another folder. Nothing was written")
