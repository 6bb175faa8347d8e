"""`python -m helpers import-config`: a MindFormers-style YAML (configs/examples/llama2_7b_mindformers.yaml) maps onto
the workbook's config, every source key gets a row, what cannot be honoured is refused in one line naming the key,
the planner sizes the full recipe and `--scale nano` of it trains on CPU."""
from __future__ import annotations

import copy

import pytest
import yaml

from helpers.book.planner import Strategy, config_estimate, config_plan, estimate, model_params
from helpers.config import ConfigError, from_dict, load_config
from helpers.mindformers import import_mindformers, leaves, scaled
from helpers.record import load_run
from tests.conftest import REPO, run_cli

EXAMPLE = REPO / "configs" / "examples" / "llama2_7b_mindformers.yaml"


@pytest.fixture(scope="module")
def recipe() -> dict:
    return yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))


def test_the_llama2_7b_recipe_imports_and_the_planner_sizes_it(recipe):
    cfg = from_dict(import_mindformers(recipe).config)
    m = cfg.model
    assert (m.d_model, m.n_layer, m.n_head, m.seq_len, m.vocab_size) == (4096, 32, 32, 2048, 32000)
    assert (m.norm, m.mlp, m.bias, m.attention) == ("rmsnorm", "swiglu", False, "flash")
    assert (cfg.batch_size, cfg.micro_batch_per_device, cfg.grad_accum_steps) == (32, 4, 8)  # 4 per device × DP 8
    assert (cfg.amp_level, cfg.amp_dtype, cfg.recompute, cfg.parallel.data_parallel) == ("O2", "fp16", "blocks", 8)
    assert (cfg.mode, cfg.jit_level, cfg.device_target) == ("graph", "O1", "Ascend")
    assert (cfg.betas, cfg.lr, cfg.min_lr, cfg.schedule, cfg.steps, cfg.warmup) == ([0.9, 0.95], 3e-4, 3e-5,
                                                                                     "cosine", 2000, 20)
    assert (cfg.loss_scale, cfg.loss_scale_value, cfg.max_grad_norm) == ("dynamic", 65536.0, 1.0)
    shape, strategy = config_plan(cfg)
    assert strategy == Strategy(dp=8, micro_batch=4, recompute=True, dtype="fp16")
    assert shape.n_params == model_params(m, 32000) and 6.4e9 < shape.n_params < 6.8e9  # LLaMA2-7B: 6.74e9
    assert config_estimate(cfg) == estimate(shape, strategy)
    assert config_estimate(cfg).total > config_estimate(from_dict({**import_mindformers(recipe).config,
                                                                   "parallel": {"data_parallel": 1}})).params


def test_every_source_key_has_a_row_and_each_unused_one_says_why(recipe):
    imported = import_mindformers(recipe)
    assert [r.source for r in imported.rows] == [k for k, _ in leaves(recipe)]
    assert all(r.note for r in imported.rows if r.ours == "not used here")
    by_key = {r.source: r for r in imported.rows}
    assert by_key["parallel_config.data_parallel"].ours == "parallel.data_parallel"
    assert "rotary" in by_key["model.model_config.type"].note
    lines = imported.table().splitlines()
    assert lines[0].split()[:3] == ["source", "key", "value"] and len(lines) == len(imported.rows) + 1


@pytest.mark.parametrize("key, value, expected", [
    ("parallel_config.pipeline_stage", 4, "parallel_config.pipeline_stage=4 cannot be honoured here: pipeline_stage "
                                          "(pipeline stages) needs several processes"),
    ("parallel_config.model_parallel", 2, "parallel_config.model_parallel=2 cannot be honoured here"),
    ("model.model_config.n_kv_heads", 8, "grouped-query attention is not in the workbook's model"),
    ("lr_schedule.type", "PolynomialWithWarmUpLR", "lr_schedule.type='PolynomialWithWarmUpLR' cannot be honoured"),
    ("optimizer.type", "SGD", "the workbook trains with AdamW"),
    ("runner_config.batch_sizes", 4, "unknown MindFormers key 'runner_config.batch_sizes'; did you mean "
                                     "'runner_config.batch_size'?"),
    ("model.model_config.hiden_size", 64, "unknown MindFormers key 'model.model_config.hiden_size'; did you mean "
                                          "'model.model_config.hidden_size'?"),
])
def test_what_cannot_be_honoured_is_refused_in_one_line_naming_the_key(recipe, key, value, expected):
    bad = copy.deepcopy(recipe)
    *path, leaf = key.split(".")
    section = bad
    for part in path:
        section = section[part]
    section[leaf] = value
    with pytest.raises(ConfigError) as err:
        import_mindformers(bad)
    assert expected in str(err.value) and "\n" not in str(err.value)


