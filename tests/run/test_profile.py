"""The profile command on real tiny runs: MindSpore op names, shares, overhead, raw output kept."""
from __future__ import annotations

import json

import numpy as np
import pytest

from helpers.run import kernels
from helpers.run.profile import load_profile
from helpers.record import load_run
from tests.conftest import run_cli, tiny_args

pytestmark = pytest.mark.slow


def test_profile_cli_writes_op_table_shares_and_overhead(tmp_path, small_corpus):
    out = tmp_path / "prof"
    proc = run_cli("profile", *tiny_args(small_corpus, 70), "--steps", "40", "--out", str(out),
                   "--progress", "none")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "profiler overhead: " in proc.stdout and "MatMul" in proc.stdout
    report = load_profile(out)
    names = [op["name"] for op in report.ops]
    # LayerNorm's backward: MindSpore's LayerNormGrad, or a native kernel (profiled as Custom) where model.kernels=auto
    # finds the library built
    norm_grad = "Custom" if kernels.library_problem() == "" else "LayerNormGrad"
    assert {"MatMul", "BatchMatMul", norm_grad, "AdamWeightDecay"} <= set(names)
    assert report.op_source == "host kernel time (cpu_op_type_info)"  # CPU: no device table to prefer
    shares = [op["share"] for op in report.ops]
    assert 0.99 < sum(shares) <= 1.0 + 1e-9 and shares == sorted(shares, reverse=True)
    assert report.window == [4, 43] and report.steps_profiled == 40
    matmul = report.ops[names.index("MatMul")]
    assert matmul["calls_per_step"] >= 10 and matmul["avg_us"] > 0
    assert report.baseline_steps == 27 and isinstance(report.overhead_pct, float)
    assert report.comm_op_share.startswith("not applicable: single process")
    summary = load_run(out).summary
    assert summary["profile_comm_op_share"] == report.comm_op_share and "comm_share" not in summary
    assert 0 <= report.data_wait_share < 0.5
    assert (out / report.trace_file).is_file()  # Chrome trace kept for a viewer
    data = json.loads((out / "profile" / "profile.json").read_text())
    assert "not produced on CPU" in data["not_produced_on_cpu"]["device_memory"]
    assert summary["profile_top_op"] == names[0] and summary["profile_overhead_pct"] == report.overhead_pct
    assert report.frame(top=5).shape == (5, 7)


def test_profile_rejects_paths_the_profiler_cannot_take(tmp_path):
    proc = run_cli("profile", "--steps", "5", "--out", str(tmp_path / "a=b"))
    assert proc.returncode == 2 and "'=' or ','" in proc.stderr
    assert not (tmp_path / "a=b").exists()


def test_profiled_steps_stay_out_of_the_speed_figures(tmp_path, small_corpus):
    out = tmp_path / "prof"
    proc = run_cli("profile", *tiny_args(small_corpus, 24), "--steps", "8", "--out", str(out), "--progress", "none")
    assert proc.returncode == 0, proc.stderr[-2000:]
    record = load_run(out)
    s = record.summary
    assert s["profiled_steps"] == [4, 11] and s["steady_window"] == [12, 24] and s["speed_steps"] == 13
    speed = [r for r in record.metrics if r["step"] >= 12]
    assert s["tokens_per_s"] == pytest.approx(1000 * sum(r["tokens"] for r in speed)
                                              / sum(r["step_time_ms"] for r in speed))
    assert s["step_time_ms"] == pytest.approx(float(np.median([r["step_time_ms"] for r in speed])))
    # the overhead line's noise figure is this run's own spread, not a typed-in one
    times = np.array([r["step_time_ms"] for r in speed])
    p10, p90 = (np.percentile(times, q) / np.median(times) - 1 for q in (10, 90))
    assert f"spread {p10:+.1%}/{p90:+.1%} (p10/p90)" in load_profile(out).overhead_note
    assert "expect" not in proc.stdout
