"""The keep/reject rule of a tuning round: throughput beyond a measured noise band, loss at equal tokens, memory.

Pure functions over run records (no training here), so a verdict can be recomputed from the records alone.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Sequence

import numpy as np

from helpers.record import RunRecord
from helpers.units import mib_text
from helpers.run.memory import memory_label

# Two repeats on a quiet machine differ by about ±2% (72–75 ms/step in mindspore-cpu-facts.md), so a smaller
# gain is not resolvable with the default repeats however steady the measured spread happens to look.
NOISE_FLOOR = 0.02
# Two-sided 95% Student-t quantiles by degrees of freedom: the run-to-run spread comes from a few repeats
# (3 dof for three groups of two); with a fixed 2σ band, 1 of 4 A/A checks on the loaded machine missed "no change".
T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
        2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
        2.045, 2.042)
P10_P90_SIGMAS = 2.563   # p90 − p10 of a normal distribution spans 2.563 σ
MEDIAN_SE = 1.2533       # standard error of a median of n normal samples = 1.2533 σ / √n


@dataclass
class Verdict:
    """The rule's outcome for one candidate against its reference; `reason` is one line with the numbers."""
    decision: str
    reason: str
    speedup: float | None
    noise_band: float
    loss_drift: float | None
    memory_ratio: float | None
    rule: str

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Verdict":
        return cls(**{k: data.get(k) for k in ("decision", "reason", "speedup", "noise_band", "loss_drift",
                                               "memory_ratio", "rule")})


def rule_text(loss_gate: float, memory_limit_bytes: int) -> str:
    """The rule with its thresholds, as printed in every verdict."""
    return (f"keep only if the median tokens/s gain exceeds the measured noise band (floor ±{NOISE_FLOOR:.0%}), "
            f"the mean training loss at equal tokens is at most {loss_gate:.1%} worse than the reference "
            f"(widened to the baseline repeats' spread when larger), and peak memory ≤ {mib_text(memory_limit_bytes)};"
            f" slower beyond the band → reject; otherwise → no change; a run that did not finish → failed")


def t975(dof: int) -> float:
    """Two-sided 95% Student-t quantile for `dof` degrees of freedom (1.96, the normal's, above 30 or at 0)."""
    return T975[dof - 1] if 1 <= dof <= len(T975) else 1.96


def _log_tokens_per_s(runs: Sequence[RunRecord]) -> np.ndarray:
    return np.log(np.array([r.summary["tokens_per_s"] for r in runs], dtype=np.float64))


def within_run_se(run: RunRecord) -> float:
    """Relative standard error of one run's steady median step time (dimensionless, ≈ SE of its log).

    σ is estimated from the steady window's p10–p90 spread (p90 − p10 = 2.563 σ for a normal), and the
    median of n steps has standard error 1.2533 σ / √n; divided by the median step time.
    """
    s = run.summary
    window = s.get("steady_window")
    n = window[1] - window[0] + 1 if window else 0
    if n < 2 or not s.get("step_time_ms"):
        return 0.0
    sigma = (s["step_time_ms_p90"] - s["step_time_ms_p10"]) / P10_P90_SIGMAS
    return MEDIAN_SE * sigma / (s["step_time_ms"] * math.sqrt(n))


def noise_band(reference: Sequence[RunRecord], candidate: Sequence[RunRecord],
               baseline: Sequence[RunRecord]) -> float:
    """Relative half-width of the band inside which a tokens/s ratio is noise (e.g. 0.041 = ±4.1%).

    Computed on log tokens/s, because interference on a shared CPU slows a run by a factor, not by an amount:
        b    = max(ln(1 + NOISE_FLOOR), t · √( v · (1/k_R + 1/k_C) + w_R/k_R + w_C/k_C ))
        band = e^b − 1;  a speedup s is beyond the band when |ln s| > b, i.e. s > 1 + band or s < 1/(1 + band)
      v   : run-to-run variance of ln(tokens/s), pooled by degrees of freedom over the distinct groups of
            repeats at hand: the pinned baseline (only while the reference still has the baseline's config:
            once a round moved the best, say from eager to graph mode, the baseline's spread belongs to
            another population), the reference and the candidate;
      w_G : mean squared `within_run_se` of group G's runs (step-time dispersion inside each run);
      k_G : number of runs in group G (the comparison is between the groups' medians);
      t   : the two-sided 95% Student-t quantile for v's pooled degrees of freedom Σ(k_G − 1) (`t975`).
    Counting within-run dispersion on top of the between-run spread double-counts a little of it; that errs
    toward "no change", and keeps the band honest when two repeats happen to agree by chance.
    With no candidate runs (a failed round), the candidate is assumed to be as noisy as the reference.
    """
    candidate = candidate or reference
    if baseline and reference and baseline[0].config != reference[0].config:
        baseline = []
    groups, seen = [], set()
    for group in (baseline, reference, candidate):
        key = tuple(sorted(str(r.path) for r in group))
        if key not in seen and len(group) >= 2:
            seen.add(key)
            groups.append(_log_tokens_per_s(group))
    dof = sum(len(g) - 1 for g in groups)
    v = sum(np.var(g, ddof=1) * (len(g) - 1) for g in groups) / dof if dof else 0.0
    k_r, k_c = len(reference), len(candidate)
    w_r = float(np.mean([within_run_se(r) ** 2 for r in reference]))
    w_c = float(np.mean([within_run_se(r) ** 2 for r in candidate]))
    b = max(math.log1p(NOISE_FLOOR), t975(dof) * math.sqrt(v * (1 / k_r + 1 / k_c) + w_r / k_r + w_c / k_c))
    return math.expm1(b)


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


