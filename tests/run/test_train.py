"""Real MindSpore training runs (tiny models, seconds each), each in its own process."""
from __future__ import annotations

import math
import shutil
from pathlib import Path

import numpy as np
import pytest

from helpers.record import SUMMARY_KEYS, load_run
from tests.conftest import run_cli, tiny_args

pytestmark = pytest.mark.slow


def test_loss_falls_on_tiny_shakespeare_and_summary_is_complete(tmp_path):
    out = tmp_path / "run"
    proc = run_cli("train", *tiny_args("tinyshakespeare", 60, "eval_every=30"), "--out", str(out),
                   "--progress", "none")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("ok · 60 steps")
    record = load_run(out)
    s = record.summary
    for key in SUMMARY_KEYS:
        assert key in s, key
        if key != "status_reason":
            assert s[key] is not None, key
    assert s["loss_first"] > 3.9 and s["loss_last"] < 3.2
    assert 0 < s["mfu"] < 1 and s["peak_flops"] > 1e9
    assert s["step_time_ms_p10"] <= s["step_time_ms"] <= s["step_time_ms_p90"]
    assert s["compile_s"] > s["step_time_ms"] / 1000
    assert 0 <= s["data_wait_share"] < 1 and s["peak_memory_bytes"] > 100 * 2**20
    # CPU: the gate's figure is process RSS, named as such; MindSpore's device counters are not recorded
    assert s["memory_source"] == "process RSS" and s["peak_rss_bytes"] == s["peak_memory_bytes"]
    assert s["peak_device_memory_bytes"] is None and all(r["device_memory_bytes"] is None for r in record.metrics)
    assert [r["step"] for r in record.metrics] == list(range(1, 61))
    assert [r["step"] for r in record.metrics if r["val_loss"] is not None] == [30, 60]
    assert math.isclose(record.metrics[-1]["val_ppl"], math.exp(record.metrics[-1]["val_loss"]), rel_tol=1e-6)
    assert (out / "tokenizer.json").is_file() and record.checkpoints()
    assert record.env["packages"]["mindspore"] == "2.10.0"


def test_lr_too_high_stops_with_nan_status_and_reason(tmp_path, small_corpus):
    out = tmp_path / "nan"
    proc = run_cli("train", *tiny_args(small_corpus, 30, "lr=1000", "warmup=0", "max_grad_norm=0"),
                   "--out", str(out), "--progress", "none")
    assert proc.returncode == 3
    s = load_run(out).summary
    assert s["status"] == "nan"
    assert "non-finite at step" in s["status_reason"] and "lower lr" in s["status_reason"]
    assert s["steps"] < 30


def test_resume_continues_step_count_and_loss_curve(tmp_path, small_corpus):
    full = tmp_path / "full"
    args = tiny_args(small_corpus, 16, "checkpoint_every=8", "keep_checkpoints=3")
    assert run_cli("train", *args, "--out", str(full), "--progress", "none").returncode == 0
    ckpt = full / "checkpoints" / "step_000008.ckpt"
    assert ckpt.is_file()
    resumed = tmp_path / "resumed"
    proc = run_cli("train", *args, "--set", f"resume_from={ckpt}", "--out", str(resumed), "--progress", "none")
    assert proc.returncode == 0, proc.stderr[-2000:]
    a, b = load_run(full).metrics, load_run(resumed).metrics
    assert [r["step"] for r in b] == list(range(1, 17))
    np.testing.assert_allclose([r["loss"] for r in b[8:]], [r["loss"] for r in a[8:]], rtol=1e-4)


def test_resume_command_after_interruption(tmp_path, small_corpus):
    run = tmp_path / "run"
    assert run_cli("train", *tiny_args(small_corpus, 10), "--out", str(run), "--progress", "none").returncode == 0
    proc = run_cli("resume", str(run), "--steps", "14", "--progress", "none")
    assert proc.returncode == 0, proc.stderr[-2000:]
    record = load_run(run)
    assert [r["step"] for r in record.metrics] == list(range(1, 15)) and record.status == "ok"


def test_pynative_jit_dynamic_loss_scale_and_accumulation(tmp_path, small_corpus):
    out = tmp_path / "py"
    proc = run_cli("train", *tiny_args(small_corpus, 12, "mode=pynative", "jit_level=O0", "loss_scale=dynamic",
                                       "loss_scale_value=4", "loss_scale_window=4", "grad_accum_steps=2"),
                   "--out", str(out), "--progress", "none")
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = load_run(out).metrics
    assert rows[-1]["tokens"] == 2 * 8 * 32
    assert rows[-1]["loss_scale"] > rows[0]["loss_scale"]  # the dynamic scale grew after finite windows
    assert rows[-1]["loss"] < rows[0]["loss"]


def test_amp_o2_llama_variant_recompute_and_bpe(tmp_path, small_corpus):
    out = tmp_path / "amp"
    proc = run_cli("train", *tiny_args(small_corpus, 12, "amp_level=O2", "model.norm=rmsnorm", "model.mlp=swiglu",
                                       "model.qkv=separate", "recompute=blocks", "data.tokenizer=bpe",
                                       "data.vocab_size=300", "loss_scale=static"),
                   "--out", str(out), "--progress", "none")
    assert proc.returncode == 0, proc.stderr[-2000:]
    record = load_run(out)
    assert record.status == "ok" and record.metrics[-1]["loss"] < record.metrics[0]["loss"]
    assert record.config.amp_level == "O2"


def test_bf16_on_cpu_is_refused_before_training(tmp_path):
    proc = run_cli("train", "--set", "amp_level=O2", "--set", "amp_dtype=bf16", "--out", str(tmp_path / "x"))
    assert proc.returncode == 2 and "bf16 does not run on CPU" in proc.stderr
    assert not (tmp_path / "x").exists()


def test_users_own_network_from_import_path(tmp_path, small_corpus, monkeypatch):
    shutil.copy(Path(__file__).parent.parent / "user_net.py", tmp_path / "user_net_mod.py")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    proc = run_cli("train", *tiny_args(small_corpus, 8, "model.build=user_net_mod:build"),
                   "--out", str(tmp_path / "u"), "--progress", "none")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert load_run(tmp_path / "u").summary["n_params"] < 20000


def test_checkpoint_holds_the_dynamic_loss_scale_and_resume_continues_it(tmp_path, small_corpus):
    import mindspore as ms
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    # fp16 with a scale that doubles every 2 finite steps: by step 6 it has moved away from its initial 4
    args = tiny_args(small_corpus, 10, "amp_level=O2", "loss_scale=dynamic", "loss_scale_value=4",
                     "loss_scale_window=2", "checkpoint_every=6", "keep_checkpoints=3")
    assert run_cli("train", *args, "--out", str(full), "--progress", "none").returncode == 0
    rows = load_run(full).metrics
    saved = ms.load_checkpoint(str(full / "checkpoints" / "step_000006.ckpt"))
    assert {"loss_scale", "loss_scale_counter"} <= set(saved), sorted(saved)
    assert float(saved["loss_scale"].asnumpy()) == rows[5]["loss_scale"] > 4
    ckpt = full / "checkpoints" / "step_000006.ckpt"
    proc = run_cli("train", *args, "--set", f"resume_from={ckpt}", "--out", str(resumed), "--progress", "none")
    assert proc.returncode == 0, proc.stderr[-2000:]
    again = load_run(resumed).metrics
    assert [r["loss_scale"] for r in again[6:]] == [r["loss_scale"] for r in rows[6:]]
