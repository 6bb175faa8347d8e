"""One real MindSpore training run that writes a run record. Runs in its own process (see `runner`).

A `Trainer` goes through four phases, each call allowed only in its own (a call out of phase fails in one line):

    built     constructed: config, record writer; nothing written, MindSpore untouched      → start() or run()
    started   record started, MindSpore set up, model and step built (build.py), loop open → step_block, finish
    stepping  steps taken (loop.py); once the record's last step is done, further steps are measurement-only
    finished  summary.json written (ok, nan, stopped or failed)                             → outcome; only a
              finished-ok record's measurement-only steps remain (a round's arm)

`run()` is start → step_block(steps) → finish. A round's arm (helpers/run/arm.py) or a data-parallel paired rank
(helpers/run/pair.py) drives the phases itself, a block of steps at a time.
"""
from __future__ import annotations

import enum
import os
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from helpers import config as config_mod
from helpers.config import Config
from helpers.record import RecordError, RecordWriter, load_run
from helpers.run.build import Built, build
from helpers.run.checkpoints import (RUN, check_resumable, note_attempt, restore, resume_hint, resume_source,
                                     resumed_rows, run_id, save_checkpoint, supersede)
from helpers.run.data import OPEN_GATE, DataGate
from helpers.run import interrupt
from helpers.run.env import environment
from helpers.run.kernels import resolve_kernels
from helpers.run.loop import Outcome, StepLoop, feed
from helpers.run.rows import fan_out
from helpers.run.startup import FixedCost, claim_cache_folder, compile_cache_dir
from helpers.run.summary import Peaks, measure_peaks, write_final_summary


class TrainError(RuntimeError):
    """A run that cannot start on this device/config, or a Trainer called out of its phase; one actionable line."""


def configure_mindspore(cfg: Config, graph_key: str = "") -> str:
    """Device, mode, seed, threads and compile cache (one folder per config and `graph_key`, see
    startup.compile_cache_dir); must run before any Cell is built. Returns why the compile cache stays off
    although the config asks for it ("" when it does not)."""
    import mindspore as ms
    use_device(cfg.device_target)
    ms.set_context(mode=ms.GRAPH_MODE if cfg.mode == "graph" else ms.PYNATIVE_MODE)
    cache_off = _no_entry_script() if cfg.compile_cache else ""
    if cfg.compile_cache and not cache_off:
        cache = compile_cache_dir(cfg, graph_key)
        cache_off = claim_cache_folder(cache)
    if cfg.compile_cache and not cache_off:
        ms.set_context(enable_compile_cache=True, compile_cache_path=str(cache))
    else:  # a run before it in this process may have turned it on
        ms.set_context(enable_compile_cache=False)
    if cfg.threads and cfg.device_target == "CPU":
        _set_threads(cfg.threads)
    if cfg.memory_optimize != "O0":  # Ascend only (config refuses it elsewhere); before the memory pool is made
        ms.runtime.set_memory(optimize_level=cfg.memory_optimize)
    reseed(cfg)
    return cache_off


def use_device(target: str) -> None:
    """MindSpore on `target` in this process; TrainError (one line) where it is not available. A second run in
    one process may ask again: MindSpore refuses set_device once its runtime has run, which on the same device is
    no error."""
    import mindspore as ms
    try:
        ms.set_device(target)
    except (RuntimeError, ValueError) as exc:
        if ms.get_context("device_target") != target or "has been initialized" not in str(exc):
            raise TrainError(f"device_target={target} is not available here ({str(exc).splitlines()[0]}); "
                             f"use device_target=CPU on this machine") from None


def _no_entry_script() -> str:
    """Why MindSpore's compile cache cannot work in this process ("" when it can): it reads its entry script (the
    sys.argv[0] it saw when it was imported) as a dependency of the graph, and compiling fails when that is no
    file (python -c, a REPL)."""
    from mindspore.graph import api
    script = getattr(api, "entry_script_path", None)  # None: no script at all, which MindSpore skips with a warning
    if not script or os.path.isfile(script):
        return ""
    return (f"compile cache off: this process has no entry script file ({script!r} when MindSpore was imported), "
            f"which MindSpore's cache reads; run from a script, a notebook or `python -m helpers` to use it")


_threads_set: list[int] = []  # MindSpore takes op threads once per process: the value it took here


def _set_threads(threads: int) -> None:
    """Op threads for CPU kernels; a second run in one process may ask for the same number, not another."""
    import mindspore as ms
    if _threads_set:
        if _threads_set[0] != threads:
            raise TrainError(f"threads={threads}: this process already runs MindSpore's CPU ops on "
                             f"{_threads_set[0]} threads, and MindSpore sets them once per process; train "
                             f"threads={threads} in a process of its own")
        return
    ms.device_context.cpu.op_tuning.threads_num(threads)
    _threads_set.append(threads)


