"""A run's fixed cost in summary.json, and the compile cache (on by default): a warm run trains exactly as the
cold one, and a cache filled by another config is never loaded (MindSpore's own cache would: it keys on files)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from helpers.record import load_run
from helpers.run import kernels
from tests.conftest import REPO, run_cli, tiny_args

pytestmark = pytest.mark.slow


def _train(out, corpus, *extra):
    proc = run_cli("train", *tiny_args(corpus, 10, *extra), "--out", str(out), "--progress", "none")
    assert proc.returncode == 0, proc.stderr[-2000:]
    record = load_run(out)
    return [r["loss"] for r in record.metrics], record.summary


@pytest.mark.parametrize("mode", [["mode=graph"], ["mode=pynative", "jit_level=O0"]])
def test_warm_compile_cache_trains_like_cold_and_is_per_config(tmp_path, small_corpus, mode):
    cache = [f"compile_cache_path={tmp_path / 'cache'}", *mode]
    cold, cold_s = _train(tmp_path / "cold", small_corpus, *cache)
    warm, warm_s = _train(tmp_path / "warm", small_corpus, *cache)
    assert cold[-1] < cold[0] - 0.05  # the loss moves: parameters are updated
    assert warm == pytest.approx(cold, rel=1e-6, abs=0)  # the warm step is the same computation
    assert warm_s["fixed_cost_s"]["compile"] < cold_s["fixed_cost_s"]["compile"]  # and it did reuse the graph
    # another config (other shapes) next to it in the same cache: its own folder, not the cached graph
    other = ["batch_size=4", "model.n_layer=1"]
    fresh, _ = _train(tmp_path / "other_nocache", small_corpus, *mode, *other, "compile_cache=false")
    shared, _ = _train(tmp_path / "other_cached", small_corpus, *cache, *other)
    assert shared == pytest.approx(fresh, rel=1e-6, abs=0)
    assert len(list((tmp_path / "cache").iterdir())) == 2


def test_keys_outside_the_graph_share_a_cache_folder_and_train_as_without_it(tmp_path, small_corpus):
    """Seed (no dropout), data pipeline, profiler window, evaluation cadence, the LR schedule and the step count do
    not change the compiled graph: a run differing only in them loads the cached graph and trains exactly as it
    does uncached (so the LR it trains with is its own, not the cached run's)."""
    cache = f"compile_cache_path={tmp_path / 'cache'}"
    first, _ = _train(tmp_path / "first", small_corpus, cache, "seed=1")
    other = ["seed=2", "data.shuffle_buffer=4", "data.num_parallel_workers=2", "eval_every=5", "steady_after=2",
             "lr=0.004", "warmup=2", "schedule=linear", "min_lr=0.0005", "steps=14"]
    warm, warm_s = _train(tmp_path / "warm", small_corpus, cache, *other)
    fresh, fresh_s = _train(tmp_path / "fresh", small_corpus, "compile_cache=false", *other)
    assert len(list((tmp_path / "cache").iterdir())) == 1  # one folder: the second run found the first's
    assert warm == pytest.approx(fresh, rel=1e-6, abs=0)
    assert warm != pytest.approx(first, rel=1e-3)  # it trained its own seed and LR, not the cached run's
    assert warm_s["fixed_cost_s"]["compile"] < fresh_s["fixed_cost_s"]["compile"]
    # with dropout the seed is in the graph's random ops: its own folder
    _train(tmp_path / "drop1", small_corpus, cache, "seed=1", "model.dropout=0.1")
    _train(tmp_path / "drop2", small_corpus, cache, "seed=2", "model.dropout=0.1")
    assert len(list((tmp_path / "cache").iterdir())) == 3


def test_a_cache_folder_is_held_by_one_process_at_a_time(tmp_path):
    """A second process asking for a folder another holds is told why it compiles without it (another rank's part
    is free); the holder may ask again, but not for a second folder (MindSpore keeps the first); the hold ends with
    the holder's process."""
    folder = tmp_path / "cache" / "abc"
    claim = "from helpers.run.startup import claim_cache_folder as c; "
    ask = [sys.executable, "-c", f"{claim}print(c({str(folder)!r}))"]
    holder = subprocess.Popen(
        [sys.executable, "-c", f"{claim}import sys; print(repr(c({str(folder)!r})), repr(c({str(folder)!r})), "
                               f"c({str(tmp_path / 'cache' / 'def')!r}), flush=True); sys.stdin.read()"],
        cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == (
            f"'' '' compile cache off: this process already compiled with {folder}, and MindSpore keeps one cache "
            f"folder per process; this run compiles without it")
        other = subprocess.run(ask, cwd=REPO, capture_output=True, text=True, timeout=60)
        assert other.stdout.strip() == (f"compile cache off: another process is compiling into or loading from "
                                        f"{folder / 'rank_0'}; this run compiles without it")
        rank_1 = subprocess.run(ask, cwd=REPO, capture_output=True, text=True, timeout=60,
                                env={**os.environ, "RANK_ID": "1"})
        assert rank_1.stdout.strip() == ""  # msrun's rank 1 compiles into rank_1/: its own part of the folder
    finally:
        holder.communicate("", timeout=60)
    assert subprocess.run(ask, cwd=REPO, capture_output=True, text=True, timeout=60).stdout.strip() == ""


def test_fixed_cost_phases_are_in_the_summary(tmp_path, small_corpus):
    _, summary = _train(tmp_path / "run", small_corpus, "compile_cache=false")
    cost = summary["fixed_cost_s"]
    assert set(cost) == {"start", "data", "import", "peak", "build", "compile", "total"}
    assert all(v >= 0 for v in cost.values())
    assert cost["import"] > 0.2 and cost["compile"] > 0.1  # importing MindSpore and a cold compile take time
    assert cost["total"] == pytest.approx(sum(v for k, v in cost.items() if k != "total"), abs=0.01)
    # which kernels model.kernels=auto (the default) ran with
    assert summary["kernels"] == ("native" if kernels.library_problem() == "" else "mindspore")


def test_a_run_in_a_process_without_an_entry_script_trains_with_the_cache_off_and_says_why(tmp_path, small_corpus):
    """MindSpore's compile cache reads sys.argv[0] as a dependency of the graph: under `python -c` (or a pytest-xdist
    worker) that is no file, and compiling failed with FileNotFoundError '<cwd>/-c'."""
    code = ("import sys\nfrom helpers.run.train import Trainer\nfrom helpers.tune.study import base_config\n"
            "cfg = base_config('debug', 4, sys.argv[1], {'eval_every': 0, 'eval_batches': 2, 'steady_after': 2,"
            " 'compile_cache_path': sys.argv[3]})\n"
            "Trainer(cfg, sys.argv[2]).run()\n")
    proc = subprocess.run([sys.executable, "-c", code, str(small_corpus), str(tmp_path / "run"),
                           str(tmp_path / "cache")], capture_output=True, text=True, cwd=tmp_path, timeout=300,
                          env=dict(os.environ, GLOG_v="3", PYTHONPATH=str(REPO)))
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = load_run(tmp_path / "run").summary
    assert summary["status"] == "ok" and summary["compile_cache_off"].startswith(
        f"compile cache off: this process has no entry script file ('{tmp_path}/-c' when MindSpore was imported)")
    assert not (tmp_path / "cache").exists()
