"""The auto-tuner's time-to-target mode: search the recipe and the speed levers for the least wall time to a
validation loss, within a wall-clock budget (`autotune(..., objective="time_to_target", target_val_loss=X)`).

Every run ends at its first validation pass with val loss ≤ the target (config `target_val_loss`), so an arm
costs only the time it needs. The time that counts is `elapsed_s`: wall seconds since the run's process started
(start-up, compile and evaluation included — everything the user pays).

One bracket, repeated while the budget allows (successive halving with two rungs, η = `eta`):
    cap       = the current best's mean seconds to target × CAP_MARGIN. An arm still short of the target at
                that time cannot beat the best (noise aside), so no run of an arm goes past it.
    rung 1    a race: the untried arms, one after another, each train once (the best's seed) until they reach
                the target or their cap: `cap`, lowered to the fastest screened arm's time × CAP_MARGIN once an arm
                has reached it. Every arm is judged on the objective itself, seconds to target, so a short schedule
                that leads early but never gets there is not preferred (an earlier screen at the fixed time cap/η
                ranked arms by val loss and promoted exactly those). An arm that leaves the recipe alone (a lever,
                a speed lever) runs on top of the fastest recipe arm so far: gains stack, and a lever screened on
                the old recipe would be capped by a faster recipe it will never be compared with. The arms that
                reached it sooner than the best, fastest first, top ⌈n/η⌉, are promoted; the rest are dropped.
    rung 2    the promoted arms, best first, as ordinary time-to-target rounds (`Workbook.run_round`: `seeds`
                seeds per arm, ABBA order, the candidate capped at `cap`, pairs stopping at the first candidate
                seed that did not reach the target), judged on seconds to target against the seed band. A kept
                round moves the best; the next arms are compared against it.
The budget is checked before every run from measured times: an arm is screened only while one round still fits
after it at its cap (at least two must fit at `cap`, else the first arm goes straight to a round). Arms = the recipe
grid around the best (`recipe_arms`: lr, warm-up, schedule length, min_lr, global batch, changed together), the
speed-record levers (`ttq_levers`: Muon, rotary positions, ReLU², QK-norm, zero-initialised projections, the
trapezoid schedule, a logit soft-cap; one group each) and the first speed levers the bottleneck diagnosis orders
(`autotune.candidates`). Each screened arm is a ledger note
(decision promoted/dropped) whose `why` and `reasoning` give its numbers, its cap and its rank; an arm the budget
left out is a "not screened" note (tried again when the workbook continues); each round's entry says why it ran.
An arm that did not reach the target is written "did not reach", never a time. Screening runs live in
`screens/NN_MM_name/`.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from helpers import config as config_mod
from helpers.config import Config, ConfigError
from helpers.record import RunRecord
from helpers.spawn.runner import launch
from helpers.tune.autotune import (BUDGET_MARGIN, WHO, AutotuneError, AutotuneResult, Candidate, median_run,
                                   note_refused, tried_changes, candidates, check_budget)
from helpers.tune.convergence import RECIPE, TIME_TO_TARGET, eval_curve, time_to_target, ttq_arms
from helpers.tune.diagnose import diagnose
from helpers.tune.ledger import RoundError
from helpers.tune.round_spec import candidate
from helpers.tune.rounds import Workbook
from helpers.tune.ttq_levers import lever_arms

CAP_MARGIN = 1.1  # run-to-run wall time drifts ±10% on the shared machine: an arm within that of the best may tie
DEFAULT_OVERHEAD_S = 3.0  # per run outside its elapsed_s (the parent's launch, the child's exit) until measured
SPEED_ARMS = 2  # speed levers screened per bracket, in the diagnosis' order
# The recipe grid around the best: peak lr ×, schedule length × (warm-up scaled with it; min_lr keeps its ratio
# to lr), global batch ×. Higher lr with a shorter schedule is the usual way to reach a loss sooner; a larger batch
# makes each step cheaper per token on CPU (the batch/threads facts) at the cost of fewer updates.
LR_FACTORS = (2.0, 3.0)
STEP_FRACTIONS = (0.5, 0.65)
BATCH_FACTORS = (1.0, 4 / 3)


def recipe_changes(cfg: Config, lr_factor: float, steps_fraction: float, batch_factor: float = 1.0) -> dict:
    """The recipe of `cfg` moved as one: peak lr × `lr_factor` (min_lr keeping its ratio to lr), schedule length
    and warm-up × `steps_fraction` (steps at least steady_after + 1), batch_size × `batch_factor`; only the keys
    that change."""
    lr = float(f"{cfg.lr * lr_factor:.3g}")
    changes = {"lr": lr, "min_lr": float(f"{cfg.min_lr * lr / cfg.lr:.3g}"),
               "steps": max(cfg.steady_after + 1, round(cfg.steps * steps_fraction)),
               "warmup": round(cfg.warmup * steps_fraction), "batch_size": round(batch_factor * cfg.batch_size)}
    return {k: v for k, v in changes.items() if v != getattr(cfg, k)}


def recipe_arms(cfg: Config) -> list[Candidate]:
    """The recipe grid around `cfg` (LR_FACTORS × STEP_FRACTIONS × BATCH_FACTORS), each one candidate that changes
    lr, min_lr, steps, warm-up and batch_size together (`recipe_changes`). Ordered soonest-finishing first —
    shortest schedule, then highest lr, then largest batch — because a budget that fits no screen runs the first
    arm alone as a round."""
    out = []
    for frac in sorted(STEP_FRACTIONS):
        for lr_f in sorted(LR_FACTORS, reverse=True):
            for batch_f in sorted(BATCH_FACTORS, reverse=True):
                changes = recipe_changes(cfg, lr_f, frac, batch_f)
                lr = changes.get("lr", cfg.lr)
                out.append(Candidate(f"recipe_lr{lr:g}_s{changes.get('steps', cfg.steps)}_b"
                                     f"{changes.get('batch_size', cfg.batch_size)}", "recipe", changes,
                                     f"peak lr ×{lr_f:g} over a schedule ×{frac:g} as long (warm-up and min_lr "
                                     f"scaled with them), global batch ×{batch_f:.3g}"))
    return out


def best_time(runs: list[RunRecord], target: float) -> float | None:
    """Mean seconds to `target` over the best's runs; None if one of them did not reach it."""
    times = [time_to_target(r, target) for r in runs]
    return None if any(t is None for t in times) else float(np.mean(times))


