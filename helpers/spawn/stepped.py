"""A speed round's measurement: the two arms as two long-lived processes (helpers/run/arm.py) that take turns.

Each arm is a process of its own: built at the same time as the other (both compile at once on the two cores),
then warmed up (one after the other when their warm-ups are profiled, so each op table holds its own arm alone),
past its steady_after (its compile step let its input pipeline read only the batch it asked for, run/loop.py).
Then this parent asks one turn of one arm, then of the other, in ABBA order inside each pair of blocks, so
whatever else the machine does lands on both arms alike. A turn is one step, or, for an arm at least ×1.5 faster
than the other (by SIZING_STEPS steps of each alone after the warm-ups), as many steps as last one step of the
slower arm (`paired.turn_steps`): an arm's working set goes cold while the other steps, so turns of equal length
make both pay that alike; its block then holds K steps per step of its turn. Every step is timed by its own arm
(from asking for the batch to the loss). Between its turns an arm is frozen (SIGSTOP to its process group, SIGCONT
before its next turn): MindSpore's op threads spin for a while after a step (measured here: ~13 ms of CPU after
each step of a small graph, against none when steps follow each other), which in a run of its own overlaps nothing
but would slow the other arm here; and its input pipeline cannot read ahead (its data gate also stops the simulated
storage clock, data.DataGate). The pairs, each step's data wait and the CPU other processes used during each pair
go to `paired.json`, which the estimator (helpers/paired.py) reads. Each arm's peak memory is its own process's.

Afterwards each arm completes its record (to its `steps`), one after the other, and exits.
"""
from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

from helpers import config as config_mod
from helpers.config import Config
from helpers.paired import (MAX_TURN_STEPS, Measurement, add_pair, live_tokens_per_s, measurement_record,
                            pair_order, turn_steps, woven)
from helpers.paths import REPO_ROOT, absolute
from helpers.record import RecordError, RunRecord, atomic_write_json, load_run
from helpers.run.foreign import ForeignLoad
from helpers.run.profile import warmup_steps, with_profiler
from helpers.spawn import zygote
from helpers.spawn.live import publish
from helpers.spawn.runner import child_env
from helpers.wire import PAIRED_FILE, ArmReady, FinishRequest, StepRequest, StepResult, decode, encode

