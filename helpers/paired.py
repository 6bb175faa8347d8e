"""The speed estimator of a round: block pairs → the ratio of the arms' throughputs over every measured step → an
interval, looked at a few fixed times with the error rate spent across the looks. Pure arithmetic (no MindSpore,
no files), on the ground floor so that the process that measures can apply the stop rule itself.

A *block* is K consecutive optimizer steps of one arm; a *pair* is one reference block and one candidate block,
taken together (the two arms' steps woven one by one, ABBA) so that whatever else the machine does hits both
arms alike. What a round estimates is what the user pays: tokens ÷ wall time of ALL the arm's measured steps,
stalls, data waits and periodic work included (a step's time runs from asking for its batch to its loss):

    R = (tokens_C · N / Σ t_C) / (tokens_R · N / Σ t_R)      over the pairs kept (N steps of each arm)

and its interval comes from the pairs (the ratio estimator's linearisation, a paired delta method):
    m_i = mean step ms of each arm's block i,  d_i = m_R,i / m̄_R − m_C,i / m̄_C,
    ln R ± t_{1−α/2}(n − 1) · sd(d) / √n.
Interference from other processes adds time to both arms of a pair, so pairing cancels most of it; a pair
during which other processes used the most CPU (measured from /proc, outside the arms: `foreign_cores`) may be
dropped whole, at most `trim` of the pairs. Which pairs go is decided by that outside measurement alone, never by
the pair's own times, so no arm's own stalls can be trimmed away (trimming the slowest ratios, as this module
once did with the blocks' 2nd-fastest steps, dropped exactly those: see docs/explanation/speed-rule.md).

Beside the ratio, `parts` splits each arm's mean step into its data wait (where measured), its compute (the
`rank`-th fastest of each block's steps less their waits: what a step costs when nothing stalls it) and its
stalls (the rest above that fast end), so a verdict can say *why*: "compute ×1.00; data wait 17% → 0.3%".

Sequential looks: at the j-th look (after `looks[j]` pairs) the interval is two-sided at level 1 − alphas[j];
Σ alphas ≤ 0.01, so by the union bound the chance that *any* look's interval misses the true ratio — the only
way an A/A round is called keep or reject — is at most 1% per round, however many looks stop early.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field, fields
from typing import Sequence

import numpy as np
from scipy import special  # stdtrit is what stats.t.ppf calls; scipy.stats alone costs ~0.5–1 s to import

from helpers.record import data_wait_share

DECISIONS = ("keep", "reject", "no change")
INTERLEAVE = ("blocks", "steps")  # a pair's two blocks back to back, or woven together step by step


def t_quantile(p: float, dof: int) -> float:
    """The exact Student-t quantile t_p(dof) (e.g. p = 0.995 for a two-sided 99% interval); no normal shortcut."""
    if not 0 < p < 1 or dof < 1:
        raise ValueError(f"t quantile needs 0 < p < 1 and dof >= 1 (got p={p}, dof={dof})")
    return float(special.stdtrit(dof, p))


def fast_end(times_ms: Sequence[float], rank: int = 2) -> float:
    """The `rank`-th fastest step time of a block (ms; rank 2 = the second fastest): the step's cost when
    nothing stalled it. A part of the verdict, not its ratio."""
    if not times_ms:
        raise ValueError("an empty block has no fast end")
    return float(sorted(times_ms)[min(rank, len(times_ms)) - 1])


@dataclass
class Measurement:
    """The pairs a round measured, as the estimator reads them.

    pairs: [(reference step ms, candidate step ms)] per block pair (the steps of each arm's block);
    tokens: (reference, candidate) tokens per optimizer step; waits: the same shape as pairs, each step's data
    wait in ms (None where not measured); foreign_cores: per pair, the CPU other processes used meanwhile, in
    cores (None where not measured).
    """
    pairs: list[tuple[list[float], list[float]]]
    tokens: tuple[float, float]
    waits: list[tuple[list[float] | None, list[float] | None]] | None = None
    foreign_cores: list[float | None] | None = None

    def __len__(self) -> int:
        return len(self.pairs)

    def head(self, n: int) -> "Measurement":
        """The first n pairs (what a look after n pairs sees)."""
        return Measurement(self.pairs[:n], self.tokens, None if self.waits is None else self.waits[:n],
                           None if self.foreign_cores is None else self.foreign_cores[:n])

    @classmethod
    def from_raw(cls, raw: dict) -> "Measurement":
        """From a paired.json dict (helpers/run/pair.py, helpers/spawn/stepped.py); tokens per step by arm."""
        tokens = raw["tokens_per_step"]
        return cls([(list(r), list(c)) for r, c in raw["pairs"]], (tokens["reference"], tokens["candidate"]),
                   raw.get("waits"), raw.get("foreign_cores"))


# ------------------------------------------------------------ how every path takes its pairs and records them
# One home for the two ways that measure in blocks (both arms in one process: run/pair.py, in each msrun rank too;
# two arm processes: spawn/stepped.py): the order of the arms, the weave of a pair's steps, the paired.json record
# and the live view's figure. The warm-up rule is `run.profile.warmup_steps` (it needs the profiler window).

ARMS = ("reference", "candidate")


def pair_order(i: int) -> tuple[str, str]:
    """The arm that leads pair `i` (0-based) and the other: the reference in even pairs, the candidate in odd ones
    (ABBA across pairs)."""
    return ARMS if i % 2 == 0 else ARMS[::-1]


def woven(order: tuple[str, str], k: int) -> list[str]:
    """Which arm takes each of a pair's 2K single steps: ABBA inside the pair too (order[0], order[1], order[1],
    order[0], …), so a slow stretch of the machine that starts mid-pair lands on both arms' blocks alike."""
    return [name for j in range(k) for name in (order if j % 2 == 0 else order[::-1])]