def time_to_beat(runs: list[RunRecord], target: float) -> tuple[float, str]:
    """(seconds, words): the best's mean seconds to `target`; if one of its runs did not reach it, the mean wall
    seconds of its whole runs instead — any arm that gets there sooner beats a best that never does."""
    t = best_time(runs, target)
    if t is not None:
        return t, f"the best reaches val loss {target:g} in {t:.1f} s (mean of its runs)"
    t = float(np.mean([_run_wall_s(r) for r in runs]))
    return t, (f"the best does not reach val loss {target:g} on every run ({_times_words(runs, target)}); its whole "
               f"runs take {t:.1f} s (mean), the time to beat")


def loss_at_time(runs: list[RunRecord], seconds: float) -> float:
    """Mean validation loss (nats/token) of `runs` at `seconds` of wall time (eval passes interpolated on
    elapsed_s; before the first pass or after the last, that pass's value)."""
    return float(np.mean([np.interp(seconds, eval_curve(r)[2], eval_curve(r)[1]) for r in runs]))


def _run_wall_s(run: RunRecord) -> float:
    """A run's elapsed seconds at its last row (0 without rows)."""
    return float(run.metrics[-1].get("elapsed_s") or 0.0) if run.metrics else 0.0


def _arms(wb: Workbook, best_cfg: Config, best: list[RunRecord], result: AutotuneResult,
          log: Callable[[str], None]) -> list[Candidate]:
    """Untried arms the config accepts: the recipe grid, the speed-record levers (`ttq_levers`), then the first
    SPEED_ARMS speed levers. A refused candidate is a skipped note (never run)."""
    diag = diagnose(median_run(best))
    speed = [c for c in candidates(best_cfg, diag)[0] if not set(c.changes) & set(RECIPE)]
    tried = tried_changes(wb.ledger())
    out, speed_taken = [], 0
    for cand in [*recipe_arms(best_cfg), *lever_arms(best_cfg), *speed]:
        is_speed = any(cand is s for s in speed)
        if cand.key() in tried or is_speed and speed_taken >= SPEED_ARMS:
            continue
        try:
            wb.candidate(cand.name, cand.changes, TIME_TO_TARGET)
        except (ConfigError, RoundError) as exc:
            note_refused(wb, cand, best_cfg, exc, result, log)
            continue
        out.append(cand)
        speed_taken += is_speed
    return out


