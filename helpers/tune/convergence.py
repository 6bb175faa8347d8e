"""The convergence rule of a tuning round: validation loss at equal tokens, with a seed-to-seed noise band.

A speed round asks "is a step faster at the same quality?"; a convergence round asks "does the model learn
more from the same data?" — the question for lr, warm-up, schedule, clipping, weight decay, betas and the
global batch. Each arm (reference = the current best, candidate) trains with the same list of seeds (paired:
seed k of both arms has the same initialisation and data order), and the seeds' spread is the noise band.
Pure functions over run records, like `verdict.judge`, so a verdict can be recomputed from the records alone.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from helpers.record import RunRecord
from helpers.tune.rules import Verdict, t975
from helpers.units import mib_text
from helpers.run.memory import memory_label

# Variables that change what a model learns per token rather than how fast a step runs: a speed round on them
# measures tokens/s, which they do not move, so `Workbook.run_round` warns and points to objective="convergence".
CONVERGENCE_VARIABLES = ("lr", "warmup", "schedule", "min_lr", "max_grad_norm", "weight_decay", "betas", "eps",
                         "model.dropout")
OBJECTIVES = ("speed", "convergence")


def convergence_rule_text(memory_limit_bytes: int) -> str:
    """The convergence rule with its thresholds, as printed in every convergence verdict."""
    return ("keep only if the candidate's mean validation loss at equal tokens (the largest token count every "
            "run evaluated at; eval points interpolated on cumulative tokens) is below the reference's by more "
            "than the seed band (95% Student-t half-width of the pooled seed-to-seed spread of both arms), and "
            f"peak memory ≤ {mib_text(memory_limit_bytes)}; above by more than the band → reject; otherwise → no "
            "change; a run that did not finish → failed. Time to target (wall seconds of training steps until "
            "validation loss ≤ the level every reference seed reached) is reported, not judged")


def eval_curve(run: RunRecord) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(cumulative tokens, validation loss in nats/token, cumulative step seconds) at each validation pass.

    Tokens count every step up to and including the eval step (tokens_per_step = batch × accum × seq_len, from
    the metrics rows); seconds are the sum of step times (compile step included, validation passes not).
    """
    tokens = seconds = 0.0
    points = []
    for row in run.metrics:
        tokens += row["tokens"]
        seconds += (row.get("step_time_ms") or 0.0) / 1000.0
        if row.get("val_loss") is not None and math.isfinite(row["val_loss"]):
            points.append((tokens, row["val_loss"], seconds))
    arr = np.array(points, dtype=np.float64).reshape(-1, 3)
    return arr[:, 0], arr[:, 1], arr[:, 2]


def compare_tokens(runs: Sequence[RunRecord]) -> float:
    """The token count every run has a validation loss at: the smallest last-eval token count.

    ValueError (one line) when a run has no validation pass, or the runs' eval ranges do not overlap.
    """
    ranges = []
    for run in runs:
        tokens, _, _ = eval_curve(run)
        if not tokens.size:
            raise ValueError(f"run {run.path.name} has no validation loss; set eval_every below steps so each run "
                             f"evaluates")
        ranges.append((tokens[0], tokens[-1]))
    start, end = max(r[0] for r in ranges), min(r[1] for r in ranges)
    if end < start:
        raise ValueError(f"the runs' validation passes cover no common token count ({start:,.0f} > {end:,.0f}); "
                         f"evaluate more often (eval_every) so the curves overlap")
    return float(end)


def val_loss_at(run: RunRecord, tokens: float) -> float:
    """Validation loss (nats/token) at `tokens` cumulative tokens, linearly interpolated between eval passes."""
    x, y, _ = eval_curve(run)
    return float(np.interp(tokens, x, y))


def time_to_target(run: RunRecord, target: float) -> float | None:
    """Wall seconds of training steps until validation loss first reaches ≤ `target` (nats/token), linearly
    interpolated between the two eval passes that bracket the crossing; None if the run never reaches it."""
    _, loss, seconds = eval_curve(run)
    for i, value in enumerate(loss):
        if value <= target:
            if i == 0 or loss[i - 1] == value:
                return float(seconds[i])
            frac = (loss[i - 1] - target) / (loss[i - 1] - value)
            return float(seconds[i - 1] + frac * (seconds[i] - seconds[i - 1]))
    return None


