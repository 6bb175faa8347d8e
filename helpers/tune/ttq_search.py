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
                ranked arms by val loss and promoted exactly those). The arms that reached it sooner than the best,
                fastest first, top ⌈n/η⌉, are promoted; the rest are dropped.
    rung 2    the promoted arms, best first, as ordinary time-to-target rounds (`Workbook.run_round`: `seeds`
                seeds per arm, ABBA order, the candidate capped at `cap`, pairs stopping at the first candidate
                seed that did not reach the target), judged on seconds to target against the seed band. A kept
                round moves the best; the next arms are compared against it.
The budget is checked before every run from measured times: an arm is screened only while one round still fits
after it at its cap (at least two must fit at `cap`, else the first arm goes straight to a round). Arms = the recipe
grid around the best (`recipe_arms`: lr, warm-up, schedule length, min_lr, global batch, changed together) and the
first speed levers the bottleneck diagnosis orders (`autotune.candidates`). Each screened arm is a ledger note
(decision promoted/dropped) whose `why` and `reasoning` give its numbers, its cap and its rank; an arm the budget
left out is a "not screened" note (tried again when the workbook continues); each round's entry says why it ran.
An arm that did not reach the target is written "did not reach", never a time. Screening runs live in
`screens/NN_MM_name/`.
"""
from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Callable

import numpy as np

from helpers import config as config_mod
from helpers.config import Config, ConfigError
from helpers.record import RunRecord
from helpers.spawn.runner import launch
from helpers.tune.autotune import (BUDGET_MARGIN, WHO, AutotuneError, AutotuneResult, Candidate, median_run,
                                   tried_changes, candidates, check_budget)
from helpers.tune.convergence import RECIPE, TIME_TO_TARGET, eval_curve, time_to_target, ttq_arms
from helpers.tune.diagnose import diagnose
from helpers.tune.ledger import RoundError
from helpers.tune.rounds import Workbook

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
    """Untried arms the config accepts: the recipe grid, then the first SPEED_ARMS speed levers. A refused
    candidate is a skipped note (never run)."""
    diag = diagnose(median_run(best))
    speed = [c for c in candidates(best_cfg, diag)[0] if not set(c.changes) & set(RECIPE)]
    tried = tried_changes(wb.ledger())
    out = []
    for cand in [*recipe_arms(best_cfg), *speed]:
        if cand.key() in tried or len([c for c in out if c.family != "recipe"]) >= SPEED_ARMS > 0 and \
                cand.family != "recipe":
            continue
        try:
            wb.candidate(cand.name, cand.changes, TIME_TO_TARGET)
        except (ConfigError, RoundError) as exc:
            current = config_mod.flatten(best_cfg)
            wb.note(cand.name, f"not run: the config refuses it — {exc}. It was considered because {cand.why}",
                    {k: (current[k], v) for k, v in cand.changes.items()}, decision="skipped", who=WHO)
            result.skipped.append({"name": cand.name, "why": str(exc)})
            log(f"skipped {cand.name}: {exc}")
            continue
        out.append(cand)
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


def search(cfg: Config, out, budget_s: float, target: float, seeds: int = 2, repeats: int = 2, eta: int = 3,
           progress: bool = False, log: Callable[[str], None] = print,
           baseline_runs: list[RunRecord] | None = None) -> AutotuneResult:
    """Run the brackets described in the module docstring into the workbook at `out` (created or continued) until
    the budget (seconds) or the arms run out. `target`: validation loss in nats/token. `baseline_runs`: finished
    runs of `cfg` to pin as the baseline instead of training it (`Workbook.baseline(adopt=...)`)."""
    if isinstance(target, bool) or not isinstance(target, (int, float)) or not math.isfinite(target) or target <= 0:
        raise AutotuneError(f"target_val_loss={target!r} must be a positive validation loss in nats/token, e.g. "
                            f"--target-val-loss 1.9")
    if isinstance(eta, bool) or not isinstance(eta, int) or eta < 2:
        raise AutotuneError(f"eta={eta!r} must be a whole number >= 2 (the fraction 1/eta of arms promoted)")
    # every run compiles cold, as in a round (convergence.ttq_arms): the baseline's times are then comparable
    cfg = config_mod.with_changes(cfg, {"target_val_loss": float(target), "compile_cache": False})
    start = time.monotonic()
    wb = Workbook.create(out, cfg, repeats=repeats)
    result = AutotuneResult(path=wb.path, budget_s=budget_s, objective=TIME_TO_TARGET)
    pinned = any(e["event"] == "baseline" for e in wb.ledger())
    base = wb.baseline(progress=progress, who=WHO, adopt=baseline_runs)
    pinned = pinned or bool(baseline_runs)
    # per-run seconds outside elapsed_s (launch, exit), measured on the baseline when this call trained it
    overheads = [] if pinned else [(time.monotonic() - start) / len(base) - max(_run_wall_s(r) for r in base)]
    log(f"baseline: {_times_words(base, target)} to val loss {target:g} ({time.monotonic() - start:.0f} s)")
    bracket = sum(e["event"] == "note" and e["name"].startswith("bracket_") for e in wb.ledger())
    while True:
        best_cfg, best = wb.best_config(), wb.best_runs()
        t_best, best_words = time_to_beat(best, target)
        cap = t_best * CAP_MARGIN
        overhead = max([DEFAULT_OVERHEAD_S, *overheads])  # overheads is empty when the baseline was pinned
        left = budget_s - (time.monotonic() - start)
        ref_s = float(np.mean([_run_wall_s(r) for r in best])) + overhead
        round_s = seeds * (ref_s + cap + overhead) * BUDGET_MARGIN
        arms = _arms(wb, best_cfg, best, result, log)
        if not arms:
            result.stop_reason = "nothing left to try: every arm of the recipe grid and the speed levers was tried"
            break
        if left < round_s:
            result.stop_reason = (f"budget: {left:.0f} s of {budget_s:.0f} s left, and a round needs ~{round_s:.0f} s "
                                  f"({seeds}×({ref_s:.0f} s reference + {cap:.0f} s capped candidate + "
                                  f"{overhead:.0f} s)×{BUDGET_MARGIN})")
            break
        screen_s = (cap + overhead) * BUDGET_MARGIN  # a screening run at most; the race lowers its cap
        n = min(len(arms), int((left - round_s) // screen_s))
        bracket += 1
        plan = (f"Bracket {bracket}: {best_words}, so no arm runs past {cap:.1f} s (×{CAP_MARGIN}: an arm not there by then cannot beat it). "
                f"{left:.0f} s left; a round costs ~{round_s:.0f} s, a screening run at most ~{screen_s:.0f} s"
                + (f", so the {len(arms)} arms race to the target one after another, each capped at the fastest "
                   f"time so far ×{CAP_MARGIN}, while a round still fits after them; the top 1/η (η={eta}) of those "
                   f"that beat the best go to rounds." if n >= 2 else
                   f"; fewer than two screening runs fit, so the first arm ({arms[0].name}: the recipe grid is "
                   f"ordered soonest-finishing first) goes straight to a round."))
        wb.note(f"bracket_{bracket:02d}", plan, decision="plan", who=WHO,
                reasoning={"best_time_s": round(t_best, 2), "cap_s": round(cap, 2), "eta": eta,
                           "arms": [a.name for a in arms], "round_estimate_s": round(round_s, 1),
                           "screen_estimate_s": round(screen_s, 1), "budget_left_s": round(left, 1),
                           "overhead_s": round(overhead, 2)})
        log(plan)
        promoted = (_screen(wb, arms, best_cfg, t_best, best, bracket, cap, eta, target, progress, overheads, log,
                            lambda: budget_s - (time.monotonic() - start), round_s) if n >= 2 else arms[:1])
        for rank, arm in enumerate(promoted, 1):
            left = budget_s - (time.monotonic() - start)
            t_best = time_to_beat(wb.best_runs(), target)[0]
            cap = t_best * CAP_MARGIN
            if left < round_s:
                current = config_mod.flatten(wb.best_config())
                wb.note(arm.name, f"promoted but not run: {left:.0f} s left < ~{round_s:.0f} s for its round",
                        {k: (current[k], v) for k, v in arm.changes.items()}, decision="not run", who=WHO,
                        reasoning={"bracket": bracket, "rank": rank, "budget_left_s": round(left, 1),
                                   "estimate_s": round(round_s, 1)})
                continue
            origin = f"promoted from the bracket {bracket} screen, rank {rank}" if n >= 2 else \
                f"the first arm of bracket {bracket} (no screen fitted)"
            why = (f"Round for {origin}: {arm.name} ({', '.join(f'{k}={v}' for k, v in arm.changes.items())}) because {arm.why}. "
                   f"Judged on wall seconds to val loss {target:g} with {seeds} seeds per arm; the candidate is "
                   f"capped at {cap:.1f} s (the best's {t_best:.1f} s ×{CAP_MARGIN}). Estimated {round_s:.0f} s of "
                   f"{left:.0f} s left.")
            t = time.monotonic()
            done = wb.run_round(arm.name, arm.changes, progress=progress, who=WHO, objective=TIME_TO_TARGET,
                                seeds=seeds, target=target, time_cap_s=cap, why=why,
                                reasoning={"bracket": bracket, "rank": rank, "family": arm.family,
                                           "candidate_why": arm.why, "best_time_s": round(t_best, 2),
                                           "cap_s": round(cap, 2), "estimate_s": round(round_s, 1),
                                           "budget_left_s": round(left, 1)})
            actual = time.monotonic() - t
            result.rounds.append({"round": done.index, "name": done.name, "decision": done.decision,
                                  "speedup": done.verdict.speedup, "estimate_s": round_s, "actual_s": actual,
                                  "reason": done.verdict.reason})
            log(f"round {done.index} {done.name}: {done.decision} ({done.verdict.reason})")
    result.elapsed_s = time.monotonic() - start
    base_t, best_t = best_time(wb.baseline_runs(), target), best_time(wb.best_runs(), target)
    result.speedup = base_t / best_t if base_t and best_t else None
    actuals = ", ".join(f"{r['name']} {r['estimate_s']:.0f}/{r['actual_s']:.0f} s" for r in result.rounds)
    wb.note("autotune_stop", f"Stopped: {result.stop_reason}. Wall time {result.elapsed_s:.0f} s of {budget_s:.0f} s; "
            f"rounds estimated/actual: {actuals or 'none'}; time to val loss {target:g}: baseline "
            f"{_times_words(wb.baseline_runs(), target)} → best {_times_words(wb.best_runs(), target)}.",
            decision="stop", who=WHO, reasoning={"elapsed_s": round(result.elapsed_s, 1), "budget_s": budget_s,
                                                 "target_val_loss": target, "time_ratio": result.speedup})
    return result


def _times_words(runs: list[RunRecord], target: float) -> str:
    from helpers.tune.convergence import seed_times_text
    return seed_times_text([time_to_target(r, target) for r in runs])


def _screen(wb: Workbook, arms: list[Candidate], best_cfg: Config, t_best: float, best: list[RunRecord],
            bracket: int, cap: float, eta: int, target: float, progress: bool, overheads: list[float],
            log: Callable[[str], None], left_s: Callable[[], float], round_s: float) -> list[Candidate]:
    """Rung 1, a race: each arm once, capped at `cap` or at the fastest time to `target` so far × CAP_MARGIN,
    while a round (`round_s` seconds) still fits in the budget (`left_s()` seconds) after it; returns the promoted
    arms, fastest first. One ledger note per arm (promoted/dropped, or "not screened" when the budget left it
    out) with its numbers."""
    scored, fastest = [], None
    for k, arm in enumerate(arms, 1):
        arm_cap = cap if fastest is None else min(cap, fastest * CAP_MARGIN)
        left = left_s()
        cand, moved = wb.candidate(arm.name, arm.changes, TIME_TO_TARGET)
        if left < round_s + (arm_cap + max([DEFAULT_OVERHEAD_S, *overheads])) * BUDGET_MARGIN:
            wb.note(arm.name, f"not screened in bracket {bracket}: {left:.0f} s left, and a round must still fit "
                    f"after a run capped at {arm_cap:.1f} s. Tried again if the workbook continues.", moved,
                    decision="not screened", who=WHO, reasoning={"bracket": bracket, "budget_left_s": round(left, 1),
                                                                 "screen_cap_s": round(arm_cap, 2)})
            log(f"screen {arm.name}: not screened (budget)")
            continue
        run_cfg = ttq_arms(cand, best_cfg, target, arm_cap)[0]
        folder = wb.path / "screens" / f"{bracket:02d}_{k:02d}_{arm.name}"
        t = time.monotonic()
        try:
            run = launch(run_cfg, folder, progress=progress, desc=f"screen {bracket}.{k} {arm.name}")
        except RuntimeError as exc:
            run = None
            status = f"left no record ({str(exc).splitlines()[0]})"
        if run is not None:
            overheads.append(max(0.0, time.monotonic() - t - _run_wall_s(run)))
            status = run.status if run.status != "ok" else ""
        if status or not eval_curve(run)[1].size:
            scored.append((arm, moved, arm_cap, None, None, None, f"ended {status or 'without a validation pass'}",
                           folder))
            continue
        _, losses, seconds = eval_curve(run)
        reached = time_to_target(run, target)
        if reached is not None:
            fastest = reached if fastest is None else min(fastest, reached)
        # the best's own val loss at the wall time of the arm's last validation pass: how far along it was
        scored.append((arm, moved, arm_cap, reached, float(losses[-1]),
                       (float(seconds[-1]), loss_at_time(best, float(seconds[-1]))), "", folder))
    ranked = sorted([s for s in scored if s[3] is not None], key=lambda s: s[3])
    n = len(scored)
    top = [s for s in ranked[:max(1, math.ceil(n / eta))] if s[3] < t_best]
    for arm, moved, arm_cap, reached, loss, (at, bar), failure, folder in [(*s[:5], s[5] or (None, None), *s[6:])
                                                                            for s in scored]:
        rank = next((i for i, s in enumerate(ranked, 1) if s[0] is arm), None)
        got = ("did not reach it by its cap" if reached is None else f"reached it in {reached:.1f} s") \
            if not failure else failure
        decision = "promoted" if any(s[0] is arm for s in top) else "dropped"
        changes = ", ".join(f"{k}={v}" for k, v in arm.changes.items())
        why = (f"Screened in bracket {bracket}, capped at {arm_cap:.1f} s (the best's {t_best:.1f} s or the "
               f"fastest arm so far, ×{CAP_MARGIN}): {arm.name} ({changes}) because {arm.why}. Val loss {target:g}: {got}"
               + (f"; val loss {loss:.4f} at its last validation pass ({at:.1f} s) vs the best's {bar:.4f} at that "
                  f"wall time" if loss is not None else "")
               + (f"; rank {rank} of the {len(ranked)} that reached it" if rank else "")
               + f" → {decision} (the top ⌈{n}/{eta}⌉ by seconds to target that beat the best's {t_best:.1f} s "
               f"go to rounds).")
        wb.note(arm.name, why, moved, decision=decision, who=WHO,
                reasoning={"bracket": bracket, "family": arm.family, "screen_cap_s": round(arm_cap, 2),
                           "run": Path(folder).relative_to(wb.path).as_posix(), "time_to_target_s": reached,
                           "reached": reached is not None, "last_eval_s": at, "val_loss_at_last_eval": loss,
                           "best_val_loss_then": bar, "best_time_s": round(t_best, 2),
                           "rank": rank, "failure": failure or None})
        log(f"screen {arm.name}: {got} → {decision}")
    return [s[0] for s in top]


__all__ = ["CAP_MARGIN", "autotune_time_to_target", "best_time", "loss_at_time", "recipe_arms", "recipe_changes",
           "search", "time_to_beat"]