def autotune_time_to_target(cfg: Config, out, budget_min: float, target_val_loss: float, seeds: int = 2,
                            repeats: int = 2, eta: int = 3, progress: bool = False,
                            log: Callable[[str], None] = print,
                            baseline_runs: list[RunRecord] | None = None) -> AutotuneResult:
    """The auto-tuner's time-to-target mode (`python -m helpers autotune --objective time_to_target
    --target-val-loss X`): search the recipe and the speed levers for the least wall time to `target_val_loss`
    (nats/token) within `budget_min` minutes, `seeds` seeds per round arm, successive halving with η = `eta`
    (module docstring); `baseline_runs` pins finished runs of `cfg` as the baseline. Bad input fails in one line
    (AutotuneError, ConfigError) before anything trains."""
    return search(cfg, out, check_budget(budget_min), target_val_loss, seeds=seeds, repeats=repeats, eta=eta,
                  progress=progress, log=log, baseline_runs=baseline_runs)


@dataclass
class _Search:
    """What every bracket of one `search` call shares."""
    wb: Workbook
    result: AutotuneResult
    start: float  # time.monotonic() when the call began
    target: float
    seeds: int
    eta: int
    progress: bool
    log: Callable[[str], None]
    overheads: list[float] = field(default_factory=list)  # per-run seconds outside elapsed_s, measured so far

    def left_s(self) -> float:
        """Budget seconds left."""
        return self.result.budget_s - (time.monotonic() - self.start)


@dataclass
class _Plan:
    """One bracket: the best it starts from, its cap and its estimates (seconds), and its arms."""
    index: int
    best_cfg: Config
    best: list[RunRecord]
    t_best: float
    best_words: str
    cap: float
    overhead: float
    left: float
    round_s: float
    screen_s: float
    arms: list[Candidate]
    screens_fit: int  # screening runs that fit before a round

    @property
    def screened(self) -> bool:
        """Whether the arms race (rung 1); else the first arm goes straight to a round."""
        return self.screens_fit >= 2


def search(cfg: Config, out, budget_s: float, target: float, seeds: int = 2, repeats: int = 2, eta: int = 3,
           progress: bool = False, log: Callable[[str], None] = print,
           baseline_runs: list[RunRecord] | None = None) -> AutotuneResult:
    """Run the brackets described in the module docstring into the workbook at `out` (created or continued) until
    the budget (seconds) or the arms run out. `target`: validation loss in nats/token. `baseline_runs`: finished
    runs of `cfg` to pin as the baseline instead of training it (`Workbook.baseline(adopt=...)`)."""
    _check_target_and_eta(target, eta)
    # every run compiles cold, as in a round (convergence.ttq_arms): the baseline's times are then comparable
    cfg = config_mod.with_changes(cfg, {"target_val_loss": float(target), "compile_cache": False})
    start = time.monotonic()
    wb = Workbook.create(out, cfg, repeats=repeats)
    ctx = _Search(wb, AutotuneResult(path=wb.path, budget_s=budget_s, objective=TIME_TO_TARGET), start, target,
                  seeds, eta, progress, log)
    ctx.overheads = _baseline(ctx, baseline_runs)
    bracket = sum(e["event"] == "note" and e["name"].startswith("bracket_") for e in wb.ledger())
    while True:
        plan = _plan(ctx, bracket + 1)
        if isinstance(plan, str):
            ctx.result.stop_reason = plan
            break
        bracket = plan.index
        _note_plan(ctx, plan)
        promoted = _screen(ctx, plan) if plan.screened else plan.arms[:1]
        _run_promoted(ctx, plan, promoted)
    _note_stop(ctx)
    return ctx.result