MAX_TURN_STEPS = 8  # the faster arm's steps per turn at most (its block is that many times the plan's)


def turn_steps(sizing_ms: dict[str, Sequence[float]], limit: int = MAX_TURN_STEPS) -> dict[str, int]:
    """Steps per turn of each arm so that the two arms' turns last about as long: the slower arm 1, the faster
    round(slower ÷ faster step) (at most `limit`), from the median of each arm's sizing steps (ms; taken alone,
    after its warm-up). An arm's working set goes cold while the other takes its turn, the more the longer that
    turn (docs/explanation/speed-rule.md): a fast arm stepping once after each step of a stall-bound arm four times
    as long paid it on every other step, where a run of its own never idles, and the round read such an effect
    ~7% low. With turns of equal length each arm pays it alike, as in an A/A. Arms less than ×1.5 apart take 1
    step each (the default weave)."""
    typical = {n: statistics.median(t) for n, t in sizing_ms.items() if t}
    turns = {n: 1 for n in ARMS}
    if len(typical) == len(ARMS) and min(typical.values()) > 0:
        fast, slow = sorted(ARMS, key=lambda n: typical[n])
        turns[fast] = max(1, min(limit, round(typical[slow] / typical[fast])))
    return turns


def measurement_record(path: str, block_steps: int, interleave: str, max_pairs: int, warmup: int,
                       tokens_per_step: dict[str, int]) -> dict:
    """paired.json as a measurement starts it: the plan, and the lists `add_pair` fills (`Measurement.from_raw`
    reads it back); status 'running' until the measuring path sets how it ended."""
    return {"path": path, "block_steps": block_steps, "interleave": interleave, "max_pairs": max_pairs,
            "warmup_steps": warmup, "tokens_per_step": {n: tokens_per_step[n] for n in ARMS}, "pairs": [],
            "waits": [], "foreign_cores": [], "first_in_pair": [], "turn_steps": {n: 1 for n in ARMS},
            "status": "running", "reason": "", "warmup_ms": {}, "sizing_ms": {}, "memory": {}}


def add_pair(record: dict, order: tuple[str, str], times_ms: dict[str, list[float]],
             waits_ms: dict[str, list[float | None]], foreign_cores: float | None) -> Measurement:
    """One complete pair into `record` (each arm's step ms and data waits, the cores other processes used
    meanwhile, the arm that led); the measurement so far, for the stop rule."""
    record["pairs"].append(tuple(times_ms[n] for n in ARMS))
    record["waits"].append(tuple(waits_ms[n] for n in ARMS))
    record["foreign_cores"].append(foreign_cores)
    record["first_in_pair"].append(order[0])
    return Measurement.from_raw(record)


def live_tokens_per_s(tokens_per_step: float, times_ms: Sequence[float]) -> float:
    """What the live view draws for an arm after a block: tokens/s at the block's median step (the verdict uses
    every step; this is only the curve)."""
    return tokens_per_step * 1000.0 / statistics.median(times_ms)


