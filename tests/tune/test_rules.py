"""The noise band's arithmetic on hand-made records (arithmetic only: real runs are in test_rounds)."""
from pathlib import Path

import pytest

from helpers.config import from_dict
from helpers.record import RunRecord
from helpers.tune.rules import noise_band


def _run(name: str, tokens_per_s: float, cfg) -> RunRecord:
    summary = {"status": "ok", "tokens_per_s": tokens_per_s, "step_time_ms": 10.0, "step_time_ms_p10": 10.0,
               "step_time_ms_p90": 10.0, "steady_window": [6, 50]}
    return RunRecord(path=Path(name), config=cfg, metrics=[], summary=summary, env={})


def test_baseline_spread_counts_only_while_the_best_is_still_the_baseline_config():
    eager, graph = from_dict({"mode": "pynative"}), from_dict({"mode": "graph"})
    baseline = [_run("b1", 22.0, eager), _run("b2", 36.0, eager)]  # a noisy eager baseline
    reference = [_run("r1", 1000.0, graph), _run("r2", 1010.0, graph)]
    candidate = [_run("c1", 1200.0, graph), _run("c2", 1190.0, graph)]
    moved_on = noise_band(reference, candidate, baseline)
    assert moved_on == pytest.approx(noise_band(reference, candidate, []))
    assert moved_on < 0.1
    same_config = [_run("b1", 900.0, graph), _run("b2", 1500.0, graph)]
    assert noise_band(reference, candidate, same_config) > 0.5  # still the baseline's population: pooled
