"""The paired process's weaving order (scheduling only: which arm steps when; the timing itself is exercised by
the real paired rounds in tests/tune/test_rounds.py)."""
from __future__ import annotations

from helpers.run.pair import _interleaved


class _Clock:
    """Stands in for the two Trainers: each single step returns its position in the shared sequence."""

    def __init__(self):
        self.calls = []

    def block(self, name: str, k: int) -> tuple[list[float], list[float | None]]:
        assert k == 1
        self.calls.append(name)
        return [float(len(self.calls))], [0.1 * len(self.calls)]


def test_woven_pair_alternates_abba_step_by_step():
    arms = _Clock()
    got = _interleaved(arms, ("reference", "candidate"), 4)
    assert arms.calls == ["reference", "candidate", "candidate", "reference"] * 2
    assert {k: v[0] for k, v in got.items()} == {"reference": [1.0, 4.0, 5.0, 8.0], "candidate": [2.0, 3.0, 6.0, 7.0]}
    assert got["reference"][1] == [0.1, 0.4, 0.5, 0.8]  # each step's data wait stays with its step
    # each arm's steps sit at the same mean position in the pair: a linear drift in speed cancels
    assert sum(got["reference"][0]) == sum(got["candidate"][0])
