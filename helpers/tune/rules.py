"""The keep/reject rules of every round, in one place: speed (a paired interval of the tokens/s ratio, loss at
equal tokens), convergence (validation loss at equal tokens against the seed band) and time to target (wall
seconds to a validation loss against the seed band), sharing the failed-run check and the memory gate.

Pure functions over run records and a round's speed measurement (no training here), so a verdict can be
recomputed from the round folder alone. The interval arithmetic is helpers/paired.py; how a round measures
(paired steps in one process, two processes stepping in turns, or whole runs) is helpers/tune/speed_path.py.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Sequence

import numpy as np

from helpers.record import RunRecord, memory_label
from helpers.units import mib_text
from helpers.tune.convergence import (TIME_TO_TARGET, TimeFigures, figures, seed_band, seed_times_text, time_figures,
                                      time_or_end)
from helpers.paired import Outcome, SpeedPlan, rule_text as speed_rule_text, t_quantile


# What each number of a Verdict is in, by objective (printed by tables; stored with the verdict).
SPEED_UNITS = {"speedup": "candidate ÷ reference tokens/s", "noise_band": "relative half-width of the interval",
               "loss_drift": "relative (candidate − reference) mean training loss at equal tokens",
               "memory_ratio": "candidate ÷ reference memory"}
CONVERGENCE_UNITS = {"speedup": "candidate ÷ reference tokens/s (reported, not judged)",
                     "noise_band": "seed band, nats/token",
                     "loss_drift": "relative (candidate − reference) validation loss at equal tokens",
                     "memory_ratio": "candidate ÷ reference memory"}
TIME_TO_TARGET_UNITS = {"speedup": "reference ÷ candidate seconds to target", "noise_band": "seed band, s",
                        "loss_drift": "not judged", "memory_ratio": "candidate ÷ reference memory"}
UNITS_BY_OBJECTIVE = {"speed": SPEED_UNITS, "convergence": CONVERGENCE_UNITS, TIME_TO_TARGET: TIME_TO_TARGET_UNITS}


@dataclass
class Verdict:
    """The rule's outcome for one candidate against its reference; `reason` is one line with the numbers.

    speedup: candidate ÷ reference tokens/s over every measured step (the interval's point estimate);
    interval: [low, high] of that ratio; noise_band: the interval's relative half-width (for a convergence round:
    the seed band, nats/token); pairs: block pairs (paired, processes) or run pairs (runs) measured; path:
    "paired", "processes" or "runs"; parts: each arm's mean step, fast end, stall and data-wait shares and the
    fast-end ("compute") ratio (helpers/paired.py `Parts`); gate: what decided (the speed interval, the loss gate,
    the memory limit, the seed band, whether the target was reached, a run that failed), shown on the decision line.
    """
    decision: str
    reason: str
    speedup: float | None
    noise_band: float | None
    loss_drift: float | None
    memory_ratio: float | None
    rule: str
    interval: list[float] | None = None
    pairs: int | None = None
    path: str | None = None
    level: float | None = None
    objective: str = "speed"
    units: dict = field(default_factory=lambda: dict(SPEED_UNITS))
    parts: dict | None = None
    gate: str = ""

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Verdict":
        """A verdict as the ledger stored it; entries written before `objective`/`units` existed were speed or
        convergence verdicts, told apart by their rule text."""
        known = {k: data[k] for k in ("decision", "reason", "speedup", "noise_band", "loss_drift", "memory_ratio",
                                      "rule", "interval", "pairs", "path", "level", "parts", "gate") if k in data}
        objective = data.get("objective") or ("convergence" if "seed band" in (data.get("rule") or "") else "speed")
        units = data.get("units") or UNITS_BY_OBJECTIVE.get(objective, SPEED_UNITS)
        return cls(**{"speedup": None, "noise_band": None, "loss_drift": None, "memory_ratio": None, **known,
                      "objective": objective, "units": dict(units)})


def rule_text(plan: SpeedPlan, path: str, loss_gate: float, memory_limit_bytes: int) -> str:
    """The whole rule with its thresholds, as printed in every speed verdict."""
    return (f"{speed_rule_text(plan, path)}; and the mean training loss at equal tokens at most {loss_gate:.1%} "
            f"worse than the reference (widened to the baseline repeats' spread when larger), peak memory ≤ "
            f"{mib_text(memory_limit_bytes)}, else reject; a run that did not finish → failed")


def t975(dof: int) -> float:
    """Two-sided 95% Student-t quantile for `dof` degrees of freedom, exact at every dof (scipy)."""
    return t_quantile(0.975, dof)


def total_tokens(run: RunRecord) -> float:
    """Tokens the run trained on (sum over its steps' rows)."""
    return float(sum(r["tokens"] for r in run.metrics))


def mean_loss_to_tokens(run: RunRecord, tokens: float) -> float:
    """Mean training loss (nats/token) over the run's first `tokens` tokens, each step weighted by its tokens.

    Aligning on cumulative tokens rather than steps lets runs with different tokens per step (batch size,
    accumulation) be compared on the same data volume; a step straddling the limit counts partially.
    """
    done = weighted = 0.0
    for row in run.metrics:
        take = min(row["tokens"], tokens - done)
        if take <= 0:
            break
        weighted += take * row["loss"]
        done += take
    return weighted / done


def loss_gate_for(baseline: Sequence[RunRecord], loss_gate: float) -> float:
    """The drift gate actually applied: `loss_gate`, widened to the baseline repeats' relative loss spread.

    mindformers' precision standard is mean loss within 1%; these runs are short (tens of steps), where the
    mean is dominated by the first, steep steps, so the default gate is 2%; if the baseline repeats of one
    config already differ by more than that, the gate cannot be tighter than what the same config produces.
    """
    limit = min(total_tokens(r) for r in baseline)
    means = [mean_loss_to_tokens(r, limit) for r in baseline]
    spread = (max(means) - min(means)) / float(np.mean(means))
    return max(loss_gate, spread)


def loss_drift(reference: Sequence[RunRecord], candidate: Sequence[RunRecord]) -> float:
    """Relative difference of mean training loss at equal tokens: (candidate − reference) / reference.

    Both groups are compared over the largest token count every run reached; positive = candidate worse.
    """
    limit = min(total_tokens(r) for r in [*reference, *candidate])
    ref = float(np.mean([mean_loss_to_tokens(r, limit) for r in reference]))
    cand = float(np.mean([mean_loss_to_tokens(r, limit) for r in candidate]))
    return (cand - ref) / ref


def failed(reason: str, loss_gate: float, memory_limit_bytes: int, rule: str | None = None) -> Verdict:
    """The verdict of a round with a run that did not finish (or left no record)."""
    return Verdict("failed", f"{reason} → failed", None, None, None, None,
                   rule or f"a run that did not finish → failed (loss gate {loss_gate:.1%}, memory limit "
                           f"{mib_text(memory_limit_bytes)})", gate="a run that did not finish")


def unfinished(reference: Sequence[RunRecord], candidate: Sequence[RunRecord]) -> str:
    """"" when every run ended ok; else the reason naming the run that failed first — one that ended on its
    own ('nan', 'failed') before one that was stopped because the other arm of its paired process ended."""
    bad = [(role, i, run) for role, group in (("candidate", candidate), ("reference", reference))
           for i, run in enumerate(group, 1) if run.status != "ok"]
    if not bad:
        return ""
    role, i, run = sorted(bad, key=lambda b: b[2].status == "stopped")[0]
    why = (run.summary.get("status_reason") or "no reason recorded").splitlines()[0]
    return f"{role} run {i} ({run.path.name}) ended '{run.status}': {why}"


def judge(reference: Sequence[RunRecord], candidate: Sequence[RunRecord], baseline: Sequence[RunRecord],
          speed: Outcome, plan: SpeedPlan, path: str, loss_gate: float, memory_limit_bytes: int) -> Verdict:
    """Apply the rule to a round: its speed outcome (`paired.conclude` over the round's pairs), the arms' records.

    A run of either arm that did not finish → "failed" with its reason (`unfinished`). memory_ratio = median
    candidate ÷ median reference peak memory (bytes; each arm's own, see helpers/run/pair.py); loss_drift from
    `loss_drift`. Precedence: failed > over the memory limit > loss worse beyond the gate > speed (keep / reject
    / no change, from the interval). A lower loss is allowed.
    """
    gate = loss_gate_for(baseline, loss_gate)
    rule = rule_text(plan, path, gate, memory_limit_bytes)
    why = unfinished(reference, candidate)
    if why:
        return failed(why, gate, memory_limit_bytes, rule)
    look = speed.look
    iv = look.interval
    drift = loss_drift(reference, candidate)
    memory = memory_gate(reference, candidate, memory_limit_bytes)
    over_memory, worse_loss = memory.over, drift > gate
    verdict = "reject" if over_memory or worse_loss else speed.decision
    decided_by = "memory limit" if over_memory else "loss gate" if worse_loss else "speed interval"
    speed_part = {"keep": f"above +{plan.floor:.0%}", "reject": f"below −{plan.floor:.0%}",
                  "no change": (f"straddles ±{plan.floor:.0%} at the last look (budget spent)" if speed.budget_spent
                                else f"inside ±{plan.futility:.0%}, so no change of that size (stopped before the "
                                     f"last look)" if look.futile else f"inside ±{plan.floor:.0%}")}[speed.decision]
    loss_part = (f"loss drift {drift:+.1%} {'beyond' if worse_loss else 'within'} gate {gate:.1%}"
                 + (" (lower loss allowed)" if drift < -gate else ""))
    hits = [w for w, hit in (("over the memory limit", over_memory), ("loss worse at equal tokens", worse_loss))
            if hit]
    dropped = f", {iv.trimmed} dropped for outside load" if iv.trimmed else ""
    reason = (f"tokens/s ×{iv.ratio:.3f} ({iv.ratio - 1:+.1%}), {iv.level:.1%} interval ×{iv.ratio_low:.3f}–"
              f"×{iv.ratio_high:.3f} (±{iv.half_width:.1%}) after {look.pairs} pairs{dropped} ({path}; tokens ÷ "
              f"wall time of every measured step) {speed_part}; why: {speed.parts.text()}; {loss_part}; "
              f"{memory.text} → {verdict}" + (f" ({', '.join(hits)})" if hits else ""))
    return Verdict(verdict, reason, iv.ratio, iv.half_width, drift, memory.ratio, rule,
                   [iv.ratio_low, iv.ratio_high], look.pairs, path, iv.level, objective="speed", units=SPEED_UNITS,
                   parts=speed.parts.to_dict(), gate=decided_by)


# ------------------------------------------------------------------------ seed-based rules

@dataclass
class MemoryGate:
    """The memory part of every rule: the candidate's own peak against the limit, and the arms' ratio (bytes)."""
    peak: float
    ratio: float
    over: bool
    text: str


def memory_gate(reference: Sequence[RunRecord], candidate: Sequence[RunRecord], limit_bytes: int) -> MemoryGate:
    """Candidate peak memory (bytes; RSS on CPU, device memory elsewhere) against `limit_bytes`, and the median
    candidate ÷ reference ratio. A paired round holds both arms in one process: there each arm's resident memory
    after its own warm-up is measured the same way for both (helpers/run/pair.py), so the ratio uses that, while
    the gate keeps the candidate's own peak, taken before the reference arm existed."""
    peak = max(r.summary["peak_memory_bytes"] for r in candidate)
    both = [*candidate, *reference]
    basis = "resident_memory_bytes" if all(r.summary.get("resident_memory_bytes") for r in both) \
        else "peak_memory_bytes"
    ratio = (float(np.median([r.summary[basis] for r in candidate]))
             / float(np.median([r.summary[basis] for r in reference])))
    over = peak > limit_bytes
    text = (f"{memory_label(candidate[0].summary)} {ratio:.2f}×"
            f"{' (resident after warm-up)' if basis == 'resident_memory_bytes' else ''} ({mib_text(peak)} "
            f"{'>' if over else '≤'} limit {mib_text(limit_bytes)})")
    return MemoryGate(peak, ratio, over, text)


def median_speedup(reference: Sequence[RunRecord], candidate: Sequence[RunRecord]) -> float | None:
    """Median candidate ÷ median reference tokens/s; None when a run has none (one stopped by a time cap
    before its steady window)."""
    rates = [[r.summary.get("tokens_per_s") for r in group] for group in (candidate, reference)]
    return float(np.median(rates[0]) / np.median(rates[1])) if all(v for g in rates for v in g) else None


def _side_text(speedup: float | None, memory: MemoryGate) -> str:
    """The reported (not judged) tokens/s and the memory gate, for the seed-based rules."""
    return f"tokens/s {'n/a' if speedup is None else f'{speedup - 1:+.1%}'}; {memory.text}"


def convergence_rule_text(memory_limit_bytes: int) -> str:
    """The convergence rule with its thresholds, as printed in every convergence verdict."""
    return ("keep only if the candidate's mean validation loss at equal tokens (the largest token count every "
            "run evaluated at; eval points interpolated on cumulative tokens) is below the reference's by more "
            "than the seed band (95% Student-t half-width of the pooled seed-to-seed spread of both arms), and "
            f"peak memory ≤ {mib_text(memory_limit_bytes)}; above by more than the band → reject; otherwise → no "
            "change; a run that did not finish → failed. Time to target (wall seconds since the run's process "
            "started, evaluation included, until validation loss ≤ the level every reference seed reached) is "
            "reported, not judged")


def ttq_rule_text(memory_limit_bytes: int) -> str:
    """The time-to-target rule with its thresholds, as printed in every time-to-target verdict."""
    return ("each arm trains until its validation loss ≤ the target (or its steps or time cap end); its time to "
            "target counts wall seconds since the run's process started — start-up, imports, data, compile, every "
            "step and validation pass: everything the user pays — interpolated between the validation passes that "
            "bracket the crossing; a run that never gets there did not reach and has no time. keep only if every "
            "candidate seed reached the target and their mean time is below the reference's by more than the seed "
            "band (95% Student-t half-width of the pooled seed-to-seed spread of both arms' times), or every "
            "candidate seed reached it and no reference seed did, or every candidate seed reached it and only some "
            "reference seeds did and the candidate's mean is below by more than the band with the others counted "
            "at their last validation pass (a lower bound of their time); reject if a candidate seed did not reach it "
            "while every reference seed did, or its mean time is above by more than the band, or peak memory > "
            f"{mib_text(memory_limit_bytes)}; otherwise no change; a run that did not finish → failed")


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
    decision, where = _against_band(f.delta, f.band)
    speedup, memory = median_speedup(reference, candidate), memory_gate(reference, candidate, memory_limit_bytes)
    if memory.over:
        decision = "reject"
    reason = (f"val loss at {f.tokens:,.0f} tokens {ref_mean:.4f} → {cand_mean:.4f} ({f.delta:+.4f}) {where} seed "
              f"band ±{f.band:.4f} ({len(f.reference_losses)}+{len(f.candidate_losses)} seeds); time to val loss "
              f"{f.target:.4f}: {_times_text(f.reference_times)} → {_times_text(f.candidate_times)}; {_side_text(speedup, memory)} → "
              f"{decision}" + (" (over the memory limit)" if memory.over else ""))
    return Verdict(decision, reason, speedup, f.band, f.delta / ref_mean, memory.ratio,
                   convergence_rule_text(memory_limit_bytes), objective="convergence", units=CONVERGENCE_UNITS,
                   gate="memory limit" if memory.over else "seed band of val loss")


def _against_band(delta: float, band: float) -> tuple[str, str]:
    """(decision, where) of a candidate − reference difference against its seed band (lower is better)."""
    if delta < -band:
        return "keep", "below"
    if delta > band:
        return "reject", "above"
    return "no change", "within"


def _against_censored(reference: Sequence[RunRecord], f) -> tuple[str, str]:
    """Every candidate seed reached the target and only some reference seeds did: the others count at their last
    validation pass (a lower bound of their time), so keep only if the candidate's mean is still below by more than
    the seed band; else no change (a reference seed's miss is not by itself evidence that the candidate is
    sooner: with a target at the reference's own worst final loss, a fresh reference seed misses it often)."""
    bounds = [time_or_end(r, f.target) for r in reference]
    band = seed_band(bounds, f.candidate_times)
    delta = float(np.mean(f.candidate_times) - np.mean(bounds))
    decision, where = _against_band(delta, band)
    decision = "keep" if decision == "keep" else "no change"
    return decision, (f"every candidate seed reached it, not every reference seed; against the reference with those "
                      f"counted at their last validation pass (≥ {np.mean(bounds):.1f} s): {delta:+.1f} s, {where} "
                      f"the seed band ±{band:.1f} s")


def judge_time_to_target(reference: Sequence[RunRecord], candidate: Sequence[RunRecord], memory_limit_bytes: int,
                         target: float) -> Verdict:
    """Apply the time-to-target rule (`ttq_rule_text`) to the two arms' seed runs (all status ok).

    Verdict fields: speedup = reference ÷ candidate mean seconds to target (> 1: the candidate gets there
    sooner; None unless both arms reached it on every seed); noise_band = the seed band in seconds;
    loss_drift = None (not judged); memory_ratio = median peak memory ratio.
    """
    f = time_figures(reference, candidate, target)
    ref_ok, cand_ok = TimeFigures.reached(f.reference_times), TimeFigures.reached(f.candidate_times)
    speedup = None
    if f.band is not None:
        speedup = float(np.mean(f.reference_times) / np.mean(f.candidate_times))
        decision, where = _against_band(f.delta, f.band)
        judged, gate = f"{f.delta:+.1f} s, {where} the seed band ±{f.band:.1f} s", "seed band of time to target"
    elif cand_ok and not any(t is not None for t in f.reference_times):
        decision, judged = "keep", "every candidate seed reached it, no reference seed did"
        gate = "target reached by the candidate only"
    elif cand_ok:
        (decision, judged), gate = _against_censored(reference, f), "seed band, unreached reference seeds censored"
    elif ref_ok:
        decision, judged = "reject", "the candidate did not reach it, the reference did"
        gate = "target not reached by the candidate"
    else:
        decision, judged, gate = "no change", "neither arm reached it on every seed", "target reached by neither arm"
    memory = memory_gate(reference, candidate, memory_limit_bytes)
    if memory.over:
        decision, gate = "reject", "memory limit"
    reason = (f"time to val loss {f.target:.4f} (wall s since process start, evaluation included): reference "
              f"{seed_times_text(f.reference_times)} → candidate {seed_times_text(f.candidate_times)}; {judged}; "
              f"{_side_text(median_speedup(reference, candidate), memory)} → {decision}"
              + (" (over the memory limit)" if memory.over else ""))
    return Verdict(decision, reason, speedup, f.band, None, memory.ratio, ttq_rule_text(memory_limit_bytes),
                   objective=TIME_TO_TARGET, units=TIME_TO_TARGET_UNITS, gate=gate)
