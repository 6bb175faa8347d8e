"""Study measurements that hold on a loaded machine: whether a warm compile-cache run really loaded the cache."""
from __future__ import annotations

import pytest

from helpers.config import with_changes
from helpers.spawn.runner import launch
from helpers.tune.study import base_config, compile_cache_reused, compile_cache_runs, sweep
from tests.conftest import snapshot

pytestmark = pytest.mark.slow


def test_warm_run_loads_the_cold_runs_graphs_and_a_changed_graph_does_not(tmp_path, small_corpus, capsys):
    cfg = base_config("debug", 12, str(small_corpus))
    runs = compile_cache_runs(cfg, tmp_path, progress=False, steps=8)
    (cold,), (warm,) = runs["cold cache"], runs["warm cache"]
    assert cold.status == warm.status == "ok"
    assert cold.summary["steps"] == warm.summary["steps"] == 8
    assert compile_cache_reused(tmp_path, warm)
    assert warm.summary["loss_last"] < warm.summary["loss_first"], "a warm-cache run must still train"
    # run again (a notebook cell run twice): both runs and the cache are reused as they are, and it says so
    before = snapshot(tmp_path)
    capsys.readouterr()
    again = compile_cache_runs(cfg, tmp_path, progress=False, steps=8)
    assert [r.path for (r,) in again.values()] == [cold.path, warm.path] and snapshot(tmp_path) == before
    assert capsys.readouterr().out.count("reused the finished run of this same config in") == 2
    assert compile_cache_reused(tmp_path, again["warm cache"][0])
    # a different graph (another batch shape) misses the cache and compiles again: the check can say no
    other = with_changes(cfg, {"compile_cache": True, "compile_cache_path": str(tmp_path / "compile_cache"),
                               "batch_size": cfg.batch_size * 2})
    assert not compile_cache_reused(tmp_path, launch(other, tmp_path / "other", progress=False))


def test_a_sweep_run_twice_reuses_its_run_and_moves_a_changed_one_aside(tmp_path, small_corpus, capsys):
    """A sweep trains into fixed folders; run again it reuses a finished run of the same config, and a
    run of another config moves the earlier one aside whole. A printed line says which."""
    cfg = base_config("debug", 8, str(small_corpus))
    ((_, first),) = sweep(cfg, "batch_size", [4], tmp_path, progress=False)
    folder, before = first.path, snapshot(first.path)
    capsys.readouterr()
    ((_, again),) = sweep(cfg, "batch_size", [4], tmp_path, progress=False)
    assert again.path == folder and snapshot(folder) == before
    assert capsys.readouterr().out == (f"reused the finished run of this same config in {folder} (nothing trained; "
                                       f"a different config would move it aside)\n")
    ((_, changed),) = sweep(with_changes(cfg, {"lr": 2e-3}), "batch_size", [4], tmp_path, progress=False)
    (aside,) = tmp_path.glob(f"{folder.name}.replaced-*")
    assert capsys.readouterr().out == (f"moved the earlier run in {folder} (status ok; its config differs in lr) "
                                       f"aside to {aside}; {folder} holds only the new run\n")
    assert snapshot(aside) == before
    assert changed.path == folder and changed.status == "ok" and changed.config.lr == 2e-3
