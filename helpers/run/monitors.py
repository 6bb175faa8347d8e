"""Stability monitors: per-step checks on the metrics row the loop already built (host arithmetic only).

Each check adds a flag to the row's `alarms` column and an {kind, step, message} entry to the summary:
grad_norm, nan, loss_spike (with periodicity), memory_growth (RSS slope), overfit, callback. The row also
gets `loss_drop_per_ktok`, so a fast run that no longer learns shows as such.
"""
from __future__ import annotations

import importlib
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from helpers.config import Config, ConfigError
from helpers.record import MetricColumns

MAX_ALARMS_PER_KIND = 20  # the summary keeps the first ones and counts the rest
MEMORY_CHECK_EVERY = 10  # steps between RSS-slope fits
SPIKE_MIN_NATS = 0.1  # a spike must also rise this much in absolute terms (near-zero losses are noisy)


@dataclass
class Alarm:
    """One monitor finding: kind, the step it fired on, one line of text."""
    kind: str
    step: int
    message: str


def spike_period(steps: list[int], tolerance: float = 0.25) -> float | None:
    """Median gap in steps between spikes if at least 3 spikes come at regular gaps (each within
    `tolerance` of the median, at least 1 step), else None."""
    if len(steps) < 3:
        return None
    gaps = np.diff(sorted(steps))
    median = float(np.median(gaps))
    if median <= 0 or np.any(np.abs(gaps - median) > max(1.0, tolerance * median)):
        return None
    return median


def rss_slope(steps: Sequence[float], rss: Sequence[float]) -> float:
    """Least-squares slope of RSS over steps, in bytes/step (0 with fewer than 2 points)."""
    if len(steps) < 2:
        return 0.0
    x = np.asarray(steps, dtype=np.float64)
    y = np.asarray(rss, dtype=np.float64)
    x -= x.mean()
    denom = float((x * x).sum())
    return float((x * (y - y.mean())).sum() / denom) if denom else 0.0


def sustained_slope(steps: Sequence[float], rss: Sequence[float]) -> float:
    """RSS growth that lasts the whole window, in bytes/step: the smaller of the slopes of its two halves.
    A one-off jump (the first evaluation's buffers) sits in one half only and reads as ~0; a leak does not."""
    half = len(steps) // 2
    if half < 2:
        return 0.0
    return min(rss_slope(steps[:half], rss[:half]), rss_slope(steps[half:], rss[half:]))


def rising_while_falling(evals: list[tuple[int, float, float]], k: int) -> bool:
    """True if the last k+1 evals (step, val_ppl, train loss_ema) show val PPL rising at each of the k
    evals while the train loss EMA ended lower than it started."""
    if len(evals) < k + 1:
        return False
    last = evals[-(k + 1):]
    ppl_up = all(b[1] > a[1] for a, b in zip(last, last[1:]))
    return ppl_up and last[-1][2] < last[0][2]


def effective_max_grad_norm(cfg: Config) -> float:
    """Clip norm for the step Cell: grad_norm_action=clip clips at grad_norm_limit from step 1."""
    mon = cfg.monitor
    if mon.grad_norm_action == "clip" and mon.grad_norm_limit > 0:
        return min(cfg.max_grad_norm, mon.grad_norm_limit) if cfg.max_grad_norm > 0 else mon.grad_norm_limit
    return cfg.max_grad_norm


def load_callbacks(specs: list[str], cfg: Config) -> list[Callable[[dict], str | None]]:
    """Import each 'pkg.mod:factory' and call factory(cfg) -> fn(row) returning alarm text or None."""
    out = []
    for spec in specs:
        module_name, _, name = spec.partition(":")
        try:
            factory = getattr(importlib.import_module(module_name), name)
        except (ImportError, AttributeError) as exc:
            raise ConfigError(f"monitor.callbacks item {spec!r} cannot be imported ({exc}); make the module "
                              f"importable (PYTHONPATH) and check the factory name") from None
        out.append(factory(cfg))
    return out


