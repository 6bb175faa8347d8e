"""A warm parent for training processes: it imports MindSpore and the trainer once, then forks one child per run.

A fresh `python -m helpers train` paid ~0.7 s of interpreter start and our imports, then ~1.0 s importing
MindSpore, before its first step (`fixed_cost_s` start + import, on this 2-core machine); a workbook starts
~45 such processes. A child forked from the zygote starts with both done. It is still its own process: its own
MindSpore context (set after the fork), its own peak memory, and a crash or OOM kill takes down only itself.
Its stdout (progress lines) and stderr (train.log) are the caller's pipe and file, passed over a Unix socket,
and its exit code comes back over the same socket (the zygote reaps it).

One zygote per calling process, started on the first run (in a notebook kernel, when the runner is imported,
so that its imports overlap the notebook's first cells), or one shared by every kernel of a workbook
(`shared`: `make workbook` starts it once, its kernels connect to it through WORKBOOK_ZYGOTE_SOCKET). A zygote
is left for another when a variable that the imports read (IMPORT_ENV) differs from the caller's, or a source
file under helpers/ or native/build/ is newer than it, so a child never runs stale code; the rest of the
caller's environment, its PYTHONPATH and folder are the child's own. WORKBOOK_ZYGOTE=0 turns it off; if it
cannot start or answer, runs start as fresh processes and train.log says why.
"""
from __future__ import annotations

import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from helpers.paths import REPO_ROOT
from helpers.run.interrupt import stop_child

SWITCH_ENV = "WORKBOOK_ZYGOTE"
SOCKET_ENV = "WORKBOOK_ZYGOTE_SOCKET"  # a shared zygote's socket (set by `shared` for the processes it starts)
# Variables read while the zygote imports MindSpore and its libraries (glog, OpenMP, the BLAS, the loader,
# Python itself); a child with other values must not come from it. PYTHONPATH is applied in the child instead.
IMPORT_ENV = ("MS_", "MINDSPORE", "GLOG_", "OMP_", "KMP_", "MKL_", "OPENBLAS_", "LD_", "PYTHON", "CUDA", "ASCEND",
              "HCCL", "WORKBOOK_")
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


def import_env(env: dict) -> dict:
    """The part of `env` that the zygote's imports read (IMPORT_ENV prefixes; not PYTHONPATH or the socket)."""
    return {k: v for k, v in env.items() if k.startswith(IMPORT_ENV) and k not in ("PYTHONPATH", SOCKET_ENV)}


class ZygoteError(RuntimeError):
    """The zygote did not start or answer; the caller starts a fresh process instead."""


class Zygote:
    """The caller's side: the socket to a zygote, which it started (and owns) or connected to (`connect`)."""

    def __init__(self, env: dict, listener: socket.socket | None = None):
        """Start a zygote with `env`; with `listener` (a bound, listening Unix socket) it also serves whoever
        connects to that socket's path."""
        self.env = dict(env)
        self.started = time.time()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.errors = tempfile.TemporaryFile()  # a file, not a pipe: nobody reads it unless the start fails
        fds = [theirs.fileno()] + ([listener.fileno()] if listener is not None else [])
        args = ["--fd", str(theirs.fileno())] + (["--listen-fd", str(listener.fileno())] if listener else [])
        try:
            self.proc = subprocess.Popen([sys.executable, "-m", "helpers", "zygote", *args],
                                         pass_fds=fds, env=self.env, cwd=REPO_ROOT,
                                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self.errors)
        finally:
            theirs.close()
        self.sock = ours
        self.ready = False  # its imports run while the caller goes on; the first run waits for them
        self.gone = False

    @classmethod
    def connect(cls, path: str, env: dict) -> "Zygote":
        """This process's side of a shared zygote (`shared`); OSError when nothing listens at `path`. Its
        environment and start time come with its first message."""
        self = cls.__new__(cls)
        self.env, self.started, self.proc, self.errors = dict(env), time.time(), None, None
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.sock.connect(path)
        except OSError:
            self.sock.close()
            raise
        self.ready, self.gone = False, False
        return self

    def _wait_ready(self) -> None:
        if not self.ready:
            try:
                hello = self._recv(READY_TIMEOUT_S)
            except ZygoteError as exc:
                raise ZygoteError(f"{exc}; its stderr: {self._stderr_tail()}") from None
            if self.proc is None:  # a shared one: what it was started with, and when
                self.env, self.started = hello["env"], hello["started"]
            self.pid, self.ready = hello["ready"], True

    def alive(self) -> bool:
        return not self.gone and (self.proc is None or self.proc.poll() is None)

    def fits(self, env: dict) -> bool:
        """Alive, started with the same import-time variables, and no newer than the code it preloaded."""
        try:
            self._wait_ready()
        except ZygoteError:
            return False
        return self.alive() and import_env(env) == import_env(self.env) and newest_source_mtime() < self.started

    def run(self, argv: list[str], env: dict, on_line: Callable[[str], None], log_path: Path,
            timeout_s: float | None = None) -> int:
        """`python -m helpers ARGV` as a forked child with environment `env`: stdout lines to `on_line`, stderr
        appended to log_path; returns its exit code (−N: killed by signal N). timeout_s: seconds to wait for its
        exit once its stdout closed (subprocess.TimeoutExpired, as Popen.wait)."""
        self._wait_ready()
        read_end, write_end = os.pipe()
        try:
            with open(log_path, "ab") as log:
                request = json.dumps({"argv": argv, "env": env, "cwd": str(REPO_ROOT)}).encode()
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
            try:
                for line in out:
                    on_line(line)
            except KeyboardInterrupt:  # the caller's Ctrl-C: the child saves its step and ends (interrupt.py)
                if pid is not None:
                    stop_child(pid, out, on_line)
                raise
        try:
            return self._recv(timeout_s, "exit", pid)["code"]
        except ZygoteError as exc:
            if self.alive():  # alive but silent: the child outlived timeout_s after closing stdout
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
                self.gone = True
                raise ZygoteError(f"the zygote exited (code {self.proc.poll() if self.proc else 'unknown'})")
            reply = json.loads(msg)
            if kind in reply and (pid is None or reply[kind] == pid):
                return reply

    def _stderr_tail(self) -> str:
        if self.errors is None:
            return "(a shared zygote's: see the process that started it)"
        try:
            self.errors.seek(0)
            return self.errors.read()[-500:].decode(errors="replace").strip().replace("\n", " | ") or "(empty)"
        except (OSError, ValueError):
            return "(unreadable)"

    def close(self) -> None:
        """Stop the zygote if this process started it, else only disconnect (its running children go on)."""
        self.sock.close()
        if self.proc is None:
            return
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.errors.close()


