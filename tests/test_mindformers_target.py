"""`import-config --target cpu`: an Ascend recipe at its own size on this machine's CPU (each change a row of the
mapping table), its combination with `--scale`, and the import's last line, which gives a command that works here
(a recipe for a device that is not here names the re-import with --target cpu)."""
from __future__ import annotations

import shlex

import pytest
import yaml

from helpers.config import ConfigError, from_dict, load_config
from helpers.mindformers import adapt, flat, import_mindformers, scaled
from helpers.mindformers.target import fit
from helpers.record import load_run
from helpers.run.devices import absent
from helpers.run.preflight import preflight
from tests.conftest import REPO, run_cli

LEGACY = REPO / "configs" / "examples" / "llama2_7b_mindformers.yaml"
MCORE = REPO / "configs" / "examples" / "qwen2_5_0_5b_mcore.yaml"
GB = 10**9

# GPT-2 small pre-training in MindFormers' legacy layout (the keys that matter of configs/gpt2/
# pretrain_gpt2_small_fp16.yaml, mindformers v1.5): batch 4 per device × data parallel 8, float16 on Ascend.
GPT2_SMALL = {
    "seed": 0, "run_mode": "train", "use_parallel": True,
    "context": {"mode": 0, "device_target": "Ascend", "device_id": 0},
    "runner_config": {"epochs": 3, "batch_size": 4, "sink_mode": True, "sink_size": 2},
    "runner_wrapper": {"type": "MFTrainOneStepCell", "use_clip_grad": True,
                       "scale_sense": {"type": "DynamicLossScaleUpdateCell", "loss_scale_value": 4294967296,
                                       "scale_factor": 2, "scale_window": 1000}},
    "parallel": {"parallel_mode": 1, "gradients_mean": True},
    "parallel_config": {"data_parallel": 8, "model_parallel": 1, "pipeline_stage": 1},
    "recompute_config": {"recompute": False},
    "model": {"model_config": {"type": "GPT2Config", "seq_length": 1024, "vocab_size": 50257, "hidden_size": 768,
                               "num_layers": 12, "num_heads": 12, "expand_ratio": 4, "hidden_act": "gelu",
                               "use_flash_attention": False, "hidden_dropout_rate": 0.1, "compute_dtype": "float16",
                               "param_init_type": "float32"},
              "arch": {"type": "GPT2LMHeadModel"}},
    "lr_schedule": {"type": "polynomial", "learning_rate": 1e-4, "lr_end": 1e-5, "warmup_steps": 0,
                    "total_steps": -1},
    "optimizer": {"type": "FusedAdamWeightDecay", "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1},
}
no_ascend = pytest.mark.skipif(not absent("Ascend"), reason="this machine has an Ascend device: Ascend configs train")


@pytest.fixture(scope="module")
def recipe() -> dict:
    return yaml.safe_load(LEGACY.read_text(encoding="utf-8"))


def _rows(imported, flag: str) -> dict[str, str]:
    """{'device_target': 'CPU', …}: what the rows of `flag` set."""
    return dict(r.ours.split("=", 1) for r in imported.rows if r.source == flag)


def _last_line(stdout: str) -> str:
    return stdout.strip().splitlines()[-1]


def test_target_cpu_keeps_the_dims_and_lists_each_change(recipe):
    full = import_mindformers(recipe)
    on_cpu = adapt(full, "cpu")
    cfg, m = from_dict(on_cpu.config), from_dict(on_cpu.config).model
    assert (m.d_model, m.n_layer, m.n_head, m.seq_len, m.vocab_size, m.mlp_hidden) == (4096, 32, 32, 2048, 32000, 11008)
    dp = fit(from_dict(full.config)).processes
    assert _rows(on_cpu, "--target cpu") == {
        "device_target": "CPU", "model.attention": "manual", "amp_level": "O0", "loss_scale": "none",
        "parallel.data_parallel": str(dp), "batch_size": str(4 * dp), "grad_accum_steps": str(64 // dp)}
    assert (cfg.device_target, cfg.amp_level, cfg.parallel.data_parallel, cfg.micro_batch_per_device) == (
        "CPU", "O0", dp, 4)
    assert cfg.global_batch == from_dict(full.config).global_batch == 256  # 4 a device × DP 8 × accumulation 8
    assert (cfg.recompute, cfg.lr, cfg.schedule, cfg.jit_level) == ("blocks", 3e-4, "cosine", "O1")  # the recipe's


def test_data_parallel_is_what_fits_the_cores_and_the_memory_and_divides_the_recipes():
    cfg = from_dict(import_mindformers(GPT2_SMALL).config)
    per = fit(cfg, cores=64, limit=10**15).per_process
    assert 10 * GB < per < 13 * GB  # the planner: fp32 weights, grads, AdamW and activations of 4 × 1024 tokens
    for cores, limit, processes in [(64, 10**15, 8), (2, 10**15, 2), (6, 10**15, 4), (3, 10**15, 2),
                                    (64, 3.5 * per, 2), (64, 1.5 * per, 1), (64, 0.5 * per, 1)]:
        assert fit(cfg, cores=cores, limit=limit).processes == processes, (cores, limit)
    assert fit(cfg, cores=64, limit=0.5 * per).copies == 0


def test_target_cpu_with_scale_is_the_scale_tryout_in_fp32(recipe):
    """--scale alone keeps the recipe's AMP (a try-out of its mechanics); with --target cpu the same try-out runs
    in fp32, and the rows say which flag made each change."""
    full = import_mindformers(recipe)
    alone, both = scaled(full, "nano"), adapt(full, "cpu", "nano")
    assert adapt(full, "", "nano").config == alone.config
    a, b = from_dict(alone.config), from_dict(both.config)
    assert {k: (v, getattr(b, k)) for k, v in vars(a).items() if getattr(b, k) != v} == {
        "amp_level": ("O2", "O0"), "loss_scale": ("dynamic", "none")}
    assert _rows(both, "--target cpu") == {"device_target": "CPU", "model.attention": "manual", "amp_level": "O0",
                                           "loss_scale": "none"}
    assert {"parallel.data_parallel": "1", "model.d_model": "128"}.items() <= _rows(both, "--scale nano").items()
    with pytest.raises(ConfigError, match="--target 'npu' is not a target; choose one of cpu"):
        adapt(full, "npu")


@no_ascend
def test_an_ascend_recipe_imported_as_written_says_to_import_it_with_target_cpu(tmp_path):
    """The last line names the import that works here, never a train command that is refused; and that import's
    own last line is a train command."""
    out = tmp_path / "mine.yaml"
    proc = run_cli("import-config", str(LEGACY), "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    line = _last_line(proc.stdout)
    assert "train it with" not in line
    assert line.startswith(f"wrote {out} for device_target=Ascend, which is not on this machine (no /dev/davinci*")
    command = line.split("to train the recipe here on CPU: ")[1]
    assert command == f"python -m helpers import-config {LEGACY} --target cpu --out {tmp_path / 'mine_cpu.yaml'}"
    again = run_cli(*shlex.split(command)[3:])
    assert again.returncode == 0, again.stderr[-2000:]
    assert load_config(tmp_path / "mine_cpu.yaml").device_target == "CPU"


def test_the_cli_writes_the_cpu_config_and_its_last_line_agrees_with_what_train_checks(tmp_path):
    out = tmp_path / "llama_cpu.yaml"
    proc = run_cli("import-config", str(LEGACY), "--target", "cpu", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    table = [line.split() for line in proc.stdout.splitlines() if line.startswith("--target cpu ")]
    assert [cells[3] for cells in table] == ["device_target=CPU", "model.attention=manual", "amp_level=O0",
                                             "loss_scale=none", "parallel.data_parallel=1", "batch_size=4",
                                             "grad_accum_steps=64"]  # 120 GB per process: one, on any machine < 240 GB
    assert out.read_text().startswith(f"# Imported from {LEGACY} by `python -m helpers import-config --target cpu`")
    cfg = load_config(out)
    assert (cfg.device_target, cfg.parallel.data_parallel, cfg.amp_level, cfg.model.d_model) == ("CPU", 1, "O0", 4096)
    try:
        preflight(cfg)
        refused = ""
    except ConfigError as exc:
        refused = str(exc)
    line = _last_line(proc.stdout)
    if refused:  # 7 B parameters in fp32 do not fit a small machine: the line says so and names a try-out
        assert line == (f"wrote {out}; as written it cannot train on this machine: {refused}; a try-out at a "
                        f"preset's dims: python -m helpers import-config {LEGACY} --target cpu --scale nano --out "
                        f"{tmp_path / 'llama_cpu_nano.yaml'}")
    else:
        assert line.startswith(f"wrote {out}; train it with: python -m helpers train --config {out} --out runs/")


def test_gpt2_small_at_its_own_size_gets_a_train_command_here(tmp_path):
    source = tmp_path / "gpt2.yaml"
    source.write_text(yaml.safe_dump(GPT2_SMALL))
    out = tmp_path / "gpt2_cpu.yaml"
    proc = run_cli("import-config", str(source), "--target", "cpu", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    cfg = load_config(out)
    dp = fit(from_dict(import_mindformers(GPT2_SMALL).config)).processes
    assert (cfg.device_target, cfg.amp_level, cfg.parallel.data_parallel, cfg.batch_size, cfg.grad_accum_steps) == (
        "CPU", "O0", dp, 4 * dp, 8 // dp)
    assert (cfg.model.d_model, cfg.model.n_layer, cfg.model.seq_len, cfg.global_batch) == (768, 12, 1024, 32)
    assert _last_line(proc.stdout).startswith(f"wrote {out}; train it with: python -m helpers train --config {out} ")


@pytest.mark.slow
def test_the_recipe_on_cpu_at_nano_dims_trains(tmp_path, recipe):
    """`--target cpu --scale nano` trains for real on CPU, in fp32 (the batch cut to 4 without accumulation only to
    keep the test to seconds)."""
    config = tmp_path / "nano.yaml"
    proc = run_cli("import-config", str(LEGACY), "--target", "cpu", "--scale", "nano", "--out", str(config))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert _last_line(proc.stdout).startswith(f"wrote {config}; train it with: python -m helpers train --config ")
    short = ["steps=3", "steady_after=1", "warmup=1", "warmup_ratio=0", "eval_batches=1", "grad_accum_steps=1",
             "batch_size=4"]
    run = run_cli("train", "--config", str(config), *[a for s in short for a in ("--set", s)], "--out",
                  str(tmp_path / "run"), "--progress", "none")
    assert run.returncode == 0, run.stderr[-2000:]
    record = load_run(tmp_path / "run")
    assert record.status == "ok" and len(record.metrics) == 3
    assert (record.config.device_target, record.config.amp_level, record.config.model.preset) == ("CPU", "O0", "nano")
    assert (record.config.recompute, record.config.model.mlp) == ("blocks", "swiglu")  # the recipe's


def test_target_cpu_changes_only_what_its_rows_name(recipe):
    full = import_mindformers(recipe)
    on_cpu = adapt(full, "cpu")
    before, after = flat(full.config), flat(on_cpu.config)
    differ = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
    assert differ == set(_rows(on_cpu, "--target cpu"))
