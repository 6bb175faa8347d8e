"""A workbook written before Workbook was split by job replays to the same state (no training).

tests/data/workbook_before_split/ was written by the workbook code of commit c638e94 (its generate.py says how): a
baseline adopted from tests/data/record_7c15080, a kept speed round, a rejected convergence round, a time-to-target
round, a note, an A/A check, a person's override that kept round 2, and a rollback to round 1. Its best.yaml is
what the old code mirrored from its own replay; its ledger lines are what the old code appended.
"""
from __future__ import annotations

import json
import shutil

import pytest
import yaml

from helpers import config as config_mod
from helpers.tune.rounds import RoundError, Workbook
from tests.conftest import REPO

BEFORE = REPO / "tests" / "data" / "workbook_before_split"


@pytest.fixture
def book(tmp_path):
    shutil.copytree(BEFORE, tmp_path / "wb", ignore=shutil.ignore_patterns("generate.py"))
    return Workbook.open(tmp_path / "wb")


def test_the_old_ledger_replays_to_the_best_the_old_code_mirrored(book):
    entries = book.ledger()
    assert [e["event"] for e in entries] == ["baseline", "round", "round", "round", "note", "aa_check", "decide",
                                             "rollback"]
    assert [e["best_round"] for e in entries] == [0, 1, 1, 1, 1, 1, 2, 1]
    best = book.best_config()
    # the old mirror, its keys filled as the code of its day ran (config.WRITTEN_BEFORE), the others by defaults
    assert best == config_mod.as_written(yaml.safe_load((book.path / "best.yaml").read_text()))
    assert best == config_mod.load_written(book.path / "rounds" / "01_batch" / "rollback" / "config.yaml")
    assert best.model.lazy_inline is False
    assert best.batch_size == 8 and book.repeats == 2 and book.memory_limit_bytes == 8 * 2 ** 30


def test_rounds_overrides_and_runs_read_as_before(book):
    batch, lr, recipe = book.rounds()
    assert [(r.index, r.name, r.objective) for r in (batch, lr, recipe)] == [
        (1, "batch", "speed"), (2, "lr", "convergence"), (3, "recipe", "time_to_target")]
    assert batch.changes == {"batch_size": (4, 8)} and batch.decision == "keep" and batch.override is None
    assert lr.verdict.decision == "reject" and lr.decision == "keep"  # ben's override
    assert (lr.override["who"], lr.override["why"]) == ("ben", "a lower loss at the end is what we want")
    assert recipe.target == 2.5 and recipe.changes == {"lr": (0.001, 0.003), "warmup": (2, 4)}
    assert recipe.rollback == book.path / "rounds" / "03_recipe" / "rollback"
    (run,) = book.baseline_runs()
    assert run.status == "ok" and run.path == book.path / "baseline" / "run_1"
    assert book.best_runs() == []  # round 1's runs are not in the folder: readers skip them, as before
    rows = {row["metric"]: row for row in book.before_after()}
    assert rows["throughput"]["baseline"] == pytest.approx(json.loads(
        (BEFORE / "ledger.jsonl").read_text().splitlines()[0])["tokens_per_s"])
    assert rows["global batch"]["baseline"] == 4 and rows["global batch"]["best"] == 8


def test_a_recorded_round_is_reused_and_new_entries_extend_the_old_ledger(book, capsys):
    before = (book.path / "ledger.jsonl").read_text()
    again = book.run_round("batch", {"batch_size": 8}, progress=False)  # a notebook run twice: nothing trains
    assert again.index == 1 and "round 1 (batch) is recorded already: keep" in capsys.readouterr().out
    assert (book.path / "ledger.jsonl").read_text() == before
    assert book.rollback(0, who="dee").batch_size == 4 and book.best_config().batch_size == 4
    assert yaml.safe_load((book.path / "best.yaml").read_text())["batch_size"] == 4
    text = (book.path / "ledger.jsonl").read_text()
    assert text.startswith(before)
    old, new = (json.loads(line) for line in (before.splitlines()[-1], text.splitlines()[-1]))
    assert set(new) == set(old) and (new["event"], new["who"], new["best_round"]) == ("rollback", "dee", 0)
    with pytest.raises(RoundError, match="there is no round 7"):
        book.decide(7, "keep", who="dee", why="no such round")
