"""The paired speed estimator of a round: block pairs → per-pair speed ratios → a robust interval, looked at a few
fixed times with the error rate spent across the looks. Pure arithmetic (no MindSpore, no files).

A *block* is K consecutive optimizer steps of one arm; a *pair* is one reference block and one candidate block
taken back to back (ABBA order over pairs, so a linear drift in load cancels). Per block the statistic is a low
order statistic of its step times (the `rank`-th fastest): interference from other processes only ever adds
time, so the fast end of a block is what the step costs (Chen & Revels 2016). Per pair the speed ratio is in
tokens/s, so arms with different tokens per step (batch size) compare on throughput:
    r_i = (tokens_C / t_C,i) / (tokens_R / t_R,i),  x_i = ln r_i
The interval is the 20%-trimmed mean of the x_i with its Tukey–McLaughlin (Yuen) standard error and the exact
Student-t quantile (scipy): robust to the odd pair a neighbour hit, exact for normal x_i when nothing is trimmed.
Sequential looks: at the j-th look (after `looks[j]` pairs) the interval is two-sided at level 1 − alphas[j];
Σ alphas ≤ 0.01, so by the union bound the chance that *any* look's interval misses the true ratio — the only
way an A/A round is called keep or reject — is at most 1% per round, however many looks stop early.
See docs/reliability.md ("The speed rule") for the thresholds and why this method.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Sequence

import numpy as np
from scipy import special  # stdtrit is what stats.t.ppf calls; scipy.stats alone costs ~0.5–1 s to import

DECISIONS = ("keep", "reject", "no change")
INTERLEAVE = ("blocks", "steps")  # a pair's two blocks back to back, or woven together step by step


def t_quantile(p: float, dof: int) -> float:
    """The exact Student-t quantile t_p(dof) (e.g. p = 0.995 for a two-sided 99% interval); no normal shortcut."""
    if not 0 < p < 1 or dof < 1:
        raise ValueError(f"t quantile needs 0 < p < 1 and dof >= 1 (got p={p}, dof={dof})")
    return float(special.stdtrit(dof, p))


def block_stat(times_ms: Sequence[float], rank: int = 2) -> float:
    """The `rank`-th fastest step time of a block (ms); rank 2 = the second fastest."""
    if len(times_ms) < rank:
        raise ValueError(f"a block of {len(times_ms)} steps has no {rank}-th fastest step; use blocks of >= {rank}")
    return float(sorted(times_ms)[rank - 1])


def pair_log_ratio(ref_ms: float, cand_ms: float, ref_tokens: float, cand_tokens: float) -> float:
    """ln(candidate tokens/s ÷ reference tokens/s) of one pair, from each block's statistic (ms per step)."""
    return math.log((cand_tokens / cand_ms) / (ref_tokens / ref_ms))


@dataclass(frozen=True)
class Interval:
    """A two-sided interval for the log speed ratio (candidate ÷ reference tokens/s); ratios are exp() of these."""
    estimate: float   # 20%-trimmed mean of the pairs' log ratios
    low: float
    high: float
    pairs: int
    trimmed: int      # pairs cut from each end
    dof: int
    t: float
    level: float      # 1 − alpha of this look

    @property
    def ratio(self) -> float:
        return math.exp(self.estimate)

    @property
    def ratio_low(self) -> float:
        return math.exp(self.low)

    @property
    def ratio_high(self) -> float:
        return math.exp(self.high)

    @property
    def half_width(self) -> float:
        """Relative half-width: e^((high − low)/2) − 1 (0.012 = ±1.2%)."""
        return math.expm1((self.high - self.low) / 2)


