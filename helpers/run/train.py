"""One real MindSpore training run that writes a run record. Runs in its own process (see `runner`)."""
from __future__ import annotations

import math
import os
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from helpers import config as config_mod
from helpers.config import Config, ConfigError
from helpers.run.data import OPEN_GATE, DataGate
from helpers.run.env import environment
from helpers.run.peaks import hardware_peak, matmul_shapes, peak_flops_info, peak_summary
from helpers.run.hooks import RunHooks
from helpers.run.precision import apply_precision
from helpers.run.rows import fan_out
from helpers.run.metrics import Ema, rss_bytes, summarize
from helpers.run.memory import DeviceMemory
from helpers.run.monitors import effective_max_grad_norm
from helpers.run.kernels import resolve_kernels
from helpers.run.startup import FixedCost, compile_cache_dir, process_start
from helpers.run.profile import window_steps
from helpers.record import (RecordError, RecordWriter, load_run, memory_source, read_metric_rows, write_failure,
                            METRICS_FILE)


class TrainError(RuntimeError):
    """A run that cannot start on this device/config; one actionable line."""


def lr_at(cfg: Config, step: int) -> float:
    """Learning rate for 1-based optimizer step `step`: linear warm-up, then cosine/linear/constant decay."""
    if cfg.warmup and step <= cfg.warmup:
        return cfg.lr * step / cfg.warmup
    if cfg.schedule == "constant" or cfg.steps <= cfg.warmup:
        return cfg.lr
    progress = min(1.0, (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup))
    shape = 0.5 * (1 + math.cos(math.pi * progress)) if cfg.schedule == "cosine" else 1 - progress
    return cfg.min_lr + shape * (cfg.lr - cfg.min_lr)


def configure_mindspore(cfg: Config, graph_key: str = "") -> None:
    """Device, mode, seed, threads and compile cache (one folder per config and `graph_key`, see
    startup.compile_cache_dir); must run before any Cell is built."""
    import mindspore as ms
    try:
        ms.set_device(cfg.device_target)
    except (RuntimeError, ValueError) as exc:
        raise TrainError(f"device_target={cfg.device_target} is not available here ({str(exc).splitlines()[0]}); "
                         f"use device_target=CPU on this machine") from None
    ms.set_context(mode=ms.GRAPH_MODE if cfg.mode == "graph" else ms.PYNATIVE_MODE)
    if cfg.compile_cache:
        cache = compile_cache_dir(cfg, graph_key)
        cache.mkdir(parents=True, exist_ok=True)
        ms.set_context(enable_compile_cache=True, compile_cache_path=str(cache))
    if cfg.threads and cfg.device_target == "CPU":
        ms.device_context.cpu.op_tuning.threads_num(cfg.threads)
    if cfg.memory_optimize != "O0":  # Ascend only (config refuses it elsewhere); before the memory pool is made
        ms.runtime.set_memory(optimize_level=cfg.memory_optimize)
    reseed(cfg)


def reseed(cfg: Config) -> None:
    """MindSpore's and NumPy's global seeds: a model built right after gets the init of a fresh process."""
    import mindspore as ms
    ms.set_seed(cfg.seed)
    np.random.seed(cfg.seed)


@dataclass
class Outcome:
    """What the loop ended with."""
    status: str
    reason: str
    start_step: int


def checkpoint_step(path: Path) -> int:
    """The step a checkpoint file was taken after, from its name step_000123.ckpt."""
    return int(Path(path).stem.split("_")[-1])


def _resume_source(resume_from: str) -> tuple[Path, Path]:
    """(run_dir, checkpoint file) from a run directory or a .ckpt path."""
    src = Path(resume_from)
    if src.is_file() and src.suffix == ".ckpt":
        return src.parent.parent, src
    ckpts = sorted((src / "checkpoints").glob("step_*.ckpt")) if src.is_dir() else []
    if not ckpts:
        raise ConfigError(f"resume_from={resume_from!r} has no checkpoint (looked for {src}/checkpoints/"
                          f"step_*.ckpt); pass a run directory with checkpoint_every > 0 or a .ckpt file")
    return src, ckpts[-1]


def check_resumable(cfg: Config) -> None:
    """Refuse, before anything is written, a resume whose checkpoint is already at or past `steps`: training would
    get zero batches and rewrite a finished record as failed."""
    if not cfg.resume_from:
        return
    src, ckpt = _resume_source(cfg.resume_from)
    done = checkpoint_step(ckpt)
    if done >= cfg.steps:
        raise ConfigError(f"run {str(src)!r} is finished: its last checkpoint is step {done} of steps={cfg.steps}, "
                          f"so there is nothing to resume (the record is unchanged); to train further pass "
                          f"--steps N (or steps=N) with N > {done}")


