"""The docs: the site builds with `mkdocs build --strict` (every link and anchor resolves), the generated reference
pages are what the code generates, every command block runs as written (or is marked `# example`, and then its
`python -m helpers` lines still parse and its `make` targets exist), the README stays short and quotes its verdict
and wall time from the committed record, and no tracked name or page speaks of how the work was organised."""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import docs_pages
from helpers.cli import parser
from tests.conftest import REPO

README = REPO / "README.md"
PAGES = sorted((REPO / "docs").rglob("*.md"))
EXAMPLE = "# example"
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.M | re.S)


def command_blocks(path: Path) -> list[tuple[str, str]]:
    """(first line, the block's text) of each ```bash block of a Markdown file."""
    return [(body.split("\n", 1)[0], body) for lang, body in FENCE.findall(path.read_text(encoding="utf-8"))
            if lang in ("bash", "sh", "shell")]


def commands(block: str) -> list[list[str]]:
    """The block's commands as argument lists: continuation lines joined, comments dropped."""
    return [words for line in block.replace("\\\n", " ").splitlines()
            if (words := shlex.split(line, comments=True))]


def test_the_site_builds_strictly_with_every_link_and_anchor_resolving(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")],
                          cwd=REPO, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, NO_MKDOCS_2_WARNING="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "site" / "reference" / "config" / "index.html").is_file()


def test_the_generated_reference_pages_are_what_the_code_generates():
    assert docs_pages.stale() == [], "run `python -m helpers.docs_pages --write`"


def test_a_knob_added_without_regenerating_makes_its_page_stale(tmp_path):
    docs_pages.write(tmp_path)
    assert docs_pages.stale(tmp_path) == []
    page = tmp_path / "reference" / "config.md"
    page.write_text(page.read_text(encoding="utf-8").replace("| `steps` |", "| `stepz` |"), encoding="utf-8")
    assert docs_pages.stale(tmp_path) == ["reference/config.md"]


def test_every_relative_link_of_the_readme_resolves():
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README.read_text(encoding="utf-8")):
        if "://" not in target:
            assert (REPO / target).exists(), target


def test_example_blocks_name_real_commands_flags_and_make_targets():
    targets = set(re.findall(r"^([a-z][\w-]*):", (REPO / "Makefile").read_text(encoding="utf-8"), re.M))
    checked = 0
    for path in [README, *PAGES]:
        for first, block in command_blocks(path):
            if first.strip() != EXAMPLE and not first.startswith(EXAMPLE + " "):
                continue
            for words in commands(block):
                if words[0] == "make":
                    assert set(w for w in words[1:] if "=" not in w) <= targets, (path.name, words)
                elif "helpers" in words and words[words.index("helpers") - 1] == "-m":
                    args = words[words.index("helpers") + 1:]
                    try:
                        parser().parse_args(args)
                    except SystemExit:
                        pytest.fail(f"{path.relative_to(REPO)}: `python -m helpers {' '.join(args)}` does not parse")
                checked += 1
    assert checked >= 20


@pytest.mark.slow
def test_every_command_block_not_marked_as_an_example_runs_as_written(tmp_path):
    """A page's blocks in order, in a fresh folder of its own holding the repository's configs and venv, as a user
    reading that page in a checkout would run them."""
    ran = []
    for path in [README, *PAGES]:
        home = tmp_path / path.relative_to(REPO).with_suffix("").as_posix().replace("/", "_")
        home.mkdir()
        for name in ("configs", ".venv"):
            (home / name).symlink_to(REPO / name)
        for first, block in command_blocks(path):
            if first.startswith(EXAMPLE):
                continue
            proc = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=home, capture_output=True,
                                  text=True, timeout=600, env=dict(os.environ, GLOG_v="3"))
            assert proc.returncode == 0, f"{path.relative_to(REPO)}:\n{block}\n{proc.stderr[-2000:]}"
            ran.append(path.name)
    assert len(ran) >= 4, ran


