"""The workbook's cumulative effect: the pinned baseline config against the current best, measured side by side
the way a speed round is (measure.measure_speed: the two arms taking turns, every step counted), so the
before/after carries an interval. The two tables' medians come from runs minutes or hours apart, on a machine whose
speed drifts; this ratio comes from steps taken in turns."""
from __future__ import annotations

from dataclasses import dataclass

from helpers import config as config_mod
from helpers.tune.entries import cumulative_entry
from helpers.tune.folders import fresh, relative
from helpers.tune.rules import Verdict
from helpers.tune.state import State, load_runs
from helpers.tune.verdicts import judged_speed

CUMULATIVE_DIR = "cumulative"  # cumulative/NN/: the baseline and the best as reference/ and candidate/


@dataclass
class Cumulative:
    """A measured cumulative effect: the best round it measured, the keys that differ from the baseline
    ({key: (baseline value, best value)}) and the speed verdict (speedup = best ÷ baseline tokens/s)."""
    number: int
    best_round: int
    changes: dict[str, tuple]
    verdict: Verdict

    @classmethod
    def from_entry(cls, entry: dict) -> "Cumulative":
        return cls(int(entry["name"].rsplit("_", 1)[1]), entry["round"],
                   {k: tuple(v) for k, v in entry["changes"].items()}, Verdict.from_dict(entry["verdict"]))

    def text(self) -> str:
        """One line: what was measured against what, and the ratio with its interval."""
        v, keys = self.verdict, ", ".join(self.changes)
        if v.interval is None:
            return f"cumulative (baseline → best of round {self.best_round}, {keys}): not measured: {v.reason}"
        low, high = v.interval
        return (f"cumulative: baseline → best of round {self.best_round} ({keys}): tokens/s ×{v.speedup:.3f}, "
                f"{v.level:.1%} interval ×{low:.3f}–×{high:.3f} ({v.pairs} pairs, {v.path}, side by side)")


def latest(state: State) -> Cumulative | None:
    """The latest cumulative measurement of the current best (None when the best moved since, or none was made)."""
    for entry in reversed(state.entries):
        if entry["event"] == "cumulative" and entry["round"] == state.best_round:
            return Cumulative.from_entry(entry)
    return None


def measure(wb, state: State, progress: bool, who: str | None) -> tuple[dict, Cumulative]:
    """Measure the baseline config (reference) against the best (candidate) into cumulative/NN; the ledger entry
    (not yet appended) and its Cumulative. The arms run as a round's do: with the compile cache off, the path the
    changed keys need (`speed_path`)."""
    (base_cfg, _), (best_cfg, _) = state.source(0), state.best()
    changes = config_mod.diff(base_cfg, best_cfg)
    number = sum(e["event"] == "cumulative" for e in state.entries) + 1
    folder = fresh(wb.path, wb.path / CUMULATIVE_DIR / f"{number:02d}")
    records, references, v = judged_speed(best_cfg, base_cfg, {k: v[1] for k, v in changes.items()}, folder,
                                          f"cumulative {number}", progress, load_runs(state.baseline_paths()),
                                          wb.loss_gate, wb.memory_limit_bytes)
    runs = ([relative(r.path, wb.path) for r in references], [relative(r.path, wb.path) for r in records])
    entry = cumulative_entry(number, state.best_round, changes, runs, v, who)
    return entry, Cumulative.from_entry(entry)