class Forked:
    """A child that a shared zygote forked for `start_forked`: the pid, poll() and wait() of a subprocess.Popen
    (what the arm code uses), its exit status coming over a connection of its own."""

    def __init__(self, conn: Zygote, pid: int):
        self.conn, self.pid, self.returncode = conn, pid, None

    def poll(self) -> int | None:
        """Its exit code if it has exited, else None."""
        try:
            return self.wait(0.0)
        except subprocess.TimeoutExpired:
            return None

    def wait(self, timeout: float | None = None) -> int:
        """Its exit code, waiting up to `timeout` seconds (subprocess.TimeoutExpired after that)."""
        if self.returncode is None:
            try:
                self._ended(self.conn._recv(timeout, "exit", self.pid)["code"])
            except ZygoteError:
                if not self.conn.gone:
                    raise subprocess.TimeoutExpired(f"forked child {self.pid}", timeout or 0) from None
                self._ended(1)  # the zygote went away: the child's status is lost; its record says how it ended
        return self.returncode

    def _ended(self, code: int) -> None:
        self.returncode = code
        self.conn.close()


def start_forked(argv: list[str], env: dict, log_path: Path) -> Forked | None:
    """Start `python -m helpers ARGV` as a child of the shared zygote (`shared`), in a session and process group of
    its own, stdout to /dev/null and stderr appended to log_path, and return at once; None when no shared zygote
    fits `env` (the caller then starts a fresh process). A speed round's arm started so skips ~3 s of interpreter
    start and MindSpore import (fixed_cost_s start + import, measured here), both arms at once on 2 cores."""
    conn = _shared(env) if enabled() else None
    if conn is None:
        return None
    try:
        with open(os.devnull, "wb") as null, open(log_path, "ab") as log:
            request = json.dumps({"argv": argv, "env": env, "cwd": str(REPO_ROOT), "session": True}).encode()
            socket.send_fds(conn.sock, [request], [null.fileno(), log.fileno()])
        return Forked(conn, conn._recv(REPLY_TIMEOUT_S, "pid")["pid"])
    except (OSError, ZygoteError) as exc:
        conn.close()
        _note(log_path, f"started as a fresh process: {exc}")
        return None


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
            _current = _new(env)
        return _current.run(argv, env, on_line, log_path, timeout_s)
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
        _current = _new(env, check=False)
    except (OSError, ZygoteError):
        pass  # the first run tries again, and says why if it must start fresh
    finally:
        _lock.release()


def _new(env: dict, check: bool = True) -> Zygote:
    """The shared zygote when WORKBOOK_ZYGOTE_SOCKET names one that listens and (check) fits `env`, else a zygote
    of our own. check=False does not wait for the shared one to be ready (the first run checks)."""
    return _shared(env, check) or Zygote(env)


def _shared(env: dict, check: bool = True) -> Zygote | None:
    """A connection to the shared zygote that WORKBOOK_ZYGOTE_SOCKET names, if one listens there and (check) fits
    `env`; else None."""
    path = os.environ.get(SOCKET_ENV)
    if not path:
        return None
    try:
        conn = Zygote.connect(path, env)
    except OSError:
        return None
    if not check or conn.fits(env):
        return conn
    conn.close()
    return None