def test_a_section_the_workbook_ignores_still_has_its_refusals_checked(recipe):
    rows = import_mindformers({**recipe, "moe_config": {"expert_num": 1, "capacity_factor": 1.1}}).rows
    assert [(r.source, r.ours) for r in rows if r.source.startswith("moe")] == [
        ("moe_config.expert_num", "not used here"), ("moe_config.capacity_factor", "not used here")]
    with pytest.raises(ConfigError, match="moe_config.expert_num=8 cannot be honoured here: expert_num"):
        import_mindformers({**recipe, "moe_config": {"expert_num": 8}})


def test_scale_keeps_the_recipe_and_shrinks_the_dims(recipe):
    imported = scaled(import_mindformers(recipe), "nano")
    cfg = from_dict(imported.config)
    m = cfg.model
    assert (m.preset, m.n_layer, m.n_head, m.d_model, m.seq_len, m.vocab_size) == ("nano", 4, 4, 128, 64, 0)
    assert (cfg.device_target, cfg.parallel.data_parallel, m.attention) == ("CPU", 1, "manual")
    assert (cfg.batch_size, cfg.grad_accum_steps, cfg.amp_level, cfg.recompute, m.mlp) == (32, 8, "O2", "blocks",
                                                                                          "swiglu")
    assert {r.ours for r in imported.rows if r.source == "--scale nano"} >= {"device_target=CPU",
                                                                            "parallel.data_parallel=1"}
    with pytest.raises(ConfigError, match="--scale 'huge' is not a preset"):
        scaled(import_mindformers(recipe), "huge")


def test_cli_writes_the_config_prints_the_table_and_refuses_in_one_line(tmp_path, recipe):
    out = tmp_path / "theirs.yaml"
    proc = run_cli("import-config", str(EXAMPLE), "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "runner_config.batch_size" in proc.stdout and "not used here" in proc.stdout
    assert "planner estimate at full size: 6.74 B parameters" in proc.stdout and "DP 8, micro-batch 4" in proc.stdout
    assert load_config(out) == from_dict(import_mindformers(recipe).config)
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**recipe, "parallel_config": {"pipeline_stage": 2}}))
    proc = run_cli("import-config", str(bad), "--out", str(tmp_path / "x.yaml"))
    assert proc.returncode == 2 and not (tmp_path / "x.yaml").exists()
    assert proc.stderr.strip().startswith("error: parallel_config.pipeline_stage=2 cannot be honoured here")
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_the_recipe_scaled_to_nano_trains_on_cpu(tmp_path):
    """The imported recipe at nano dims (AMP O2 fp16, dynamic loss scale, recompute, SwiGLU, RMSNorm) trains; the
    batch is cut to 4 without accumulation here only to keep the test to seconds."""
    config = tmp_path / "nano.yaml"
    assert run_cli("import-config", str(EXAMPLE), "--out", str(config), "--scale", "nano").returncode == 0
    short = ["steps=2", "steady_after=1", "warmup=1", "eval_batches=1", "grad_accum_steps=1", "batch_size=4"]
    proc = run_cli("train", "--config", str(config), *[a for s in short for a in ("--set", s)], "--out",
                   str(tmp_path / "run"), "--progress", "none")
    assert proc.returncode == 0, proc.stderr[-2000:]
    run = load_run(tmp_path / "run")
    assert run.status == "ok" and run.config.amp_level == "O2" and run.config.recompute == "blocks"
    assert all(r["loss"] < 6 for r in run.metrics)
