"""Every measured figure and verdict in a report comes from the run's data: none is typed into the notebooks or into
the sentences the helpers print (rule constants are fine in code: they are the rule, printed from named constants).

`typed_outcomes(text)` is the check: each form it catches has a name and the reason it is refused, so a failure
names the notebook, the cell, the form and the sentence around it.
"""
from __future__ import annotations

import json
import re

import pytest
import yaml

from helpers.paths import NOTEBOOKS_DIR
from helpers.tune.diagnose import TROUBLESHOOTING, _next_rounds

_NUM = r"\d+(?:[.,]\d+)*"
# (form, pattern, why it is refused). Case-insensitive; a code cell's format spec (`{x:.1%}`) is not a figure.
FORMS: list[tuple[str, str, str]] = [
    ("measured speed", rf"\d[\d.,–-]*\s?(?:k\s)?(?:ms\b|tokens/s|GFLOP/s|s/step|samples/s)",
     "a speed is measured by a run, not typed"),
    ("percent", rf"(?<![\w.:%{{])[+−±-]?{_NUM}\s?%", "a share, change or level is measured or is a named constant"),
    ("ratio", rf"(?<!\d)(?<!\d )×\s?{_NUM}|\b{_NUM}(?:x\b|\s?×(?!\s?\d))",
     "a ratio (×1.4, 2x, 1.4×) is what runs measure"),
    ("duration", rf"\b{_NUM}\s?(?:s|sec|seconds?|min|minutes?|h|hours?)\b"
                 r"|\b(?:half|quarter|one|two|three|a few|several)[- ](?:second|minute|hour)s?\b",
     "a duration is measured (or a parameter, read from it)"),
    ("memory size", rf"\b{_NUM}\s?(?:[KMGT]i?B)\b", "a size is measured or computed by a cell"),
    ("approximate figure", r"[~≈]\s?\d", "an approximate figure is a typed measurement"),
    ("magnitude words", r"\b(?:tens|hundreds|thousands|millions|billions) of\b|\bfraction of\b",
     "a magnitude in words is a typed figure"),
    ("outcome word", r"\b(?:faster|slower|wins?|won|beats?|beaten|outperforms?)\b",
     "who is faster is the verdict's to say, from the runs"),
    ("verdict in advance", r"\bexpect|\bis rejected\b", "a verdict announced before the runs"),
    ("stale term: noise band", r"\bnoise band\b",
     "speed rounds are judged by an interval (helpers/paired.py); seeds give a 'seed band'"),
    ("stale claim: seconds of training steps", r"\bseconds of training steps\b",
     "time to target counts from the training process's start (elapsed_s), not training steps only"),
]
_COMPILED = [(name, re.compile(pattern, re.IGNORECASE), why) for name, pattern, why in FORMS]


def typed_outcomes(text: str) -> list[tuple[str, str, str]]:
    """(form, the matched text, the sentence around it) for each typed figure or outcome in `text`."""
    hits = []
    for name, pattern, _ in _COMPILED:
        for m in pattern.finditer(text):
            start = max([m.start() - 80, 0] + [text.rfind(sep, 0, m.start()) + len(sep) for sep in (". ", "\n")
                                               if text.rfind(sep, 0, m.start()) >= 0])
            end = min(x for x in (text.find(". ", m.end()), text.find("\n", m.end()), m.end() + 80, len(text))
                      if x >= 0)
            hits.append((name, m.group(0), text[start:end].strip()))
    return hits


def notebook_hits(path) -> list[str]:
    """One line per typed figure in a notebook: cell number (0-based), kind, form, match and sentence."""
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    return [f"cell {i} ({c['cell_type']}): {form} {match!r} in «{sentence}»"
            for i, c in enumerate(cells) for form, match, sentence in typed_outcomes("".join(c["source"]))]


@pytest.mark.parametrize("notebook", sorted(NOTEBOOKS_DIR.glob("[0-9][0-9]_*.ipynb")), ids=lambda p: p.stem)
def test_notebook_sources_type_in_no_figures_or_verdicts(notebook):
    hits = notebook_hits(notebook)
    assert not hits, (f"{notebook.name}: typed figures or outcomes (compute them in a cell from the run records, or "
                      f"cut them):\n" + "\n".join(hits))


