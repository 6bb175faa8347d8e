"""The step loop of one run: recorded optimizer steps (a metrics row each, validation passes, early ends,
checkpoints, a non-finite loss), then, for a round's arm, measurement-only steps past the record's last one.

Every step is timed from asking for its batch to its loss, so its data wait is inside its time (ms).
"""
from __future__ import annotations

import math
import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Callable

from helpers.config import Config
from helpers.run import interrupt
from helpers.run.build import Built
from helpers.run.data import pipeline_error
from helpers.run.metrics import Ema, rss_bytes
from helpers.run.rows import StepSink
from helpers.run.schedule import lr_at


@dataclass
class Outcome:
    """How a run's record ended: status ok / nan / stopped / interrupted / failed, why, and the step it (re)started
    at."""
    status: str
    reason: str
    start_step: int


def nan_reason(step: int, last_good: int, lr: float, scale: float, what: str, cfg: Config) -> str:
    """The one-line reason of a run stopped by a non-finite loss or gradient norm, with what to try."""
    cause = "fp16 overflow" if cfg.amp_level != "O0" else "learning rate too high or a bad batch"
    return (f"{what} became non-finite at step {step} (last good step {last_good}, lr {lr:.3g}, loss scale "
            f"{scale:g}); likely cause: {cause}; try: lower lr (e.g. lr={cfg.lr / 10:g}), longer warmup, "
            f"loss_scale=dynamic, or amp_level=O0; last good checkpoint kept in checkpoints/")


def feed(cfg: Config, calls: list, dataset):
    """What the loop takes its batches from: an iterator, or in sink mode (Ascend/GPU only, the config refuses it
    elsewhere) MindSpore's data_sink, one sunk batch per call."""
    if cfg.dataset_sink:
        import mindspore as ms
        return ms.data_sink(calls[0], dataset, sink_size=1)
    return iter(dataset.create_tuple_iterator(num_epochs=1, output_numpy=True))


