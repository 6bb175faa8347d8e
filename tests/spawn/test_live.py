"""The live listeners of a parent process (helpers/spawn/live.py): who hears a published row, and for how long."""
from __future__ import annotations

import pytest

from helpers.spawn.live import listen, publish


def test_every_listener_hears_each_row_only_while_its_block_runs():
    outer, inner = [], []
    publish("before", {"step": 0})  # nobody listens: nothing happens
    with listen(lambda label, row: outer.append((label, row["step"]))):
        publish("a", {"step": 1})
        with listen(lambda label, row: inner.append((label, row["step"]))):
            publish("b", {"step": 2})
        publish("c", {"step": 3})
    publish("after", {"step": 4})
    assert outer == [("a", 1), ("b", 2), ("c", 3)] and inner == [("b", 2)]


def test_a_listener_is_removed_when_its_block_raises():
    heard = []

    def listener(label, row):
        heard.append(label)
    with pytest.raises(RuntimeError, match="round failed"):
        with listen(listener):
            publish("during", {"step": 1})
            raise RuntimeError("round failed")
    publish("after", {"step": 2})
    assert heard == ["during"]


def test_a_listener_that_stops_listening_while_hearing_a_row_does_not_disturb_the_others():
    heard = []
    with listen(lambda label, row: heard.append(("first", label))):
        block = listen(lambda label, row: (heard.append(("second", label)), block.__exit__(None, None, None)))
        block.__enter__()
        publish("one", {"step": 1})  # the second listener leaves while the row is handed out
        publish("two", {"step": 2})
    assert heard == [("first", "one"), ("second", "one"), ("first", "two")]
