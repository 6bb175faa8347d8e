"""troubleshooting.yaml reads as written: each cause, check and fix is one whole item (a YAML flow list split
'nan alarm message (grad-norm trend, last good step)' into two broken bullets), and every `key=value` fix it names
is a setting the config accepts."""
from __future__ import annotations

import re

import pytest

from helpers.config import ConfigError, from_dict
from helpers.docs_pages import troubleshooting_page
from helpers.tune.diagnose import TROUBLESHOOTING, troubleshooting_table

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
