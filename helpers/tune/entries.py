"""The ledger's entries, one builder per event (baseline, round, note, aa_check, cumulative, decide, rollback): the fields each
event writes, every one signed by `ledger.stamped` (who, when). The best_round each entry moves the best to is
added when it is appended (`Workbook._append`); state.py reads them back."""
from __future__ import annotations

from helpers import config as config_mod
from helpers.config import Config
from helpers.record import RunRecord, median_summary
from helpers.tune.convergence import TIME_TO_TARGET
from helpers.tune.ledger import RoundError, stamped
from helpers.tune.round_spec import RoundSpec
from helpers.tune.rules import Verdict
from helpers.tune.state import State

OVERRIDE_DECISIONS = ("keep", "reject", "no change")


def baseline_entry(runs: list[str], records: list[RunRecord], who: str | None, **extra) -> dict:
    """The pinned baseline: its run folders (relative), anything `extra` (adopted_from), its median tokens/s."""
    return stamped({"event": "baseline", "round": 0, "name": "baseline", "changes": {}, "runs": runs, **extra,
                    "tokens_per_s": median_summary(records, "tokens_per_s"), "verdict": None,
                    "decision": "baseline"}, who)


def round_entry(index: int, spec: RoundSpec, target: float | None, target_from: str, reference_round: int,
                runs: tuple[list[str], list[str]], verdict: Verdict, rollback: str, who: str | None, why: str,
                reasoning: dict | None) -> dict:
    """A measured round: what it was (objective, seeds, a time-to-target round's target and cap, the lr rule's
    scaling, its changes), what it was measured against, its (reference, candidate) runs and rollback point
    (relative), its verdict; `why` and `reasoning` say why it was run."""
    return stamped({"event": "round", "round": index, "name": spec.name, "objective": spec.objective,
                    **({"seeds": spec.seeds} if spec.seeds else {}),
                    **({"target": target, "target_from": target_from, "time_cap_s": spec.time_cap_s}
                       if spec.objective == TIME_TO_TARGET else {}),
                    **({"lr_scaling": spec.scaling.to_dict()} if spec.scaling is not None else {}),
                    "changes": {k: list(v) for k, v in spec.moved.items()}, "reference_round": reference_round,
                    "reference_runs": runs[0], "candidate_runs": runs[1], "verdict": verdict.to_dict(),
                    "decision": verdict.decision, "rollback": rollback}, who, why, reasoning)


def note_entry(name: str, why: str, changes: dict[str, tuple] | None, decision: str, who: str | None,
               reasoning: dict | None) -> dict:
    """A step that trained nothing: a candidate the config refuses, a stop reason ({key: (current, requested)})."""
    return stamped({"event": "note", "round": None, "name": name,
                    "changes": {k: list(v) for k, v in (changes or {}).items()}, "verdict": None,
                    "decision": decision}, who, why, reasoning)


def aa_entry(number: int, best_round: int, runs: tuple[list[str], list[str]], verdict: Verdict,
             who: str | None) -> dict:
    """A/A check `number` of round `best_round`'s config, its (reference, candidate) runs and verdict."""
    return stamped({"event": "aa_check", "round": best_round, "name": f"aa_{number:02d}", "changes": {},
                    "reference_runs": runs[0], "candidate_runs": runs[1], "verdict": verdict.to_dict(),
                    "decision": verdict.decision}, who)


def cumulative_entry(number: int, best_round: int, changes: dict[str, tuple], runs: tuple[list[str], list[str]],
                     verdict: Verdict, who: str | None) -> dict:
    """Cumulative measurement `number`: the baseline (reference runs) against round `best_round`'s config
    (candidate runs), the keys that differ ({key: (baseline, best)}) and the speed verdict."""
    return stamped({"event": "cumulative", "round": best_round, "name": f"cumulative_{number:02d}",
                    "changes": {k: list(v) for k, v in changes.items()}, "reference_runs": runs[0],
                    "candidate_runs": runs[1], "verdict": verdict.to_dict(), "decision": verdict.decision}, who)


def decide_entry(state: State, index: int, decision: str, who: str, why: str) -> tuple[dict, int]:
    """A person's override of round `index`'s verdict and the best round after it: keep → that round; reject / no
    change → the round it was compared against if it is the current best, else the best stays. RoundError (one
    line) for a decision not allowed, a missing who or why, an unknown round, or keeping a failed one."""
    if decision not in OVERRIDE_DECISIONS:
        raise RoundError(f"decision {decision!r} is not allowed; choose one of {', '.join(OVERRIDE_DECISIONS)}")
    if not (isinstance(who, str) and who.strip() and isinstance(why, str) and why.strip()):
        raise RoundError("an override needs who (your name) and why (one sentence); both were not given")
    entry = state.round_entry(index)
    if decision == "keep" and entry["verdict"]["decision"] == "failed":
        raise RoundError(f"round {index} ({entry['name']}) failed, its config did not finish training; "
                         f"it cannot be kept — run a new round instead")
    best_round = state.best_round
    if decision == "keep":
        best_round = index
    elif best_round == index:
        best_round = entry["reference_round"]
    return stamped({"event": "decide", "round": index, "name": entry["name"], "changes": entry["changes"],
                    "verdict": entry["verdict"], "decision": decision}, who.strip(), why), best_round


def rollback_entry(state: State, index: int, who: str | None) -> tuple[dict, Config]:
    """Making round `index`'s config (0 = the baseline) the best again, and that config; RoundError for an unknown
    or failed round (its rollback point never trained to the end)."""
    if index != 0:
        entry = state.round_entry(index)
        if entry["verdict"]["decision"] == "failed":
            raise RoundError(f"round {index} ({entry['name']}) failed, so its rollback point never trained "
                             f"to the end; roll back to another round or 0 (the baseline)")
    before, cfg = state.best()[0], state.source(index)[0]
    return stamped({"event": "rollback", "round": index, "name": "rollback",
                    "changes": {k: list(v) for k, v in config_mod.diff(before, cfg).items()},
                    "verdict": None, "decision": "rollback"}, who), cfg
