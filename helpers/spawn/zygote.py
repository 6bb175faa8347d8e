"""A warm parent for training processes: it imports MindSpore and the trainer once, then forks one child per run.

A fresh `python -m helpers train` paid ~0.7 s of interpreter start and our imports, then ~1.0 s importing
MindSpore, before its first step (`fixed_cost_s` start + import, on this 2-core machine); a workbook starts
~45 such processes. A child forked from the zygote starts with both done. It is still its own process: its own
MindSpore context (set after the fork), its own peak memory, and a crash or OOM kill takes down only itself.
Its stdout (progress lines) and stderr (train.log) are the caller's pipe and file, passed over a Unix socket,
and its exit code comes back over the same socket (the zygote reaps it).

One zygote per calling process, started on the first run (in a notebook kernel, when the runner is imported,
so that its imports overlap the notebook's first cells). It is replaced when the
environment a child would get changes (MindSpore reads some variables at import) or a source file under
helpers/ or native/build/ is newer than the zygote, so a child never runs stale code. WORKBOOK_ZYGOTE=0 turns
it off; if it cannot start or answer, runs start as fresh processes and train.log says why.
"""
from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Callable

from helpers.paths import REPO_ROOT

SWITCH_ENV = "WORKBOOK_ZYGOTE"
READY_TIMEOUT_S = 120.0  # importing MindSpore on a loaded 2-core machine has taken over 10 s
REPLY_TIMEOUT_S = 30.0
WATCHED = (REPO_ROOT / "helpers", REPO_ROOT / "native" / "build")
MAX_MESSAGE = 1 << 20


def enabled() -> bool:
    """Whether runs start from the zygote (WORKBOOK_ZYGOTE unset or not 0/false/off)."""
    return os.environ.get(SWITCH_ENV, "1").strip().lower() not in ("0", "false", "off", "no")


def newest_source_mtime() -> float:
    """The newest modification time (s since the epoch) of the code a child runs: helpers/ and native/build/."""
    newest = 0.0
    for root in WATCHED:
        for dirpath, _, files in os.walk(root):
            for name in files:
                if name.endswith((".py", ".so", ".yaml")):
                    try:
                        newest = max(newest, os.stat(os.path.join(dirpath, name)).st_mtime)
                    except OSError:
                        pass
    return newest


class ZygoteError(RuntimeError):
    """The zygote did not start or answer; the caller starts a fresh process instead."""


class Zygote:
    """The kernel's side: one zygote process and the socket to it."""

    def __init__(self, env: dict):
        self.env = dict(env)
        self.started = time.time()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.errors = tempfile.TemporaryFile()  # a file, not a pipe: nobody reads it unless the start fails
        try:
            self.proc = subprocess.Popen([sys.executable, "-m", "helpers", "zygote", "--fd", str(theirs.fileno())],
                                         pass_fds=[theirs.fileno()], env=self.env, cwd=REPO_ROOT,
                                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self.errors)
        finally:
            theirs.close()
        self.sock = ours
        self.ready = False  # its imports run while the caller goes on; the first run waits for them

    def _wait_ready(self) -> None:
        if not self.ready:
            try:
                self._recv(READY_TIMEOUT_S)
            except ZygoteError as exc:
                raise ZygoteError(f"{exc}; its stderr: {self._stderr_tail()}") from None
            self.ready = True

    def fits(self, env: dict) -> bool:
        """Alive, started with this environment, and no newer than the code it preloaded."""
        return self.proc.poll() is None and env == self.env and newest_source_mtime() < self.started

    def run(self, argv: list[str], on_line: Callable[[str], None], log_path: Path,
            timeout_s: float | None = None) -> int:
        """`python -m helpers ARGV` as a forked child: stdout lines to `on_line`, stderr appended to log_path;
        returns its exit code (−N: killed by signal N). timeout_s: seconds to wait for its exit once its stdout
        closed (subprocess.TimeoutExpired, as Popen.wait)."""
        self._wait_ready()
        read_end, write_end = os.pipe()
        try:
            with open(log_path, "ab") as log:
                request = json.dumps({"argv": argv, "env": self.env, "cwd": str(REPO_ROOT)}).encode()
                socket.send_fds(self.sock, [request], [write_end, log.fileno()])
        except OSError as exc:
            os.close(read_end)
            raise ZygoteError(f"could not send the run to the zygote ({exc})") from None
        finally:
            os.close(write_end)
        with os.fdopen(read_end, "r", encoding="utf-8", errors="replace") as out:
            try:
                pid = self._recv(REPLY_TIMEOUT_S, "pid")["pid"]  # the child holds the pipe: EOF when it exits
            except ZygoteError:
                if select.select([out], [], [], 0)[0] and not out.read(1):
                    raise  # nobody holds the pipe: no child started, a fresh process may run it
                pid = None  # a child was forked and runs; only its pid is unknown (any exit is then its)
            for line in out:
                on_line(line)
        try:
            return self._recv(timeout_s, "exit", pid)["code"]
        except ZygoteError as exc:
            if self.proc.poll() is None:  # alive but silent: the child outlived timeout_s after closing stdout
                raise subprocess.TimeoutExpired([sys.executable, "-m", "helpers", *argv], timeout_s or 0,
                                                output=f"forked child {pid}") from None
            # The child ran (never start it again); only its exit status is lost. Its record says how it ended.
            _note(log_path, f"exit status of forked child {pid} unknown: {exc}")
            return 1

    def _recv(self, timeout_s: float | None, kind: str = "ready", pid: int | None = None) -> dict:
        """The next message of `kind` (for `pid`); older ones are skipped: the exit of a run whose caller was
        interrupted (KeyboardInterrupt) arrives later, unasked."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([self.sock], [], [], left)
            if not ready:
                raise ZygoteError(f"the zygote did not answer within {timeout_s:g} s")
            msg = self.sock.recv(MAX_MESSAGE)
            if not msg:
                raise ZygoteError(f"the zygote exited (code {self.proc.poll()})")
            reply = json.loads(msg)
            if kind in reply and (pid is None or reply[kind] == pid):
                return reply

    def _stderr_tail(self) -> str:
        try:
            self.errors.seek(0)
            return self.errors.read()[-500:].decode(errors="replace").strip().replace("\n", " | ") or "(empty)"
        except (OSError, ValueError):
            return "(unreadable)"

    def close(self) -> None:
        """Stop the zygote (its running children, if any, go on)."""
        self.sock.close()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.errors.close()


def _note(log_path: Path, text: str) -> None:
    """One `note:` line in the run's train.log."""
    with open(log_path, "a", encoding="utf-8") as log:
        log.write(f"note: {text}\n")


