"""Matplotlib figures from run records. Each returns a Figure (not drawn through pyplot, so a notebook
shows it once, as the cell's result, and tests need no display)."""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from matplotlib.figure import Figure

from helpers.record import RunRecord
from helpers.units import MIB
from helpers.record import DEVICE, memory_label

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]
MAX_POINTS = 2000  # points a per-step curve draws at most: a longer run's curve is drawn as that many buckets


def _figure(panels: int = 1, width: float = 6.0, height: float = 3.6):
    fig = Figure(figsize=(width * panels, height), layout="constrained")
    return fig, [fig.add_subplot(1, panels, i + 1) for i in range(panels)]


class Curve(NamedTuple):
    """Points to draw: at x, the value y, within the band lo..hi (lo = y = hi where a point is one step)."""
    x: np.ndarray
    y: np.ndarray
    lo: np.ndarray
    hi: np.ndarray


def bucketed(steps: np.ndarray, values: np.ndarray, max_points: int = MAX_POINTS) -> Curve:
    """`values` against `steps`, non-finite values left out, in at most `max_points` points: the points themselves
    when there are no more, else equal-count buckets of consecutive points, each at its middle step with its mean
    (y) and its min and max (lo, hi), so a one-step spike stays visible as the band's edge."""
    keep = np.isfinite(values)
    steps, values = np.asarray(steps, dtype=np.float64)[keep], values[keep]
    if values.size <= max_points:
        return Curve(steps, values, values, values)
    starts = np.linspace(0, values.size, max_points + 1).astype(np.int64)[:-1]  # strictly rising: size > points
    sizes = np.diff(np.append(starts, values.size))
    return Curve(steps[starts + sizes // 2], np.add.reduceat(values, starts) / sizes,
                 np.minimum.reduceat(values, starts), np.maximum.reduceat(values, starts))


def draw(ax, curve: Curve, **style) -> None:
    """Plot a `bucketed` curve on `ax` with `style` (matplotlib's plot keywords), and its min–max band where its
    buckets hold more than one value."""
    line, = ax.plot(curve.x, curve.y, **style)
    if (curve.hi > curve.lo).any():
        ax.fill_between(curve.x, curve.lo, curve.hi, color=line.get_color(), alpha=0.2, lw=0)


def _series(record: RunRecord, column: str, scale: float = 1.0) -> Curve:
    cols = record.columns("step", column)
    return bucketed(cols["step"], cols[column] * scale)


def curves(groups: dict[str, list[RunRecord]], column: str, ylabel: str, title: str, scale: float = 1.0,
           logy: bool = False) -> Figure:
    """`column` against step for every run (`bucketed` when long); one colour per group, one line per repeat."""
    fig, (ax,) = _figure()
    for i, (label, records) in enumerate(groups.items()):
        for j, rec in enumerate(records):
            draw(ax, _series(rec, column, scale), color=COLORS[i % len(COLORS)], alpha=0.85, lw=1.2,
                 label=label if j == 0 else None)
    ax.set(xlabel="step", ylabel=ylabel, title=title)
    if logy:
        ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def step_time_plot(groups: dict[str, list[RunRecord]]) -> Figure:
    """Step time (ms) per step, log scale so the compile step and the steady state both show."""
    return curves(groups, "step_time_ms", "step time (ms, log)", "Step time: compile, warm-up, steady state",
                  logy=True)


def loss_plot(groups: dict[str, list[RunRecord]]) -> Figure:
    """Training loss per step (nats/token)."""
    return curves(groups, "loss", "training loss (nats/token)", "Loss curves")


def memory_plot(groups: dict[str, list[RunRecord]]) -> Figure:
    """Memory per step (MiB): process RSS on CPU, the device allocator's per-step peak on GPU/Ascend."""
    first = next((r for runs in groups.values() for r in runs), None)
    if first is not None and memory_label(first.summary) == "peak device memory":
        return curves(groups, "device_memory_bytes", "device memory (MiB)",
                      f"Memory per step ({DEVICE})", scale=1 / MIB)
    return curves(groups, "rss_bytes", "RSS (MiB)", "Memory (process RSS) per step", scale=1 / MIB)


def data_wait_plot(groups: dict[str, list[RunRecord]]) -> Figure:
    """Time blocked on the input pipeline per step (ms)."""
    return curves(groups, "data_wait_ms", "data wait (ms)", "Time each step waited for its batch")


def sweep_plot(points: list[tuple[object, RunRecord]], xlabel: str) -> Figure:
    """Tokens/s and peak memory (MiB; RSS on CPU, device memory off it) against a swept value; points are
    (value, record) pairs."""
    fig, (left, right) = _figure(2, width=4.8)
    ok = [(str(v), r) for v, r in points if r.summary.get("tokens_per_s")]
    labels = [v for v, _ in ok]
    left.bar(labels, [r.summary["tokens_per_s"] for _, r in ok], color=COLORS[0])
    left.set(xlabel=xlabel, ylabel="tokens/s (steady median)", title="Throughput")
    right.bar(labels, [(r.summary.get("peak_memory_bytes") or 0) / MIB for _, r in ok], color=COLORS[3])
    right.set(xlabel=xlabel, ylabel=f"{memory_label(ok[0][1].summary if ok else None)} (MiB)", title="Peak memory")
    for ax in (left, right):
        ax.grid(alpha=0.3, axis="y")
    return fig


def waterfall(baseline_tokens_s: float, steps: list[tuple[str, float, str]]) -> Figure:
    """Tokens/s from the baseline through each round: kept rounds move the running level, others show
    their measured effect as a hatched, unapplied bar. steps: (label, candidate/reference ratio, decision)."""
    fig, (ax,) = _figure(width=8.0)
    level = baseline_tokens_s
    ax.bar(["baseline"], [level], color=COLORS[0])
    for label, ratio, decision in steps:
        if ratio is None or not math.isfinite(ratio):
            ax.bar([label], [0], color="#cccccc")
            ax.annotate(decision, (label, 0), ha="center", va="bottom", fontsize=8)
            continue
        delta = level * (ratio - 1.0)
        kept = decision == "keep"
        color = (COLORS[2] if delta >= 0 else COLORS[1]) if kept else "#bbbbbb"
        ax.bar([label], [delta], bottom=[level], color=color, hatch=None if kept else "//", edgecolor="#555555")
        ax.annotate(f"{ratio:.2f}× {decision}", (label, level + max(delta, 0)), ha="center", va="bottom",
                    fontsize=8)
        if kept:
            level += delta
    ax.bar(["best"], [level], color=COLORS[0])
    ax.set(ylabel="tokens/s", title="Tokens/s round by round (hatched = measured, not kept)")
    ax.tick_params(axis="x", rotation=30, labelsize=8)
    ax.grid(alpha=0.3, axis="y")
    return fig


def evaluation_plot(record: RunRecord) -> Figure:
    """Three panels: training loss with its EMA and validation loss; validation PPL; gradient norm."""
    fig, (loss_ax, ppl_ax, grad_ax) = _figure(3, width=4.6)
    for column, style, label in (("loss", dict(alpha=0.35, lw=1), "train loss"),
                                 ("loss_ema", dict(lw=1.8), "train loss EMA"),
                                 ("val_loss", dict(marker="o", lw=1.5), "val loss")):
        draw(loss_ax, _series(record, column), label=label, **style)
    loss_ax.set(xlabel="step", ylabel="loss (nats/token)", title="Train vs validation")
    loss_ax.legend(fontsize=8)
    draw(ppl_ax, _series(record, "val_ppl"), marker="o", color=COLORS[3])
    ppl_ax.set(xlabel="step", ylabel="perplexity", title="Validation perplexity")
    draw(grad_ax, _series(record, "grad_norm"), color=COLORS[4], lw=1)
    limit = record.config.max_grad_norm
    if limit:
        grad_ax.axhline(limit, ls="--", color="#555555", label=f"clip at {limit:g}")
        grad_ax.legend(fontsize=8)
    grad_ax.set(xlabel="step", ylabel="global grad norm (before clipping)", title="Gradient norm")
    for ax in (loss_ax, ppl_ax, grad_ax):
        ax.grid(alpha=0.3)
    return fig


def op_shift_plot(shift, top: int = 12, title: str = "Operator time per step, before → after") -> Figure:
    """Horizontal bars of ms/step before and after for the `top` ops by |delta| (a `fusion.op_table_shift`
    frame); vanished/new ops are marked in their label."""
    rows = shift.head(top).iloc[::-1]
    fig, (ax,) = _figure(width=7.5, height=0.32 * len(rows) + 1.4)
    y = range(len(rows))
    labels = [f"{op} ({flag})" if flag else op for op, flag in zip(rows["op"], rows["flag"])]
    ax.barh([i + 0.2 for i in y], rows["ms/step before"], height=0.4, color=COLORS[0], label="before (reference)")
    ax.barh([i - 0.2 for i in y], rows["ms/step after"], height=0.4, color=COLORS[3], label="after (candidate)")
    ax.set_yticks(list(y), labels, fontsize=8)
    ax.set(xlabel="ms per step (profiled, median over runs)", title=title)
    ax.grid(alpha=0.3, axis="x")
    ax.legend(fontsize=8)
    return fig


def _eval_curves(ax, groups: dict[str, list[RunRecord]], x: int) -> None:
    """Validation loss of every run against `eval_curve`'s column `x` (0 tokens, 2 wall seconds); one colour per
    group, one line per seed."""
    from helpers.tune.convergence import eval_curve
    for i, (label, records) in enumerate(groups.items()):
        for j, rec in enumerate(records):
            curve = eval_curve(rec)
            ax.plot(curve[x], curve[1], marker="o", ms=3, color=COLORS[i % len(COLORS)], alpha=0.85, lw=1.2,
                    label=label if j == 0 else None)


def val_loss_time_plot(groups: dict[str, list[RunRecord]], target: float | None = None) -> Figure:
    """Validation loss against wall seconds since each run's process started (start-up, compile and evaluation
    included) for every run, with the target as a dashed line and a cross where each run reached it."""
    from helpers.tune.convergence import time_to_target
    fig, (ax,) = _figure()
    _eval_curves(ax, groups, 2)
    if target:
        ax.axhline(target, ls="--", color="#555555", label=f"target {target:.4f}")
        for i, records in enumerate(groups.values()):
            hits = [t for t in (time_to_target(r, target) for r in records) if t is not None]
            ax.plot(hits, [target] * len(hits), "x", ms=9, mew=2, color=COLORS[i % len(COLORS)])
    ax.set(xlabel="wall seconds since the process started", ylabel="validation loss (nats/token)",
           title="Validation loss against wall time")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def val_loss_tokens_plot(groups: dict[str, list[RunRecord]], at_tokens: float | None = None) -> Figure:
    """Validation loss against cumulative tokens for every run (one colour per group, one line per seed),
    with a dashed line where a convergence round compared them (`at_tokens`)."""
    fig, (ax,) = _figure()
    _eval_curves(ax, groups, 0)
    if at_tokens:
        ax.axvline(at_tokens, ls="--", color="#555555", label=f"compared at {at_tokens:,.0f} tokens")
    ax.set(xlabel="tokens trained", ylabel="validation loss (nats/token)", title="Validation loss at equal tokens")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def step_parts_plot(results: list) -> Figure:
    """Where each arm's mean step went in each speed round (ms): its compute (the fast end of its steps less
    their data wait: what a step costs when nothing stalls it), its data wait and its other stalls, stacked; the
    verdict's tokens/s ratio counts all three."""
    rounds = [r for r in results if getattr(r.verdict, "parts", None)]
    fig, (ax,) = _figure(height=1.2 + 0.9 * max(1, len(rounds)))
    labels, y = [], 0.0
    for r in rounds:
        for arm in ("reference", "candidate"):
            p = r.verdict.parts[arm]
            wait = (p["data_wait_share"] or 0.0) * p["mean_ms"]
            left = 0.0
            for width, color, name in ((p["compute_ms"], COLORS[0], "compute"), (wait, COLORS[1], "data wait"),
                                       (p["stall_share"] * p["mean_ms"], COLORS[3], "other stalls")):
                ax.barh(y, width, left=left, color=color, label=name if not labels else None)
                left += width
            labels.append(f"{r.name}: {arm}")
            y += 1
        y += 0.5
    ax.set_yticks([i + 0.5 * (i // 2) for i in range(len(labels))], labels, fontsize=8)
    ax.invert_yaxis()
    ax.set(xlabel="mean step (ms)", title="Where each arm's step time goes")
    ax.grid(axis="x", alpha=0.3)
    if labels:
        ax.legend(fontsize=8, loc="lower right")
    return fig