def failed(reason: str, band: float, loss_gate: float, memory_limit_bytes: int) -> Verdict:
    """The verdict of a round with a run that did not finish (or left no record)."""
    return Verdict("failed", f"{reason} → failed", None, band, None, None, rule_text(loss_gate, memory_limit_bytes))


def judge(reference: Sequence[RunRecord], candidate: Sequence[RunRecord], baseline: Sequence[RunRecord],
          loss_gate: float, memory_limit_bytes: int) -> Verdict:
    """Apply the rule (see `rule_text`) to a candidate's repeats against the reference's (run records).

    A run of either side that did not finish makes the verdict "failed" with that run's status_reason.
    speedup = median candidate tokens/s ÷ median reference tokens/s; memory_ratio = median peak memory (bytes;
    process RSS on CPU, the device allocator's peak on GPU/Ascend, named by the summary's memory_source)
    ratio; loss_drift from `loss_drift`; the band from `noise_band`. Precedence: failed > over the memory
    limit > loss worse beyond the gate > speed (keep / reject "slower" / no change). A lower loss is allowed.
    """
    gate = loss_gate_for(baseline, loss_gate)
    for role, group in (("candidate", candidate), ("reference", reference)):
        for i, run in enumerate(group, 1):
            if run.status != "ok":
                why = (run.summary.get("status_reason") or "no reason recorded").splitlines()[0]
                ok_refs = [r for r in reference if r.status == "ok"] or list(baseline)
                return failed(f"{role} run {i} ({run.path.name}) ended '{run.status}': {why}",
                              noise_band(ok_refs, [], baseline), gate, memory_limit_bytes)
    band = noise_band(reference, candidate, baseline)
    ref_tps = float(np.median([r.summary["tokens_per_s"] for r in reference]))
    cand_tps = float(np.median([r.summary["tokens_per_s"] for r in candidate]))
    speedup = cand_tps / ref_tps
    gain, beyond = speedup - 1, abs(math.log(speedup)) > math.log1p(band)
    drift = loss_drift(reference, candidate)
    peak = max(r.summary["peak_memory_bytes"] for r in candidate)
    memory_ratio = (float(np.median([r.summary["peak_memory_bytes"] for r in candidate]))
                    / float(np.median([r.summary["peak_memory_bytes"] for r in reference])))

    if beyond and gain > 0:
        speed, verdict = "beyond", "keep"
    elif beyond:
        speed, verdict = "slower beyond", "reject"
    else:
        speed, verdict = "within", "no change"
    over_memory, worse_loss = peak > memory_limit_bytes, drift > gate
    if over_memory or worse_loss:
        verdict = "reject"
    loss_part = (f"loss drift {drift:+.1%} {'beyond' if worse_loss else 'within'} gate {gate:.1%}"
                 + (" (lower loss allowed)" if drift < -gate else ""))
    memory_part = (f"{memory_label(candidate[0].summary)} {memory_ratio:.2f}× ({mib_text(peak)} {'>' if over_memory else '≤'} limit "
                   f"{mib_text(memory_limit_bytes)})")
    why = [w for w, hit in (("over the memory limit", over_memory), ("loss worse at equal tokens", worse_loss))
           if hit]
    reason = (f"tokens/s {gain:+.1%} ({ref_tps:,.0f} → {cand_tps:,.0f}) {speed} noise band "
              f"{1 / (1 + band) - 1:+.1%}/+{band:.1%}; "
              f"{loss_part}; {memory_part} → {verdict}" + (f" ({', '.join(why)})" if why else ""))
    return Verdict(verdict, reason, speedup, band, drift, memory_ratio, rule_text(gate, memory_limit_bytes))
