"""A workbook's state, replayed from its ledger: the current best round, each round's config and runs, the rounds
with any override a person recorded, and the recorded round a request repeats.

Every ledger entry carries `best_round`: the round whose config is the current best after it (0 = the baseline). A
round's config is its rollback point's config.yaml; its runs are the folders its entry names, relative to the
workbook. Nothing here writes: a workbook can be replayed by another process at any time.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from helpers import config as config_mod
from helpers.config import Config
from helpers.record import SUMMARY_FILE, RecordError, RunRecord, load_run
from helpers.tune.ledger import RoundError
from helpers.tune.rules import Verdict


@dataclass
class RoundResult:
    """One round as recorded in the ledger (paths absolute)."""
    index: int
    name: str
    changes: dict[str, tuple]
    reference_runs: list[Path]
    candidate_runs: list[Path]
    verdict: Verdict
    override: dict | None
    rollback: Path
    objective: str = "speed"  # "speed" (tokens/s rule), "convergence" (val loss at equal tokens, seeds) or
    # "time_to_target" (wall seconds to a val loss, seeds)
    target: float | None = None  # a time-to-target round's validation loss (nats/token)

    @property
    def decision(self) -> str:
        """The person's override decision if any, else the verdict's."""
        return self.override["decision"] if self.override else self.verdict.decision


def load_runs(runs) -> list[RunRecord]:
    """Records of run folders, in order. One policy for every reader of a workbook's runs: a folder that
    holds no record (a run that died before writing one) is skipped; a record that exists but cannot be read
    raises RoundError (one line), because a verdict or a table without it would be silently wrong."""
    out = []
    for p in runs:
        p = Path(p)
        if not (p / SUMMARY_FILE).is_file():
            continue
        try:
            out.append(load_run(p))
        except RecordError as exc:
            raise RoundError(f"a run of this workbook is unreadable: {exc}") from None
    return out


class State:
    """The ledger `entries` of the workbook at `path` (pinned to `baseline_config`), replayed."""

    def __init__(self, path: Path, baseline_config: Config, entries: list[dict]):
        self.path, self.baseline_config, self.entries = Path(path), baseline_config, entries

    @property
    def best_round(self) -> int:
        """The round whose config is the current best (0 = the baseline)."""
        return self.entries[-1]["best_round"] if self.entries else 0

    def round_entries(self) -> dict[int, dict]:
        """Each round's own entry (event 'round'), by round number."""
        return {e["round"]: e for e in self.entries if e["event"] == "round"}

    def next_round(self) -> int:
        """The number the next round gets."""
        return max(self.round_entries(), default=0) + 1

    def round_entry(self, index: int) -> dict:
        """Round `index`'s entry; RoundError (one line) naming the rounds there are."""
        recorded = self.round_entries()
        if index not in recorded:
            raise RoundError(f"there is no round {index!r}; rounds so far: {sorted(recorded) or 'none'}")
        return recorded[index]

    @property
    def pinned(self) -> bool:
        """Whether the baseline is pinned (its entry is in the ledger)."""
        return any(e["event"] == "baseline" for e in self.entries)

    def require_baseline(self) -> None:
        """RoundError unless the baseline is pinned."""
        if not self.pinned:
            raise RoundError("no baseline pinned yet; call wb.baseline() first")

    def baseline_paths(self) -> list[Path]:
        """The pinned baseline's run folders ([] before it is pinned)."""
        pinned = [e for e in self.entries if e["event"] == "baseline"]
        return [self.path / p for p in pinned[0]["runs"]] if pinned else []

    def source(self, index: int) -> tuple[Config, list[Path]]:
        """(config, run folders) of round `index`'s candidate, or of the baseline for 0."""
        if index == 0:
            return self.baseline_config, self.baseline_paths()
        entry = self.round_entries()[index]
        cfg = config_mod.load_written(self.path / entry["rollback"] / "config.yaml")
        return cfg, [self.path / p for p in entry["candidate_runs"]]

    def best(self) -> tuple[Config, list[Path]]:
        """(config, run folders) of the current best."""
        return self.source(self.best_round)

    def rounds(self) -> list[RoundResult]:
        """Every round, oldest first, with the latest override a person recorded for it."""
        overrides = {e["round"]: {"decision": e["decision"], "who": e["who"], "why": e["why"], "at": e["when"]}
                     for e in self.entries if e["event"] == "decide"}
        return [RoundResult(index=e["round"], name=e["name"],
                            changes={k: tuple(v) for k, v in e["changes"].items()},
                            reference_runs=[self.path / p for p in e["reference_runs"]],
                            candidate_runs=[self.path / p for p in e["candidate_runs"]],
                            verdict=Verdict.from_dict(e["verdict"]), override=overrides.get(e["round"]),
                            rollback=self.path / e["rollback"], objective=e.get("objective", "speed"),
                            target=e.get("target"))
                for e in self.entries if e["event"] == "round"]

    def round(self, index: int) -> RoundResult:
        """Round `index` as a RoundResult."""
        return next(r for r in self.rounds() if r.index == index)

    def recorded(self, name: str, changes: dict[str, Any], objective: str) -> RoundResult | None:
        """The latest recorded round of this name, objective and requested values, if any (a notebook run again)."""
        for e in reversed(self.entries):
            if (e["event"] == "round" and e["name"] == name and e.get("objective", "speed") == objective
                    and all(k in e["changes"] and e["changes"][k][1] == v for k, v in changes.items())):
                return self.round(e["round"])
        return None

    def aa_checks(self) -> int:
        """How many A/A checks are recorded."""
        return sum(e["event"] == "aa_check" for e in self.entries)

    def with_entry(self, entry: dict) -> "State":
        """The state after one more entry."""
        return State(self.path, self.baseline_config, [*self.entries, entry])