@dataclass(frozen=True)
class SpeedPlan:
    """How a round measures speed: block length, looks (pairs done when the interval is checked) and the
    two-sided error spent at each look, the practical floor, and the trimming of disturbed pairs.

    block_steps: steps per block; looks: increasing pair counts; alphas: error spent per look (Σ ≤ 0.01 keeps
    the A/A false-call rate ≤ 1% per round); floor: the smallest relative change called keep/reject (0.01 = 1%);
    trim: at most this fraction of the pairs may be dropped for outside load, those during which other processes
    used more than `foreign_limit` cores, the busiest first; rank: which fastest step of a block is its fast end
    (a part of the verdict); interleave: a pair's blocks back to back ("blocks") or woven step by step ("steps");
    futility: at a look before the last, an undecided interval that lies inside ±futility stops the round with
    "no change" (no change of that size is there to find; stopping for it can only lower the false-call rate).
    """
    block_steps: int = 8
    looks: tuple[int, ...] = (8, 12)
    alphas: tuple[float, ...] = (0.003, 0.007)
    floor: float = 0.01
    trim: float = 0.2
    foreign_limit: float = 0.1
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
        if not 0 <= self.trim < 0.5 or self.foreign_limit < 0:
            raise ValueError(f"trim={self.trim} must be in [0, 0.5) and foreign_limit={self.foreign_limit} >= 0")
        if self.block_steps < 1 or self.rank < 1:
            raise ValueError(f"block_steps={self.block_steps} and rank={self.rank} must be >= 1")

    @property
    def max_pairs(self) -> int:
        return self.looks[-1]

    def to_dict(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, data: dict) -> "SpeedPlan":
        """A plan as speed.json or a pair request stored it (keys this version no longer has are ignored)."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items() if k in known})


# The default plan: 8 steps per arm per pair (a nano step is ~70–90 ms when two arms take turns, so a pair is
# ~1.4 s), the two arms' steps woven one by one (interleave "steps"): a slow stretch of the machine that starts
# mid-pair then lands on both arms alike (back-to-back blocks measured ~3× the per-pair spread here). The spread of
# one pair's log ratio, every step counted, was 2.2–5.4% (A/A rounds on nano, this 2-core machine); so an early
# look at 6 pairs (α 0.1%: t ≈ 6.9 with 5 dof) resolves only large changes, about ±10–20%, and ends a round whose
# answer is plain in half the steps; 12 pairs (0.2%) resolve about ±5%, 20 pairs (0.3%) ~±2.8%, and the last look
# at 28 (0.4%) ~±2.2% — about 40 s of a nano round's steps — where an A/A ends unless its interval lies inside
# ±2.5% earlier (futility).
PROCESS_PLAN = SpeedPlan(looks=(6, 12, 20, 28), alphas=(0.001, 0.002, 0.003, 0.004), interleave="steps",
                         futility=0.025)
# Data parallel paired rounds: every rank runs the last look's pairs (helpers/spawn/dp_worker.py; a stop taken
# from one rank's times could leave the other in an all-reduce), so one look at 8 pairs spends the whole 1%, in
# blocks of 4 steps: a DP step is ~100 ms here, and 8-step blocks cost every launch ~6 s more. Shorter blocks
# leave the interval valid (it comes from the 8 pairs) and only cost power.
DP_PAIRED_PLAN = SpeedPlan(block_steps=4, looks=(8,), alphas=(0.01,), interleave="steps")
# Whole runs in separate processes (the compile cache, msrun's data-parallel processes, the profiler): one pair =
# one run of each arm, its steady window the block; a run costs seconds of start and compile, so fewer looks.
RUNS_PLAN = SpeedPlan(block_steps=8, looks=(3, 4), alphas=(0.003, 0.007))


@dataclass(frozen=True)
class Interval:
    """A two-sided interval for the log speed ratio (candidate ÷ reference tokens/s); ratios are exp() of these."""
    estimate: float   # ln of the ratio of the arms' throughputs over the pairs kept
    low: float
    high: float
    pairs: int        # pairs measured
    trimmed: int      # pairs dropped for outside load
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


def kept_pairs(foreign_cores: Sequence[float | None] | None, n: int, trim: float, limit: float) -> list[bool]:
    """Which of n pairs the estimate uses: all but those during which other processes used more than `limit`
    cores, the busiest first, at most ⌊trim·n⌋ of them. Unmeasured outside load (None) drops nothing."""
    keep = [True] * n
    if not foreign_cores:
        return keep
    busy = sorted((f, i) for i, f in enumerate(foreign_cores[:n]) if f is not None and f > limit)
    for _, i in busy[::-1][:int(math.floor(trim * n))]:
        keep[i] = False
    return keep


def ratio_interval(ref_ms: Sequence[float], cand_ms: Sequence[float], tokens: tuple[float, float],
                   alpha: float, trimmed: int = 0) -> Interval:
    """Two-sided (1 − alpha) interval of ln(candidate ÷ reference tokens/s) from each pair's mean step times
    (ms; each arm's block of pair i), see the module docstring. `trimmed` only records how many were dropped."""
    r, c = np.asarray(ref_ms, dtype=np.float64), np.asarray(cand_ms, dtype=np.float64)
    n = r.size
    if n < 2 or c.size != n:
        raise ValueError(f"{n} pairs (of {c.size} candidate blocks) cannot give an interval; it needs >= 2")
    estimate = math.log(tokens[1] / tokens[0]) + math.log(r.mean() / c.mean())
    d = r / r.mean() - c / c.mean()
    se = float(np.std(d, ddof=1)) / math.sqrt(n)
    t = t_quantile(1 - alpha / 2, n - 1)
    return Interval(estimate, estimate - t * se, estimate + t * se, n + trimmed, trimmed, n - 1, t, 1 - alpha)


def interval_of(m: Measurement, plan: SpeedPlan, alpha: float) -> Interval:
    """The interval over the pairs of `m` that `kept_pairs` keeps."""
    keep = kept_pairs(m.foreign_cores, len(m), plan.trim, plan.foreign_limit)
    ref = [statistics.fmean(r) for (r, _), k in zip(m.pairs, keep) if k]
    cand = [statistics.fmean(c) for (_, c), k in zip(m.pairs, keep) if k]
    return ratio_interval(ref, cand, m.tokens, alpha, trimmed=len(m) - len(ref))


@dataclass(frozen=True)
class ArmParts:
    """Where one arm's mean step goes, over the pairs kept (ms per step; shares of its mean step): its data wait
    (where measured), its compute (the fast end of the rest: what a step costs when nothing stalls it) and its
    stalls (the rest above that fast end: interference, intermittent work, jitter). The three add up to mean_ms."""
    mean_ms: float              # what the ratio counts: the mean of every measured step
    compute_ms: float           # median over blocks of the rank-th fastest (step − data wait)
    stall_share: float          # (mean − data wait − compute) ÷ mean
    data_wait_share: float | None  # Σ data wait ÷ Σ step time (`record.data_wait_share`); None: not measured


@dataclass(frozen=True)
class Parts:
    """Both arms' parts and the compute ratio in tokens/s (at each arm's fast end): why the throughput ratio is
    what it is."""
    reference: ArmParts
    candidate: ArmParts
    compute_ratio: float  # candidate ÷ reference tokens/s at each arm's compute

    def to_dict(self) -> dict:
        return asdict(self)

    def text(self) -> str:
        """e.g. "compute ×1.002 (fast-end work 50.1 → 50.0 ms a step); stalls 3.2% → 2.9%, data wait 17.0% →
        0.2% of the mean step"."""
        r, c = self.reference, self.candidate
        waits = ("" if r.data_wait_share is None or c.data_wait_share is None else
                 f", data wait {r.data_wait_share:.1%} → {c.data_wait_share:.1%}")
        return (f"compute ×{self.compute_ratio:.3f} (fast-end work {r.compute_ms:.1f} → {c.compute_ms:.1f} ms a "
                f"step); stalls {r.stall_share:.1%} → {c.stall_share:.1%}{waits} of the mean step")


def parts(m: Measurement, plan: SpeedPlan) -> Parts:
    """Each arm's mean step, compute, stall and data-wait shares over the pairs `kept_pairs` keeps."""
    keep = kept_pairs(m.foreign_cores, len(m), plan.trim, plan.foreign_limit)
    arms = []
    for side in (0, 1):
        blocks = [p[side] for p, k in zip(m.pairs, keep) if k]
        waits = None
        if m.waits is not None:
            got = [w[side] for w, k in zip(m.waits, keep) if k]
            if all(g is not None and None not in g for g in got):
                waits = got
        work = [[t - w for t, w in zip(b, wb)] for b, wb in zip(blocks, waits)] if waits else blocks
        total = sum(sum(b) for b in blocks)
        mean = total / sum(len(b) for b in blocks)
        # the same quantile in a faster arm's longer block (turn_steps): rank per plan.block_steps steps
        compute = statistics.median(fast_end(b, plan.rank * max(1, len(b) // plan.block_steps)) for b in work)
        wait_share = (data_wait_share([t for b in blocks for t in b], [w for wb in waits for w in wb]) if waits
                      else None)
        stall = max(0.0, 1 - (compute / mean) - (wait_share or 0.0))
        arms.append(ArmParts(mean, compute, stall, wait_share))
    ref, cand = arms
    return Parts(ref, cand, (m.tokens[1] / cand.compute_ms) / (m.tokens[0] / ref.compute_ms))


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
    """Where the sequential measurement ended: the deciding (or last) look, whether the budget ran out, and the
    parts of the pairs that look used."""
    decision: str
    look: Look
    looks: list[Look] = field(default_factory=list)
    budget_spent: bool = False
    parts: Parts | None = None


def look_at(m: Measurement, plan: SpeedPlan) -> Look | None:
    """The look due now (len(m) equals one of plan.looks), or None between looks."""
    n = len(m)
    if n not in plan.looks:
        return None
    alpha = plan.alphas[plan.looks.index(n)]
    interval = interval_of(m, plan, alpha)
    decision = decide(interval, plan.floor)
    if decision is None and plan.futility is not None and n < plan.max_pairs and inside(interval, plan.futility):
        return Look(n, alpha, interval, "no change", futile=True)
    return Look(n, alpha, interval, decision)


def should_stop(m: Measurement, plan: SpeedPlan) -> bool:
    """Stop adding pairs: a look decided, or the last look is reached."""
    look = look_at(m, plan)
    return look is not None and (look.decision is not None or len(m) >= plan.max_pairs)


def conclude(m: Measurement, plan: SpeedPlan) -> Outcome:
    """Replay the looks over the pairs measured (the first that decided ends it); at the last look without a
    decision the round says "no change" with budget_spent=True. Fewer pairs than the first look → ValueError."""
    looks = []
    for n in plan.looks:
        if n > len(m):
            break
        look = look_at(m.head(n), plan)
        looks.append(look)
        if look.decision is not None:
            return Outcome(look.decision, look, looks, parts=parts(m.head(n), plan))
    if not looks:
        raise ValueError(f"{len(m)} pairs measured; the first look needs {plan.looks[0]}")
    n = looks[-1].pairs
    return Outcome("no change", looks[-1], looks, budget_spent=True, parts=parts(m.head(n), plan))


def stop_rule(plan: SpeedPlan):
    """The callable a measuring process asks after each pair: stop now (see `should_stop`)?"""
    return lambda m: should_stop(m, plan)


def rule_text(plan: SpeedPlan, path: str) -> str:
    """The speed rule with its numbers, as printed in a verdict."""
    unit = {"paired": "steps of each arm per pair, woven step by step (ABBA) in one process",
            "processes": "turns of each arm per pair, woven turn by turn (ABBA) between two long-lived processes; "
                         "a turn is 1 step, or for an arm ≥ ×1.5 faster as many steps as last one of the other's",
            "runs": "run of each arm per pair (its steady window), ABBA runs in separate processes"}.get(path, path)
    if plan.interleave == "blocks" and path != "runs":
        unit = unit.replace("woven step by step (ABBA)", "in ABBA blocks")
    looks = ", ".join(f"{n} pairs at {1 - a:.2%}" for n, a in zip(plan.looks, plan.alphas))
    futile = "" if plan.futility is None else f" (or, before the last look, inside ±{plan.futility:.0%})"
    return (f"speed ({path}: {plan.block_steps if path != 'runs' else 1} {unit}): the ratio of the arms' tokens ÷ "
            f"wall time of every measured step (stalls and data waits included), with a paired delta-method t "
            f"interval over the pairs; up to {plan.trim:.0%} of the pairs dropped whole where other processes used "
            f"more than {plan.foreign_limit:g} cores; looks after {looks} (Σα = {sum(plan.alphas):.1%}); keep if "
            f"the whole interval is above +{plan.floor:.0%}, reject if below −{plan.floor:.0%}, no change if inside "
            f"±{plan.floor:.0%}{futile} or when the last look is undecided")


def ordinal(n: int) -> str:
    return {1: "1st", 2: "2nd", 3: "3rd"}.get(n, f"{n}th")
