"""Tuning rounds against a pinned baseline: one change per round, a measured verdict, an append-only ledger.

A workbook folder:
    workbook.json            marks the folder; the rule's settings and the pinned baseline config
    baseline/run_K/          the baseline's `repeats` run records
    rounds/NN_name/          a round: candidate/ and reference/ (two arm processes, or one msrun launch; paired.json) or
                             candidate_K/ and reference_K/ runs (separate processes), speed.json, rollback/ point
    aa/NN/                   A/A checks: the current best as candidate_K/ and reference_K/
    cumulative/NN/           the baseline config (reference/) against the best (candidate/), side by side
    ledger.jsonl             the journal, one fsync'd JSON line per event, never rewritten: the source of truth
    best.yaml                the current best config (a mirror of the ledger, rewritten atomically)
    .lock                    flock'd while an operation writes (see `ledger.WorkbookLock`)
    interrupted/             run folders of operations that died before their ledger entry, moved aside

Every entry carries `best_round`: the round whose config is the current best after it (0 = the baseline).
Replaying the ledger gives the state, so a workbook can be reopened, or read by another process, at any time.

`Workbook` is the one object notebooks use, a facade over one module per job:
    round_spec.py     what a round is (one variable or group, the lr rule, a time-to-target round's arms)
    measure.py        how it is measured (seed pairs of runs; speed by two processes, one msrun launch or runs)
    verdicts.py       how it is judged (which rule, which failures), rules.py the rules themselves
    state.py          how the ledger is read (the best, each round's config and runs, rounds, a repeated round)
    entries.py        what each event writes to it (baseline, round, note, aa_check, decide, rollback)
    ledger.py         the journal, the lock, and `stamped` (who and when on every entry)
    folders.py        the folder's lifecycle (marker, settings, fresh folders, rollback points, adopted runs)
    before_after.py   the final table; cumulative.py the baseline against the best, side by side
"""
from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from helpers import config as config_mod
from helpers.config import Config
from helpers.paths import absolute
from helpers.record import RunRecord, atomic_write_json
from helpers.tune import cumulative as cumulative_mod
from helpers.tune.before_after import before_after_rows
from helpers.tune.entries import (aa_entry, baseline_entry, decide_entry, note_entry, rollback_entry,
                                  round_entry)
from helpers.tune.folders import (MARKER, SETTINGS, checked_settings, copy_adopted, fresh, make_folder, read_marker,
                                  relative, require_same, save_rollback, write_best)
from helpers.tune.ledger import Ledger, RoundError, WorkbookLock
from helpers.tune.lr_rule import DEFAULT_LR_RULE
from helpers.tune.measure import SPEED_FILE, measure_runs, measure_speed, train_baseline
from helpers.tune.round_spec import FIXED, GROUPS, candidate, check_request, plan_round
from helpers.tune.rules import Verdict
from helpers.tune.state import RoundResult, State, load_runs
from helpers.tune.verdicts import judge_round, judged_speed

__all__ = ["FIXED", "GROUPS", "MARKER", "RoundError", "RoundResult", "Verdict", "Workbook", "load_runs"]


