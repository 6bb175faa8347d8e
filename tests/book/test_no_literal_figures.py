"""Every measured figure and verdict in a report comes from the run's data: none is typed into the notebooks or into
the sentences the helpers print (rule constants are fine: they are the rule, printed from named constants)."""
from __future__ import annotations

import json
import re

import pytest
import yaml

from helpers.paths import NOTEBOOKS_DIR
from helpers.tune.diagnose import TROUBLESHOOTING, _next_rounds

# A measured speed (12 ms, 9.9k tokens/s, 107 GFLOP/s), a signed change (+37%, −10%), a ratio (×1.4), or a verdict
# announced before the runs ("expect …", "is rejected", "slower here").
LITERAL = re.compile(r"\d[\d.,–-]*\s?(k\s)?(ms\b|tokens/s|GFLOP/s|s/step)|[+−±-]\d+(\.\d+)?\s?%|×\s?\d+\.\d|\bexpect"
                     r"|is rejected|slower here|faster here", re.IGNORECASE)


@pytest.mark.parametrize("notebook", sorted(NOTEBOOKS_DIR.glob("[0-9][0-9]_*.ipynb")), ids=lambda p: p.stem)
def test_notebook_sources_type_in_no_figures_or_verdicts(notebook):
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    hits = [(i, m.group(0)) for i, c in enumerate(cells) for m in LITERAL.finditer("".join(c["source"]))]
    assert hits == [], f"{notebook.name}: cell, literal = {hits}"


def test_diagnosis_advice_predicts_no_verdict():
    advice = [r for b in ("compute-bound", "balanced", "data-bound", "memory-bound", "communication-bound")
              for r in _next_rounds(b, {"dominant_op": "MatMul"}, [])]
    rows = yaml.safe_load(TROUBLESHOOTING.read_text(encoding="utf-8"))
    # every row's entries are plain lines (a ': ' inside a YAML flow list silently makes a mapping)
    assert [x for r in rows for k in ("causes", "checks", "fix") for x in r[k] if not isinstance(x, str)] == []
    advice += [fix for row in rows for fix in row["fix"]]
    words = re.compile(r"slower|faster|\bwin\b|rises to", re.IGNORECASE)
    assert [a for a in advice if LITERAL.search(a) or words.search(a)] == []