class Monitors:
    """The stability checks, fed one metrics row per step by the train loop. `lr_scale` is what
    grad_norm_action=lower_lr has made of the learning rate; the hooks apply it to later steps."""

    def __init__(self, cfg: Config, run_dir: Path):
        self.cfg, self.mon, self.run_dir = cfg, cfg.monitor, Path(run_dir)
        self.callbacks = load_callbacks(self.mon.callbacks, cfg)
        self.alarms: list[Alarm] = []
        self.counts: dict[str, int] = {}
        self.lr_scale = 1.0
        self.prev_ema: float | None = None
        self.spikes: list[int] = []
        self.over_limit = False
        self.ema_tokens: deque = deque(maxlen=self.mon.throughput_window + 1)
        self.tokens_seen = 0
        self.rss: deque = deque(maxlen=self.mon.memory_window)
        self.evals: list[tuple[int, float, float]] = []
        self.finite_rows: deque = deque(maxlen=6)
        self.fired: set[str] = set()

    def _alarm(self, row: dict, kind: str, message: str) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + 1
        if self.counts[kind] <= MAX_ALARMS_PER_KIND:
            self.alarms.append(Alarm(kind, row["step"], message))
        row["alarms"] = f"{row['alarms']};{kind}" if row.get("alarms") else kind

    def on_row(self, row: dict) -> str | None:
        """Run every check on this step's row (adds 'alarms', 'loss_drop_per_ktok'; rescales 'lr' after a
        lower_lr alarm). Returns a stop reason, or None to go on."""
        row["lr"] = row["lr"] * self.lr_scale
        row.setdefault("alarms", None)
        self._throughput(row)
        stop = None
        if self._non_finite(row):
            self._alarm(row, "nan", self.nan_diagnosis(row))
        else:
            stop = self._grad_norm(row)
            self._spike(row)
            self._memory(row)
            self._overfit(row)
            self.finite_rows.append(row)
        for callback in self.callbacks:
            message = callback(row)
            if message:
                self._alarm(row, "callback", str(message))
        return stop

    def _throughput(self, row: dict) -> None:
        self.tokens_seen += row["tokens"]
        ema = row.get("loss_ema")
        if ema is not None and math.isfinite(ema):
            self.ema_tokens.append((ema, self.tokens_seen))
        row["loss_drop_per_ktok"] = None
        if len(self.ema_tokens) == self.ema_tokens.maxlen:
            (e0, t0), (e1, t1) = self.ema_tokens[0], self.ema_tokens[-1]
            row["loss_drop_per_ktok"] = (e0 - e1) / (t1 - t0) * 1000.0

    def _non_finite(self, row: dict) -> bool:
        norm = row.get("grad_norm")
        return not math.isfinite(row["loss"]) or (self.cfg.loss_scale == "none" and norm is not None
                                                   and not math.isfinite(norm))

    def _grad_norm(self, row: dict) -> str | None:
        limit, action, norm = self.mon.grad_norm_limit, self.mon.grad_norm_action, row.get("grad_norm")
        over = bool(limit) and norm is not None and norm > limit
        was_over, self.over_limit = self.over_limit, over
        if not over:
            return None
        text = f"grad norm {norm:.3g} > limit {limit:g}"
        if action == "stop":
            self._alarm(row, "grad_norm", f"{text}; run stopped (monitor.grad_norm_action=stop)")
            return (f"grad norm {norm:.3g} exceeded monitor.grad_norm_limit={limit:g} at step {row['step']}; "
                    f"lower lr, raise warmup, or set max_grad_norm to clip")
        if action == "lower_lr":
            self._lower_lr(row, text)
        elif not was_over:
            note = f"; clipped to {effective_max_grad_norm(self.cfg):g}" if action == "clip" else ""
            self._alarm(row, "grad_norm", text + note)
        return None

    def _lower_lr(self, row: dict, text: str) -> None:
        self.lr_scale *= self.mon.lr_factor  # from the next step on: this row's step has run
        self._alarm(row, "grad_norm", f"{text}; LR of later steps scaled to {self.lr_scale:.3g}x")

    def _spike(self, row: dict) -> None:
        prev, self.prev_ema = self.prev_ema, row.get("loss_ema")
        if prev is None or row["loss"] - prev <= max(prev * self.mon.spike_ratio, SPIKE_MIN_NATS):
            return
        self.spikes.append(row["step"])
        period = spike_period(self.spikes)
        every = (f"; spikes come every ~{period:.0f} steps: look at data order (epoch/shard boundaries) or the "
                 f"LR schedule" if period else "")
        self._alarm(row, "loss_spike", f"loss {row['loss']:.3f} is {row['loss'] / prev - 1:.0%} above its EMA "
                                       f"{prev:.3f}{every}")

    def _memory(self, row: dict) -> None:
        if not self.mon.memory_slope_limit or row["step"] <= self.cfg.steady_after or row.get("rss_bytes") is None:
            return
        self.rss.append((row["step"], row["rss_bytes"]))
        if "memory_growth" in self.fired or len(self.rss) < self.rss.maxlen or row["step"] % MEMORY_CHECK_EVERY:
            return
        steps, rss = zip(*self.rss)
        slope = sustained_slope(list(steps), list(rss))
        if slope > self.mon.memory_slope_limit:
            self.fired.add("memory_growth")
            self._alarm(row, "memory_growth", f"RSS grows {slope / 1024:,.0f} KiB/step over steps {steps[0]}-"
                                              f"{steps[-1]} (limit {self.mon.memory_slope_limit / 1024:,.0f} "
                                              f"KiB/step): a slow leak, e.g. tensors kept alive across steps")

    def _overfit(self, row: dict) -> None:
        if row.get("val_ppl") is None or "overfit" in self.fired:
            return
        self.evals.append((row["step"], row["val_ppl"], row["loss_ema"]))
        k = self.mon.overfit_evals
        if rising_while_falling(self.evals, k):
            first, last = self.evals[-(k + 1)], self.evals[-1]
            self.fired.add("overfit")
            self._alarm(row, "overfit", f"val PPL rose {first[1]:.2f} → {last[1]:.2f} over {k} evals (steps "
                                        f"{first[0]}-{last[0]}) while train loss fell {first[2]:.3f} → "
                                        f"{last[2]:.3f}: overfitting; stop earlier, add data or dropout")

    def nan_diagnosis(self, row: dict) -> str:
        """Why the loss/grad went non-finite: last good step, lr, loss scale, grad-norm trend, likely cause,
        what to try, and the last checkpoint on disk."""
        what = "loss" if not math.isfinite(row["loss"]) else "gradient norm"
        good = list(self.finite_rows)
        norms = [r["grad_norm"] for r in good if r.get("grad_norm") is not None]
        last_good = good[-1]["step"] if good else None
        if self.cfg.amp_level != "O0":
            cause = "fp16 overflow (amp_level is not O0)"
        elif row["lr"] >= 1.0:
            cause = f"learning rate {row['lr']:.3g} is far above AdamW's usual 1e-4..1e-2"
        elif len(norms) >= 2 and norms[-1] > 10 * min(norms):
            cause = f"divergence: grad norm grew {min(norms):.3g} → {norms[-1]:.3g} in the last {len(norms)} steps"
        elif good:
            cause = "a sudden blow-up from a normal state: a bad batch or an op overflow"
        else:
            cause = "non-finite from the first step: learning rate far too high or broken initialisation"
        ckpts = sorted((self.run_dir / "checkpoints").glob("step_*.ckpt"))
        kept = (f"last good checkpoint: checkpoints/{ckpts[-1].name}" if ckpts else
                "no checkpoint on disk (set checkpoint_every to keep one)")
        return (f"{what} non-finite at step {row['step']} (last good step {last_good}, lr {row['lr']:.3g}, "
                f"loss scale {row.get('loss_scale')}); likely cause: {cause}; try: lr={self.cfg.lr / 10:g}, "
                f"longer warmup, max_grad_norm=1, loss_scale=dynamic or amp_level=O0; {kept}")

    def summary(self, rows: MetricColumns) -> dict:
        """Summary keys: alarms (first per kind), alarm_counts, spike_period (steps), lr_scale,
        loss_drop_per_ktok (loss EMA drop per 1,000 tokens over the record's rows with a finite EMA)."""
        finite = np.isfinite(rows["loss_ema"])
        ema, tokens = rows["loss_ema"][finite], float(rows["tokens"][finite][1:].sum())
        return {
            "alarms": [asdict(a) for a in self.alarms],
            "alarm_counts": dict(self.counts),
            "spike_period": spike_period(self.spikes),
            "lr_scale": self.lr_scale,
            "loss_drop_per_ktok": float(ema[0] - ema[-1]) / tokens * 1000.0 if tokens else None,
        }
