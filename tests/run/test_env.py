"""The measured matmul peak behind MFU: when it is measured again, and how a run names the peak it used."""
from __future__ import annotations

import json
import os
import time

import pytest

from helpers.run import env
from helpers.record import load_run
from tests.conftest import run_cli, tiny_args


def _cache(tmp_path, monkeypatch, entry: dict) -> None:
    """A peak cache in a private XDG_CACHE_HOME holding `entry` for this machine's CPU fp32 key."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    path = env._cache_file()
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({env._machine_key("CPU", "fp32", 0): entry}))


def _at(seconds_ago: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() - seconds_ago))


def test_a_fresh_quiet_peak_is_used_as_cached(tmp_path, monkeypatch):
    _cache(tmp_path, monkeypatch, {"flops": 123.0, "measured_at": _at(60), "load_avg_1m": 0.1})
    info = env.peak_flops_info("CPU", "fp32", 0)
    assert info["flops"] == 123.0 and info["source"].startswith("cached: measured")


@pytest.mark.parametrize("entry, why", [
    ({"flops": 1.0, "measured_at": _at(2 * env.PEAK_STALE_S), "load_avg_1m": 0.1}, "older than"),
    ({"flops": 1.0, "measured_at": _at(60), "load_avg_1m": 50.0 * (os.cpu_count() or 1)}, "was measured at load"),
    ({"flops": 1.0, "measured_at": _at(60)}, "no load average recorded"),  # written before loads were kept
])
def test_a_stale_or_loaded_peak_is_measured_again(tmp_path, monkeypatch, entry, why):
    _cache(tmp_path, monkeypatch, entry)
    info = env.peak_flops_info("CPU", "fp32", 0)
    assert info["flops"] > 1e8, info  # a real 1024³ matmul, not the cached 1 FLOP/s
    assert why in info["source"] and info["measured_at"] != entry["measured_at"]
    assert info["load_avg_1m"] >= 0 and info["cores"] == os.cpu_count()
    cached = json.loads(env._cache_file().read_text())[env._machine_key("CPU", "fp32", 0)]
    assert cached["flops"] == info["flops"] and cached["load_avg_1m"] == info["load_avg_1m"]


def test_summary_and_show_name_the_peak_the_mfu_used(tmp_path, small_corpus):
    run = tmp_path / "run"
    assert run_cli("train", *tiny_args(small_corpus, 6), "--out", str(run), "--progress", "none").returncode == 0
    s = load_run(run).summary
    assert s["mfu"] > 0 and s["peak_flops"] > 0
    assert s["peak_flops_measured_at"] and s["peak_flops_load_avg"] is not None
    assert s["peak_flops_source"].startswith(("cached: measured", "measured now at load"))
    shown = run_cli("show", str(run)).stdout
    assert "peak_flops_measured_at" in shown and s["peak_flops_measured_at"] in shown
    assert "peak_flops_load_avg" in shown
