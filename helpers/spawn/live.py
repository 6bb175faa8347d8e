"""Where a parent's parsed step rows go besides its progress bars: listeners that a view registers for the length
of a round (`helpers/book/live.py` draws them). Each row is published with the label of the run or arm it came
from; the rows are the ones the runner already reads from its children, so listening costs the child nothing."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator

Listener = Callable[[str, dict], None]
_listeners: list[Listener] = []


@contextmanager
def listen(listener: Listener) -> Iterator[Listener]:
    """Call `listener(label, row)` for every step row a child reports while the block runs."""
    _listeners.append(listener)
    try:
        yield listener
    finally:
        _listeners.remove(listener)


def publish(label: str, row: dict) -> None:
    """Hand one parsed row (step, loss, tokens_per_s, …) to every listener."""
    for listener in list(_listeners):
        listener(label, row)