def trimmed_interval(x: Sequence[float], alpha: float, trim: float = 0.2) -> Interval:
    """Two-sided (1 − alpha) interval of the `trim`-trimmed mean of `x` (Tukey & McLaughlin 1963; Yuen 1974).

    g = ⌊trim·n⌋ values cut from each end, h = n − 2g kept; the winsorized sample (the g lowest set to the
    (g+1)-th, the g highest to the (n−g)-th) has variance s_w²; SE² = (n − 1)·s_w² / (h·(h − 1));
    interval = trimmed mean ± t_{1−alpha/2}(h − 1)·SE. With g = 0 this is the ordinary t interval.
    """
    xs = np.sort(np.asarray(x, dtype=np.float64))
    n = xs.size
    g = int(math.floor(trim * n))
    h = n - 2 * g
    if h < 2:
        raise ValueError(f"{n} pairs leave {h} after trimming {g} from each end; an interval needs >= 2")
    kept = xs[g:n - g]
    wins = np.concatenate([np.full(g, kept[0]), kept, np.full(g, kept[-1])])
    se = math.sqrt((n - 1) * float(np.var(wins, ddof=1)) / (h * (h - 1)))
    t = t_quantile(1 - alpha / 2, h - 1)
    mean = float(kept.mean())
    return Interval(mean, mean - t * se, mean + t * se, n, g, h - 1, t, 1 - alpha)


@dataclass(frozen=True)
class SpeedPlan:
    """How a round measures speed: block length, looks (pairs done when the interval is checked) and the
    two-sided error spent at each look, the practical floor and the block statistic.

    block_steps: steps per block (paired path; the separate-process path uses them to cut each run's steady
    window into blocks); looks: increasing pair counts; alphas: error spent per look (Σ ≤ 0.01 keeps the A/A
    false-call rate ≤ 1% per round); floor: the smallest relative change called keep/reject (0.01 = 1%);
    trim: fraction trimmed from each end of the pairs; rank: which fastest step of a block is its statistic;
    interleave: a pair's blocks back to back ("blocks") or woven step by step ("steps"; paired path only);
    futility: at a look before the last, an undecided interval that lies inside ±futility stops the round with
    "no change" (no change of that size is there to find; stopping for it can only lower the false-call rate).
    """
    block_steps: int = 8
    looks: tuple[int, ...] = (8, 12)
    alphas: tuple[float, ...] = (0.003, 0.007)
    floor: float = 0.01
    trim: float = 0.2
    rank: int = 2
    interleave: str = "blocks"
    futility: float | None = None

    def __post_init__(self):
        if len(self.looks) != len(self.alphas) or not self.looks:
            raise ValueError(f"looks {self.looks} and alphas {self.alphas} must be equally long and non-empty")
        if list(self.looks) != sorted(set(self.looks)) or self.looks[0] < 2:
            raise ValueError(f"looks {self.looks} must be increasing pair counts >= 2")
        if not all(a > 0 for a in self.alphas) or sum(self.alphas) > 0.01 + 1e-12:
            raise ValueError(f"alphas {self.alphas} must be positive and sum to <= 0.01 (1% false calls per round)")
        if not 0 <= self.floor <= 0.01:
            raise ValueError(f"floor={self.floor} must be in [0, 0.01] (a practical floor of at most 1%)")
        if self.futility is not None and not self.floor < self.futility < 1:
            raise ValueError(f"futility={self.futility} must lie between the floor ({self.floor}) and 1")
        if self.interleave not in INTERLEAVE:
            raise ValueError(f"interleave={self.interleave!r} must be one of {', '.join(INTERLEAVE)}")
        if self.block_steps < self.rank:
            raise ValueError(f"block_steps={self.block_steps} must be >= rank={self.rank}")

    @property
    def max_pairs(self) -> int:
        return self.looks[-1]

    def to_dict(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, data: dict) -> "SpeedPlan":
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})


