"""The cumulative effect: the baseline config against the best, measured side by side once per best (real tiny runs)."""
from __future__ import annotations

import json

import pytest

from helpers.config import with_changes
from helpers.record import load_run
from helpers.tune.before_after import SIDE_BY_SIDE
from helpers.tune.rounds import Workbook
from tests.tune.test_rounds import tiny_config

pytestmark = pytest.mark.slow


def test_cumulative_measures_the_baseline_against_the_best_once_per_best(tmp_path, small_corpus):
    eager = with_changes(tiny_config(small_corpus), {"mode": "pynative", "jit_level": "none"})
    wb = Workbook.create(tmp_path / "book", eager, repeats=1)
    wb.baseline(progress=False)
    assert wb.cumulative(progress=False) is None  # no round kept: nothing to measure, nothing recorded
    r = wb.run_round("graph_mode", {"mode": "graph", "jit_level": "O0"}, progress=False)
    if r.decision != "keep":  # a person keeps it, so the best moves whatever this machine's load said
        wb.decide(r.index, "keep", "test", "the cumulative measurement needs a best apart from the baseline")
    c = wb.cumulative(progress=False)
    low, high = c.verdict.interval
    assert c.best_round == r.index and c.number == 1 and low <= c.verdict.speedup <= high
    assert c.changes == {"mode": ("pynative", "graph"), "jit_level": ("none", "O0")}
    assert c.verdict.path == "processes" and f"×{c.verdict.speedup:.3f}" in c.text()
    speed = json.loads((wb.path / "cumulative" / "01" / "speed.json").read_text())
    assert speed["verdict"]["speedup"] == c.verdict.speedup and len(speed["pairs"]) == c.verdict.pairs
    entry = wb.ledger()[-1]
    assert entry["event"] == "cumulative" and entry["best_round"] == r.index  # the best does not move
    # the reference arm trained the baseline config, the candidate the best
    arms = {a: load_run(wb.path / "cumulative" / "01" / a).config for a in ("reference", "candidate")}
    assert (arms["reference"].mode, arms["candidate"].mode) == ("pynative", "graph")
    row = wb.before_after()[-1]
    assert row["metric"] == SIDE_BY_SIDE and row["ratio"] == c.verdict.speedup and row["interval"] == [low, high]
    n = len(wb.ledger())
    again = wb.cumulative(progress=False)  # measured once per best: the same entry, nothing trains
    assert again.number == 1 and len(wb.ledger()) == n and not (wb.path / "cumulative" / "02").exists()
    wb.rollback(0)
    assert wb.cumulative(progress=False) is None and SIDE_BY_SIDE not in [x["metric"] for x in wb.before_after()]
