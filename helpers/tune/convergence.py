"""What convergence and time-to-target rounds measure: validation loss at equal tokens, seconds to a target,
and the seed-to-seed noise band.

A speed round asks "is a step faster at the same quality?"; a convergence round asks "does the model learn
more from the same data?" — the question for lr, warm-up, schedule, clipping, weight decay, betas and the
global batch. Each arm (reference = the current best, candidate) trains with the same list of seeds (paired:
seed k of both arms has the same initialisation and data order), and the seeds' spread is the noise band.
Pure arithmetic over run records (curves, interpolation, the seed band); the judges that use it are in
`rules.py`, beside the speed judge, so a verdict can be recomputed from the records alone.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from helpers.config import Config, with_changes
from helpers.levers import keys_where
from helpers.record import RunRecord
from helpers.paired import t_quantile

# Variables that change what a model learns per token rather than how fast a step runs: a speed round on them
# measures tokens/s, which they do not move, so `Workbook.run_round` warns and points to objective="convergence".
CONVERGENCE_VARIABLES = keys_where(learning=True)  # declared in helpers/levers.py
TIME_TO_TARGET = "time_to_target"
OBJECTIVES = ("speed", "convergence", TIME_TO_TARGET)
# The recipe: what a time-to-target round may change together (the schedule's length, steps, included: the
# comparison is in wall seconds to a val loss, not at equal steps or tokens).
RECIPE = keys_where(recipe=True)


def eval_curve(run: RunRecord) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(cumulative tokens, validation loss in nats/token, wall seconds) at each validation pass.

    Tokens count every step up to and including the eval step (tokens_per_step = batch × accum × seq_len, from
    the metrics rows). Seconds are what the user pays: the row's `elapsed_s`, wall seconds since the training
    process started (interpreter start, imports, data, compile, every step and validation pass up to this one
    included); records written before that column existed fall back to the sum of step times (compile step
    included, start-up and validation passes not).
    """
    cols = run.columns("tokens", "step_time_ms", "val_loss", "elapsed_s")
    tokens = np.cumsum(cols["tokens"])
    steps_s = np.cumsum(np.where(cols.filled["step_time_ms"], cols["step_time_ms"], 0.0) / 1000.0)
    evals = np.isfinite(cols["val_loss"])
    seconds = np.where(cols.filled["elapsed_s"], cols["elapsed_s"], steps_s)
    return tokens[evals], cols["val_loss"][evals], seconds[evals]


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
    """Wall seconds (`eval_curve`'s: since the process started, evaluation included) until validation loss first
    reaches ≤ `target` (nats/token), linearly interpolated between the two eval passes that bracket the
    crossing; None if the run never reaches it ("did not reach": it gets no time)."""
    _, loss, seconds = eval_curve(run)
    for i, value in enumerate(loss):
        if value <= target:
            if i == 0 or loss[i - 1] == value:
                return float(seconds[i])
            frac = (loss[i - 1] - target) / (loss[i - 1] - value)
            return float(seconds[i - 1] + frac * (seconds[i] - seconds[i - 1]))
    return None


def time_or_end(run: RunRecord, target: float) -> float:
    """`time_to_target`, or for a run that never reached `target` its last validation pass's wall seconds: a lower
    bound of the time it would have needed (it had not got there by then)."""
    reached = time_to_target(run, target)
    return reached if reached is not None else float(eval_curve(run)[2][-1])


def seed_band(reference: Sequence[float], candidate: Sequence[float]) -> float:
    """Half-width inside which a difference of the two arms' means is noise, in the values' unit (nats/token for
    validation losses, seconds for times to target).

        band = t · √( v · (1/k_R + 1/k_C) ),  v = variance of the seeds' losses pooled over both arms
    (degrees of freedom k_R − 1 + k_C − 1), t = the two-sided 95% Student-t quantile for them. With two seeds
    per arm that is t(2) = 4.30: two seeds resolve only differences several times their spread.
    """
    groups = [np.asarray(g, dtype=np.float64) for g in (reference, candidate)]
    dof = sum(len(g) - 1 for g in groups)
    if dof < 1:
        raise ValueError("a seed band needs at least two runs in one arm; use seeds=2 or more")
    v = sum(float(np.var(g, ddof=1)) * (len(g) - 1) for g in groups if len(g) > 1) / dof
    return t_quantile(0.975, dof) * math.sqrt(v * (1 / len(groups[0]) + 1 / len(groups[1])))


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
        target = reference_level(reference)
    return ConvergenceFigures(tokens, ref, cand, seed_band(ref, cand), float(target),
                              [time_to_target(r, target) for r in reference],
                              [time_to_target(r, target) for r in candidate])


# ------------------------------------------------------------------------------------- time to target

@dataclass
class TimeFigures:
    """The numbers a time-to-target verdict is made of: seconds per seed (None = did not reach), the band (s)."""
    target: float
    reference_times: list[float | None]
    candidate_times: list[float | None]
    band: float | None  # only when every seed of both arms reached the target

    @staticmethod
    def reached(times: list[float | None]) -> bool:
        """Whether every seed of an arm reached the target (only then does the arm have a time)."""
        return all(t is not None for t in times)

    @property
    def delta(self) -> float | None:
        """Candidate − reference mean seconds to target (negative = candidate there sooner); None unless both
        arms reached it on every seed."""
        if self.band is None:
            return None
        return float(np.mean(self.candidate_times) - np.mean(self.reference_times))


def time_figures(reference: Sequence[RunRecord], candidate: Sequence[RunRecord], target: float) -> TimeFigures:
    """Seconds to `target` (nats/token) per seed of each arm, and the seed band when both arms reached it."""
    ref = [time_to_target(r, target) for r in reference]
    cand = [time_to_target(r, target) for r in candidate]
    band = seed_band(ref, cand) if TimeFigures.reached(ref) and TimeFigures.reached(cand) else None
    return TimeFigures(float(target), ref, cand, band)


def reference_level(reference: Sequence[RunRecord]) -> float:
    """The validation loss every reference seed reached at its last step (the worst of their final ones)."""
    return max(float(eval_curve(r)[1][-1]) for r in reference)


def ttq_arms(cand: Config, best: Config, target: float | None,
             time_cap_s: float | None = None) -> tuple[Config, Config]:
    """(candidate, reference) configs as a time-to-target round trains them: both end at their first validation
    pass with val loss ≤ `target` (None: both train to their last step, the target being set afterwards by
    `reference_level`); the candidate also once `time_cap_s` wall seconds have passed (an arm not there by then
    cannot beat the best). Both compile cold (no compile cache): a change may be a new graph (a batch, a lever),
    and a warm reference against a cold candidate would charge the candidate alone for compiling. The round's
    rollback point keeps the candidate's own config."""
    ends = {"compile_cache": False, **({"target_val_loss": float(target)} if target is not None else {})}
    return (with_changes(cand, {**ends, **({"max_time_s": float(time_cap_s)} if time_cap_s else {})}),
            with_changes(best, ends))


def seed_times_text(times: list[float | None]) -> str:
    """Each seed's seconds to target, "did not reach" where it has none; the mean only when all reached, and only
    of two or more (one run reads "6.1 s (one run)")."""
    each = ", ".join("did not reach" if t is None else f"{t:.1f} s" for t in times)
    if not TimeFigures.reached(times):
        return f"did not reach ({each})"
    return f"{times[0]:.1f} s (one run)" if len(times) == 1 else f"mean {np.mean(times):.1f} s ({each})"