# The defaults of a round. Paired: 8 steps per arm per pair (a nano step is ~45–70 ms, so a pair is ~1 s), the two
# arms' steps woven one by one (interleave "steps"): a slow stretch of the machine that starts mid-pair then lands
# on both arms alike. Measured here (session 6, 5 A/A and 5 +5% trials of each, alternating): A/A median half-width
# at 12 pairs ±1.61% woven vs ±2.05% in back-to-back blocks (at 16 pairs ±1.05% vs ±1.60%), +5% called reject 5/5
# vs 4/5, the same ratio estimate (×0.943).
# Looks after 8 and 12 pairs carry almost all the error budget, so a quiet machine decides there (an A/A stops at
# 12 with "no change" once its interval is inside ±3%: ~20 s a round, against 37–41 s at 7c15080). Looks at 24
# and 48 pairs are for a busy machine: with a one-core hog the A/A half-width at 12 pairs was ±11–26%, and only
# more pairs narrow it (roughly as 1/√pairs).
PAIRED_PLAN = SpeedPlan(looks=(8, 12, 24, 48), alphas=(0.0025, 0.0055, 0.001, 0.001), interleave="steps",
                        futility=0.03)
# Data parallel paired rounds: every rank runs the last look's pairs (helpers/spawn/dp_worker.py; a stop taken
# from one rank's times could leave the other in an all-reduce), so one look at 8 pairs spends the whole 1%, in
# blocks of 4 steps: a DP step is ~100 ms here, and 8-step blocks cost every launch ~6 s more. Shorter blocks
# leave the interval valid (it comes from the 8 pair ratios) and only cost power; the power bench covers the
# single-process plan, not this one (on 2 shared cores DP=2 says nothing about multi-device speed anyway).
DP_PAIRED_PLAN = SpeedPlan(block_steps=4, looks=(8,), alphas=(0.01,), interleave="steps")
# Separate processes (process-global variables): one pair = one run of each arm; a run costs seconds of start
# and compile, so fewer, later looks. Three pairs are the fewest whose t interval is usable at this alpha.
PROCESS_PLAN = SpeedPlan(block_steps=8, looks=(3, 4), alphas=(0.003, 0.007))


def decide(interval: Interval, floor: float) -> str | None:
    """keep / reject / no change when the interval clears a threshold, else None (keep measuring).

    keep: the whole interval is above +floor; reject: the whole interval is below −floor (on the log scale,
    ln(1 + floor)); no change: the whole interval is inside ±floor.
    """
    f = math.log1p(floor)
    if interval.low > f:
        return "keep"
    if interval.high < -f:
        return "reject"
    return "no change" if inside(interval, floor) else None


def inside(interval: Interval, bound: float) -> bool:
    """The whole interval lies within ±bound (a relative change, 0.03 = ±3%; compared as ln(1 + bound))."""
    return -math.log1p(bound) <= interval.low and interval.high <= math.log1p(bound)


@dataclass
class Look:
    """One look: pairs so far, its interval and what it decided (None = go on); futile: "no change" because the
    undecided interval lay inside ±plan.futility before the last look."""
    pairs: int
    alpha: float
    interval: Interval
    decision: str | None
    futile: bool = False

    def to_dict(self) -> dict:
        return {"pairs": self.pairs, "alpha": self.alpha, "decision": self.decision, "futile": self.futile,
                "interval": asdict(self.interval), "ratio": self.interval.ratio,
                "ratio_low": self.interval.ratio_low, "ratio_high": self.interval.ratio_high,
                "half_width": self.interval.half_width}


@dataclass
class Outcome:
    """Where the sequential measurement ended: the deciding (or last) look and whether the budget ran out."""
    decision: str
    look: Look
    looks: list[Look] = field(default_factory=list)
    budget_spent: bool = False


def look_at(log_ratios: Sequence[float], plan: SpeedPlan) -> Look | None:
    """The look due now (len(log_ratios) equals one of plan.looks), or None between looks."""
    n = len(log_ratios)
    if n not in plan.looks:
        return None
    alpha = plan.alphas[plan.looks.index(n)]
    interval = trimmed_interval(log_ratios, alpha, plan.trim)
    decision = decide(interval, plan.floor)
    if decision is None and plan.futility is not None and n < plan.max_pairs and inside(interval, plan.futility):
        return Look(n, alpha, interval, "no change", futile=True)
    return Look(n, alpha, interval, decision)


