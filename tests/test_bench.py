"""`make bench` fails when an item it measured misses a must (goals are only reported), naming the must."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow


def test_a_missed_must_fails_the_bench(tmp_path):
    # nanoGPT's config trained 20 iterations instead of 2000: its real val loss is far above the 1.95 limit
    proc = subprocess.run([sys.executable, "bench/bench.py", "parity", "--iters", "20", "--results", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stderr[-2000:]
    record = json.loads((tmp_path / "parity.json").read_text())
    (check,) = record["checks"]
    assert check["kind"] == "must" and check["status"] == "missed" and record["result"]["val_loss"] > 1.95
    assert proc.stderr.splitlines() == [f"bench: parity: must missed: {check['line']}"]
    assert f"val loss {record['result']['val_loss']:.4f} at 20 iterations > limit 1.95" in check["line"]
