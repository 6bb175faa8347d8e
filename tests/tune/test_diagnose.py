"""Real tiny runs that each trigger one finding of `diagnose` / the monitors."""
from __future__ import annotations

import json
import random

import pytest

from helpers.tune.diagnose import diagnose
from helpers.record import load_run
from tests.conftest import run_cli, tiny_args

pytestmark = pytest.mark.slow


def _train(out, *args):
    return run_cli("train", *args, "--out", str(out), "--progress", "none")


def _diagnose(out):
    proc = run_cli("diagnose", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout, json.loads((out / "summary.json").read_text())


def test_healthy_run_is_balanced_without_alarms(tmp_path, small_corpus):
    out = tmp_path / "ok"
    assert _train(out, *tiny_args(small_corpus, 60, "eval_every=20")).returncode == 0
    text, summary = _diagnose(out)
    assert summary["bottleneck"] == "balanced" and summary["alarms"] == []
    assert "next round: batch_size" in text and "symptom:" not in text
    assert summary["loss_drop_per_ktok"] > 0
    assert summary["bottleneck_evidence"]["comm_step_share"] == "not applicable: single process"


def test_slow_source_is_data_bound(tmp_path, small_corpus):
    out = tmp_path / "slow"
    # 50 ms a sample (400 ms a batch) against a ~6 ms step, on one op thread: with MindSpore's default threads an
    # oversubscribed machine (four busy processes on two cores) stretched that step to 100–800 ms and the wait share
    # of a 16 ms source fell to 8–20%; on one thread under that load this source still waits 63% of the time
    assert _train(out, *tiny_args(small_corpus, 20, "data.source_delay_ms=50", "data.prefetch=2",
                                   "data.shuffle_buffer=1", "threads=1")).returncode == 0
    text, summary = _diagnose(out)
    assert summary["bottleneck"] == "data-bound", text
    assert summary["bottleneck_evidence"]["data_wait_share"] >= 0.25
    assert "next round: data_pipeline" in text and "symptom: data-bound" in text


def test_one_wide_matmul_is_compute_bound_naming_the_op(tmp_path, small_corpus):
    out = tmp_path / "mm"
    proc = run_cli("profile", *tiny_args(small_corpus, 40, "model.build=tests.matmul_net:build", "batch_size=32"),
                   "--steps", "20", "--out", str(out), "--progress", "none")
    assert proc.returncode == 0, proc.stderr[-2000:]
    text, summary = _diagnose(out)
    assert summary["bottleneck"] == "compute-bound", text
    assert summary["bottleneck_evidence"]["dominant_op"] == "MatMul"
    assert summary["bottleneck_evidence"]["dominant_op_share"] >= 0.45 and "MatMul takes" in text


def test_lr_1e3_stops_with_nan_diagnosis_and_keeps_last_checkpoint(tmp_path, small_corpus):
    out = tmp_path / "nan"
    proc = _train(out, *tiny_args(small_corpus, 30, "lr=1000", "warmup=3", "max_grad_norm=0",
                                  "checkpoint_every=1"))
    assert proc.returncode == 3
    text, summary = _diagnose(out)
    assert summary["status"] == "nan"
    (alarm,) = [a for a in summary["alarms"] if a["kind"] == "nan"]
    assert "likely cause: learning rate" in alarm["message"] and "try: lr=100" in alarm["message"]
    ckpts = sorted(p.name for p in (out / "checkpoints").glob("step_*.ckpt"))
    if ckpts:
        assert f"last good checkpoint: checkpoints/{ckpts[-1]}" in alarm["message"]
        assert int(ckpts[-1][5:11]) < alarm["step"]
    else:
        assert "no checkpoint on disk" in alarm["message"]
    assert "symptom: loss or gradients became NaN/Inf" in text


def test_callback_keeping_tensors_alive_raises_memory_growth(tmp_path, small_corpus):
    out = tmp_path / "leak"
    proc = _train(out, *tiny_args(small_corpus, 60, "monitor.callbacks=[tests.leaky_callback:factory]",
                                  "monitor.memory_window=20"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    record = load_run(out)
    (alarm,) = [a for a in record.summary["alarms"] if a["kind"] == "memory_growth"]
    assert "KiB/step" in alarm["message"]
    assert any(r["alarms"] == "memory_growth" for r in record.metrics)
    result = diagnose(record)
    assert result.bottleneck == "memory-bound" and result.evidence["rss_slope_bytes_per_step"] > 256 * 1024
    assert result.next_rounds[0].startswith("fix the leak")


def test_tiny_random_train_split_overfits(tmp_path):
    corpus = tmp_path / "random.txt"
    rng = random.Random(0)
    corpus.write_text("".join(rng.choice("abcdefghijklmnopqrst") for _ in range(3000)))
    out = tmp_path / "overfit"
    proc = _train(out, *tiny_args(corpus, 120, "batch_size=16", "lr=3e-3", "min_lr=3e-4", "warmup=10",
                                  "eval_every=20", "eval_batches=4", "data.val_fraction=0.5", "weight_decay=0"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    text, summary = _diagnose(out)
    (alarm,) = [a for a in summary["alarms"] if a["kind"] == "overfit"]
    assert "val PPL rose" in alarm["message"] and "symptom: overfitting" in text


def test_grad_norm_actions_lower_lr_and_stop(tmp_path, small_corpus):
    base = tiny_args(small_corpus, 40, "monitor.grad_norm_limit=0.01")
    assert _train(tmp_path / "log", *base).returncode == 0
    assert _train(tmp_path / "low", *base, "--set", "monitor.grad_norm_action=lower_lr").returncode == 0
    logged, lowered = load_run(tmp_path / "log"), load_run(tmp_path / "low")
    assert logged.summary["alarm_counts"]["grad_norm"] == 1 and logged.summary["lr_scale"] == 1.0
    assert lowered.summary["lr_scale"] < 1e-6 and lowered.metrics[-1]["lr"] < 1e-9
    # the scaled LR really reached the optimizer: the lowered run stops learning
    assert lowered.summary["loss_last"] > logged.summary["loss_last"] + 0.2
    proc = _train(tmp_path / "stop", *base, "--set", "monitor.grad_norm_action=stop")
    assert proc.returncode == 3
    stopped = load_run(tmp_path / "stop")
    assert stopped.status == "stopped" and stopped.summary["steps"] == 1
    assert "exceeded monitor.grad_norm_limit=0.01" in stopped.summary["status_reason"]