def should_stop(log_ratios: Sequence[float], plan: SpeedPlan) -> bool:
    """Stop adding pairs: a look decided, or the last look is reached."""
    look = look_at(log_ratios, plan)
    return look is not None and (look.decision is not None or len(log_ratios) >= plan.max_pairs)


def conclude(log_ratios: Sequence[float], plan: SpeedPlan) -> Outcome:
    """Replay the looks over the pairs measured (the first that decided ends it); at the last look without a
    decision the round says "no change" with budget_spent=True. Fewer pairs than the first look → ValueError."""
    looks = []
    for n in plan.looks:
        if n > len(log_ratios):
            break
        look = look_at(log_ratios[:n], plan)
        looks.append(look)
        if look.decision is not None:
            return Outcome(look.decision, look, looks)
    if not looks:
        raise ValueError(f"{len(log_ratios)} pairs measured; the first look needs {plan.looks[0]}")
    return Outcome("no change", looks[-1], looks, budget_spent=True)


def rule_text(plan: SpeedPlan, path: str) -> str:
    """The speed rule with its numbers, as printed in a verdict."""
    unit = ("steps of each arm per pair, woven step by step (ABBA) in one process" if plan.interleave == "steps"
            else "steps per block, ABBA blocks in one process") if path == "paired" else \
        "runs per pair, ABBA runs in separate processes"
    looks = ", ".join(f"{n} pairs at {1 - a:.2%}" for n, a in zip(plan.looks, plan.alphas))
    futile = "" if plan.futility is None else f" (or, before the last look, inside ±{plan.futility:.0%})"
    return (f"speed ({path}: {plan.block_steps if path == 'paired' else 1} {unit}): per pair the tokens/s ratio "
            f"of the blocks' {ordinal(plan.rank)}-fastest steps; {plan.trim:.0%}-trimmed mean of log ratios with "
            f"a Tukey–McLaughlin t interval; looks after {looks} (Σα = {sum(plan.alphas):.1%}); keep if the whole "
            f"interval is above +{plan.floor:.0%}, reject if below −{plan.floor:.0%}, no change if inside "
            f"±{plan.floor:.0%}{futile} or when the last look is undecided")


def ordinal(n: int) -> str:
    return {1: "1st", 2: "2nd", 3: "3rd"}.get(n, f"{n}th")


def log_ratios(pairs: Sequence[tuple[Sequence[float], Sequence[float]]], ref_tokens: float, cand_tokens: float,
               rank: int) -> list[float]:
    """Each pair's ln speed ratio from (reference block ms, candidate block ms) and each arm's tokens per step."""
    return [pair_log_ratio(block_stat(r, rank), block_stat(c, rank), ref_tokens, cand_tokens) for r, c in pairs]


def stop_rule(plan: SpeedPlan, ref_tokens: float, cand_tokens: float):
    """The callable a paired training process asks after each pair: stop now (see `should_stop`)?"""
    return lambda pairs: should_stop(log_ratios(pairs, ref_tokens, cand_tokens, plan.rank), plan)


def run_stat(record, plan: SpeedPlan) -> float:
    """A separate-process run's step time (ms) for the estimator: the `plan.rank`-th fastest step of its steady
    window (the summary's, profiled steps left out) — the whole window is one block. Across ten identical nano
    runs the minimum varied least (CV 2.0%, against 7.2% for the median; shared/mindspore-cpu-facts.md), and a run
    that a neighbour slowed for a while still has its fast steps."""
    s = record.summary
    first, last = s["steady_window"]
    profiled = s.get("profiled_steps") or (0, -1)
    times = [r["step_time_ms"] for r in record.metrics
             if first <= r["step"] <= last and not profiled[0] <= r["step"] <= profiled[1]]
    return block_stat(times, min(plan.rank, len(times)))
