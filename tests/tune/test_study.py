"""Study measurements that hold on a loaded machine: whether a warm compile-cache run really loaded the cache."""
from __future__ import annotations

import pytest

from helpers.config import with_changes
from helpers.spawn.runner import launch
from helpers.tune.study import base_config, compile_cache_reused, compile_cache_runs

pytestmark = pytest.mark.slow


def test_warm_run_loads_the_cold_runs_graphs_and_a_changed_graph_does_not(tmp_path, small_corpus):
    cfg = base_config("tiny", 12, str(small_corpus))
    runs = compile_cache_runs(cfg, tmp_path, progress=False, steps=8)
    (cold,), (warm,) = runs["cold cache"], runs["warm cache"]
    assert cold.status == warm.status == "ok"
    assert cold.summary["steps"] == warm.summary["steps"] == 8
    assert compile_cache_reused(tmp_path, warm)
    assert warm.summary["loss_last"] < warm.summary["loss_first"], "a warm-cache run must still train"
    # a different graph (another batch shape) misses the cache and compiles again: the check can say no
    other = with_changes(cfg, {"compile_cache": True, "compile_cache_path": str(tmp_path / "compile_cache"),
                               "batch_size": cfg.batch_size * 2})
    assert not compile_cache_reused(tmp_path, launch(other, tmp_path / "other", progress=False))