def _check_target_and_eta(target: float, eta: int) -> None:
    """A one-line AutotuneError for a target or an η `search` cannot use."""
    if isinstance(target, bool) or not isinstance(target, (int, float)) or not math.isfinite(target) or target <= 0:
        raise AutotuneError(f"target_val_loss={target!r} must be a positive validation loss in nats/token, e.g. "
                            f"--target-val-loss 1.9")
    if isinstance(eta, bool) or not isinstance(eta, int) or eta < 2:
        raise AutotuneError(f"eta={eta!r} must be a whole number >= 2 (the fraction 1/eta of arms promoted)")


def _baseline(ctx: _Search, adopt: list[RunRecord] | None) -> list[float]:
    """Train the baseline, or pin `adopt`; the per-run seconds outside elapsed_s (launch, exit) it measured."""
    pinned = any(e["event"] == "baseline" for e in ctx.wb.ledger()) or bool(adopt)
    base = ctx.wb.baseline(progress=ctx.progress, who=WHO, adopt=adopt)
    # measured on the baseline only when this call trained it
    overheads = [] if pinned else [(time.monotonic() - ctx.start) / len(base) - max(_run_wall_s(r) for r in base)]
    ctx.log(f"baseline: {_times_words(base, ctx.target)} to val loss {ctx.target:g} "
            f"({time.monotonic() - ctx.start:.0f} s)")
    return overheads