@contextmanager
def shared(env: dict) -> Iterator[None]:
    """One zygote, started now with `env`, for every process started inside this block that runs training (a
    workbook's kernels): its socket's path is in os.environ[SOCKET_ENV] meanwhile. Each kernel would otherwise
    import MindSpore into a zygote of its own (~2 s of CPU) while its notebook starts. Off (WORKBOOK_ZYGOTE=0)
    or failing to start: nothing is shared, and each kernel starts its own as before."""
    if not enabled():
        yield
        return
    folder = tempfile.mkdtemp(prefix="wb-zygote-")
    path = os.path.join(folder, "socket")
    owner = None
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as listener:
            listener.bind(path)
            listener.listen(16)
            owner = Zygote(env, listener=listener)  # the zygote holds its own copy of the listening socket
    except OSError:
        owner = None
    saved = os.environ.get(SOCKET_ENV)
    if owner is not None:
        os.environ[SOCKET_ENV] = path
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(SOCKET_ENV, None)
        else:
            os.environ[SOCKET_ENV] = saved
        if owner is not None:
            owner.close()
        shutil.rmtree(folder, ignore_errors=True)


# ------------------------------------------------------------------------------------ the zygote's side

def serve(fd: int, run: Callable[[list[str]], int], listen_fd: int | None = None) -> int:
    """The zygote process: preload, say ready, then fork a child per request until the socket `fd` (to the
    process that started it) closes. With `listen_fd` (a listening Unix socket, `shared`) it also accepts
    connections from other processes and serves each the same way; a child's exit goes to the one that asked.

    run(argv) → exit code is what a child executes (the CLI's main). No thread is started here: a fork copies
    only the forking thread, so the preloaded state must not depend on others.
    """
    started, env = time.time(), dict(os.environ)  # before the imports: MindSpore's own adds LD_LIBRARY_PATH
    import mindspore  # noqa: F401  (the point: every child starts with it imported)
    import mindspore.dataset  # noqa: F401
    import helpers.run.train  # noqa: F401
    owner = socket.socket(fileno=fd)
    listener = socket.socket(fileno=listen_fd) if listen_fd is not None else None
    hello = json.dumps({"ready": os.getpid(), "started": started, "env": env}).encode()
    owner.send(hello)
    conns = [owner]
    children: dict[int, socket.socket] = {}
    sessions: set[int] = set()  # children in sessions of their own (start_forked)
    while True:
        waiting = conns + ([listener] if listener is not None else [])
        ready, _, _ = select.select(waiting, [], [], 0.05 if children else None)
        for sock in ready:
            if sock is listener:
                conn, _ = listener.accept()
                try:
                    conn.send(hello)
                except OSError:  # it went away while waiting to be accepted (a kernel already shut down)
                    conn.close()
                    continue
                conns.append(conn)
                continue
            try:
                msg, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE, 2)
            except OSError:  # reset by a caller that died: as if it had closed
                msg, fds = b"", []
            if not msg:
                if sock is owner:
                    return 0  # the process that started it went away
                conns.remove(sock)
                sock.close()
                # a session child (a round's arm, frozen between its steps) dies with the process that asked for
                # it, as a fresh one does by PR_SET_PDEATHSIG: nobody else would ever wake it
                for pid in [p for p, s in children.items() if s is sock and p in sessions]:
                    _kill_group(pid)
                continue
            request = json.loads(msg)
            pid = os.fork()
            if pid == 0:
                _child([*conns, *([listener] if listener is not None else [])], fds, request, run)
            for f in fds:
                os.close(f)
            children[pid] = sock
            if request.get("session"):
                sessions.add(pid)
            _send(sock, {"pid": pid})
        _reap(children, sessions)


def _reap(children: dict[int, socket.socket], sessions: set[int]) -> None:
    """Each child that exited: forgotten, its exit code sent to the connection that asked for it."""
    for pid, sock in list(children.items()):
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            del children[pid]
            sessions.discard(pid)
            _send(sock, {"exit": pid, "code": os.waitstatus_to_exitcode(status)})


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass  # already gone


def _send(sock: socket.socket, message: dict) -> None:
    """A reply; a caller that disconnected meanwhile (a kernel shut down) does not stop the zygote."""
    try:
        sock.send(json.dumps(message).encode())
    except OSError:
        pass


def _child(socks: list[socket.socket], fds: list[int], request: dict, run: Callable[[list[str]], int]) -> None:
    """In the forked child: take the caller's stdout pipe and log file, environment, PYTHONPATH and folder; run;
    exit."""
    code = 1
    try:
        for sock in socks:
            sock.close()
        out, log = fds
        if request.get("session"):
            os.setsid()  # a process group of its own: the caller freezes it, its map workers included
        os.dup2(out, 1)
        os.dup2(log, 2)
        os.close(out)
        os.close(log)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.environ.clear()
        os.environ.update(request["env"])
        # the caller's PYTHONPATH entries the zygote lacks (a notebook's folder: model.build modules), after the
        # script folder as a fresh interpreter would put them
        extra = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]
        sys.path[1:1] = extra
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