def _nan_reason(step: int, last_good: int, lr: float, scale: float, what: str, cfg: Config) -> str:
    cause = "fp16 overflow" if cfg.amp_level != "O0" else "learning rate too high or a bad batch"
    return (f"{what} became non-finite at step {step} (last good step {last_good}, lr {lr:.3g}, loss scale "
            f"{scale:g}); likely cause: {cause}; try: lower lr (e.g. lr={cfg.lr / 10:g}), longer warmup, "
            f"loss_scale=dynamic, or amp_level=O0; last good checkpoint kept in checkpoints/")


class Trainer:
    """Builds data, model and step Cells for a config; `run()` trains and writes the record."""

    def __init__(self, cfg: Config, run_dir: str | os.PathLike,
                 progress: Callable[[dict, int], None] | None = None):
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.writer = RecordWriter(self.run_dir)
        self.sinks = fan_out(self.writer, progress)  # every finished row goes to the record, then to progress
        self.extra_summary: dict = {}
        self.prep = None
        self.outcome: Outcome | None = None  # set when the record's steps end (ok, nan, stopped)
        self.extra_steps = 0  # measurement-only steps allowed after the last recorded one (paired rounds)
        self.shares_process = False  # another Trainer already set up MindSpore in this process (paired rounds)
        # the input pipeline works only while this gate is open: always, unless a round's arms take turns
        self.gate: DataGate = OPEN_GATE
        self.block_waits: list[float | None] = []  # data wait (ms) of each step of the last step_block
        self.finished = False  # finish() wrote the summary
        self._peak = self._hardware_peak = None

    def _configure(self) -> None:
        """Set up MindSpore for this process (a data-parallel rank also joins its process group here)."""
        if self.shares_process:  # process-wide settings are made (they are equal for both arms): reseed only
            reseed(self.cfg)
            return
        configure_mindspore(self.cfg, str(self.prep.tokenizer.vocab_size) if self.prep else "")

    def _data(self):
        """The tokenized corpus, prepared once; `run` calls it before MindSpore is imported, so a bad corpus
        fails in about a second instead of after the import and the peak-FLOP/s measurement."""
        if self.prep is None:
            from helpers.run.data import prepare
            self.prep = prepare(self.cfg, self.run_dir)
        return self.prep

    def _build(self):
        import mindspore as ms
        from helpers.run.data import train_dataset, val_batches
        from helpers.run.model import LossNet, build_model, count_params, flops_per_token
        from helpers.run.step import Stepper, make_optimizer
        cfg = self.cfg
        self._data()
        vocab = cfg.model.vocab_size or self.prep.tokenizer.vocab_size
        if vocab < self.prep.tokenizer.vocab_size:
            raise ConfigError(f"model.vocab_size={vocab} is smaller than the tokenizer's "
                              f"{self.prep.tokenizer.vocab_size}; set model.vocab_size=0 to take the tokenizer's")
        backbone = build_model(cfg, vocab, self.kernels)
        self.n_params = count_params(backbone)
        self.flops_per_token = flops_per_token(self.n_params, cfg.model)
        if cfg.recompute == "blocks":
            for block in getattr(backbone, "blocks", []):
                block.recompute()
        backbone = apply_precision(backbone, cfg)
        self.loss_net = LossNet(backbone, vocab)
        self.eval_net = LossNet(backbone, vocab)
        lrs = [lr_at(cfg, s) for s in range(1, cfg.steps + self.extra_steps + 1)]
        optimizer = make_optimizer(backbone, lrs, cfg.weight_decay, cfg.betas, cfg.eps)
        self.stepper = Stepper(self.loss_net, optimizer, effective_max_grad_norm(cfg), cfg.loss_scale,
                               cfg.loss_scale_value, cfg.loss_scale_window, cfg.grad_accum_steps, cfg.grad_norm)
        self.hooks = RunHooks(cfg, self.run_dir, optimizer)
        # On a device the per-step figure is MindSpore's allocator peak; on CPU its counters are always 0.
        self.device_memory = DeviceMemory(cfg.device_target) if cfg.device_target != "CPU" else None
        self._compile_cells(ms)
        self._ballast = None
        if cfg.model.ballast_every and cfg.model.ballast:  # test-only intermittent cost (model.ballast_every)
            from helpers.run.model import Ballast
            self._ballast = Ballast(cfg.tokens_per_step, cfg.model.d_model, cfg.model.ballast)
            self._ballast().asnumpy()  # compiled now, not inside the first step that runs it
        if cfg.amp_level != "O0":  # after the real model is built, so its init (RNG draws) matches O0 runs
            self._audit_amp(vocab)
        self.val = [(ms.Tensor(x), ms.Tensor(y)) for x, y in val_batches(cfg, self.prep)]
        self._train_dataset = lambda skip: train_dataset(cfg, self.prep, skip_batches=skip, gate=self.gate,
                                                         extra_batches=self.extra_steps * cfg.grad_accum_steps)

    def _audit_amp(self, vocab: int) -> None:
        """Write dtype_audit.json and keep its summary for summary.json (`amp_audit`)."""
        from helpers.run.precision import audit_summary, dtype_audit, rows_as_dicts
        from helpers.record import atomic_write_json
        rows = dtype_audit(self.cfg, vocab, self.kernels)
        atomic_write_json(self.run_dir / "dtype_audit.json", rows_as_dicts(rows))
        self.extra_summary["amp_audit"] = audit_summary(rows)

    def _compile_cells(self, ms) -> None:
        """Graph mode: jit_level per Cell. PyNative: wrap the step Cells in ms.jit unless jit_level=none."""
        cfg = self.cfg
        calls = self.stepper.cells
        if cfg.mode == "graph":
            for cell in calls:
                cell.set_jit_config(ms.JitConfig(jit_level=cfg.jit_level if cfg.jit_level != "none" else "O0"))
            self.calls = calls
        elif cfg.jit_level != "none":
            self.calls = [ms.jit(cell, jit_level=cfg.jit_level) for cell in calls]
        else:
            self.calls = calls

    def _previous_rows(self) -> list[dict]:
        """Metrics rows of the run being resumed, up to its checkpoint (read before anything is written)."""
        src_dir, ckpt = _resume_source(self.cfg.resume_from)
        metrics = src_dir / METRICS_FILE
        step = checkpoint_step(ckpt)
        return [r for r in read_metric_rows(metrics) if r["step"] <= step] if metrics.is_file() else []

    def _restore(self) -> int:
        """Load the resume checkpoint into the step Cells; return the last finished step."""
        import mindspore as ms
        _, ckpt = _resume_source(self.cfg.resume_from)
        for part in ckpt.parent.glob(".tmp_step_*"):  # a partial write of the killed attempt, never a checkpoint
            part.unlink(missing_ok=True)
        params = ms.load_checkpoint(str(ckpt))
        step = int(params.pop("step").asnumpy())
        params.pop("learning_rate", None)
        for cell in self.stepper.cells:
            ms.load_param_into_net(cell, params, strict_load=False)
        return step

    def _device_memory_bytes(self) -> int | None:
        """This step's device-allocator peak (bytes), or None on CPU (see helpers/run/memory.py)."""
        return self.device_memory.step_peak() if self.device_memory is not None else None

    def _save_checkpoint(self, step: int) -> None:
        """Metrics first, then the checkpoint: a resume never finds a checkpoint newer than its rows."""
        import mindspore as ms
        self.writer.flush(time.perf_counter())
        folder = self.run_dir / "checkpoints"
        final = folder / f"step_{step:06d}.ckpt"
        tmp = folder / f".tmp_step_{step:06d}.ckpt"
        try:
            ms.save_checkpoint(self.stepper.parameters_and_state(), str(tmp),
                               append_dict={"step": step})
            os.replace(tmp, final)
        except (OSError, RuntimeError) as exc:  # MindSpore leaves its partial file (.tmp) behind: remove it
            for part in folder.glob(f".tmp_step_{step:06d}.*"):
                part.unlink(missing_ok=True)
            raise write_failure(final, exc) from None
        for old in sorted(folder.glob("step_*.ckpt"))[:-self.cfg.keep_checkpoints]:
            old.unlink(missing_ok=True)

    def _validate(self, row: dict) -> None:
        """A validation pass into `row` (val_loss in nats/token, val_ppl)."""
        row["val_loss"] = self.evaluate()
        row["val_ppl"] = math.exp(min(row["val_loss"], 50.0))

    def _early_end(self, row: dict) -> str:
        """Why the run ends at this row before its last step, or "": its val loss reached `target_val_loss`, or
        `max_time_s` wall seconds have passed (a validation pass is then made, so its curve ends where it stopped;
        `elapsed_s` is updated to include it)."""
        cfg = self.cfg
        if cfg.target_val_loss and row["val_loss"] is not None and row["val_loss"] <= cfg.target_val_loss:
            return (f"reached target_val_loss={cfg.target_val_loss:g}: val loss {row['val_loss']:.4f} at step "
                    f"{row['step']}, {row['elapsed_s']:.1f} s after the process started")
        if cfg.max_time_s and row["elapsed_s"] >= cfg.max_time_s and row["step"] < cfg.steps:
            if row["val_loss"] is None:
                self._validate(row)
                row["elapsed_s"] = time.perf_counter() - self._clock0
            return (f"time cap max_time_s={cfg.max_time_s:g} s passed at step {row['step']} "
                    f"({row['elapsed_s']:.1f} s, val loss {row['val_loss']:.4f})")
        return ""

    def evaluate(self) -> float:
        """Mean validation loss over the fixed validation batches (nats/token)."""
        self.eval_net.set_train(False)
        losses = [float(self.eval_net(x, y).asnumpy()) for x, y in self.val]
        for cell in self.stepper.cells:
            cell.set_train(True)
        return float(np.mean(losses))

    def _one_step(self, batches) -> tuple[float, float, bool, float, float]:
        """Run one optimizer step; returns (loss, grad_norm, finite, loss_scale, data_wait_ms)."""
        import mindspore as ms
        if self.cfg.dataset_sink:  # `batches` is ms.data_sink's step: the device takes its own batch, so the
            loss, norm, finite, scale = batches()  # wait for it is inside the step and not measured (None)
            return float(loss.asnumpy()), float(norm.asnumpy()), bool(finite.asnumpy()), float(scale.asnumpy()), None
        wait = 0.0
        losses = []
        for i in range(self.cfg.grad_accum_steps):
            t0 = time.perf_counter()
            x, y = next(batches)
            wait += time.perf_counter() - t0
            x, y = ms.Tensor(x), ms.Tensor(y)
            if self.cfg.grad_accum_steps == 1:
                loss, norm, finite, scale = self.calls[0](x, y)
            else:
                losses.append(self.calls[0](x, y))
        if self.cfg.grad_accum_steps > 1:
            norm, finite, scale = self.calls[1]()
            loss = sum(float(v.asnumpy()) for v in losses) / len(losses)
        else:
            loss = float(loss.asnumpy())
        return loss, float(norm.asnumpy()), bool(finite.asnumpy()), float(scale.asnumpy()), wait * 1000.0

    def _intermittent(self, step: int) -> None:
        """The test-only ballast of every k-th step (model.ballast_every), inside that step's time."""
        if self._ballast is not None and step % self.cfg.model.ballast_every == 0:
            self._ballast().asnumpy()

    def run(self) -> Outcome:
        """Train `cfg.steps` steps (continuing a checkpoint if resume_from), writing the record."""
        self.start()
        self.step_block(self.cfg.steps)
        return self.finish()

    # Block stepping: start() → step_block(n) … → finish(). A paired round (helpers/run/pair.py) drives two
    # Trainers of one process this way, alternating blocks of steps between them.
    def start(self) -> int:
        """Write the record's start, prepare the data, set up MindSpore (only reseed when `shares_process`),
        build and compile the step Cells and open the step loop; returns the first step to train."""
        cfg = self.cfg
        base = self._base = {"status": "running", "status_reason": "", "pid": os.getpid(),
                "started_at": time.strftime("%Y-%m-%dT%H:%M:%S")}
        if cfg.resume_from:
            check_resumable(cfg)
            self.writer.rows = self._previous_rows()
            base["resumed_from"] = str(_resume_source(cfg.resume_from)[1])
        self.writer.start(config_mod.dump(cfg), environment(cfg.device_target, cfg.threads), base)
        cost = self.fixed_cost = FixedCost()
        # elapsed_s counts from this process's creation (start, imports, compile, evaluation: all a user pays);
        # a resumed run goes on from the seconds its earlier rows had already taken
        before = next((r["elapsed_s"] for r in reversed(self.writer.rows) if r.get("elapsed_s") is not None), 0.0)
        self._clock0 = time.perf_counter() - cost.seconds["start"] - before
        try:
            # which kernels `auto` picks, in the summary; a missing or stale native library fails now, not after
            # the MindSpore import
            self.kernels = self.extra_summary["kernels"] = resolve_kernels(cfg)
            with cost.phase("data"):
                self._data()
            with cost.phase("import"):
                self._configure()
            with cost.phase("peak"):  # both peaks MFU divides by: the model's own matmul shapes, the CPU's arithmetic
                dtype = "fp32" if cfg.amp_level == "O0" else cfg.amp_dtype
                peak_info = peak_flops_info(cfg.device_target, dtype, cfg.threads,
                                            matmul_shapes(cfg, cfg.model.vocab_size or self.prep.tokenizer.vocab_size))
                hardware = hardware_peak(dtype, cfg.device_target)
            self.extra_summary.update(peak_summary(peak_info, hardware))  # which peaks the MFU used: when, load
            self._peak, self._hardware_peak = peak_info["flops"], (hardware or {}).get("flops")
            with cost.phase("build"):
                self._build()
            start = self._restore() + 1 if cfg.resume_from else 1
            self._open(start)
        except Exception as exc:  # recorded as a failed run; the caller decides how loud to be
            self._fail(exc)
        return start

    def step_block(self, n: int) -> list[float]:
        """Train up to `n` more steps and return their step times (ms; each from asking for its batch to its
        loss, so data waits included); their data waits go to `block_waits`. Fewer when the run ends (its last
        step, a non-finite loss, a monitor's stop): `self.outcome` is then set. Once the record's last step is
        done, further steps are measurement-only (timed, no metrics row; at most `extra_steps` of them). The
        data gate is open meanwhile (see data.DataGate)."""
        self.block_waits = []
        self.gate.open()
        try:
            return self._extra(n) if self.outcome is not None else self._steps(n)
        except Exception as exc:
            self._fail(exc)
        finally:
            self.gate.close()

    def measure_block(self, n: int) -> tuple[list[float], list[float | None]]:
        """`n` steps of a round's measurement: (step ms, data wait ms). A record that reaches its last step inside
        the block is finished there (its summary written) and the block goes on measurement-only."""
        times = self.step_block(n)
        waits = list(self.block_waits)
        if len(times) < n and self.outcome is not None and self.outcome.status == "ok":
            self.finish()
            times += self.step_block(n - len(times))
            waits += self.block_waits
        return times, waits

    def finish(self, reason: str = "") -> Outcome:
        """Write the summary with the outcome (once); a run stopped before its end is 'stopped' (with `reason`)."""
        if self.finished:
            return self.outcome
        if self.outcome is None:
            self.outcome = Outcome("stopped", reason or "stopped before its last step", self._start)
        self._finish({**self._base, "status": self.outcome.status, "status_reason": self.outcome.reason},
                     self.outcome.start_step, self._peak)
        self.finished = True
        return self.outcome

    def _fail(self, exc: Exception) -> None:
        """Record the run as failed with `exc` (called while handling it), then re-raise it."""
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        try:
            self._finish({**self._base, "status": "failed", "status_reason": f"{type(exc).__name__}: {reason}",
                          "traceback": traceback.format_exc()[-4000:]}, 1, None)
        except RecordError:
            pass  # the disk refused the failed summary too: the 'running' one left reads as 'interrupted'
        raise exc

    def _finish(self, base: dict, start_step: int, peak: float | None) -> None:
        if hasattr(self, "hooks"):
            self.extra_summary.update(self.hooks.finish(self.writer.rows))
        self.writer.flush()
        stats = summarize(self.writer.rows, start_step, self.cfg.steady_after,
                          getattr(self, "flops_per_token", 0.0), peak, window_steps(self.cfg),
                          memory_source(self.cfg.device_target), self._hardware_peak if peak else None)
        if getattr(self, "device_memory", None) is not None:  # the allocator's own totals, next to the peak
            stats.update(self.device_memory.stats())
        first = [r for r in self.writer.rows if r["step"] == start_step]
        fixed = self.fixed_cost.summary(first, stats.get("step_time_ms")) if hasattr(self, "fixed_cost") else None
        summary = {**base, **stats, **self.extra_summary, "n_params": getattr(self, "n_params", None),
                   "fixed_cost_s": fixed, "process_start": process_start(),
                   "tokens_per_step": self.cfg.tokens_per_step,
                   # one process: no collective in the step; data-parallel runs get it measured by rankmerge
                   "comm_step_share": 0.0 if self.cfg.parallel.data_parallel == 1 else None,
                   "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S")}
        summary.pop("pid", None)
        self.writer.write_summary(summary)

    def _open(self, start: int) -> None:
        """The loop's state: batches from step `start` on, the loss EMA of earlier rows, no outcome yet."""
        cfg = self.cfg
        self._batches = self._feed(self._train_dataset((start - 1) * cfg.grad_accum_steps))
        self._ema = Ema()
        for row in self.writer.rows:
            self._ema.update(row["loss"])
        self._start = self._next = start
        self._last_good = start - 1
        self._extra_done = 0

    def _feed(self, dataset):
        """What `_one_step` takes its batches from: an iterator, or in sink mode (Ascend/GPU only, the config
        refuses it elsewhere) MindSpore's data_sink, one sunk batch per call."""
        if self.cfg.dataset_sink:
            import mindspore as ms
            return ms.data_sink(self.calls[0], dataset, sink_size=1)
        return iter(dataset.create_tuple_iterator(num_epochs=1, output_numpy=True))

    def _steps(self, n: int) -> list[float]:
        """Up to `n` recorded steps from `self._next`; sets `self.outcome` when the run ends."""
        cfg, start, ema, batches = self.cfg, self._start, self._ema, self._batches
        tokens = cfg.tokens_per_step
        times = []
        for step in range(self._next, min(self._next + n, cfg.steps + 1)):
            self._next = step + 1
            self.hooks.before_step(step)
            t0 = time.perf_counter()
            loss, norm, finite, scale, wait_ms = self._one_step(batches)
            self._intermittent(step)
            step_ms = (time.perf_counter() - t0) * 1000.0
            times.append(step_ms)
            self.block_waits.append(wait_ms)
            row = {"step": step, "step_time_ms": step_ms, "data_wait_ms": wait_ms, "tokens": tokens,
                   "tokens_per_s": tokens / (step_ms / 1000.0), "loss": loss, "loss_ema": ema.update(loss),
                   "grad_norm": norm, "loss_scale": scale, "overflow": int(not finite), "lr": lr_at(cfg, step),
                   "rss_bytes": rss_bytes(), "device_memory_bytes": self._device_memory_bytes(),
                   "val_loss": None, "val_ppl": None}
            bad = "loss" if not math.isfinite(loss) else (
                "gradient norm" if cfg.loss_scale == "none" and not math.isfinite(norm) else "")
            if not bad and ((cfg.eval_every and step % cfg.eval_every == 0) or step == cfg.steps):
                self._validate(row)
            row["elapsed_s"] = time.perf_counter() - self._clock0
            good_enough = "" if bad else self._early_end(row)
            stop = self.hooks.after_row(row)  # monitors first: they write the row's alarms
            self.sinks(row, cfg.steps)
            if bad:
                self.outcome = Outcome("nan", _nan_reason(step, self._last_good, row["lr"], scale, bad, cfg), start)
                return times
            if stop:
                self.outcome = Outcome("stopped", stop, start)
                return times
            if good_enough:  # reached the target or the time cap: a finished run (status ok) that ended early
                self._save_checkpoint(step)
                self.outcome = Outcome("ok", good_enough, start)
                return times
            self._last_good = step
            if cfg.checkpoint_every and step % cfg.checkpoint_every == 0 and step != cfg.steps:
                self._save_checkpoint(step)
        if self._next > cfg.steps:
            self._save_checkpoint(cfg.steps)
            self.outcome = Outcome("ok", "", start)
        return times

    def _extra(self, n: int) -> list[float]:
        """Up to `n` measurement-only steps after a finished record: the same Cells on the batches that follow the
        run's own, from the same pipeline (it was built `extra_steps` longer, as the optimizer's LR list: lr_at is
        min_lr past the end), so they cost what more steps of a longer run would; no metrics row, monitor or
        checkpoint. Nothing after a NaN or stop: those ended the measurement too."""
        if self.outcome.status != "ok":
            return []
        times = []
        for _ in range(min(n, self.extra_steps - self._extra_done)):
            t0 = time.perf_counter()
            wait_ms = self._one_step(self._batches)[-1]
            self._extra_done += 1
            self._intermittent(self.cfg.steps + self._extra_done)
            times.append((time.perf_counter() - t0) * 1000.0)
            self.block_waits.append(wait_ms)
        return times


def train(cfg: Config, run_dir: str | os.PathLike, progress=None, replace: bool = False):
    """Train in this process and return the loaded RunRecord (use `runner.launch` for a separate process). A run_dir
    that holds another run's record is refused, or with `replace` moved aside first (`outdir.claim`)."""
    from helpers.run.outdir import claim
    moved = claim(run_dir, cfg, replace)
    if moved:
        print(moved)
    Trainer(cfg, run_dir, progress).run()
    return load_run(run_dir)