def test_the_readme_is_short_and_quotes_its_rounds_cumulative_and_wall_time_from_the_committed_record():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 150
    record = json.loads((REPO / "bench" / "records" / "workbook.json").read_text(encoding="utf-8"))
    quoted = " ".join(re.search(r"```text\n(.*?)```", text, re.S).group(1).split())
    c = record["result"]["rounds"]["cumulative"]
    assert quoted == (f"cumulative: baseline → best of round {c['best_round']} ({', '.join(c['changes'])}): tokens/s "
                      f"×{c['speedup']:.3f}, {c['level']:.1%} interval ×{c['interval'][0]:.3f}–×{c['interval'][1]:.3f} "
                      f"({c['pairs']} pairs, {c['path']}, side by side)")
    for r in record["result"]["rounds"]["ledger"]:  # the rounds table: each round's ratio and interval as recorded
        row = next(line for line in text.splitlines() if line.startswith(f"| {r['index']} {r['name']} |"))
        assert r["decision"] in row.lower(), row
        if r["interval"]:
            assert f"×{r['speedup']:.3f}" in row and f"×{r['interval'][0]:.3f}–×{r['interval'][1]:.3f}" in row, row
    assert f"`make workbook` took {record['result']['wall_s']:.0f} s" in text


# Words about how the work was organised, not about what the workbook does: prose names things by what they hold.
# In code "session" also names process and pytest sessions; a numbered one is still about the work.
ORGANISATION_WORDS = r"seeds?' rules|seed rules|\bissues? #?\d+|other engineers|\blent\b|our reference material|" \
                     r"\bsubagent|\bhelper \d+|\bsessions? \d+"
IN_PROSE, IN_CODE = re.compile("session|" + ORGANISATION_WORDS, re.I), re.compile(ORGANISATION_WORDS, re.I)


def test_no_tracked_name_or_page_speaks_of_how_the_work_was_organised():
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert [p for p in tracked.splitlines() if "session" in p.lower()] == []
    prose = [(p, IN_PROSE) for p in (README, *PAGES, *sorted((REPO / "notebooks").glob("*.ipynb")))]
    code = [(REPO / p, IN_CODE) for p in tracked.splitlines() if p.endswith(".py") and p != "tests/test_docs_site.py"]
    found = [f"{p.relative_to(REPO)}: {m.group(0)!r}" for p, words in prose + code if p.is_file()
             for m in [words.search(p.read_text(encoding="utf-8"))] if m]
    assert found == []


# What pages may name that is not this repository's: typos that pages show being refused, names from libc,
# MindSpore, MindFormers, Hugging Face and the tools the pages run, and what a build makes.
NOT_OURS = {"my_callbackz", "user_nett", "x_missing", "model.d_modl", "malloc_trim", "adam_m", "model.model_config",
            "model.safetensors", "--durations", "--strict", "--help", "native/build/libwbkernels.so"}
PATH_ROOTS = ("helpers/", "tests/", "bench/", "docs/", "notebooks/", "configs/", "native/")


def _code_words(tracked: list[str]) -> set[str]:
    words = set(NOT_OURS) | {Path(p).stem for p in tracked}
    for p in tracked:
        if p.endswith((".py", ".yaml", ".ipynb", ".cc", ".h")) or p == "Makefile":
            words |= set(re.findall(r"--?[A-Za-z][\w-]*|[A-Za-z_]\w*", (REPO / p).read_text(errors="replace")))
    return words


def test_every_config_key_name_cli_flag_and_repository_path_a_page_names_exists():
    """Docs drift: a page naming a summary key, config key, CLI flag or file the code no longer has. Checked in
    `code` spans of every page but the changelog (which keeps old names on purpose) and the evidence files."""
    from helpers import config as config_mod
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    keys, words = set(config_mod.flatten(config_mod.from_dict({}))), _code_words(tracked)
    sections = "|".join(config_mod.SECTIONS)
    missing = []
    for page in [README, *PAGES]:
        rel = page.relative_to(REPO)
        if rel.name == "changelog.md" or rel.parts[:2] == ("docs", "data") or rel.name in ("mindformers-keys.md",
                                                                                          "hf-config-keys.md"):
            continue  # those two map other projects' keys
        for span in re.findall(r"`([^`\n]+)`", page.read_text(encoding="utf-8")):
            found = [k for k in re.findall(rf"(?<![\w./-])((?:{sections})\.[a-z_0-9]+)(?![\w.])", span)
                     if k not in keys and k not in NOT_OURS]
            found += [w for w in re.findall(r"(?<![\w./])([a-z][a-z0-9]*_[a-z0-9_]+)(?![\w(.])", span)
                      if w not in words and not re.fullmatch(r"step_\d+", w)]
            found += [f for f in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", span) if f not in words]
            found += [p for p in re.findall(r"(?<![\w/.])((?:%s)[\w./-]*\.\w+)" % "|".join(PATH_ROOTS), span)
                      if p not in tracked and p not in NOT_OURS and "*" not in p]
            missing += [f"{rel}: {name}" for name in found]
    assert missing == []