_lock = threading.Lock()
_current: Zygote | None = None


def run_forked(argv: list[str], env: dict, on_line: Callable[[str], None], log_path: Path,
               timeout_s: float | None = None) -> int | None:
    """Run `python -m helpers ARGV` from this process's zygote (started or replaced as needed); its exit code,
    or None when the zygote is off, busy with another thread's run, or failed (then log_path says why)."""
    global _current
    if not enabled() or not _lock.acquire(blocking=False):
        return None
    try:
        if _current is not None and not _current.fits(env):
            _current.close()
            _current = None
        if _current is None:
            _current = Zygote(env)
        return _current.run(argv, on_line, log_path, timeout_s)
    except (ZygoteError, OSError) as exc:
        if _current is not None:
            _current.close()
            _current = None
        _note(log_path, f"started as a fresh process: {exc}")
        return None
    finally:
        _lock.release()


def prestart(env: dict) -> None:
    """Start this process's zygote now without waiting for it (a notebook kernel does, on importing the runner):
    MindSpore's import then runs on the other core while the notebook's first cells run."""
    global _current
    if not enabled() or _current is not None or not _lock.acquire(blocking=False):
        return
    try:
        _current = Zygote(env)
    except OSError:
        pass  # the first run tries again, and says why if it must start fresh
    finally:
        _lock.release()


# ------------------------------------------------------------------------------------ the zygote's side

def serve(fd: int, run: Callable[[list[str]], int]) -> int:
    """The zygote process: preload, say ready, then fork a child per request until the socket closes.

    run(argv) → exit code is what a child executes (the CLI's main). No thread is started here: a fork copies
    only the forking thread, so the preloaded state must not depend on others.
    """
    import mindspore  # noqa: F401  (the point: every child starts with it imported)
    import mindspore.dataset  # noqa: F401
    import helpers.run.pair  # noqa: F401
    import helpers.run.train  # noqa: F401
    sock = socket.socket(fileno=fd)
    sock.send(json.dumps({"ready": os.getpid()}).encode())
    children: set[int] = set()
    while True:
        ready, _, _ = select.select([sock], [], [], 0.05 if children else None)
        if ready:
            msg, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE, 2)
            if not msg:
                return 0  # the caller went away
            pid = os.fork()
            if pid == 0:
                _child(sock, fds, json.loads(msg), run)
            for f in fds:
                os.close(f)
            children.add(pid)
            sock.send(json.dumps({"pid": pid}).encode())
        for pid in list(children):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                children.discard(pid)
                sock.send(json.dumps({"exit": pid, "code": os.waitstatus_to_exitcode(status)}).encode())


def _child(sock: socket.socket, fds: list[int], request: dict, run: Callable[[list[str]], int]) -> None:
    """In the forked child: take the caller's stdout pipe and log file, environment and folder; run; exit."""
    code = 1
    try:
        sock.close()
        out, log = fds
        os.dup2(out, 1)
        os.dup2(log, 2)
        os.close(out)
        os.close(log)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        from helpers.run import startup
        startup.FORKED_FROM = os.getppid()
        sys.argv = ["helpers", *request["argv"]]
        code = run(request["argv"])
        if not isinstance(code, int):
            print(code, file=sys.stderr)
            code = 1
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if isinstance(exc.code, str):
            print(exc.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001  whatever happens, this process must leave here and not serve
        traceback.print_exc()
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)
