"""The bench items and their musts and goals, in one place.

Every module `bench/*_item.py` or `bench/*_items.py` declares its items as `ITEMS = [Item(...)]`: how it runs,
its command-line options, the table rows its result gives, and its checks — each a **must** (a miss, or a
measurement made outside the condition it needs, fails `make bench`) or a **goal** (reported only). `bench.py` runs
the items and exits by these checks; the generated tables of docs/benchmarks.md (bench/table.py) list the same
checks with their status in the committed records. So adding an item, with its musts, is one new module.
"""
from __future__ import annotations

import argparse
import difflib
import importlib
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

BENCH = Path(__file__).resolve().parent
MUST, GOAL = "must", "goal"
MET, MISSED, INVALID, NOT_MEASURED = "met", "missed", "invalid", "not measured"


@dataclass(frozen=True)
class Judgement:
    """One check on one result: status (met | missed | invalid | not measured) and the line saying why, with the
    figures."""
    status: str
    line: str


@dataclass(frozen=True)
class Check:
    """A must or a goal of one item.

    limit: the limit as docs/benchmarks.md shows it (one line); judge: result → Judgement; miss: a result this check
    calls missed (every must has one: the proof that it can fail, tests/test_bench_table.py).
    """
    kind: str
    limit: str
    judge: Callable[[dict], Judgement]
    miss: dict | None = None

    def __post_init__(self):
        if self.kind not in (MUST, GOAL):
            raise ValueError(f"check kind {self.kind!r}: choose {MUST} or {GOAL}")
        if self.kind == MUST and self.miss is None:
            raise ValueError(f"must '{self.limit}' has no example of a missed result (`miss`)")


@dataclass(frozen=True)
class Item:
    """One bench item.

    run: parsed arguments → result (a JSON-able dict holding every raw measurement behind its figures);
    rows: result → [(what, result text)] rows of the measured table; checks: its musts and goals (at least
    one: an item whose checks are all "not measured" measured nothing, and fails); options: argparse
    (flags, kwargs) it reads (a flag shared by two items must be declared alike); check_args: arguments → the line
    saying why they would measure nothing or name an unknown condition ("" when fine); in_all: part of `all`.
    """
    name: str
    about: str
    run: Callable[[argparse.Namespace], dict]
    rows: Callable[[dict], list[tuple[str, str]]]
    checks: tuple[Check, ...]
    options: tuple[tuple[tuple[str, ...], dict], ...] = ()
    check_args: Callable[[argparse.Namespace], str] = field(default=lambda args: "")
    in_all: bool = True

    def __post_init__(self):
        if not self.checks:
            raise ValueError(f"bench item {self.name} has no must or goal")


def _modules() -> list[str]:
    return sorted({p.stem for pattern in ("*_item.py", "*_items.py") for p in BENCH.glob(pattern)})


def items() -> dict[str, Item]:
    """Every declared item by name, in module order (imported from bench/; names must be unique)."""
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    found: dict[str, Item] = {}
    for module in _modules():
        for item in importlib.import_module(module).ITEMS:
            if item.name in found:
                raise ValueError(f"bench item {item.name!r} is declared twice (second in bench/{module}.py)")
            found[item.name] = item
    return found


def add_options(parser: argparse.ArgumentParser, registered: dict[str, Item]) -> None:
    """Each item's options, once per flag (a flag two items declare differently is an error)."""
    seen: dict[tuple[str, ...], tuple[str, dict]] = {}
    for item in registered.values():
        for flags, kwargs in item.options:
            if flags in seen:
                if seen[flags][1] != kwargs:
                    raise ValueError(f"option {'/'.join(flags)} is declared differently by {seen[flags][0]} and "
                                     f"{item.name}")
                continue
            seen[flags] = (item.name, kwargs)
            parser.add_argument(*flags, **kwargs)


def judge(item: Item, result: dict) -> list[dict]:
    """Each check of `item` on `result`: {kind, limit, status, line}."""
    out = []
    for check in item.checks:
        j = check.judge(result)
        out.append({"kind": check.kind, "limit": check.limit, "status": j.status, "line": j.line})
    return out


def failures(item: Item, judgements: list[dict]) -> list[str]:
    """Why this run of `item` fails `make bench`: one line per must missed or measured invalidly, or one line when
    nothing was measured at all; [] when it passes."""
    if all(j["status"] == NOT_MEASURED for j in judgements):
        return [f"{item.name}: measured nothing ({'; '.join(j['line'] for j in judgements)})"]
    return [f"{item.name}: must {j['status']}: {j['line']}" for j in judgements
            if j["kind"] == MUST and j["status"] in (MISSED, INVALID)]


# ------------------------------------------------------------------------------------ helpers for the items

def at_least(value: float | None, limit: float, text: str) -> Judgement:
    """met when value ≥ limit; `text` is the line, formatted with the comparison sign ({sign})."""
    if value is None:
        return Judgement(NOT_MEASURED, text.format(sign="?"))
    return Judgement(MET if value >= limit else MISSED, text.format(sign="≥" if value >= limit else "<"))


def at_most(value: float | None, limit: float, text: str) -> Judgement:
    """met when value ≤ limit; `text` is the line, formatted with the comparison sign ({sign})."""
    if value is None:
        return Judgement(NOT_MEASURED, text.format(sign="?"))
    return Judgement(MET if value <= limit else MISSED, text.format(sign="≤" if value <= limit else ">"))


def positive(args: argparse.Namespace, *names: str) -> str:
    """The line for the first option among `names` below 1 (it would measure nothing), or ""."""
    for name in names:
        if getattr(args, name) < 1:
            flag = "--" + name.replace("_", "-")
            return f"{flag} {getattr(args, name)} measures nothing; give {flag} 1 or more"
    return ""


def known(what: str, given: list[str], choices: list[str]) -> str:
    """The line for the first of `given` not among `choices` (with the closest one), or ""."""
    for value in given:
        if value not in choices:
            close = difflib.get_close_matches(value, choices, n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            return f"unknown {what} '{value}'; choose from {', '.join(choices)}{hint}"
    return ""