class StepLoop:
    """The loop from step `start` on. ema_from: the loss EMA of the record's last row (a resume's), which this run's
    goes on from (None, or not finite when no earlier loss was: it starts at this run's first finite loss); clock0: the
    perf_counter value that `elapsed_s` counts from; sinks: where each row goes; checkpoint(step): saves one;
    extra_steps: how many measurement-only steps may follow the record's last step."""

    def __init__(self, cfg: Config, built: Built, batches, ema_from: float | None, start: int, clock0: float,
                 sinks: StepSink, checkpoint: Callable[[int], None], extra_steps: int, compile_gate=None):
        self.cfg, self.built, self.batches = cfg, built, batches
        # A round's arm (its data.DataGate): in the first step, which compiles for seconds, the pipeline works only
        # while the step waits for a batch. Left open, it read data.prefetch batches ahead during the compile, and
        # the arm's first dozens of timed steps met none of the waits every later step of a data-bound run pays.
        self.compile_gate = None if cfg.dataset_sink else compile_gate
        # The same gate after the compile: held through validation passes and checkpoints (DataGate.held).
        self.turn_gate = self.compile_gate
        self.sinks, self.checkpoint = sinks, checkpoint
        self.ema = Ema(value=ema_from if ema_from is not None and math.isfinite(ema_from) else None)
        self.start = self.next = start
        self.last_good = start - 1
        self.clock0 = clock0
        self.extra_steps, self.extra_done = extra_steps, 0

    def steps(self, n: int) -> tuple[list[float], list[float | None], Outcome | None]:
        """Up to `n` recorded steps from `next`: their times and data waits (ms), and the Outcome when the record
        ends in them (its last step, a non-finite loss, a monitor's stop, the target reached), else None."""
        cfg, times, waits = self.cfg, [], []
        for step in range(self.next, min(self.next + n, cfg.steps + 1)):
            self.next = step + 1
            self.built.hooks.before_step(step)
            t0 = time.perf_counter()
            loss, norm, finite, scale, wait_ms = self._one_step()
            self._intermittent(step)
            step_ms = (time.perf_counter() - t0) * 1000.0
            times.append(step_ms)
            waits.append(wait_ms)
            ended = self._record(step, step_ms, wait_ms, loss, norm, finite, scale)
            if ended is None and step < cfg.steps and interrupt.requested():
                self.checkpoint(step)  # metrics first, then the checkpoint of this step: always resumable
                ended = Outcome("interrupted", f"interrupted by Ctrl-C after step {step} of {cfg.steps} (checkpoint "
                                               f"step_{step:06d}.ckpt saved)", self.start)
            if ended is not None:
                return times, waits, ended
        if self.next > cfg.steps:
            self.checkpoint(cfg.steps)
            return times, waits, Outcome("ok", "", self.start)
        return times, waits, None

    def extra(self, n: int) -> tuple[list[float], list[float | None]]:
        """Up to `n` measurement-only steps after a finished record: the same Cells on the batches that follow the
        run's own, from the same pipeline (it was built `extra_steps` longer; the learning rate stays at the last
        step's), so they cost what more steps of a longer run would; no metrics row, monitor or
        checkpoint. Their times and data waits (ms)."""
        times, waits = [], []
        for _ in range(min(n, self.extra_steps - self.extra_done)):
            self.built.hooks.set_lr(self.cfg.steps + self.extra_done + 1)
            t0 = time.perf_counter()
            wait_ms = self._one_step()[-1]
            self.extra_done += 1
            self._intermittent(self.cfg.steps + self.extra_done)
            times.append((time.perf_counter() - t0) * 1000.0)
            waits.append(wait_ms)
        return times, waits

    def _record(self, step: int, step_ms: float, wait_ms: float | None, loss: float, norm: float, finite: bool,
                scale: float) -> Outcome | None:
        """The step's metrics row (a validation pass on eval steps and the last), through the monitors to the sinks;
        a checkpoint when due; the Outcome when the record ends at this step."""
        cfg, tokens = self.cfg, self.cfg.tokens_per_step
        row = {"step": step, "step_time_ms": step_ms, "data_wait_ms": wait_ms, "tokens": tokens,
               "tokens_per_s": tokens / (step_ms / 1000.0), "loss": loss, "loss_ema": self.ema.update(loss),
               "grad_norm": norm, "loss_scale": scale, "overflow": int(not finite), "lr": lr_at(cfg, step),
               "rss_bytes": rss_bytes(), "device_memory_bytes": self.built.device_memory_bytes(),
               "val_loss": None, "val_ppl": None}
        bad = "loss" if not math.isfinite(loss) else (
            "gradient norm" if cfg.loss_scale == "none" and not math.isfinite(norm) else "")
        if not bad and ((cfg.eval_every and step % cfg.eval_every == 0) or step == cfg.steps):
            with self._held():
                self._validate(row)
        row["elapsed_s"] = time.perf_counter() - self.clock0
        good_enough = "" if bad else self._early_end(row)
        stop = self.built.hooks.after_row(row)  # monitors first: they write the row's alarms
        self.sinks(row, cfg.steps)
        if bad:
            return Outcome("nan", nan_reason(step, self.last_good, row["lr"], scale, bad, cfg), self.start)
        if stop:
            return Outcome("stopped", stop, self.start)
        if good_enough:  # reached the target or the time cap: a finished run (status ok) that ended early
            self.checkpoint(step)
            return Outcome("ok", good_enough, self.start)
        self.last_good = step
        if cfg.checkpoint_every and step % cfg.checkpoint_every == 0 and step != cfg.steps:
            with self._held():
                self.checkpoint(step)
        return None

    def _held(self):
        """A round's arm holds its pipeline through work no step waits on (`DataGate.held`); a run of its own not."""
        return self.turn_gate.held() if self.turn_gate is not None else nullcontext()

    def _validate(self, row: dict) -> None:
        """A validation pass into `row` (val_loss in nats/token, val_ppl)."""
        row["val_loss"] = self.built.evaluate()
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
                row["elapsed_s"] = time.perf_counter() - self.clock0
            return (f"time cap max_time_s={cfg.max_time_s:g} s passed at step {row['step']} "
                    f"({row['elapsed_s']:.1f} s, val loss {row['val_loss']:.4f})")
        return ""

    def _one_step(self) -> tuple[float, float, bool, float, float | None]:
        """Run one optimizer step; returns (loss, grad_norm, finite, loss_scale, data_wait_ms)."""
        import mindspore as ms
        cfg, calls, batches = self.cfg, self.built.calls, self.batches
        if cfg.dataset_sink:  # `batches` is ms.data_sink's step: the device takes its own batch, so the
            loss, norm, finite, scale = batches()  # wait for it is inside the step and not measured (None)
            return float(loss.asnumpy()), float(norm.asnumpy()), bool(finite.asnumpy()), float(scale.asnumpy()), None
        wait = 0.0
        losses = []
        for _ in range(cfg.grad_accum_steps):
            t0 = time.perf_counter()
            x, y = self._fetch(batches)
            wait += time.perf_counter() - t0
            x, y = ms.Tensor(x), ms.Tensor(y)
            if cfg.grad_accum_steps == 1:
                loss, norm, finite, scale = calls[0](x, y)
            else:
                losses.append(calls[0](x, y))
        if cfg.grad_accum_steps > 1:
            norm, finite, scale = calls[1]()
            loss = sum(float(v.asnumpy()) for v in losses) / len(losses)
        else:
            loss = float(loss.asnumpy())
        return loss, float(norm.asnumpy()), bool(finite.asnumpy()), float(scale.asnumpy()), wait * 1000.0

    def _fetch(self, batches):
        """The next batch; in a round arm's compile step, with its data gate open only meanwhile. A data problem
        found while the pipeline ran (a bad id in a streamed row) is raised as its own one-line error."""
        gate = self.compile_gate
        if gate is not None:
            gate.open()
        try:
            return next(batches)
        except RuntimeError as exc:
            found = pipeline_error(exc)
            if found is None:
                raise
            raise found from None
        finally:
            if gate is not None:
                gate.close()

    def compiled(self) -> None:
        """The first step is done: from now on the gate stays open while the arm steps (Trainer opens it)."""
        self.compile_gate = None

    def _intermittent(self, step: int) -> None:
        """The test-only ballast of every k-th step (model.ballast_every), inside that step's time."""
        if self.built.ballast is not None and step % self.cfg.model.ballast_every == 0:
            self.built.ballast().asnumpy()
