"""`python -m helpers import-config`: MindFormers YAMLs of both schemas (configs/examples/llama2_7b_mindformers.yaml,
legacy; configs/examples/qwen2_5_0_5b_mcore.yaml, mcore) map onto the workbook's config; every source key gets a row,
everything that cannot be honoured is reported at once, MindFormers' own defaults are taken and said, and `--scale`
turns what only a cluster can run into noted reductions."""
from __future__ import annotations

import copy
import json

import pytest
import yaml

from helpers.book.planner import Strategy, config_estimate, config_plan, estimate, model_params
from helpers.config import ConfigError, from_dict, load_config, with_changes
from helpers.mindformers import import_mindformers, leaves, scaled
from helpers.record import load_run
from tests.conftest import REPO, run_cli

LEGACY = REPO / "configs" / "examples" / "llama2_7b_mindformers.yaml"
MCORE = REPO / "configs" / "examples" / "qwen2_5_0_5b_mcore.yaml"


@pytest.fixture(scope="module")
def recipe() -> dict:
    return yaml.safe_load(LEGACY.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def mcore() -> dict:
    return yaml.safe_load(MCORE.read_text(encoding="utf-8"))


def _set(data: dict, key: str, value) -> dict:
    out = copy.deepcopy(data)
    *path, leaf = key.split(".")
    section = out
    for part in path:
        section = section.setdefault(part, {})
    section[leaf] = value
    return out


def _drop(data: dict, key: str) -> dict:
    out = copy.deepcopy(data)
    *path, leaf = key.split(".")
    section = out
    for part in path:
        section = section[part]
    del section[leaf]
    return out


def test_the_legacy_llama2_7b_recipe_imports_and_the_planner_sizes_it(recipe):
    cfg = from_dict(import_mindformers(recipe).config)
    m = cfg.model
    assert (m.d_model, m.n_layer, m.n_head, m.seq_len, m.vocab_size) == (4096, 32, 32, 2048, 32000)
    assert (m.norm, m.mlp, m.bias, m.attention, m.rms_eps) == ("rmsnorm", "swiglu", False, "flash", 1e-5)
    assert (cfg.batch_size, cfg.micro_batch_per_device, cfg.grad_accum_steps) == (32, 4, 8)  # 4 per device × DP 8
    assert (cfg.amp_level, cfg.amp_dtype, cfg.recompute, cfg.parallel.data_parallel) == ("O2", "fp16", "blocks", 8)
    assert (cfg.mode, cfg.jit_level, cfg.device_target) == ("graph", "O1", "Ascend")
    assert (cfg.betas, cfg.lr, cfg.min_lr, cfg.schedule, cfg.steps) == ([0.9, 0.95], 3e-4, 3e-5, "cosine", 2000)
    assert (cfg.warmup_ratio, cfg.warmup_steps) == (0.01, 20)
    assert (cfg.loss_scale, cfg.loss_scale_value, cfg.max_grad_norm) == ("dynamic", 65536.0, 1.0)
    shape, strategy = config_plan(cfg)
    assert strategy == Strategy(dp=8, micro_batch=4, recompute=True, dtype="fp16")
    assert shape.n_params == model_params(m, 32000) and abs(shape.n_params / 6.738e9 - 1) < 0.01  # LLaMA2-7B
    assert config_estimate(cfg) == estimate(shape, strategy)


def test_the_mcore_qwen2_5_recipe_imports_as_written_with_grouped_heads_and_qkv_bias(mcore):
    imported = import_mindformers(mcore)
    cfg = from_dict(imported.config)
    m = cfg.model
    assert (m.n_layer, m.d_model, m.n_head, m.n_kv_head, m.mlp_hidden, m.vocab_size) == (24, 896, 14, 2, 4864, 151936)
    assert (m.qkv_bias, m.bias, m.tie_head, m.rope_theta, m.norm, m.mlp) == (True, False, True, 1e6, "rmsnorm",
                                                                             "swiglu")
    assert (cfg.amp_dtype, cfg.parallel.data_parallel, cfg.batch_size, cfg.eval_every) == ("bf16", 8, 32, 0)
    assert imported.reductions == []
    assert abs(config_plan(cfg)[0].n_params / 0.494e9 - 1) < 0.01  # Qwen2.5-0.5B: 494 M parameters
    by_key = {r.source: r for r in imported.rows}
    assert by_key["use_legacy"].ours == "(schema)"
    assert "the workbook's corpus trains instead" in by_key["train_dataset.data_loader.type"].note


def test_every_source_key_has_a_row_and_each_unused_one_says_why(recipe, mcore):
    for data in (recipe, mcore):
        imported = import_mindformers(data)
        sources = [r.source for r in imported.rows]
        assert [k for k, _ in leaves(data)] == [s for s in sources if s in dict(leaves(data))][:len(leaves(data))]
        assert all(r.note for r in imported.rows if r.ours == "not used here")
        lines = imported.table().splitlines()
        assert lines[0].split()[:3] == ["source", "key", "value"] and len(lines) == len(imported.rows) + 1


def test_every_refusal_is_reported_at_once_each_with_why(recipe):
    bad = _set(_set(_set(recipe, "optimizer.type", "SGD"), "model.model_config.hiden_size", 64),
               "lr_schedule.type", "CosineWithRestartsLR")
    with pytest.raises(ConfigError) as err:
        import_mindformers(bad, source="bad.yaml")
    text = str(err.value)
    assert text.startswith("bad.yaml: 3 keys cannot be honoured here (nothing written):")
    assert "optimizer.type=SGD: the workbook trains with AdamW" in text
    assert "model.model_config.hiden_size=64: not a key the import knows; did you mean " \
           "'model.model_config.hidden_size'?" in text
    assert "lr_schedule.type=CosineWithRestartsLR: the import maps the schedules" in text
    assert len(text.splitlines()) == 4


@pytest.mark.parametrize("key, value, line", [
    ("model.model_config.num_layers", 2.5, "num_layers=2.5: must be a whole number, not 2.5"),
    ("model.model_config.num_layers", True, "num_layers=True: must be a whole number, not True"),
    ("runner_config.batch_size", 2.5, "batch_size=2.5: must be a whole number, not 2.5"),
    ("model.model_config.multiple_of", 0, "multiple_of=0: must be a whole number ≥ 1, not 0"),
    ("model.model_config.multiple_of", -256, "multiple_of=-256: must be a whole number ≥ 1"),
    ("model.model_config.ffn_dim_multiplier", float("nan"), "ffn_dim_multiplier=nan: must be a finite number > 0"),
    ("model.model_config.ffn_dim_multiplier", -1.0, "ffn_dim_multiplier=-1.0: must be a finite number > 0"),
])
def test_a_count_or_factor_that_would_be_cut_or_divide_by_zero_is_refused_even_under_scale(recipe, key, value, line):
    """int(2.5) is 2 and int(True) is 1: a count is read whole or refused, never cut; the SwiGLU width's factors
    must be > 0 (multiple_of 0 divided by zero, -256 gave 10752 wide instead of 11008)."""
    for reduce in (False, True):
        with pytest.raises(ConfigError, match="1 key cannot be honoured") as err:
            import_mindformers(_set(recipe, key, value), reduce=reduce)
        assert line in str(err.value), str(err.value)
    m = from_dict(import_mindformers(_set(recipe, "model.model_config.num_layers", 32.0)).config).model
    assert (m.n_layer, m.mlp_hidden) == (32, 11008)  # 32.0 is whole; LLaMA-2-7B's width from multiple_of 256


@pytest.mark.parametrize("key, value, line", [
    ("parallel_config.pipeline_stage", 4, "pipeline_stage (pipeline stages) splits the model over several devices"),
    ("parallel_config.model_parallel", 2, "model_parallel (tensor parallel) splits the model"),
    ("moe_config.expert_num", 8, "mixture of experts is not in the workbook's model"),
    ("model.model_config.extend_method", "NTK", "rotary context extension NTK is not in the workbook"),
])
def test_what_only_a_cluster_runs_is_refused_at_full_size_and_a_noted_reduction_under_scale(recipe, key, value, line):
    bad = _set(recipe, key, value)
    with pytest.raises(ConfigError, match="1 key cannot be honoured") as err:
        import_mindformers(bad)
    assert line in str(err.value) and "\n" not in str(err.value)
    reduced = scaled(import_mindformers(bad, reduce=True), "nano")
    row = next(r for r in reduced.rows if r.source == key and r.ours.startswith("--scale: "))
    assert line in row.note
    assert from_dict(reduced.config).device_target == "CPU"


def test_a_value_that_is_no_size_question_stays_refused_under_scale(recipe):
    bad = _set(recipe, "model.model_config.pet_config", {"pet_type": "lora", "lora_rank": 8})
    with pytest.raises(ConfigError, match="parameter-efficient fine-tuning \\(lora\\) is not in the workbook"):
        import_mindformers(bad, reduce=True)


def test_a_recipe_for_another_kind_of_model_is_refused_in_one_line(recipe):
    bert = _set(recipe, "model.model_config.type", "BertConfig")
    with pytest.raises(ConfigError) as err:
        import_mindformers(bert, source="bert.yaml")
    assert str(err.value).startswith("bert.yaml cannot be imported: model.model_config.type=BertConfig: BertConfig "
                                     "is not one of the model families")
    assert "\n" not in str(err.value)


def test_mindformers_defaults_are_taken_and_said_where_they_differ_from_ours(recipe):
    bare = _drop(_drop(_drop(_drop(recipe, "optimizer.weight_decay"), "optimizer.beta1"), "optimizer.beta2"),
                 "lr_schedule.lr_end")
    bare = _drop(_drop(bare, "parallel.gradients_mean"), "runner_wrapper.use_clip_grad")
    imported = import_mindformers(bare)
    cfg = from_dict(imported.config)
    assert (cfg.weight_decay, cfg.betas, cfg.min_lr, cfg.parallel.gradients_mean, cfg.max_grad_norm) == (
        0.0, [0.9, 0.999], 0.0, False, 0.0)
    noted = {r.source: r.note for r in imported.rows if r.source.endswith("(absent)")}
    assert "the workbook's is 0.1" in noted["optimizer.weight_decay (absent)"]
    assert "[0.9, 0.99]" in noted["optimizer.betas (absent)"]
    assert {"lr_schedule.lr_end (absent)", "parallel.gradients_mean (absent)", "do_eval (absent)",
            "runner_wrapper.use_clip_grad (absent)"} <= set(noted)


def test_warmup_ratio_stays_a_ratio_so_a_later_steps_recomputes_it(recipe):
    cfg = from_dict(import_mindformers(recipe).config)
    assert cfg.warmup_steps == 20 and with_changes(cfg, {"steps": 500}).warmup_steps == 5
    both = import_mindformers(_set(recipe, "lr_schedule.warmup_steps", 7))
    assert from_dict(both.config).warmup_steps == 7  # MindFormers takes warmup_steps over warmup_ratio
    assert any(r.source == "lr_schedule.warmup_ratio" and "takes it over" in r.note for r in both.rows)


@pytest.mark.parametrize("changes, expected", [
    ({"do_eval": True, "eval_step_interval": 250}, {"eval_every": 250}),
    ({"do_eval": False, "eval_step_interval": 250}, {"eval_every": 0}),
    ({"lr_schedule.type": "PolynomialWithWarmUpLR", "lr_schedule.power": 1.0}, {"schedule": "linear"}),
    ({"lr_schedule.type": "ConstantWarmUpLR"}, {"schedule": "constant"}),
    ({"runner_wrapper.scale_sense.scale_factor": 1}, {"loss_scale": "static"}),
    ({"model.model_config.n_kv_heads": 8, "model.model_config.qkv_has_bias": True}, {"model.n_kv_head": 8,
                                                                                    "model.qkv_bias": True}),
    ({"model.model_config.extend_method": "PI", "model.model_config.scaling_factor": 4.0},
     {"model.rope_scaling": "linear", "model.rope_scaling_factor": 4.0}),
    ({"model.model_config.tie_word_embeddings": True}, {"model.tie_head": True}),
])
def test_the_keys_real_recipes_always_have_are_mapped(recipe, changes, expected):
    data = recipe
    for key, value in changes.items():
        data = _set(data, key, value)
    cfg = from_dict(import_mindformers(data).config)
    for key, value in expected.items():
        section, _, leaf = key.rpartition(".")
        assert getattr(getattr(cfg, section) if section else cfg, leaf) == value


def test_polynomial_decay_other_than_linear_is_refused(recipe):
    data = _set(_set(recipe, "lr_schedule.type", "PolynomialWithWarmUpLR"), "lr_schedule.power", 2.0)
    with pytest.raises(ConfigError, match="lr_schedule.power=2.0: polynomial decay of power ≠ 1"):
        import_mindformers(data)


def test_finetune_starts_from_the_named_hugging_face_weights_or_says_it_cannot(mcore, tmp_path):
    data = _set(mcore, "run_mode", "finetune")
    rows = import_mindformers(data).rows
    assert any(r.source == "run_mode" and "set init_from=" in r.note for r in rows)
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "model.safetensors").write_bytes(b"")
    (hf / "config.json").write_text(json.dumps({"num_hidden_layers": 2, "hidden_size": 64}))
    cfg = from_dict(import_mindformers(_set(data, "pretrained_model_dir", str(hf))).config)
    assert cfg.init_from == str(hf)