# Sentences the notebooks once held (copies, as they stood): the check must refuse every one.
ISSUE_SENTENCES = {
    "nb02 thousands of samples": "On this CPU the default pipeline (pre-tokenized text, one map worker) produces "
                                 "thousands of samples per second, far more than training consumes",
    "nb02 fraction of a percent": "the wait is a fraction of a percent, and a data round on the main workbook "
                                  "would measure nothing but noise.",
    "nb02 threads beat": "On 2 cores threads beat `python_multiprocessing=True` (processes pay pickling for every "
                         "sample)",
    "nb04 wins sooner": "With a warm cache, graph mode wins sooner.",
    "nb06 ~1e-8": "gives the same optimizer step as one big batch (the gradients match to ~1e-8)",
    "nb11 all slower": 'or start from eager PyNative (`"mode": "pynative", "jit_level": "none"` in `naive`), whose '
                       "rounds are all slower.",
    "nb11 half-minute": "With the default half-minute budget the rounds that fit are the paired ones",
    "nb11 99% interval": "the same keep/reject rule with its 99% interval, loss and memory gates",
    "nb13 training steps": "**time to target** (wall seconds of training steps until validation loss reaches the "
                           "level every reference seed reached) is reported beside it.",
    "nb03 noise band": "the round's verdict with the noise band it was judged against",
    # the forms the issue names
    "2x": "the paired round is 2x cheaper", "1.4×": "a 1.4× speed-up", "×2": "tokens/s ×2",
    "unsigned percent": "data wait is 3% of the step", "seconds": "the round takes 30 s",
    "MiB": "peak RSS 700 MiB",
}
# Sentences the check must let through (it is not a check that refuses everything).
CLEAN_SENTENCES = ["Steps until graph mode's extra first-step cost is paid back by its steady steps",
                   "a 1024³ fp32 matmul, best of `repeats`", "the nano shape (12 × 64 × 128)",
                   "print(f'{share:.1%} of the step')", "the keep/reject rule with its interval"]


@pytest.mark.parametrize("sentence", list(ISSUE_SENTENCES.values()), ids=list(ISSUE_SENTENCES))
def test_the_check_refuses_each_typed_outcome_the_issue_found(sentence):
    assert typed_outcomes(sentence), sentence


@pytest.mark.parametrize("sentence", CLEAN_SENTENCES)
def test_the_check_lets_untyped_text_through(sentence):
    assert typed_outcomes(sentence) == []


def test_diagnosis_advice_predicts_no_verdict():
    advice = [r for b in ("compute-bound", "balanced", "data-bound", "memory-bound", "communication-bound")
              for r in _next_rounds(b, {"dominant_op": "MatMul"}, [])]
    rows = yaml.safe_load(TROUBLESHOOTING.read_text(encoding="utf-8"))
    # every row's entries are plain lines (a ': ' inside a YAML flow list silently makes a mapping)
    assert [x for r in rows for k in ("causes", "checks", "fix") for x in r[k] if not isinstance(x, str)] == []
    advice += [fix for row in rows for fix in row["fix"]]
    words = re.compile(r"\bwin\b|rises to", re.IGNORECASE)
    assert [a for a in advice if typed_outcomes(a) or words.search(a)] == []


# A figure in markdown: a number with a unit, a ratio or a share. It may stand only where the notebook itself holds
# it: in a code cell (a parameter or default the reader can change) or in an output of the committed copy.
FIGURE = re.compile(rf"[×x]\s?{_NUM}|{_NUM}\s?(?:%|×|x\b|ms\b|s\b|min\b|[KMGT]i?B\b|GFLOP/s|tokens/s)", re.IGNORECASE)


def _outputs_text(cell) -> str:
    parts = []
    for out in cell.get("outputs", []):
        parts.append("".join(out.get("text", "")))
        parts += ["".join(v) if isinstance(v, list) else str(v) for k, v in out.get("data", {}).items()
                  if k.startswith("text/")]
    return "\n".join(parts)


def unheld_figures(cells: list[dict]) -> list[str]:
    """Each figure a markdown cell states that no code cell and no output of the notebook holds."""
    held = "\n".join("".join(c["source"]) + "\n" + _outputs_text(c) for c in cells if c["cell_type"] == "code")
    held_numbers = set(re.findall(_NUM, held))
    return [f"cell {i}: {m.group(0)!r}" for i, c in enumerate(cells) if c["cell_type"] == "markdown"
            for m in FIGURE.finditer("".join(c["source"])) if re.search(_NUM, m.group(0)).group(0) not in held_numbers]


@pytest.mark.parametrize("notebook", sorted(NOTEBOOKS_DIR.glob("[0-9][0-9]_*.ipynb")), ids=lambda p: p.stem)
def test_markdown_states_no_figure_the_notebook_does_not_hold(notebook):
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    assert unheld_figures(cells) == [], f"{notebook.name}: figures in markdown that no cell computes or sets"


def _cell(kind: str, source: str, output: str = "") -> dict:
    cell = {"cell_type": kind, "source": [source]}
    if kind == "code":
        cell["outputs"] = [{"output_type": "stream", "name": "stdout", "text": [output]}] if output else []
    return cell


@pytest.mark.parametrize("claim", ["the step takes 41.0 ms", "tokens/s ×0.63", "a 35% data wait"])
def test_a_planted_figure_fails_and_a_held_one_passes(claim):
    planted = [_cell("code", "steps = 50", "ok · 50 steps"), _cell("markdown", f"Here {claim}.")]
    assert unheld_figures(planted), claim
    figure = re.search(_NUM, claim).group(0)
    held = [_cell("code", "print(step)", f"measured: {figure}"), _cell("markdown", f"Here {claim}.")]
    assert unheld_figures(held) == []
    parameter = [_cell("code", f"limit = {figure}  # a default"), _cell("markdown", f"Here {claim}.")]
    assert unheld_figures(parameter) == []