class Workbook:
    """A folder of tuning rounds; see the module docstring for its layout, rules and modules."""

    def __init__(self, path: Path, settings: dict, baseline_config: Config):
        self.path = Path(path)
        self.repeats: int = settings["repeats"]
        self.loss_gate: float = settings["loss_gate"]
        self.memory_limit_bytes: int = settings["memory_limit_bytes"]
        self._baseline_config = baseline_config
        self._ledger = Ledger(self.path / "ledger.jsonl")
        self._lock = WorkbookLock(self.path / ".lock")

    @classmethod
    def create(cls, path, cfg: Config, repeats: int = 2, loss_gate: float = 0.02,
               memory_limit_bytes: int | None = None) -> "Workbook":
        """A new workbook pinned to `cfg` (an existing one with the same baseline and settings is opened). repeats:
        baseline runs (1 pins it; 2+ widen the loss gate to their loss spread); loss_gate: allowed relative loss
        drift at equal tokens (0.02); memory_limit_bytes: the peak's limit (default 90% of RAM or device memory).
        Relative paths (`path`, those in `cfg`) mean what they mean in the caller's working directory."""
        path, cfg = absolute(path), config_mod.absolute_paths(cfg)
        settings = checked_settings(cfg, repeats, loss_gate, memory_limit_bytes)
        if (path / MARKER).is_file():
            book = cls.open(path)
            require_same(path, book._baseline_config, {k: getattr(book, k) for k in SETTINGS}, cfg, settings)
            return book
        make_folder(path, cfg, settings)
        return cls(path, settings, cfg)

    @classmethod
    def open(cls, path) -> "Workbook":
        """An existing workbook; RoundError (one line) for a missing, foreign or unreadable folder."""
        path = absolute(path)
        settings, cfg = read_marker(path)
        return cls(path, settings, cfg)

    @contextmanager
    def lock(self) -> Iterator[None]:
        """Hold the workbook's lock across several operations (each operation also takes it on its own)."""
        with self._lock.hold():
            yield

    def ledger(self) -> list[dict]:
        """Every ledger entry, oldest first: event, round, changes, verdict, decision, best_round, who, when."""
        return self._ledger.entries()

    def _state(self) -> State:
        return State(self.path, self._baseline_config, self.ledger())

    load_runs = staticmethod(load_runs)

    def baseline_runs(self) -> list[RunRecord]:
        """The pinned baseline's records ([] before it is pinned; never trains)."""
        return load_runs(self._state().baseline_paths())

    def best_runs(self) -> list[RunRecord]:
        """Records of the current best config: the kept round's candidate runs, or the baseline's."""
        return load_runs(self._state().best()[1])

    def best_config(self) -> Config:
        """The current best config (the baseline until a round is kept, overridden or rolled back to)."""
        return self._state().best()[0]

    def rounds(self) -> list[RoundResult]:
        """Every round so far, oldest first, with any override a person recorded."""
        return self._state().rounds()

    def candidate(self, name: str, changes: dict[str, Any],
                  objective: str = "speed") -> tuple[Config, dict[str, tuple]]:
        """The round's candidate config on the current best and its {key: (old, new)}; `round_spec.candidate`."""
        return candidate(self.best_config(), name, changes, objective)

    def before_after(self) -> list[dict]:
        """Baseline vs current best, medians over each side's runs: rows of metric, unit, baseline, best, ratio
        (best ÷ baseline; None where a side has no value); comm share appears only if a run reports it; last, the
        two measured side by side with an interval, once `cumulative` measured the current best."""
        state = self._state()
        state.require_baseline()
        (base_cfg, base_runs), (best_cfg, best_runs) = state.source(0), state.best()
        return before_after_rows(base_cfg, load_runs(base_runs), best_cfg, load_runs(best_runs),
                                 cumulative_mod.latest(state))

    def cumulative(self, progress: bool = True, who: str | None = None) -> "cumulative_mod.Cumulative | None":
        """The baseline config against the current best, measured side by side like a speed round (the interval of
        best ÷ baseline tokens/s); measured once per best (a later call returns it; nothing trains), recorded in
        the ledger (event cumulative; the best does not move). None while the best is the baseline."""
        with self._lock.hold():
            state = self._state()
            state.require_baseline()
            if state.best_round == 0:
                return None
            done = cumulative_mod.latest(state)
            if done is not None:
                return done
            entry, result = cumulative_mod.measure(self, state, progress, who)
            self._append(entry, state.best_round, state)
            return result

    def _append(self, entry: dict, best_round: int, state: State) -> None:
        """Ledger first (the truth), then the best.yaml mirror if the best moved."""
        entry = {**entry, "best_round": best_round}
        self._ledger.append(entry)
        if best_round != state.best_round:
            write_best(self.path, state.with_entry(entry).source(best_round)[0])

    def _rels(self, records: list[RunRecord]) -> list[str]:
        return [relative(r.path, self.path) for r in records]

    def baseline(self, progress: bool = True, who: str | None = None,
                 adopt: list[RunRecord] | None = None) -> list[RunRecord]:
        """The pinned baseline's runs: trained `repeats` times (each in its own process) on the first call.
        adopt: finished runs of the baseline config to pin instead (copied into baseline/), e.g. the runs that set
        a time-to-target bench's target, trained as the baseline's own runs are (`config.speed_measured`); they
        may differ only in folders.ADOPTABLE keys (seed, when a run ends, profiler window), else RoundError."""
        with self._lock.hold():
            state = self._state()
            if state.pinned:
                return load_runs(state.baseline_paths())
            folder = fresh(self.path, self.path / "baseline")
            extra = {"adopted_from": [str(r.path) for r in adopt]} if adopt else {}
            records = (load_runs(copy_adopted(adopt, config_mod.speed_measured(self._baseline_config), folder)) if adopt
                       else train_baseline(self._baseline_config, folder, self.repeats, progress))
            self._append(baseline_entry(self._rels(records), records, who, **extra), 0, state)
            return records

    def run_round(self, name: str, changes: dict[str, Any], progress: bool = True,
                  who: str | None = None, objective: str = "speed", seeds: int = 2,
                  target: float | None = None, why: str = "", reasoning: dict | None = None,
                  time_cap_s: float | None = None, profile_steps: int = 0,
                  lr_rule: str = DEFAULT_LR_RULE) -> RoundResult:
        """Train the current best + `changes` against a rerun of it, judge, record, save a rollback point (a round
        recorded already under this name, objective and values comes back; nothing trains). objective "speed":
        tokens/s, measured the way the variable allows (measure.measure_speed) until the interval decides or the
        budget ends; "convergence": `seeds` runs per arm (seed best.seed + k − 1 for run k of both), val loss at
        equal tokens against the seed band (`target`: where time to target is read); "time_to_target": those seeds,
        each arm ending at its first val loss ≤ `target` (default the best's target_val_loss, else the level every
        reference seed reached), the candidate also at `time_cap_s` s. A moved global batch moves lr by `lr_rule`
        there (round_spec.plan_round). `why`, `reasoning` go into the entry; profile_steps: a profiler window in
        each arm's warm-up (speed, processes or msrun)."""
        check_request(name, changes, objective, seeds, lr_rule)
        with self._lock.hold():
            state = self._state()
            state.require_baseline()
            done = state.recorded(name, changes, objective)
            if done is not None:  # a notebook run again: the round is in the ledger already
                print(f"round {done.index} ({name}) is recorded already: {done.decision}; reused, nothing trained "
                      f"(measure it again under another name)")
                return done
            spec = plan_round(state.best()[0], name, changes, objective, seeds, target, time_cap_s, lr_rule)
            baseline, index = load_runs(state.baseline_paths()), state.next_round()
            folder = fresh(self.path, self.path / "rounds" / f"{index:02d}_{name}")
            label, speed = f"round {index} {name}", None
            if objective == "speed":
                records, references, error, speed = measure_speed(spec.candidate, spec.arms[1], spec.moved, folder,
                                                                  label, progress, profile_steps)
            else:
                records, references, error = measure_runs(*spec.arms, folder, label, progress, len(spec.seeds),
                                                          spec.seeds, spec.after_pair)
            v, target, target_from = judge_round(spec, records, references, error, baseline, self.loss_gate,
                                                 self.memory_limit_bytes, speed)
            if speed is not None:
                atomic_write_json(folder / SPEED_FILE, {**speed, "verdict": v.to_dict()})
            rollback = save_rollback(folder / "rollback", spec.candidate, records)
            self._append(round_entry(index, spec, target, target_from, state.best_round,
                                     (self._rels(references), self._rels(records)), v,
                                     relative(rollback, self.path), who, why, reasoning),
                         index if v.decision == "keep" else state.best_round, state)
            return self.rounds()[-1]

    def run_suggestion(self, suggestion, progress: bool = True, who: str | None = None) -> RoundResult:
        """Run a `suggest.Suggestion` (name, changes, objective) as a round against the current best."""
        return self.run_round(suggestion.name, suggestion.changes, progress=progress, who=who,
                              objective=suggestion.objective)

    def note(self, name: str, why: str, changes: dict[str, tuple] | None = None, decision: str = "note",
             who: str | None = None, reasoning: dict | None = None) -> None:
        """Record a step that trains nothing (a candidate the config refuses, a stop reason); the best stays.
        changes: {key: (current, requested)}; decision: a short word such as 'skipped' or 'stop'."""
        with self._lock.hold():
            state = self._state()
            self._append(note_entry(name, why, changes, decision, who, reasoning), state.best_round, state)

    def aa_check(self, progress: bool = True, who: str | None = None, path: str | None = None) -> Verdict:
        """The current best as both candidate and reference, judged by the same rule: an honest rule says "no
        change". path: how to measure (default the best's own, `speed_path`; "processes", "runs" or "paired").
        Recorded in the ledger (event aa_check); the best does not move."""
        with self._lock.hold():
            state = self._state()
            state.require_baseline()
            cfg, baseline, number = state.best()[0], load_runs(state.baseline_paths()), state.aa_checks() + 1
            folder = fresh(self.path, self.path / "aa" / f"{number:02d}")
            records, references, v = judged_speed(cfg, cfg, {}, folder, f"A/A {number}", progress, baseline,
                                                  self.loss_gate, self.memory_limit_bytes, path=path)
            self._append(aa_entry(number, state.best_round, (self._rels(references), self._rels(records)), v, who),
                         state.best_round, state)
            return v

    def decide(self, index: int, decision: str, who: str, why: str) -> RoundResult:
        """Record a person's override of round `index`'s verdict and move the best (`entries.decide_entry`): keep →
        that round's config; reject / no change → back to its reference if it is the best (`rollback` goes further)."""
        with self._lock.hold():
            state = self._state()
            entry, best_round = decide_entry(state, index, decision, who, why)
            self._append(entry, best_round, state)
            return self._state().round(index)

    def rollback(self, index: int, who: str | None = None) -> Config:
        """Make round `index`'s config (its rollback point; 0 = the baseline) the current best again."""
        with self._lock.hold():
            state = self._state()
            state.require_baseline()
            entry, cfg = rollback_entry(state, index, who)
            self._append(entry, index, state)
            return cfg

    def __repr__(self) -> str:
        return f"Workbook({str(self.path)!r}, repeats={self.repeats})"
