"""What a round is, before anything trains: one variable (or one declared group) changed on the current best, its
objective's arguments checked, the learning rate moved with a moved global batch (lr_rule.py), and a
time-to-target round's arms and target. A bad round is refused here in one line, before any folder or run exists."""
from __future__ import annotations

import re
import warnings
from dataclasses import dataclass
from typing import Any

from helpers import config as config_mod
from helpers.config import Config
from helpers import levers
from helpers.levers import keys_where
from helpers.run.preflight import check_kernels
from helpers.tune.convergence import CONVERGENCE_VARIABLES, OBJECTIVES, RECIPE, TIME_TO_TARGET, time_to_target, ttq_arms
from helpers.tune.ledger import RoundError
from helpers.tune.lr_rule import SCALED, LrScaling, check_rule, moves_global_batch, scale_lr
from helpers.tune.measure import AfterPair

# Variables that only make sense changed together; any other round changes exactly one variable.
GROUPS = tuple(levers.GROUPS)  # declared, with why, in helpers/levers.py
# Held fixed so candidate and reference runs cover the same steps, data order and steady window.
FIXED = keys_where(fixed=True)  # declared in helpers/levers.py
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,47}$")


@dataclass
class RoundSpec:
    """A round ready to measure. candidate: its config (the rollback point's); moved: {key: (old, new)}, the
    requested keys plus lr/min_lr when the lr rule moved them; arms: (candidate, reference) configs as trained (a
    time-to-target round's end at the target); seeds: run k of both arms trains with seeds[k-1] (None for speed);
    after_pair(runs) → True stops after a pair (a candidate that missed a given target cannot win)."""
    name: str
    objective: str
    candidate: Config
    moved: dict[str, tuple]
    arms: tuple[Config, Config]
    scaling: LrScaling | None = None
    target: float | None = None
    time_cap_s: float | None = None
    seeds: list[int] | None = None
    after_pair: AfterPair | None = None


def check_request(name: str, changes: dict[str, Any], objective: str, seeds: int, lr_rule: str) -> None:
    """The round's arguments that need no workbook state: RoundError (one line) for a bad objective, seed count or
    lr rule; a warning for a speed round on what the model learns."""
    if objective not in OBJECTIVES:
        raise RoundError(f"objective={objective!r} is not allowed; choose one of {', '.join(OBJECTIVES)}")
    if objective != "speed" and (not isinstance(seeds, int) or seeds < 2):
        raise RoundError(f"seeds={seeds!r} cannot measure seed-to-seed spread; use seeds=2 or more")
    learning = [k for k in changes if k in CONVERGENCE_VARIABLES]
    if objective == "speed" and learning:
        warnings.warn(f"round {name!r} changes {', '.join(learning)}, which moves what the model learns, not "
                      f"tokens/s; judge it with objective='convergence'", stacklevel=3)
    try:
        check_rule(lr_rule)
    except ValueError as exc:
        raise RoundError(str(exc)) from None


def candidate(best: Config, name: str, changes: dict[str, Any],
              objective: str = "speed") -> tuple[Config, dict[str, tuple]]:
    """The candidate config of a round on `best` and its {key: (old, new)} changes; refuses bad rounds.

    RoundError for a bad name, more than one variable outside a declared group (GROUPS), a fixed key
    (FIXED) or a value equal to the current one; ConfigError for an invalid value or native kernels not built. A
    time-to-target round may change any part of the recipe (RECIPE, `steps` included) together: it compares wall
    seconds to a validation loss, not runs of equal length.
    """
    recipe = objective == TIME_TO_TARGET and set(changes) <= set(RECIPE)
    if not isinstance(name, str) or not _NAME.match(name):
        raise RoundError(f"round name {name!r} must be 1-48 letters, digits or _ . + - (it names a folder), "
                         f"e.g. 'batch_size'")
    if not changes:
        raise RoundError(f"round {name!r} changes nothing; pass e.g. {{'batch_size': 24}}")
    keys = list(changes)
    if len(keys) > 1 and frozenset(keys) not in GROUPS and not recipe:
        groups = ", ".join("+".join(sorted(g)) for g in GROUPS)
        raise RoundError(f"round {name!r} changes {len(keys)} variables ({', '.join(keys)}); change one per "
                         f"round, or declare a group such as {groups}")
    fixed = [k for k in keys if k in FIXED and not (recipe and k == "steps")]
    if fixed:
        raise RoundError(f"round {name!r} changes {', '.join(fixed)}; {', '.join(FIXED)} stay fixed so runs "
                         f"compare — create a new workbook to change them")
    cand = config_mod.with_changes(best, changes)
    check_kernels(cand)  # a machine's build, not a value: refused here, before either arm starts
    moved = config_mod.diff(best, cand)
    same = [k for k in keys if k not in moved]
    if same:
        current = config_mod.flatten(best)
        raise RoundError(f"round {name!r}: {', '.join(f'{k}={current[k]!r}' for k in same)} equals the current "
                         f"best; no change requested — pick a different value")
    return cand, {k: moved[k] for k in keys}


def plan_round(best: Config, name: str, changes: dict[str, Any], objective: str, seeds: int,
               target: float | None, time_cap_s: float | None, lr_rule: str) -> RoundSpec:
    """The round of `changes` on `best` (see `candidate`). Convergence and time to target: lr and min_lr follow a
    moved global batch by `lr_rule`, and `seeds` seeds from best.seed on. Time to target: the target defaults to
    the best's target_val_loss (None: set afterwards from the reference seeds), both checked. A speed round that
    moves the global batch warns: its loss at equal tokens is worse whatever its speed. `target` of a convergence
    round: the val loss its time to target is read at (None: the level every reference seed reached)."""
    cand, moved = candidate(best, name, changes, objective)
    spec = RoundSpec(name, objective, cand, moved, (cand, best))
    if objective == "speed":
        if moves_global_batch(best, cand):
            warnings.warn(f"round {name!r} changes the global batch ({best.global_batch} → {cand.global_batch} "
                          f"sequences per step): fewer updates per token, so at an unchanged learning rate its "
                          f"loss at equal tokens is worse whatever its speed; judge it with "
                          f"objective='time_to_target', where the learning rate follows the batch "
                          f"(lr_rule={lr_rule!r})", stacklevel=3)
        return spec
    spec.candidate, spec.scaling = scale_lr(best, cand, changes, lr_rule)  # the lr follows the global batch
    spec.moved = {**moved, **{k: v for k, v in config_mod.diff(best, spec.candidate).items() if k in SCALED}}
    spec.arms, spec.seeds = (spec.candidate, best), [best.seed + k for k in range(seeds)]
    spec.target = target  # convergence: the val loss its time to target is read at (None: the reference seeds')
    if objective == TIME_TO_TARGET:
        spec.target = target or best.target_val_loss or None
        if spec.target is not None and not (isinstance(spec.target, (int, float)) and spec.target > 0):
            raise RoundError(f"target={spec.target!r} must be a validation loss in nats/token (e.g. 1.9), or "
                             f"None for the level every reference seed reaches")
        if time_cap_s is not None and not (isinstance(time_cap_s, (int, float)) and time_cap_s > 0):
            raise RoundError(f"time_cap_s={time_cap_s!r} must be positive seconds, or None for no cap")
        spec.time_cap_s = time_cap_s
        spec.arms = ttq_arms(spec.candidate, best, spec.target, time_cap_s)
        if spec.target is not None:
            goal = spec.target
            spec.after_pair = lambda runs: time_to_target(runs["candidate"][-1], goal) is None
    return spec