ARMS = ("candidate", "reference")
READY_TIMEOUT_S = 600.0  # start, import and build of a big config on a loaded machine
SIZING_STEPS = 3  # steps of each arm alone after the warm-ups, whose median sizes the turns (paired.turn_steps)
class _Arm:
    """The parent's side of one arm process: its process, its socket, freezing and waking it."""

    def __init__(self, name: str, cfg: Config, folder: Path, address: tuple[str, int], extra: int):
        self.name, self.cfg, self.run_dir = name, cfg, folder / name
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False, dir=folder, prefix=f".{name}.") as fh:
            fh.write(config_mod.dump(config_mod.absolute_paths(cfg)))
            self.request = Path(fh.name)
        cmd = [sys.executable, "-m", "helpers", "arm", "--config", str(self.request), "--out", str(self.run_dir),
               "--arm", name, "--connect", f"{address[0]}:{address[1]}", "--extra-steps", str(extra)]
        # a process group of its own, so that a freeze reaches its map workers too; forked from the workbook's
        # zygote where there is one (MindSpore already imported), else a fresh interpreter
        self.proc = zygote.start_forked(cmd[3:], child_env(), self.run_dir / "train.log")
        if self.proc is None:
            with open(self.run_dir / "train.log", "ab") as log:
                self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
                                             env=child_env(), cwd=REPO_ROOT, start_new_session=True)
        self.chan = None

    def send(self, message) -> None:
        self.chan.write(encode(message) + "\n")
        self.chan.flush()

    def receive(self):
        """The arm's next message; RuntimeError when it closed its socket (it exited or crashed)."""
        for line in self.chan:
            message = decode(line)
            if message is not None:
                return message
        raise RuntimeError(f"the {self.name} arm's process ended (exit {self.proc.wait()}); see "
                           f"{self.run_dir / 'train.log'}")

    def signal(self, sig: int) -> None:
        """SIGSTOP freezes the arm and its children between its steps; SIGCONT wakes them."""
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass  # it exited: the next read says how

    def ask(self, request: StepRequest) -> None:
        self.signal(signal.SIGCONT)
        self.send(request)

    def answer(self) -> StepResult:
        """The arm's StepResult, after which it is frozen again."""
        result = self.receive()
        self.signal(signal.SIGSTOP)
        if not isinstance(result, StepResult):
            raise RuntimeError(f"the {self.name} arm answered {type(result).__name__} to a step")
        if result.ended.startswith("failed"):
            raise RuntimeError(f"the {self.name} arm {result.ended}")
        return result

    def step(self, steps: int = 1) -> StepResult:
        """One turn of this arm (`steps` steps), woken for it and frozen again after it."""
        self.ask(StepRequest(steps))
        return self.answer()

    def close(self, complete: bool, reason: str) -> int:
        """Tell the arm to complete (or stop) its record and wait for it to exit; its exit code. An arm that never
        said it was built is waited for at most READY_TIMEOUT_S (its socket closed, it stops its record; one whose
        connection was never accepted would wait forever), then killed: its record reads as interrupted."""
        self.signal(signal.SIGCONT)
        if self.chan is not None and self.proc.poll() is None:
            try:
                self.send(FinishRequest(complete, reason))
            except OSError:
                pass
        try:
            code = self.proc.wait(timeout=None if self.chan is not None else READY_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            code = self.proc.wait()
        if self.chan is not None:
            self.chan.close()
        self.request.unlink(missing_ok=True)
        return code


def _connect(listener: socket.socket, arms: dict[str, _Arm]) -> None:
    """Accept each arm's connection and wait until both are built (ArmReady), each then frozen. When one fails,
    the connections not yet named by an arm are closed, and the listener with them: such an arm then reads the end
    of its socket and stops, instead of waiting for a message that never comes."""
    waiting: dict = {}  # socket → its line reader, until the arm's first message names it
    try:
        _accept_ready(listener, arms, waiting)
    except BaseException:
        for sock, chan in waiting.items():
            chan.close()
            sock.close()
        listener.close()  # a connection still in its backlog is refused now
        raise


def _accept_ready(listener: socket.socket, arms: dict[str, _Arm], waiting: dict) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    pending = dict(arms)
    while pending:
        dead = [a for a in pending.values() if a.proc.poll() is not None]
        if dead:
            raise RuntimeError(f"the {dead[0].name} arm's process exited {dead[0].proc.returncode} before it was "
                               f"built; see {dead[0].run_dir / 'train.log'}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"the arms were not built within {READY_TIMEOUT_S:g} s")
        ready, _, _ = select.select([listener, *waiting], [], [], 0.5)
        for sock in ready:
            if sock is listener:
                conn, _ = listener.accept()
                waiting[conn] = conn.makefile("rw", encoding="utf-8")
                continue
            chan = waiting.pop(sock)
            line = chan.readline()
            message = decode(line)
            if not isinstance(message, ArmReady) or message.arm not in pending:
                raise RuntimeError(f"an arm process sent {line.strip()[:120]!r} instead of being ready")
            arm = pending.pop(message.arm)
            arm.chan = chan
            if message.status != "ok":
                raise RuntimeError(f"the {arm.name} arm could not be built: {message.reason}")
            arm.signal(signal.SIGSTOP)


def _warm(arms: dict[str, _Arm], steps: int, apart: bool, out: dict) -> bool:
    """Each arm's warm-up (compile, `steps` steps, a validation pass): both at once, or one after the other (apart:
    their profiler windows must not see the other arm). Their resident memory after it goes to out["memory"].
    False when an arm's record ended in it (a NaN, a monitor's stop): out says which."""
    groups = [[a] for a in arms.values()] if apart else [list(arms.values())]
    for group in groups:
        for arm in group:
            arm.ask(StepRequest(steps, warm=True))
        for arm in group:
            result = arm.answer()
            out["warmup_ms"][arm.name] = result.times_ms
            out["memory"][f"{arm.name}_resident_bytes"] = result.rss_bytes
            if result.ended not in ("", "ok"):
                out["status"], out["reason"] = "ended", f"the {arm.name} arm's record ended '{result.ended}' in its warm-up"
    return out["status"] == "running"


def launch_stepped(reference: Config, candidate: Config, folder, plan: dict, stop: Callable[[Measurement], bool],
                   progress: bool = True, desc: str | None = None, profile_steps: int = 0):
    """Measure a round with its two arms in two processes taking turns (module docstring); both records go to
    `folder`/reference and `folder`/candidate, the pairs to `folder`/paired.json.

    plan: a paired.SpeedPlan as a dict (block_steps, looks, …); stop(measurement) → True ends the measurement
    after a pair; profile_steps: each arm gets a profiler window of that many steps right after its steady_after
    (an arm whose config has a window keeps it), in its warm-up, the arms warmed one after the other. Returns
    (reference record or None, candidate record or None, the paired.json dict or None, error text ("" when both
    arms left their records)).
    """
    folder = absolute(folder)
    folder.mkdir(parents=True, exist_ok=True)
    k, max_pairs = plan["block_steps"], plan["looks"][-1]
    cfgs = _arm_configs(reference, candidate, profile_steps)
    # (The warm-up once also ran past data.prefetch + 4 steps: the pipeline read that far ahead while the first
    # step compiled. Now the compile step gates the pipeline, run/loop.py.)
    warmup = max(warmup_steps(c) for c in cfgs.values())
    out = measurement_record("processes", k, "steps", max_pairs, warmup,
                             {n: c.tokens_per_step for n, c in cfgs.items()})
    bar, label = None, desc or folder.name
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=max_pairs, desc=label, unit="pair", leave=True)
    t0 = time.perf_counter()
    arms: dict[str, _Arm] = {}
    with socket.create_server(("127.0.0.1", 0)) as listener:
        try:
            extra = warmup + SIZING_STEPS + k * max_pairs * MAX_TURN_STEPS  # up to that many steps per turn
            arms = {n: _Arm(n, cfgs[n], folder, listener.getsockname()[:2], extra) for n in ARMS}
            _connect(listener, arms)
            warm = _warm(arms, warmup, any(c.monitor.profile_steps for c in cfgs.values()), out)
            out["setup_s"] = time.perf_counter() - t0
            if warm:
                _measure(arms, out, k, max_pairs, stop, bar, label)
        except (RuntimeError, OSError) as exc:  # an arm process that crashed or could not be built
            out["status"], out["reason"] = "failed", str(exc).splitlines()[0]
        finally:
            if out["status"] == "running":
                out["status"] = "ok"
            out["measure_s"] = time.perf_counter() - t0 - out.get("setup_s", 0.0)
            ok = out["status"] == "ok"
            for name in ARMS:  # one after the other: completing a record is not measured
                if name in arms:
                    other = next(n for n in ARMS if n != name)
                    arms[name].close(ok, "" if ok else f"the {other} arm or the measurement ended first "
                                                       f"({out['reason']})")
            if bar is not None:
                bar.close()
    out["wall_s"] = time.perf_counter() - t0
    atomic_write_json(folder / PAIRED_FILE, out)
    records = dict(zip(("reference", "candidate"), _records(folder)))
    missing = [n for n, r in records.items() if r is None]
    # the records say how a run ended (a NaN, a failure): only a missing one makes the round's error
    error = f"the {missing[0]} arm left no record ({out['reason'] or 'no reason recorded'})" if missing else ""
    return records["reference"], records["candidate"], out, error


def _arm_configs(reference: Config, candidate: Config, profile_steps: int) -> dict[str, Config]:
    """Each arm's config as its process trains it: with a profiler window of `profile_steps` (unless it has its
    own). Rounds pass both arms with the compile cache off (`config.speed_measured`): an arm that loaded its graph
    from the cache stepped faster than one that compiled it."""
    cfgs = {}
    for name, cfg in (("reference", reference), ("candidate", candidate)):
        if profile_steps and not cfg.monitor.profile_steps:
            cfg = with_profiler(cfg, profile_steps)
        cfgs[name] = cfg
    return cfgs


def _records(folder: Path) -> tuple[RunRecord | None, RunRecord | None]:
    """(reference, candidate) records the arms left in `folder`, None where one left none."""
    records = []
    for name in ("reference", "candidate"):
        try:
            records.append(load_run(folder / name))
        except RecordError:
            records.append(None)
    return records[0], records[1]


def _measure(arms: dict[str, _Arm], out: dict, k: int, max_pairs: int, stop: Callable[[Measurement], bool], bar,
             label: str) -> None:
    """The pairs: K turns of each arm, woven one by one in ABBA order, until `stop` or `max_pairs`."""
    foreign = ForeignLoad(lambda: [a.proc.pid for a in arms.values()])
    for name in ARMS:  # untimed by the estimator: each arm alone for a few steps, to size the turns
        out["sizing_ms"][name] = arms[name].step(SIZING_STEPS).times_ms
    turns = out["turn_steps"] = turn_steps(out["sizing_ms"])
    for i in range(max_pairs):
        order = pair_order(i)
        got = {n: StepResult([], []) for n in order}
        foreign.start()
        for name in woven(order, k):
            result = arms[name].step(turns[name])
            got[name].times_ms += result.times_ms
            got[name].waits_ms += result.waits_ms
            got[name].loss, got[name].ended = result.loss, result.ended
        ended = [n for n, g in got.items() if g.ended not in ("", "ok") or len(g.times_ms) < k * turns[n]]
        if ended:
            out["status"] = "ended"
            out["reason"] = f"the {ended[0]} arm's record ended '{got[ended[0]].ended}' before pair {i + 1} was complete"
            return
        measured = add_pair(out, order, {n: g.times_ms for n, g in got.items()},
                            {n: g.waits_ms for n, g in got.items()}, foreign.read())
        for name in order:
            step = out["warmup_steps"] + SIZING_STEPS + (i + 1) * k * turns[name]
            publish(f"{label} {name}", {"step": step, "loss": got[name].loss,
                                        "tokens_per_s": live_tokens_per_s(out["tokens_per_step"][name],
                                                                          got[name].times_ms)})
        if bar is not None:
            bar.n = i + 1
            bar.refresh()
        if stop(measured):
            return
