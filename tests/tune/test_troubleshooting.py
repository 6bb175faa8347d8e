"""troubleshooting.yaml reads as written: each cause, check and fix is one whole item (a YAML flow list split
'nan alarm message (grad-norm trend, last good step)' into two broken bullets), every `key=value` fix it names
is a setting the config accepts, and each row's `levers` are exactly the declared config keys its fixes name."""
from __future__ import annotations

import re

import pytest

from helpers.config import ConfigError, from_dict
from helpers.docs_pages import levers_page, troubleshooting_page
from helpers.levers import LEVERS
from helpers.tune.diagnose import TROUBLESHOOTING, troubleshooting_by_lever, troubleshooting_table

SETTING = re.compile(r"\b([a-z_]+(?:\.[a-z_]+)?)=([\w.]+)")


def _items():
    return [(row["symptom"], part, item) for row in troubleshooting_table() for part in ("causes", "checks", "fix")
            for item in row[part]]


def test_every_item_is_whole_and_the_file_has_no_flow_lists_for_them():
    broken = [(s, part, item) for s, part, item in _items() if item.count("(") != item.count(")")]
    assert broken == []
    assert not re.search(r"^\s+(causes|checks|fix): \[", TROUBLESHOOTING.read_text(encoding="utf-8"), re.M)
    assert "- nan alarm message (grad-norm trend, last good step)" in troubleshooting_page()


@pytest.mark.parametrize("setting", sorted({m.group(0) for _, part, item in _items() if part == "fix"
                                            for m in SETTING.finditer(item)}))
def test_every_setting_a_fix_names_is_one_the_config_accepts(setting):
    try:
        from_dict({}, [setting])
    except ConfigError as exc:
        pytest.fail(f"troubleshooting.yaml names {setting}, which the config refuses: {exc}")


def _keys_named(text: str) -> set[str]:
    """The declared config keys a fix's text names as whole words ('raise data.prefetch' names data.prefetch)."""
    return {w for w in re.findall(r"[a-z_]+(?:\.[a-z_]+)?", text) if w in LEVERS}


@pytest.mark.parametrize("row", troubleshooting_table(), ids=lambda r: r["symptom"].split(" (")[0])
def test_each_rows_levers_are_the_declared_keys_its_fixes_name(row):
    named = set().union(*(_keys_named(item) for item in row["fix"]))
    assert row["levers"], "a row names the config keys its fixes change under `levers`"
    assert not set(row["levers"]) - set(LEVERS), "a lever the registry (helpers/levers.py) does not declare"
    assert set(row["levers"]) == named, "`levers` and the keys the fix text names differ"
    assert len(row["levers"]) == len(set(row["levers"]))


def test_a_levers_troubleshooting_rows_are_found_from_the_key_and_shown_on_both_pages():
    rows = troubleshooting_by_lever()
    assert rows["data.num_parallel_workers"] == ["data-bound (steps wait for the next batch)"]
    assert len(rows["max_grad_norm"]) == 3 and "data.corpus" not in rows
    assert "| `recompute` | processes |" in levers_page() and "| memory-bound or out of memory |" in levers_page()
    assert "Levers: `data.tokenize`, `data.num_parallel_workers`, `data.prefetch`" in troubleshooting_page()