def seed_band(reference: Sequence[float], candidate: Sequence[float]) -> float:
    """Half-width (nats/token) inside which a difference of the two arms' mean validation losses is noise.

        band = t · √( v · (1/k_R + 1/k_C) ),  v = variance of the seeds' losses pooled over both arms
    (degrees of freedom k_R − 1 + k_C − 1), t = the two-sided 95% Student-t quantile for them. With two seeds
    per arm that is t(2) = 4.30: two seeds resolve only differences several times their spread.
    """
    groups = [np.asarray(g, dtype=np.float64) for g in (reference, candidate)]
    dof = sum(len(g) - 1 for g in groups)
    if dof < 1:
        raise ValueError("a seed band needs at least two runs in one arm; use seeds=2 or more")
    v = sum(float(np.var(g, ddof=1)) * (len(g) - 1) for g in groups if len(g) > 1) / dof
    return t975(dof) * math.sqrt(v * (1 / len(groups[0]) + 1 / len(groups[1])))


@dataclass
class ConvergenceFigures:
    """The numbers a convergence verdict is made of (losses in nats/token, times in seconds)."""
    tokens: float
    reference_losses: list[float]
    candidate_losses: list[float]
    band: float
    target: float
    reference_times: list[float | None]
    candidate_times: list[float | None]

    @property
    def delta(self) -> float:
        """Candidate mean − reference mean validation loss (negative = candidate learns more per token)."""
        return float(np.mean(self.candidate_losses) - np.mean(self.reference_losses))


def figures(reference: Sequence[RunRecord], candidate: Sequence[RunRecord],
            target: float | None = None) -> ConvergenceFigures:
    """Validation losses at the common token count, the seed band and times to target for both arms.

    target: validation loss to reach; default = the highest final validation loss among the reference seeds
    (the level every reference seed reached — its mean would leave some reference seeds short of it)."""
    tokens = compare_tokens([*reference, *candidate])
    ref = [val_loss_at(r, tokens) for r in reference]
    cand = [val_loss_at(r, tokens) for r in candidate]
    if target is None:
        target = max(float(eval_curve(r)[1][-1]) for r in reference)
    return ConvergenceFigures(tokens, ref, cand, seed_band(ref, cand), float(target),
                              [time_to_target(r, target) for r in reference],
                              [time_to_target(r, target) for r in candidate])


def _times_text(times: list[float | None]) -> str:
    reached = [t for t in times if t is not None]
    if not reached:
        return "not reached"
    note = "" if len(reached) == len(times) else f" ({len(reached)}/{len(times)} seeds reached it)"
    return f"{np.mean(reached):.1f} s{note}"


def judge_convergence(reference: Sequence[RunRecord], candidate: Sequence[RunRecord], memory_limit_bytes: int,
                      target: float | None = None) -> Verdict:
    """Apply the convergence rule (`convergence_rule_text`) to the two arms' seed runs (all status ok).

    Verdict fields: noise_band = the seed band in nats/token; loss_drift = relative difference of mean
    validation loss at equal tokens (positive = candidate worse); speedup = median tokens/s ratio (reported,
    not judged); memory_ratio = median peak RSS ratio.
    """
    f = figures(reference, candidate, target)
    ref_mean, cand_mean = float(np.mean(f.reference_losses)), float(np.mean(f.candidate_losses))
    if f.delta < -f.band:
        decision, where = "keep", "below"
    elif f.delta > f.band:
        decision, where = "reject", "above"
    else:
        decision, where = "no change", "within"
    peak = max(r.summary["peak_memory_bytes"] for r in candidate)
    memory_ratio = (float(np.median([r.summary["peak_memory_bytes"] for r in candidate]))
                    / float(np.median([r.summary["peak_memory_bytes"] for r in reference])))
    over_memory = peak > memory_limit_bytes
    if over_memory:
        decision = "reject"
    speedup = (float(np.median([r.summary["tokens_per_s"] for r in candidate]))
               / float(np.median([r.summary["tokens_per_s"] for r in reference])))
    reason = (f"val loss at {f.tokens:,.0f} tokens {ref_mean:.4f} → {cand_mean:.4f} ({f.delta:+.4f}) {where} seed "
              f"band ±{f.band:.4f} ({len(f.reference_losses)}+{len(f.candidate_losses)} seeds); time to val loss "
              f"{f.target:.4f}: {_times_text(f.reference_times)} → {_times_text(f.candidate_times)}; tokens/s "
              f"{speedup - 1:+.1%}; {memory_label(candidate[0].summary)} {memory_ratio:.2f}× ({mib_text(peak)} {'>' if over_memory else '≤'} limit"
              f" {mib_text(memory_limit_bytes)}) → {decision}" + (" (over the memory limit)" if over_memory else ""))
    return Verdict(decision, reason, speedup, f.band, f.delta / ref_mean, memory_ratio,
                   convergence_rule_text(memory_limit_bytes))