def test_an_mcore_template_takes_its_dims_from_the_hugging_face_config_json(mcore, tmp_path):
    template = copy.deepcopy(mcore)
    for key in ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "intermediate_size",
                "vocab_size", "head_dim"):
        del template["model"]["model_config"][key]
    template["pretrained_model_dir"] = str(tmp_path / "absent")
    with pytest.raises(ConfigError, match="pretrained_model_dir=.*config.json, which is not on this machine"):
        import_mindformers(template)
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text(json.dumps({
        "num_hidden_layers": 3, "hidden_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
        "intermediate_size": 256, "vocab_size": 1000, "torch_dtype": "bfloat16"}))
    template["pretrained_model_dir"] = str(tmp_path / "hf")
    imported = import_mindformers(template)
    m = from_dict(imported.config).model
    assert (m.n_layer, m.d_model, m.n_head, m.n_kv_head, m.mlp_hidden, m.vocab_size) == (3, 128, 4, 2, 256, 1000)


def test_glm_turns_half_of_each_head_so_it_is_a_reduction_under_scale(recipe):
    glm = _set(recipe, "model.model_config.type", "ChatGLM2Config")
    with pytest.raises(ConfigError, match="rotary_pct=0.5: this family's rotary positions turn 0.5 of each head"):
        import_mindformers(glm)
    rows = import_mindformers(glm, reduce=True).rows
    assert any(r.ours == "--scale: rotary positions over whole heads" for r in rows)


