"""The keep/reject rule of a speed round: a paired interval of the tokens/s ratio, loss at equal tokens, memory.

Pure functions over run records and a round's speed measurement (no training here), so a verdict can be
recomputed from the round folder alone. The interval arithmetic is helpers/tune/paired.py; how a round measures
(paired blocks in one process, or runs in separate processes) is helpers/tune/speed_path.py.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Sequence

import numpy as np

from helpers.record import RunRecord
from helpers.units import mib_text
from helpers.run.memory import memory_label
from helpers.tune.paired import Outcome, SpeedPlan, ordinal, rule_text as speed_rule_text, t_quantile


@dataclass
class Verdict:
    """The rule's outcome for one candidate against its reference; `reason` is one line with the numbers.

    speedup: candidate ÷ reference tokens/s (the interval's point estimate); interval: [low, high] of that
    ratio; noise_band: the interval's relative half-width (for a convergence round: the seed band, nats/token);
    pairs: block pairs (paired) or run pairs (processes) measured; path: "paired" or "processes".
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

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Verdict":
        return cls(**{k: data.get(k) for k in ("decision", "reason", "speedup", "noise_band", "loss_drift",
                                               "memory_ratio", "rule", "interval", "pairs", "path", "level")})


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
                           f"{mib_text(memory_limit_bytes)})")


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
    peak = max(r.summary["peak_memory_bytes"] for r in candidate)
    # A paired round holds both arms in one process: each arm's resident memory after its warm-up is measured
    # the same way for both (helpers/run/pair.py), so the ratio uses it; the gate uses the candidate's own peak.
    basis = "resident_memory_bytes" if all(r.summary.get("resident_memory_bytes") for r in [*candidate, *reference]) \
        else "peak_memory_bytes"
    memory_ratio = (float(np.median([r.summary[basis] for r in candidate]))
                    / float(np.median([r.summary[basis] for r in reference])))
    over_memory, worse_loss = peak > memory_limit_bytes, drift > gate
    verdict = "reject" if over_memory or worse_loss else speed.decision
    speed_part = {"keep": f"above +{plan.floor:.0%}", "reject": f"below −{plan.floor:.0%}",
                  "no change": (f"straddles ±{plan.floor:.0%} at the last look (budget spent)" if speed.budget_spent
                                else f"inside ±{plan.floor:.0%}")}[speed.decision]
    loss_part = (f"loss drift {drift:+.1%} {'beyond' if worse_loss else 'within'} gate {gate:.1%}"
                 + (" (lower loss allowed)" if drift < -gate else ""))
    memory_part = (f"{memory_label(candidate[0].summary)} {memory_ratio:.2f}×"
                   f"{' (resident after warm-up)' if basis == 'resident_memory_bytes' else ''} ({mib_text(peak)} "
                   f"{'>' if over_memory else '≤'} limit {mib_text(memory_limit_bytes)})")
    hits = [w for w, hit in (("over the memory limit", over_memory), ("loss worse at equal tokens", worse_loss))
            if hit]
    reason = (f"tokens/s ×{iv.ratio:.3f} ({iv.ratio - 1:+.1%}), {iv.level:.1%} interval ×{iv.ratio_low:.3f}–"
              f"×{iv.ratio_high:.3f} (±{iv.half_width:.1%}) after {look.pairs} pairs ({path}; "
              f"{plan.trim:.0%}-trimmed mean of per-pair log ratios of {ordinal(plan.rank)}-fastest steps) "
              f"{speed_part}; {loss_part}; {memory_part} → {verdict}" + (f" ({', '.join(hits)})" if hits else ""))
    return Verdict(verdict, reason, iv.ratio, iv.half_width, drift, memory_ratio, rule,
                   [iv.ratio_low, iv.ratio_high], look.pairs, path, iv.level)

