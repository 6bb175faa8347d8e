"""`make bench` fails when an item it measured misses a "must" limit (goals are only reported)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow


def test_a_missed_must_limit_fails_the_bench(tmp_path):
    # nanoGPT's config trained 20 iterations instead of 2000: its real val loss is far above the 1.95 limit
    proc = subprocess.run([sys.executable, "bench/bench.py", "parity", "--iters", "20", "--results", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stderr[-2000:]
    result = json.loads((tmp_path / "parity.json").read_text())
    assert result["must"]["ok"] is False and result["val_loss"] > result["limit"]
    missed = [line for line in proc.stderr.splitlines() if line.startswith("bench: must limit missed: ")]
    assert missed == [f"bench: must limit missed: parity: {result['must']['text']}"]
    assert f"val loss {result['val_loss']:.4f} at 20 iterations > limit 1.95" in missed[0]