def reseed(cfg: Config) -> None:
    """MindSpore's and NumPy's global seeds: a model built right after gets the init of a fresh process."""
    import mindspore as ms
    ms.set_seed(cfg.seed)
    np.random.seed(cfg.seed)


class Phase(enum.Enum):
    """Where a Trainer is (module docstring)."""
    BUILT = "built"
    STARTED = "started"
    STEPPING = "stepping"
    FINISHED = "finished"


@dataclass(frozen=True)
class Turns:
    """How a run takes turns with another in a round (the default: it does not). gate: its input pipeline works
    only while this is open (data.DataGate); extra_steps: measurement-only steps allowed after its record's last;
    shares_process: another Trainer already set up MindSpore in this process (a paired rank), so only reseed."""
    gate: DataGate = OPEN_GATE
    extra_steps: int = 0
    shares_process: bool = False


@dataclass(frozen=True)
class Rank:
    """This process's place in a data-parallel run (msrun, helpers/spawn/dp_worker.py): rank `index` reads its
    shard of every global batch and only rank 0 writes checkpoints; join(cfg) runs right after MindSpore is set up
    (joining the process group, or in a paired process setting this arm's all-reduce fusion)."""
    index: int
    join: Callable[[Config], None]


class Trainer:
    """One run of `cfg` into the record `run_dir`, phase by phase (module docstring); progress(row, total) sees
    every finished row after the record does."""

    def __init__(self, cfg: Config, run_dir: str | os.PathLike,
                 progress: Callable[[dict, int], None] | None = None, turns: Turns | None = None,
                 rank: Rank | None = None):
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.writer = RecordWriter(self.run_dir)  # an unusable run_dir fails here, before anything is written
        self.sinks = fan_out(self.writer, progress)
        self.turns, self.rank = turns or Turns(), rank
        self.phase = Phase.BUILT
        self.outcome: Outcome | None = None  # how the record ended (ok, nan, stopped, failed); None while it goes on
        self.extra_summary: dict = {}  # what start-up adds to summary.json: kernels, peaks, AMP audit
        # set by start(): the record's running status, start-up seconds, the built model and step, the loop, peaks;
        # a start that fails part-way leaves the later ones None (the failed summary then has no model figures)
        self._status: dict = {}
        self._fixed_cost: FixedCost | None = None
        self._built: Built | None = None
        self._loop: StepLoop | None = None
        self._peaks: Peaks | None = None

    def run(self) -> Outcome:
        """Train `cfg.steps` steps (continuing a checkpoint if resume_from), writing the record."""
        self.start()
        self.step_block(self.cfg.steps)
        return self.finish()

    def start(self) -> int:
        """Write the record's start, prepare the data, set up MindSpore (only reseed when the process is shared),
        build the model and step Cells and open the loop; returns the first step to train. A failure is recorded
        (status failed) and re-raised."""
        if self.phase is not Phase.BUILT:
            raise TrainError(f"Trainer.start() called on a {self.phase.value} trainer; a Trainer trains one run, "
                             f"make a new one")
        cfg = self.cfg
        self._status = {"status": "running", "status_reason": "", "pid": os.getpid(),
                        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S"), RUN: run_id(cfg, self.run_dir)}
        start_args = (config_mod.dump(cfg), environment(cfg.device_target, cfg.threads), self._status)
        if cfg.resume_from:  # the record it continues is left as it is until the first new step is written
            check_resumable(cfg)
            kept = resumed_rows(cfg)
            self._status["resumed_from"] = str(resume_source(cfg.resume_from)[1])
            self.writer.start_later(*start_args, kept=kept, before=lambda: supersede(cfg, kept.after))
        else:
            self.writer.start(*start_args)
        try:  # from the record's start on: a Ctrl-C between it and the set-up once left it 'running'
            self._fixed_cost = FixedCost()
            # elapsed_s counts from this process's creation (start, imports, compile, evaluation: all a user pays);
            # a resumed run goes on from the seconds its earlier rows had already taken
            before = (self.writer.last_row or {}).get("elapsed_s") or 0.0
            clock0 = time.perf_counter() - self._fixed_cost.seconds["start"] - before
            start = self._set_up(clock0)
        except Exception as exc:  # recorded as a failed run; the caller decides how loud to be
            self._fail(exc)
        except KeyboardInterrupt:
            self._interrupted("before its first step")
        self.phase = Phase.STARTED
        return start

    def step_block(self, n: int) -> list[float]:
        """Train up to `n` more steps and return their step times (ms; each from asking for its batch to its
        loss, so data waits included). Fewer when the record ends (its last step, a non-finite loss, a monitor's
        stop): `outcome` is then set. Once the record's last step is done, further steps are measurement-only
        (timed, no metrics row; at most `turns.extra_steps` of them). The data gate is open meanwhile."""
        return self._block(n)[0]

    def measure_block(self, n: int) -> tuple[list[float], list[float | None]]:
        """`n` steps of a round's measurement: (step ms, data wait ms). A record that reaches its last step inside
        the block is finished there (its summary written) and the block goes on measurement-only."""
        times, waits = self._block(n)
        if len(times) < n and self.outcome is not None and self.outcome.status == "ok":
            self.finish()
            more, more_waits = self._block(n - len(times))
            times, waits = times + more, waits + more_waits
        return times, waits

    def evaluate(self) -> float:
        """Mean validation loss over the fixed validation batches (nats/token)."""
        self._require_started("evaluate")
        if self._built is None:
            raise TrainError(f"Trainer.evaluate(): this run failed before its model was built ({self.outcome.reason})")
        return self._built.evaluate()

    @property
    def last_loss(self) -> float | None:
        """The record's latest training loss (nats/token; None before its first row)."""
        return self.writer.last_row["loss"] if self.writer.last_row is not None else None

    def finish(self, reason: str = "") -> Outcome:
        """Write the summary with the outcome (once); a run stopped before its end is 'stopped' (with `reason`). No
        step is asked after it: its data gate opens for good (`_release_pipeline`)."""
        self._require_started("finish")
        if self.phase is Phase.FINISHED:  # ended in its steps: no step comes after this call either
            self._release_pipeline()
            return self.outcome
        if self.outcome is None:
            self.outcome = Outcome("stopped", reason or "stopped before its last step", self._loop.start)
        if self.outcome.status == "interrupted":
            self.outcome.reason += f"; {self._resume_hint()}"
        self._write_summary({**self._status, "status": self.outcome.status, "status_reason": self.outcome.reason},
                            self.outcome.start_step, self._peaks)
        self.phase = Phase.FINISHED
        self._release_pipeline()
        return self.outcome

    def _release_pipeline(self) -> None:
        """Open the data gate of a record that ended: its pipeline's threads were waiting for a turn that will not
        come, and MindSpore joins them when the process exits (a DP rank hung there, in TaskGroup::join_all)."""
        if self.turns.gate is not OPEN_GATE:
            self.turns.gate.open()

    def _resume_hint(self) -> str:
        return resume_hint(self.run_dir, self.writer.last_row is not None, self.cfg.checkpoint_every)

    def _require_started(self, call: str) -> None:
        if self.phase is Phase.BUILT:
            raise TrainError(f"Trainer.{call}() before start(): this trainer is only built; call start() first")

    def _set_up(self, clock0: float) -> int:
        """start()'s work after the record's start is written, each part timed as a start-up phase; clock0: the
        perf_counter value `elapsed_s` counts from."""
        from helpers.run.data import prepare, train_dataset
        cfg, cost = self.cfg, self._fixed_cost
        # which kernels `auto` picks, resolved once for the run; a missing or stale native library fails now, not
        # after the MindSpore import
        kernels = self.extra_summary["kernels"] = resolve_kernels(cfg)
        with cost.phase("data"):  # before MindSpore's import: a bad corpus fails in about a second
            prep = prepare(cfg, self.run_dir)
        with cost.phase("import"):
            self._configure(str(prep.tokenizer.vocab_size))
        with cost.phase("peak"):
            self._peaks, named = measure_peaks(cfg, cfg.model.vocab_size or prep.tokenizer.vocab_size)
        self.extra_summary.update(named)  # which peaks the MFU used: when, load
        with cost.phase("build"):
            self._built = build(cfg, prep, self.run_dir, kernels)
        if self._built.amp_audit is not None:
            self.extra_summary["amp_audit"] = self._built.amp_audit
        if self._built.init is not None:
            self.extra_summary["init_from"] = self._built.init
        start = restore(cfg, self._built.stepper.cells) + 1 if cfg.resume_from else 1
        dataset = train_dataset(cfg, prep, skip_batches=(start - 1) * cfg.grad_accum_steps,
                                rank=self.rank.index if self.rank is not None else None, gate=self.turns.gate,
                                extra_batches=self.turns.extra_steps * cfg.grad_accum_steps)
        self._loop = StepLoop(cfg, self._built, feed(cfg, self._built.calls, dataset),
                              (self.writer.last_row or {}).get("loss_ema"), start, clock0, self.sinks,
                              self._checkpoint, self.turns.extra_steps,
                              compile_gate=None if self.turns.gate is OPEN_GATE else self.turns.gate)
        return start

    def _configure(self, graph_key: str) -> None:
        """Set up MindSpore for this process (a data-parallel rank also joins its process group here)."""
        if self.turns.shares_process:  # process-wide settings are made (they are equal for both arms): reseed only
            reseed(self.cfg)
        else:
            cache_off = configure_mindspore(self.cfg, graph_key)
            if cache_off:
                self.extra_summary["compile_cache_off"] = cache_off
        if self.rank is not None:
            self.rank.join(self.cfg)

    def _checkpoint(self, step: int) -> None:
        """A checkpoint after `step` (rank 0 only in a data-parallel run: the ranks' parameters are equal)."""
        if self.rank is None or self.rank.index == 0:
            save_checkpoint(self.run_dir, self.writer, self._built.stepper.parameters_and_state(), step,
                            self.cfg.keep_checkpoints, self._status[RUN])

    def _block(self, n: int) -> tuple[list[float], list[float | None]]:
        """step_block's steps and their data waits (ms)."""
        self._require_started("step_block")
        try:
            if self.outcome is not None:  # the record ended: measurement-only steps, none after a NaN or stop
                self.turns.gate.open()
                return self._loop.extra(n) if self.outcome.status == "ok" else ([], [])
            self.phase = Phase.STEPPING
            times, waits, outcome = [], [], None
            with interrupt.steps():  # a first Ctrl-C ends the record after the step it is in (loop.py)
                if self._loop.compile_gate is not None and n:  # the compile step: the gate opens only for its batch
                    times, waits, outcome = self._loop.steps(1)
                    self._loop.compiled()
                if outcome is None and len(times) < n:
                    self.turns.gate.open()
                    more, more_waits, outcome = self._loop.steps(n - len(times))
                    times, waits = times + more, waits + more_waits
            self.outcome = outcome
            return times, waits
        except Exception as exc:
            self._fail(exc)
        except KeyboardInterrupt:
            self._interrupted(f"during step {self._loop.next - 1} (a second Ctrl-C: that step is not saved)")
        finally:
            self.turns.gate.close()

    def _fail(self, exc: Exception) -> None:
        """Record the run as failed with `exc` (called while handling it), then re-raise it. A resume that fails
        before its first new step leaves the record it continues as it was, and notes the attempt in history/."""
        reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
        self._end("failed", reason, {"traceback": traceback.format_exc()[-4000:]}, 1, None)
        raise exc

    def _interrupted(self, when: str) -> None:
        """Record a KeyboardInterrupt (Ctrl-C outside the steps, or a second one) as 'interrupted', then re-raise."""
        start = self._loop.start if self._loop is not None else 1
        self._end("interrupted", f"interrupted by Ctrl-C {when}; {self._resume_hint()}", {}, start, self._peaks)
        raise KeyboardInterrupt

    def _end(self, status: str, reason: str, extra: dict, start_step: int, peaks: Peaks | None) -> None:
        """The summary of a run that ended early (`status`), or for a resume before its first new step, a note in
        history/ that leaves the record it continues as it was."""
        self.outcome, self.phase = Outcome(status, reason, start_step), Phase.FINISHED
        self._release_pipeline()
        try:
            if not self.writer.started:
                note_attempt(self.run_dir, {"status": status, "status_reason": reason, **extra})
                return
            self._write_summary({**self._status, "status": status, "status_reason": reason, **extra}, start_step,
                                peaks)
        except RecordError:
            pass  # the disk refused the summary too: the 'running' one left reads as 'interrupted'

    def _write_summary(self, status: dict, start_step: int, peaks: Peaks | None) -> None:
        write_final_summary(self.cfg, self.writer, status, start_step, self._built, peaks, self._fixed_cost,
                            self.extra_summary)


def train(cfg: Config, run_dir: str | os.PathLike, progress=None, replace: bool = False):
    """Train in this process and return the loaded RunRecord (use `runner.launch` for a separate process). A run_dir
    that holds another run's record is refused, or with `replace` moved aside first (`outdir.claim_locked`); its
    writer lock is held while it trains."""
    from helpers import folder_lock
    from helpers.run.outdir import claim_locked
    held = folder_lock.holds(run_dir)
    try:
        moved = claim_locked(run_dir, cfg, replace)
        if moved:
            print(moved)
        Trainer(cfg, run_dir, progress).run()
    finally:
        if not held:  # a notebook kernel lives on: the folder is free for its next run
            folder_lock.release(run_dir)
    return load_run(run_dir)
