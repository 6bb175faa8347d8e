"""Hostile YAML (an alias bomb, a recursive alias, 20,000-deep nesting, an oversized file, a duplicated key, a
binary file) is refused in one `error:` line and well under a second by every command that reads YAML: a recipe
(import-config), a config (train --config, a run's config.yaml), a parameters file (workbook --params). Before,
they spun for minutes, ran out of memory, ended in RecursionError, or silently took the last duplicate."""
from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO, run_cli

# "Billion laughs": ~550 bytes whose aliases spell 10^9 leaves to whatever walks the result.
BILLION_LAUGHS = 'a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]\n' + "".join(
    f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]\n" for i in range(1, 9))

# name → (file bytes, what the one error line must say)
HOSTILE = {
    "alias bomb": (BILLION_LAUGHS.encode(), ["aliases that expand to over 100,000 nodes", "alias *a3 at line 5"]),
    "recursive alias": (b"model: &m\n  inner: *m\n", ["recursive alias *m at line 2"]),
    "20,000-deep nesting": (("{a: " * 20_000 + "1" + "}" * 20_000).encode(), ["nests deeper than 100 levels"]),
    "oversized": (b"steps: 1\n" + b"# padding\n" * 30_000, ["is 293 KiB, over the 256 KiB limit",
                                                            "rerun with WORKBOOK_YAML_MAX_KIB=293"]),
    "duplicate key": (b"model:\n  num_layers: 32\n  hidden_size: 64\n  num_layers: 2\n",
                      ["key 'num_layers' twice in the same mapping, at lines 2 and 4; keep one"]),
    "binary": (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", ["is binary (a NUL byte at offset 8)"]),
    "not UTF-8": ("name: café\n".encode("latin-1"), ["is not UTF-8 text (byte 0xe9 at offset 9)"]),
}
WALL_S = 10.0  # one refusing command, interpreter start and imports included (~0.2-1.5 s here)
LOADER_S = 1.0  # the loader itself on one hostile file


def _file(tmp_path: Path, name: str) -> Path:
    path = tmp_path / "hostile.yaml"
    path.write_bytes(HOSTILE[name][0])
    return path


# entry point → (its arguments for a file, the path it must not create)
ENTRIES = {
    "import-config": lambda f, tmp: (["import-config", str(f), "--out", str(tmp / "out.yaml")], tmp / "out.yaml"),
    "train --config": lambda f, tmp: (["train", "--config", str(f), "--out", str(tmp / "run")], tmp / "run"),
    "workbook --params": lambda f, tmp: (["workbook", "--params", str(f), "--out", str(tmp / "wb")], tmp / "wb"),
}


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("case", HOSTILE)
def test_every_command_that_reads_yaml_refuses_a_hostile_file_in_one_line_within_seconds(tmp_path, entry, case):
    args, target = ENTRIES[entry](_file(tmp_path, case), tmp_path)
    t0 = time.monotonic()
    proc = run_cli(*args, timeout=WALL_S)
    took = time.monotonic() - t0
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "hostile.yaml" in lines[0], proc.stderr[-2000:]
    assert all(words in lines[0] for words in HOSTILE[case][1]), lines[0]
    assert not target.exists(), "refused, yet it wrote (or started) something"
    assert took < WALL_S


@pytest.mark.parametrize("case", HOSTILE)
def test_the_loader_refuses_each_hostile_file_within_a_second(tmp_path, case):
    from helpers.bounded_yaml import YamlRefused, load_file
    path = _file(tmp_path, case)
    t0 = time.perf_counter()
    with pytest.raises(YamlRefused) as err:
        load_file(path)
    assert time.perf_counter() - t0 < LOADER_S
    assert all(words in str(err.value) for words in HOSTILE[case][1]) and "\n" not in str(err.value)


@pytest.mark.parametrize("text, words", [
    # aliases that reach 101 levels through an alias of a 60-deep list inside a 41-deep one
    ("a: &a " + "[" * 60 + "]" * 60 + "\nb: " + "[" * 40 + "*a" + "]" * 40 + "\n", "nests deeper than 100 levels "
                                                                                 "through alias *a at line 2"),
    ("- " * 20_000 + "1\n", "nests deeper than 100 levels at line 1"),
    ("".join("  " * i + "a:\n" for i in range(200)), "nests deeper than 100 levels at line 101"),
    ("a: &a [1, *a]\n", "recursive alias *a at line 1: it is inside the collection it names (line 1)"),
    ("yes: 1\nno: 2\ntrue: 3\n", "key 'yes' twice in the same mapping, at lines 1 and 3"),  # the same key, True
])
def test_nesting_through_aliases_block_nesting_recursion_and_equal_keys_are_refused(text, words):
    from helpers.bounded_yaml import YamlRefused, load_text
    with pytest.raises(YamlRefused, match=words.replace("*", r"\*").replace("(", r"\(").replace(")", r"\)")):
        load_text(text)


def test_what_real_files_hold_reads_as_safe_load_reads_it():
    """No false refusals: the example recipes, run records and workbook files load as before; a merge key's own
    mapping overriding a merged key is YAML's meaning, not a duplicate; a few small aliases are fine."""
    from helpers.bounded_yaml import load_file, load_text
    files = [*REPO.glob("configs/**/*.yaml"), *REPO.glob("tests/data/**/*.yaml")]
    assert len(files) > 5
    for path in files:
        assert load_file(path) == yaml.safe_load(path.read_text(encoding="utf-8")), path
    merged = "base: &b {lr: 1.0e-3, steps: 10}\nrun:\n  <<: *b\n  steps: 20\nalso: *b\n"
    assert load_text(merged) == {"base": {"lr": 1e-3, "steps": 10}, "run": {"lr": 1e-3, "steps": 20},
                                 "also": {"lr": 1e-3, "steps": 10}}
    assert load_text("\ufeffsteps: 5\n") == {"steps": 5}  # a UTF-8 byte-order mark


def test_the_size_limit_is_raised_by_its_variable_and_a_bad_value_is_one_line(tmp_path, monkeypatch):
    from helpers.bounded_yaml import MAX_BYTES, YamlRefused, load_file
    path = _file(tmp_path, "oversized")
    assert MAX_BYTES < path.stat().st_size
    monkeypatch.setenv("WORKBOOK_YAML_MAX_KIB", "293")
    assert load_file(path) == {"steps": 1}
    monkeypatch.setenv("WORKBOOK_YAML_MAX_KIB", "lots")
    with pytest.raises(YamlRefused, match="WORKBOOK_YAML_MAX_KIB='lots' is not a whole number of KiB"):
        load_file(path)


def test_a_run_record_config_an_override_and_a_recipe_convert_the_refusal_to_their_own_error(tmp_path):
    from helpers.config import ConfigError, load_written, parse_override
    from helpers.mindformers import read_yaml
    path = _file(tmp_path, "duplicate key")
    with pytest.raises(ConfigError, match="twice in the same mapping.*it belongs to a run record or rollback point"):
        load_written(path)
    with pytest.raises(ConfigError, match=r"override 'data.corpus=&a \[\*a\]' has a recursive alias"):
        parse_override("data.corpus=&a [*a]")
    with pytest.raises(ConfigError, match="is UTF-16 text; save it as UTF-8"):
        (tmp_path / "utf16.yaml").write_text("steps: 5\n", encoding="utf-16")
        read_yaml(str(tmp_path / "utf16.yaml"))


def test_a_recipe_of_100k_unknown_keys_is_reported_in_seconds_with_hints_for_the_first_few():
    """A close-match search is ~1 ms a key: 100k unknown keys took minutes and a 100k-line message."""
    from helpers.config import ConfigError
    from helpers.mindformers import import_mindformers
    junk = {f"key_{i}": i for i in range(100_000)}
    data = {"model": {"model_config": {"num_hiden_layers": 4}}, "junk": junk}
    t0 = time.perf_counter()
    with pytest.raises(ConfigError) as err:
        import_mindformers(data, source="huge.yaml")
    assert time.perf_counter() - t0 < 5.0
    from helpers.mindformers.importer import LISTED_REFUSALS
    lines = str(err.value).splitlines()
    assert lines[0].startswith("huge.yaml: 100001 keys cannot be honoured here")
    assert "did you mean 'model.model_config.num_hidden_layers'?" in lines[1]
    assert len(lines) == 1 + LISTED_REFUSALS + 1 and lines[-1] == f"  - … and {100_001 - LISTED_REFUSALS:,} more"