def test_scale_keeps_the_recipe_and_shrinks_the_dims(recipe, mcore):
    imported = scaled(import_mindformers(recipe), "nano")
    cfg = from_dict(imported.config)
    m = cfg.model
    assert (m.preset, m.n_layer, m.n_head, m.d_model, m.seq_len, m.vocab_size) == ("nano", 4, 4, 128, 64, 0)
    assert (cfg.device_target, cfg.parallel.data_parallel, m.attention) == ("CPU", 1, "manual")
    assert (cfg.batch_size, cfg.grad_accum_steps, cfg.amp_level, cfg.recompute, m.mlp) == (32, 8, "O2", "blocks",
                                                                                          "swiglu")
    assert {r.ours for r in imported.rows if r.source == "--scale nano"} >= {"device_target=CPU",
                                                                            "parallel.data_parallel=1"}
    q = from_dict(scaled(import_mindformers(mcore), "nano").config).model
    assert (q.n_head, q.n_kv_head, q.qkv_bias) == (4, 1, True)  # 7 query heads per k,v head: all 4 share one
    with pytest.raises(ConfigError, match="--scale 'huge' is not a preset"):
        scaled(import_mindformers(recipe), "huge")


def test_cli_writes_the_config_prints_the_table_and_reports_refusals(tmp_path, recipe):
    out = tmp_path / "theirs.yaml"
    proc = run_cli("import-config", str(LEGACY), "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "runner_config.batch_size" in proc.stdout and "not used here" in proc.stdout
    assert "planner estimate at full size: 6.74 B parameters" in proc.stdout and "DP 8, micro-batch 4" in proc.stdout
    assert load_config(out) == from_dict(import_mindformers(recipe).config)
    again = run_cli("import-config", str(LEGACY), "--out", str(out))
    assert again.returncode == 2 and "already exists" in again.stderr and "--replace" in again.stderr
    replaced = run_cli("import-config", str(MCORE), "--out", str(out), "--replace")
    assert replaced.returncode == 0 and "aside to" in replaced.stderr
    assert load_config(out).model.n_kv_head == 2 and len(list(tmp_path.glob("theirs.yaml.replaced-*"))) == 1
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**recipe, "parallel_config": {"pipeline_stage": 2, "model_parallel": 2}}))
    proc = run_cli("import-config", str(bad), "--out", str(tmp_path / "x.yaml"))
    assert proc.returncode == 2 and not (tmp_path / "x.yaml").exists()
    assert proc.stderr.startswith(f"error: {bad}: 2 keys cannot be honoured here")
    assert "parallel_config.pipeline_stage=2" in proc.stderr and "parallel_config.model_parallel=2" in proc.stderr
    scaled_out = run_cli("import-config", str(bad), "--out", str(tmp_path / "x.yaml"), "--scale", "nano")
    assert scaled_out.returncode == 0, scaled_out.stderr[-2000:]
    assert "--scale: pipeline_stage (pipeline stages): 1" in scaled_out.stdout


@pytest.mark.slow
@pytest.mark.parametrize("example", [LEGACY, MCORE], ids=["legacy", "mcore"])
def test_the_recipe_scaled_to_nano_trains_on_cpu(tmp_path, example):
    """The imported recipe at nano dims trains; the batch is cut to 4 without accumulation here only to keep the
    test to seconds."""
    config = tmp_path / "nano.yaml"
    assert run_cli("import-config", str(example), "--out", str(config), "--scale", "nano").returncode == 0
    short = ["steps=2", "steady_after=1", "warmup=1", "warmup_ratio=0", "eval_batches=1", "grad_accum_steps=1",
             "batch_size=4"]
    proc = run_cli("train", "--config", str(config), *[a for s in short for a in ("--set", s)], "--out",
                   str(tmp_path / "run"), "--progress", "none")
    assert proc.returncode == 0, proc.stderr[-2000:]
    run = load_run(tmp_path / "run")
    assert run.status == "ok" and run.config.amp_level == "O2" and run.config.recompute == "blocks"
    assert all(r["loss"] < 7 for r in run.metrics)