def _plan(ctx: _Search, index: int) -> _Plan | str:
    """Bracket `index` from the current best: its arms, cap and estimates; or why the search stops (no arm left,
    or no round fits in the budget)."""
    best_cfg, best = ctx.wb.best_config(), ctx.wb.best_runs()
    t_best, best_words = time_to_beat(best, ctx.target)
    cap = t_best * CAP_MARGIN
    overhead = max([DEFAULT_OVERHEAD_S, *ctx.overheads])  # overheads is empty when the baseline was pinned
    left = ctx.left_s()
    ref_s = float(np.mean([_run_wall_s(r) for r in best])) + overhead
    round_s = ctx.seeds * (ref_s + cap + overhead) * BUDGET_MARGIN
    arms = _arms(ctx.wb, best_cfg, best, ctx.result, ctx.log)
    if not arms:
        return "nothing left to try: every arm of the recipe grid and the speed levers was tried"
    if left < round_s:
        return (f"budget: {left:.0f} s of {ctx.result.budget_s:.0f} s left, and a round needs ~{round_s:.0f} s "
                f"({ctx.seeds}×({ref_s:.0f} s reference + {cap:.0f} s capped candidate + {overhead:.0f} s)"
                f"×{BUDGET_MARGIN})")
    screen_s = (cap + overhead) * BUDGET_MARGIN  # a screening run at most; the race lowers its cap
    return _Plan(index, best_cfg, best, t_best, best_words, cap, overhead, left, round_s, screen_s, arms,
                 screens_fit=min(len(arms), int((left - round_s) // screen_s)))


def _note_plan(ctx: _Search, plan: _Plan) -> None:
    """The bracket's plan note: its cap, its estimates, and whether its arms race or the first goes to a round."""
    text = (f"Bracket {plan.index}: {plan.best_words}, so no arm runs past {plan.cap:.1f} s (×{CAP_MARGIN}: an arm "
            f"not there by then cannot beat it). {plan.left:.0f} s left; a round costs ~{plan.round_s:.0f} s, a "
            f"screening run at most ~{plan.screen_s:.0f} s"
            + (f", so the {len(plan.arms)} arms race to the target one after another, each capped at the fastest "
               f"time so far ×{CAP_MARGIN}, while a round still fits after them; the top 1/η (η={ctx.eta}) of those "
               f"that beat the best go to rounds." if plan.screened else
               f"; fewer than two screening runs fit, so the first arm ({plan.arms[0].name}: the recipe grid is "
               f"ordered soonest-finishing first) goes straight to a round."))
    ctx.wb.note(f"bracket_{plan.index:02d}", text, decision="plan", who=WHO,
                reasoning={"best_time_s": round(plan.t_best, 2), "cap_s": round(plan.cap, 2), "eta": ctx.eta,
                           "arms": [a.name for a in plan.arms], "round_estimate_s": round(plan.round_s, 1),
                           "screen_estimate_s": round(plan.screen_s, 1), "budget_left_s": round(plan.left, 1),
                           "overhead_s": round(plan.overhead, 2)})
    ctx.log(text)


def _run_promoted(ctx: _Search, plan: _Plan, promoted: list[Candidate]) -> None:
    """Rung 2: the promoted arms, best first, each a round against the best of its time while one fits; an arm
    the budget left out, or that no longer changes the best (a kept round moved it to the arm's values), is a
    "not run" note."""
    for rank, arm in enumerate(promoted, 1):
        left = ctx.left_s()
        t_best = time_to_beat(ctx.wb.best_runs(), ctx.target)[0]  # a kept round may have moved the best
        why = f"{left:.0f} s left < ~{plan.round_s:.0f} s for its round" if left < plan.round_s else ""
        try:
            ctx.wb.candidate(arm.name, arm.changes, TIME_TO_TARGET)
        except (ConfigError, RoundError) as exc:  # e.g. two recipe arms that share an lr, the first one kept
            why = why or f"the best moved since its screen: {exc}"
        if why:
            current = config_mod.flatten(ctx.wb.best_config())
            ctx.wb.note(arm.name, f"promoted but not run: {why}",
                        {k: (current[k], v) for k, v in arm.changes.items()}, decision="not run", who=WHO,
                        reasoning={"bracket": plan.index, "rank": rank, "budget_left_s": round(left, 1),
                                   "estimate_s": round(plan.round_s, 1)})
            ctx.log(f"round for {arm.name}: not run ({why})")
            continue
        _run_round(ctx, plan, rank, arm, left, t_best)


def _run_round(ctx: _Search, plan: _Plan, rank: int, arm: Candidate, left: float, t_best: float) -> None:
    """One time-to-target round of `arm` against the best (`t_best` seconds to the target), the candidate capped
    at `t_best` × CAP_MARGIN; its outcome goes to the result and the log."""
    cap = t_best * CAP_MARGIN
    origin = f"promoted from the bracket {plan.index} screen, rank {rank}" if plan.screened else \
        f"the first arm of bracket {plan.index} (no screen fitted)"
    why = (f"Round for {origin}: {arm.name} ({', '.join(f'{k}={v}' for k, v in arm.changes.items())}) because "
           f"{arm.why}. Judged on wall seconds to val loss {ctx.target:g} with {ctx.seeds} seeds per arm; the "
           f"candidate is capped at {cap:.1f} s (the best's {t_best:.1f} s ×{CAP_MARGIN}). Estimated "
           f"{plan.round_s:.0f} s of {left:.0f} s left.")
    t = time.monotonic()
    done = ctx.wb.run_round(arm.name, arm.changes, progress=ctx.progress, who=WHO, objective=TIME_TO_TARGET,
                            seeds=ctx.seeds, target=ctx.target, time_cap_s=cap, why=why,
                            reasoning={"bracket": plan.index, "rank": rank, "family": arm.family,
                                       "candidate_why": arm.why, "best_time_s": round(t_best, 2),
                                       "cap_s": round(cap, 2), "estimate_s": round(plan.round_s, 1),
                                       "budget_left_s": round(left, 1)})
    actual = time.monotonic() - t
    ctx.result.rounds.append({"round": done.index, "name": done.name, "decision": done.decision,
                              "speedup": done.verdict.speedup, "estimate_s": plan.round_s, "actual_s": actual,
                              "reason": done.verdict.reason})
    ctx.log(f"round {done.index} {done.name}: {done.decision} ({done.verdict.reason})")


def _note_stop(ctx: _Search) -> None:
    """Close the call: elapsed seconds and baseline ÷ best seconds to the target on the result, and a stop note."""
    result, wb, target = ctx.result, ctx.wb, ctx.target
    result.elapsed_s = time.monotonic() - ctx.start
    base_t, best_t = best_time(wb.baseline_runs(), target), best_time(wb.best_runs(), target)
    result.speedup = base_t / best_t if base_t and best_t else None
    actuals = ", ".join(f"{r['name']} {r['estimate_s']:.0f}/{r['actual_s']:.0f} s" for r in result.rounds)
    wb.note("autotune_stop", f"Stopped: {result.stop_reason}. Wall time {result.elapsed_s:.0f} s of "
            f"{result.budget_s:.0f} s; rounds estimated/actual: {actuals or 'none'}; time to val loss {target:g}: "
            f"baseline {_times_words(wb.baseline_runs(), target)} → best {_times_words(wb.best_runs(), target)}.",
            decision="stop", who=WHO, reasoning={"elapsed_s": round(result.elapsed_s, 1), "budget_s": result.budget_s,
                                                 "target_val_loss": target, "time_ratio": result.speedup})


def _times_words(runs: list[RunRecord], target: float) -> str:
    from helpers.tune.convergence import seed_times_text
    return seed_times_text([time_to_target(r, target) for r in runs])


@dataclass
class _Screened:
    """One arm's screening run: seconds to the target (None: not reached by its cap), or why it failed, and its
    last validation pass (val loss, wall seconds) with the best's val loss at that wall time."""
    arm: Candidate
    moved: dict[str, tuple]  # {key: (best's value, arm's value)}
    cap: float  # seconds
    folder: Path
    time_s: float | None = None  # seconds to the target
    failure: str = ""
    last_loss: float | None = None  # nats/token
    last_eval_s: float | None = None
    best_loss_then: float | None = None  # the best's val loss at last_eval_s
    on: str = ""  # the recipe arm it was screened on top of ("" : on the best itself)


def _screen(ctx: _Search, plan: _Plan) -> list[Candidate]:
    """Rung 1, a race: each arm once, capped at the bracket's cap or at the fastest time to the target so far ×
    CAP_MARGIN, while a round still fits in the budget after it; returns the promoted arms, fastest first. An arm
    that leaves the recipe alone (a lever, a speed lever) is screened on top of the fastest recipe arm so far (`on`),
    the regime its round will meet if that arm is kept first; its round changes its own group only. One ledger
    note per arm (promoted/dropped, or "not screened" when the budget left it out) with its numbers."""
    scored, fastest, fastest_recipe = [], None, None
    for k, arm in enumerate(plan.arms, 1):
        arm_cap = plan.cap if fastest is None else min(plan.cap, fastest * CAP_MARGIN)
        left = ctx.left_s()
        is_recipe = bool(set(arm.changes) & set(RECIPE))
        on = fastest_recipe if fastest_recipe is not None and not is_recipe else None
        cand, moved = ctx.wb.candidate(arm.name, arm.changes, TIME_TO_TARGET)  # moved: the arm's own group
        if on is not None:
            try:
                on_cfg = ctx.wb.candidate(on.arm.name, on.arm.changes, TIME_TO_TARGET)[0]
                cand = candidate(on_cfg, arm.name, arm.changes, TIME_TO_TARGET)[0]
            except (ConfigError, RoundError):
                on = None  # the two do not combine: screened on the best itself
        if left < plan.round_s + (arm_cap + max([DEFAULT_OVERHEAD_S, *ctx.overheads])) * BUDGET_MARGIN:
            ctx.wb.note(arm.name, f"not screened in bracket {plan.index}: {left:.0f} s left, and a round must still "
                        f"fit after a run capped at {arm_cap:.1f} s. Tried again if the workbook continues.", moved,
                        decision="not screened", who=WHO,
                        reasoning={"bracket": plan.index, "budget_left_s": round(left, 1),
                                   "screen_cap_s": round(arm_cap, 2)})
            ctx.log(f"screen {arm.name}: not screened (budget)")
            continue
        scored.append(_screen_arm(ctx, plan, k, arm, cand, moved, arm_cap))
        scored[-1].on = on.arm.name if on else ""
        if scored[-1].time_s is not None:
            fastest = scored[-1].time_s if fastest is None else min(fastest, scored[-1].time_s)
            if is_recipe and (fastest_recipe is None or scored[-1].time_s < fastest_recipe.time_s):
                fastest_recipe = scored[-1]
    ranked = sorted([s for s in scored if s.time_s is not None], key=lambda s: s.time_s)
    top = [s for s in ranked[:max(1, math.ceil(len(scored) / ctx.eta))] if s.time_s < plan.t_best]
    for s in scored:
        rank = next((i for i, r in enumerate(ranked, 1) if r.arm is s.arm), None)
        decision = "promoted" if any(p.arm is s.arm for p in top) else "dropped"
        _note_screened(ctx, plan, s, rank, len(ranked), len(scored), decision)
    return [s.arm for s in top]


def _screen_arm(ctx: _Search, plan: _Plan, k: int, arm: Candidate, cand: Config, moved: dict,
                cap: float) -> _Screened:
    """Train arm `k` once (the best's seed) until it reaches the target or `cap` seconds of wall time."""
    run_cfg = ttq_arms(cand, plan.best_cfg, ctx.target, cap)[0]
    folder = ctx.wb.path / "screens" / f"{plan.index:02d}_{k:02d}_{arm.name}"
    t = time.monotonic()
    try:
        run = launch(run_cfg, folder, progress=ctx.progress, desc=f"screen {plan.index}.{k} {arm.name}")
    except RuntimeError as exc:
        return _Screened(arm, moved, cap, folder, failure=f"ended left no record ({str(exc).splitlines()[0]})")
    ctx.overheads.append(max(0.0, time.monotonic() - t - _run_wall_s(run)))
    status = run.status if run.status != "ok" else ""
    if status or not eval_curve(run)[1].size:
        return _Screened(arm, moved, cap, folder, failure=f"ended {status or 'without a validation pass'}")
    _, losses, seconds = eval_curve(run)
    # the best's own val loss at the wall time of the arm's last validation pass: how far along it was
    return _Screened(arm, moved, cap, folder, time_s=time_to_target(run, ctx.target), last_loss=float(losses[-1]),
                     last_eval_s=float(seconds[-1]), best_loss_then=loss_at_time(plan.best, float(seconds[-1])))


def _note_screened(ctx: _Search, plan: _Plan, s: _Screened, rank: int | None, reached_count: int, n: int,
                   decision: str) -> None:
    """A screened arm's note: its time to the target (or why none), its rank among the `reached_count` arms that
    reached it, of `n` screened, and the decision."""
    got = s.failure or ("did not reach it by its cap" if s.time_s is None else f"reached it in {s.time_s:.1f} s")
    changes = ", ".join(f"{k}={v}" for k, v in s.arm.changes.items())
    why = (f"Screened in bracket {plan.index}, capped at {s.cap:.1f} s (the best's {plan.t_best:.1f} s or the "
           f"fastest arm so far, ×{CAP_MARGIN}): {s.arm.name} ({changes}) because {s.arm.why}"
           + (f"; on top of {s.on}, the fastest recipe arm so far (its round changes {s.arm.name}'s group only)"
              if s.on else "") + ". Val loss "
           f"{ctx.target:g}: {got}"
           + (f"; val loss {s.last_loss:.4f} at its last validation pass ({s.last_eval_s:.1f} s) vs the best's "
              f"{s.best_loss_then:.4f} at that wall time" if s.last_loss is not None else "")
           + (f"; rank {rank} of the {reached_count} that reached it" if rank else "")
           + f" → {decision} (the top ⌈{n}/{ctx.eta}⌉ by seconds to target that beat the best's "
           f"{plan.t_best:.1f} s go to rounds).")
    ctx.wb.note(s.arm.name, why, s.moved, decision=decision, who=WHO,
                reasoning={"bracket": plan.index, "family": s.arm.family, "screen_cap_s": round(s.cap, 2),
                           "screened_on": s.on or None,
                           "run": s.folder.relative_to(ctx.wb.path).as_posix(), "time_to_target_s": s.time_s,
                           "reached": s.time_s is not None, "last_eval_s": s.last_eval_s,
                           "val_loss_at_last_eval": s.last_loss, "best_val_loss_then": s.best_loss_then,
                           "best_time_s": round(plan.t_best, 2), "rank": rank, "failure": s.failure or None})
    ctx.log(f"screen {s.arm.name}: {got} → {decision}")


__all__ = ["CAP_MARGIN", "autotune_time_to_target", "best_time", "loss_at_time", "recipe_arms", "recipe_changes",
           "search", "time_to_beat"]
