"""A MindSpore Transformers (MindFormers) pre-training YAML mapped onto the workbook's config
(`python -m helpers import-config`).

The mapping is data: `RULES` gives each source key the workbook key it sets and how, or why it is not used here;
`UNUSED_SECTIONS` names whole sections the workbook has no use for. A key in neither is refused (a typo, or a
setting nobody has mapped), and so is a value the workbook cannot honour (pipeline stages, tensor parallel, …), each
in one ConfigError line naming the key. `scaled` keeps the recipe and shrinks the dims to a preset for a CPU try-out.
"""
from __future__ import annotations

import difflib
import os
from dataclasses import dataclass
from typing import Any, Callable

from helpers.config import PRESETS, ConfigError, flatten, from_dict


class Refused(Exception):
    """A value the workbook cannot honour; its message says why and what to change."""


def _set(key: str, kind: type = str) -> Callable[[Any], dict]:
    return lambda v: {key: kind(v)}


def _ignore(v: Any) -> dict:
    return {}


def _only(allowed, why: str) -> Callable[[Any], dict]:
    """Not used here while at one of `allowed`; refused otherwise."""
    def check(v):
        if v not in allowed:
            raise Refused(why)
        return {}
    return check


def _dtype(v: Any) -> dict:
    levels = {"float32": {"amp_level": "O0"}, "float16": {"amp_level": "O2", "amp_dtype": "fp16"},
              "bfloat16": {"amp_level": "O2", "amp_dtype": "bf16"}}
    if v not in levels:
        raise Refused("compute_dtype must be float32, float16 or bfloat16")
    return levels[v]


def _arch(v: Any) -> dict:
    archs = {"LlamaConfig": {"model.norm": "rmsnorm", "model.mlp": "swiglu", "model.bias": False,
                             "model.positions": "rope", "model.tie_head": False},
             "GPT2Config": {"model.norm": "layernorm", "model.mlp": "gelu_tanh", "model.bias": True,
                            "model.positions": "learned", "model.tie_head": True}}
    if v not in archs:
        raise Refused(f"the workbook maps {' and '.join(archs)}; start from one of those")
    return archs[v]


def _schedule(v: Any) -> dict:
    kinds = {"CosineWithWarmUpLR": "cosine", "LinearWithWarmUpLR": "linear", "ConstantWarmUpLR": "constant",
             "CosineAnnealingLR": "cosine"}
    if v not in kinds:
        raise Refused(f"the workbook's schedules are {', '.join(kinds)} (warm-up, then cosine, linear or constant)")
    return {"schedule": kinds[v]}


def _optimizer(v: Any) -> dict:
    if v not in ("AdamW", "AdamWeightDecay", "FP32StateAdamWeightDecay", "FusedAdamWeightDecay"):
        raise Refused("the workbook trains with AdamW; use an AdamW/AdamWeightDecay optimizer")
    return {}


def _at_most_one(what: str) -> Callable[[Any], dict]:
    def check(v):
        if v not in (None, 1, 0):
            raise Refused(f"{what} needs several processes each holding a part of the model; the workbook trains "
                          f"data parallel only (one process per rank): set it to 1")
        return {}
    return check


def _off(what: str) -> Callable[[Any], dict]:
    return _only((None, False, 0), f"{what} is not available in the workbook: set it to False")


Rule = tuple[str, Callable[[Any], dict], str]  # (our key(s), value → {our key: value}, how it maps or why not)
NOT_USED = ""

RULES: dict[str, Rule] = {
    # model
    "model.model_config.type": ("model.norm, model.mlp, model.bias, model.positions, model.tie_head", _arch,
                                "its norm, MLP, biases, positions and head (LLaMA: rotary positions, a head of its "
                                "own)"),
    "model.model_config.theta": ("model.rope_theta", _set("model.rope_theta", float), ""),
    "model.model_config.seq_length": ("model.seq_len", _set("model.seq_len", int), ""),
    "model.model_config.hidden_size": ("model.d_model", _set("model.d_model", int), ""),
    "model.model_config.num_layers": ("model.n_layer", _set("model.n_layer", int), ""),
    "model.model_config.num_heads": ("model.n_head", _set("model.n_head", int), ""),
    "model.model_config.vocab_size": ("model.vocab_size", _set("model.vocab_size", int), ""),
    "model.model_config.n_kv_heads": (NOT_USED, _only((None,), "grouped-query attention is not in the workbook's "
                                                               "model: set n_kv_heads to null (one k,v per head)"), ""),
    "model.model_config.hidden_dropout_prob": ("model.dropout", _set("model.dropout", float), ""),
    "model.model_config.compute_dtype": ("amp_level, amp_dtype", _dtype,
                                         "float16/bfloat16 compute with fp32 weights is AMP O2"),
    "model.model_config.layernorm_compute_type": (NOT_USED, _only(("float32",), "norms are kept in float32 under "
                                                                  "AMP (fp32_cells)"), "norms run in fp32 (fp32_cells)"),
    "model.model_config.softmax_compute_type": ("fp32_cells", lambda v: {} if v == "float32" else
                                                {"fp32_cells": ["layernorm"]}, "softmax in fp32 unless float16"),
    "model.model_config.param_init_type": (NOT_USED, _ignore, "the workbook keeps fp32 weights (AMP casts compute)"),
    "model.model_config.rotary_dtype": (NOT_USED, _ignore, "the rotary tables are fp32 here"),
    "model.model_config.use_flash_attention": ("model.attention", lambda v: {"model.attention": "flash" if v else
                                                                             "manual"}, "flash = Ascend only"),
    "model.model_config.use_past": (NOT_USED, _off("use_past (the inference KV cache)"), "inference only"),
    "model.model_config.multiple_of": ("model.mlp_hidden", _set("mf.multiple_of", int),
                                       "LLaMA's SwiGLU width: ⌈(2/3·4·hidden_size × ffn_dim_multiplier) / multiple_of⌉ "
                                       "× multiple_of, unless intermediate_size names it"),
    "model.model_config.intermediate_size": ("model.mlp_hidden", lambda v: {} if v is None else
                                             {"model.mlp_hidden": int(v)}, ""),
    "model.model_config.ffn_dim_multiplier": ("model.mlp_hidden", lambda v: {} if v is None else
                                              {"mf.ffn_dim_multiplier": float(v)}, "see multiple_of"),
    "model.model_config.rms_norm_eps": ("model.rms_eps", _set("model.rms_eps", float), ""),
    "model.model_config.checkpoint_name_or_path": (NOT_USED, _ignore, "weights come in through init_from "
                                                                      "(Hugging Face safetensors)"),
    "model.arch.type": (NOT_USED, _ignore, "the workbook's decoder (helpers/run/model.py)"),
    # trainer
    "runner_config.batch_size": ("batch_size", _set("mf.batch_size", int), "per device; × data_parallel = global"),
    "runner_config.gradient_accumulation_steps": ("grad_accum_steps", _set("grad_accum_steps", int), ""),
    "runner_config.epochs": (NOT_USED, _ignore, "steps come from lr_schedule.total_steps, else set steps: epochs × "
                                                "dataset rows is not known at import"),
    "runner_config.sink_mode": (NOT_USED, _ignore, "the workbook feeds and times every step from the host"),
    "runner_config.sink_size": (NOT_USED, _ignore, "the workbook feeds and times every step from the host"),
    "runner_wrapper.type": (NOT_USED, _ignore, "the workbook's own step Cells (helpers/run/step.py)"),
    "runner_wrapper.scale_sense.type": ("loss_scale", lambda v: {"loss_scale": "dynamic" if "Dynamic" in str(v) else
                                                                 "static"}, ""),
    "runner_wrapper.scale_sense.loss_scale_value": ("loss_scale_value", _set("loss_scale_value", float), ""),
    "runner_wrapper.scale_sense.scale_window": ("loss_scale_window", _set("loss_scale_window", int), ""),
    "runner_wrapper.scale_sense.scale_factor": (NOT_USED, _only((2,), "the workbook's dynamic scale moves by 2"),
                                                "the dynamic scale moves by 2 here too"),
    "runner_wrapper.use_clip_grad": ("max_grad_norm", _set("mf.use_clip_grad", bool), "true: clip at max_grad_norm "
                                                                                        "(1.0 unless given)"),
    "runner_wrapper.max_grad_norm": ("max_grad_norm", _set("mf.max_grad_norm", float), ""),
    # optimizer and schedule
    "optimizer.type": (NOT_USED, _optimizer, "AdamW (nn.AdamWeightDecay) here"),
    "optimizer.beta1": ("betas[0]", _set("mf.beta1", float), ""),
    "optimizer.beta2": ("betas[1]", _set("mf.beta2", float), ""),
    "optimizer.eps": ("eps", _set("eps", float), ""),
    "optimizer.weight_decay": ("weight_decay", _set("weight_decay", float), ""),
    "optimizer.learning_rate": ("lr", _set("mf.optimizer_lr", float), "unless lr_schedule.learning_rate is given"),
    "lr_schedule.type": ("schedule", _schedule, ""),
    "lr_schedule.learning_rate": ("lr", _set("lr", float), ""),
    "lr_schedule.lr_end": ("min_lr", _set("min_lr", float), ""),
    "lr_schedule.min_lr": ("min_lr", _set("min_lr", float), ""),
    "lr_schedule.warmup_steps": ("warmup", _set("warmup", int), ""),
    "lr_schedule.warmup_ratio": ("warmup", _set("mf.warmup_ratio", float), "× steps"),
    "lr_schedule.warmup_lr_init": (NOT_USED, _only((0, 0.0), "warm-up starts at lr 0 here: set it to 0"), ""),
    "lr_schedule.total_steps": ("steps", lambda v: {"steps": int(v)} if v and int(v) > 0 else {},
                                "-1 (the dataset's size): the workbook's steps stay"),
    "lr_schedule.decay_steps": (NOT_USED, _ignore, "the decay runs to the last step here"),
    # parallel, recompute
    "parallel_config.data_parallel": ("parallel.data_parallel", _set("parallel.data_parallel", int), ""),
    "parallel_config.model_parallel": (NOT_USED, _at_most_one("model_parallel (tensor parallel)"), ""),
    "parallel_config.pipeline_stage": (NOT_USED, _at_most_one("pipeline_stage (pipeline stages)"), ""),
    "parallel_config.context_parallel": (NOT_USED, _at_most_one("context_parallel"), ""),
    "parallel_config.expert_parallel": (NOT_USED, _at_most_one("expert_parallel"), ""),
    "parallel_config.use_seq_parallel": (NOT_USED, _off("use_seq_parallel (sequence parallel)"), ""),
    "parallel_config.micro_batch_num": (NOT_USED, _ignore, "pipeline micro-batches: no pipeline here"),
    "parallel_config.vocab_emb_dp": (NOT_USED, _ignore, "the embedding is replicated (data parallel only)"),
    "parallel_config.gradient_aggregation_group": (NOT_USED, _ignore, "all-reduce fusion is parallel.comm_fusion"),
    "micro_batch_interleave_num": (NOT_USED, _at_most_one("micro_batch_interleave_num"), ""),
    "parallel.parallel_mode": (NOT_USED, _ignore, "data parallel through msrun (parallel.data_parallel)"),
    "parallel.gradients_mean": ("parallel.gradients_mean", _set("parallel.gradients_mean", bool), ""),
    "parallel.enable_parallel_optimizer": (NOT_USED, _ignore, "optimizer sharding: the planner's optimizer_shard "
                                                              "what-if, not a run setting"),
    "recompute_config.recompute": ("recompute", lambda v: {"recompute": "blocks" if v else "none"}, ""),
    "recompute_config.select_recompute": (NOT_USED, _ignore, "selective recompute is not here: whole blocks or none"),
    # context
    "context.mode": ("mode", lambda v: {"mode": "pynative" if v in (1, "PYNATIVE_MODE") else "graph"}, "0 graph, "
                                                                                                        "1 pynative"),
    "context.device_target": ("device_target", _set("device_target"), ""),
    "context.jit_config.jit_level": ("jit_level", _set("jit_level"), ""),
    "context.memory_optimize_level": ("memory_optimize", _set("memory_optimize"), ""),
    "context.max_device_memory": (NOT_USED, _ignore, "the planner estimates memory; nothing is capped"),
    "context.enable_graph_kernel": (NOT_USED, _off("enable_graph_kernel (its compiler is not on CPU)"), ""),
    # data
    "train_dataset.data_loader.type": ("data.format", _only(("MindDataset",), "the workbook reads MindRecord "
                                                                              "(MindDataset) or text"),
                                       "mindrecord when dataset_dir is given"),
    "train_dataset.data_loader.dataset_dir": ("data.corpus", _set("mf.dataset_dir"), "empty: the workbook's corpus"),
    "train_dataset.data_loader.shuffle": ("data.shuffle_buffer", lambda v: {} if v else {"data.shuffle_buffer": 1},
                                          "false = buffer 1"),
    "train_dataset.input_columns": (NOT_USED, lambda v: _only(({"input_ids"}, {"input_ids", "labels"}),
                                                              "the workbook reads input_ids and labels")(set(v)), ""),
    "train_dataset.num_parallel_workers": ("data.num_parallel_workers", _set("mf.workers", int), "capped at the cores"),
    "train_dataset.python_multiprocessing": ("data.python_multiprocessing",
                                             _set("data.python_multiprocessing", bool), ""),
    "train_dataset.prefetch_size": ("data.prefetch", _set("data.prefetch", int), ""),
    "train_dataset.batch_size": (NOT_USED, _ignore, "MindFormers takes runner_config.batch_size"),
    "seed": ("seed", _set("seed", int), ""),
    "run_mode": (NOT_USED, _only(("train",), "the workbook trains: set run_mode: train"), ""),
    "moe_config.expert_num": (NOT_USED, _at_most_one("expert_num (mixture of experts)"), ""),
}

# Keys the workbook has no use for, and why.
_GENERATION = "generation settings (inference)"
UNUSED_KEYS = {
    **{f"model.model_config.{k}": _GENERATION for k in ("repetition_penalty", "max_decode_length", "top_k", "top_p",
                                                        "do_sample", "batch_size", "is_dynamic")},
    **{f"model.model_config.{k}": "token ids of the tokenizer (the workbook's loss counts every token)"
       for k in ("bos_token_id", "eos_token_id", "pad_token_id", "ignore_token_id")},
    **{f"model.model_config.{k}": "rotary context extension: the workbook's rotary positions cover model.seq_len"
       for k in ("scaling_factor", "extend_method", "max_position_embedding")},
    **{f"model.model_config.{k}": "an Ascend kernel or layout option" for k in (
        "offset", "qkv_concat", "use_rope_slice", "fine_grain_interleave", "embedding_init_type", "fused_rms_norm",
        "use_fused_rope", "use_fused_swiglu", "parallel_optimizer", "pp_interleave_num")},
    "model.model_config.attention_dropout_prob": "attention dropout is model.dropout (hidden_dropout_prob)",
    **{f"context.{k}": "a context setting with no effect on what is trained" for k in (
        "save_graphs", "save_graphs_path", "device_id", "max_call_depth", "runtime_num_threads",
        "ascend_config", "mempool_block_size", "affinity_cpu_list")},
    **{f"parallel.{k}": "a semi-auto-parallel setting (the workbook is data parallel only)" for k in (
        "full_batch", "search_mode", "strategy_ckpt_save_file", "strategy_ckpt_config", "enable_alltoall",
        "parallel_optimizer_config", "dataset_strategy", "pipeline_config")},
    **{f"recompute_config.{k}": "fine-grained recompute (whole blocks here)" for k in (
        "parallel_optimizer_comm_recompute", "mp_comm_recompute", "recompute_slice_activation",
        "select_comm_recompute")},
    **{f"train_dataset.{k}": "a loader detail of MindFormers" for k in (
        "drop_remainder", "repeat", "numa_enable", "output_columns", "construct_args_key", "data_loader.shuffle_seed",
        "tokenizer", "text_col")},
    "trainer.type": "the workbook's trainer", "trainer.model_name": "the workbook's trainer",
    "runner_config.initial_epoch": "no epochs here", "runner_config.stop_step": "steps",
    "runner_wrapper.scale_sense.use_clip_grad": "runner_wrapper.use_clip_grad",
    "output_dir": "--out", "load_checkpoint": "init_from (Hugging Face weights)",
    "src_strategy_path_or_dir": "one process, no strategy", "auto_trans_ckpt": "no sharded checkpoints",
    "only_save_strategy": "no strategy", "resume_training": "python -m helpers resume",
    "use_parallel": "parallel.data_parallel", "remote_save_url": "records are local",
    "auto_tune": "python -m helpers autotune", "filepath_prefix": "autotune", "autotune_per_step": "autotune",
    "layer_scale": "layer-wise LR is not here", "layer_decay": "layer-wise LR is not here",
    "lr_scale_factor": "the LR is taken as given", **{k: "python -m helpers profile" for k in (
        "profile", "profile_start_step", "profile_stop_step", "init_start_profile", "profile_communication",
        "profile_memory")},
}
# Sections the workbook has no use for at all (lists of callbacks, evaluation, …).
UNUSED_SECTIONS = {
    "callbacks": "the workbook's monitors and checkpoints", "eval_callbacks": "the workbook's evaluation",
    "eval_dataset": "validation is the held-out part of the corpus", "eval_dataset_task": "as eval_dataset",
    "train_dataset_task": "restates train_dataset (a YAML alias)", "metric": "validation loss and perplexity here",
    "processor": "the workbook's tokenizers", "moe_config": "mixture of experts is not here (expert_num must be 1)",
}


@dataclass(frozen=True)
class Row:
    """One line of the mapping table: a source key and its value, the workbook key(s) it set (or "not used here"),
    and how it maps or why it is not used."""
    source: str
    value: Any
    ours: str
    note: str


@dataclass
class Imported:
    """A MindFormers YAML mapped: the workbook config (nested, as its YAML) and the mapping table."""
    config: dict
    rows: list[Row]

    def table(self) -> str:
        """The mapping table as aligned text, one source key per line."""
        cells = [("source key", "value", "workbook key", "how / why")]
        cells += [(r.source, _short(r.value), r.ours, r.note) for r in self.rows]
        widths = [max(len(c[i]) for c in cells) for i in range(3)]
        return "\n".join(f"{a:<{widths[0]}}  {b:<{widths[1]}}  {c:<{widths[2]}}  {d}".rstrip() for a, b, c, d in cells)


def _short(value: Any) -> str:
    text = str(value)
    return text if len(text) <= 40 else text[:37] + "..."


def leaves(data: dict, prefix: str = "") -> list[tuple[str, Any]]:
    """(dotted key, value) of every setting; lists and the mapped or unused sections stay whole."""
    out = []
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        ruled_inside = any(k.startswith(dotted + ".") for k in RULES)  # e.g. moe_config.expert_num is checked
        whole = dotted in UNUSED_KEYS or dotted in RULES or (dotted in UNUSED_SECTIONS and not ruled_inside)
        if isinstance(value, dict) and value and not whole:
            out += leaves(value, dotted + ".")
        else:
            out.append((dotted, value))
    return out


def _row(key: str, value: Any) -> tuple[dict, Row]:
    """What one source key sets, and its table row; a key nobody mapped or a value not honoured is refused."""
    if key not in RULES:
        why = UNUSED_KEYS.get(key) or next((note for section, note in UNUSED_SECTIONS.items()
                                            if key == section or key.startswith(section + ".")), None)
        if why is None:
            known = [*RULES, *UNUSED_KEYS, *UNUSED_SECTIONS]
            close = difflib.get_close_matches(key, known, n=1, cutoff=0.75)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            raise ConfigError(f"unknown MindFormers key '{key}'{hint} (the import maps the keys listed in "
                              f"helpers/mindformers.py); fix or remove it")
        return {}, Row(key, value, "not used here", why)
    ours, how, note = RULES[key]
    note = note or ("" if ours else "at its no-op value")
    try:
        got = how(value)
    except Refused as exc:
        raise ConfigError(f"{key}={value!r} cannot be honoured here: {exc}") from None
    except (TypeError, ValueError):
        raise ConfigError(f"{key}={value!r} is not a value the workbook can read for {ours or key}; fix it") from None
    return got, Row(key, value, ours or "not used here", note)


def _derived(raw: dict) -> dict:
    """The workbook keys of the values MindFormers spreads over several keys (mf.*)."""
    out = {k: v for k, v in raw.items() if not k.startswith("mf.")}
    dp = out.get("parallel.data_parallel", 1)
    if "mf.batch_size" in raw:
        out["batch_size"] = raw["mf.batch_size"] * dp
    if "mf.beta1" in raw or "mf.beta2" in raw:
        out["betas"] = [raw.get("mf.beta1", 0.9), raw.get("mf.beta2", 0.99)]
    if "lr" not in out and "mf.optimizer_lr" in raw:
        out["lr"] = raw["mf.optimizer_lr"]
    if raw.get("mf.use_clip_grad") is False:
        out["max_grad_norm"] = 0.0
    elif "mf.use_clip_grad" in raw or "mf.max_grad_norm" in raw:
        out["max_grad_norm"] = raw.get("mf.max_grad_norm", 1.0)
    if "mf.warmup_ratio" in raw and "warmup" not in out:
        out["warmup"] = round(raw["mf.warmup_ratio"] * out.get("steps", from_dict({}).steps))
    if raw.get("mf.dataset_dir"):
        out.update({"data.format": "mindrecord", "data.corpus": [raw["mf.dataset_dir"]]})
    if "mf.workers" in raw:
        out["data.num_parallel_workers"] = max(1, min(raw["mf.workers"], os.cpu_count() or 1))
    if "mf.multiple_of" in raw and "model.mlp_hidden" not in out and out.get("model.mlp") == "swiglu":
        width = int(2 * 4 * out.get("model.d_model", from_dict({}).model.d_model) / 3)
        width = int(raw.get("mf.ffn_dim_multiplier", 1.0) * width)
        out["model.mlp_hidden"] = raw["mf.multiple_of"] * -(-width // raw["mf.multiple_of"])
    if any(k.startswith("model.") for k in out):
        out["model.preset"] = "custom"
    return out


def nested(flat: dict) -> dict:
    """{'model.n_layer': 4, 'lr': 1e-3} → {'model': {'n_layer': 4}, 'lr': 1e-3} (the config YAML's shape)."""
    out: dict = {}
    for key, value in flat.items():
        head, _, tail = key.partition(".")
        if tail:
            out.setdefault(head, {})[tail] = value
        else:
            out[key] = value
    return out


def import_mindformers(data: dict) -> Imported:
    """Map a MindFormers YAML (loaded as a dict) onto a validated workbook config; ConfigError (one line, naming
    the key) for an unknown key, a value that cannot be honoured, or a config the workbook refuses."""
    if not isinstance(data, dict):
        raise ConfigError("a MindFormers YAML must be a mapping of sections (model, runner_config, …)")
    raw, rows = {}, []
    for key, value in leaves(data):
        got, row = _row(key, value)
        raw.update(got)
        rows.append(row)
    config = nested(dict(sorted(_derived(raw).items())))
    from_dict(config)  # validated now: a recipe the workbook refuses fails here, in its own one line
    return Imported(config, rows)


def flat(config: dict) -> dict:
    """The inverse of `nested`: {'model': {'n_layer': 4}} → {'model.n_layer': 4}."""
    out = {}
    for key, value in config.items():
        if isinstance(value, dict):
            out.update({f"{key}.{k}": v for k, v in value.items()})
        else:
            out[key] = value
    return out


# What a CPU try-out (`scaled`) changes beyond the dims: key → (new value, or a function of the old one; why).
CPU_TRYOUT: dict[str, tuple[Any, str]] = {
    "device_target": ("CPU", "a CPU try-out"),
    "parallel.data_parallel": (1, "one process; batch_size stays the recipe's global batch"),
    "jit_level": (lambda v: "O1" if v == "O2" else v, "jit_level O2 is Ascend only"),
    "memory_optimize": ("O0", "an Ascend memory-pool level"),
    "model.attention": ("manual", "flash attention is Ascend only"),
    "amp_dtype": (lambda v: "fp16" if v == "bf16" else v, "bf16 does not run on CPU"),
    "model.vocab_size": (0, "the workbook tokenizer's vocabulary"),
    "model.mlp_hidden": (0, "the preset's own feed-forward width"),
    "data.format": ("text", "the workbook's corpus"),
    "data.corpus": (["tinyshakespeare"], "the workbook's corpus"),
}


def scaled(imported: Imported, preset: str) -> Imported:
    """The same recipe at a preset's dims (model.n_layer, n_head, d_model, seq_len) on CPU, one process; the
    changes are added to the table as rows of '--scale PRESET'."""
    if preset not in PRESETS:
        raise ConfigError(f"--scale {preset!r} is not a preset; choose one of {', '.join(PRESETS)}")
    config = flat(imported.config)
    changes = {"model.preset": (preset, f"the {preset} preset's dims"),
               **{f"model.{k}": (v, f"the {preset} preset") for k, v in PRESETS[preset].items()}, **CPU_TRYOUT}
    rows, defaults = list(imported.rows), flatten(from_dict({}))
    for key, (new, why) in changes.items():
        old = config.get(key, defaults[key])
        value = new(old) if callable(new) else new
        if old != value:
            rows.append(Row(f"--scale {preset}", old, f"{key}={value}", why))
            config[key] = value
    result = nested(config)
    from_dict(result)
    return Imported(result, rows)


def read_yaml(path: str) -> dict:
    """A MindFormers YAML file as a dict; one ConfigError line when it is missing or not YAML."""
    import yaml
    try:
        with open(path, encoding="utf-8") as fh:
            return yaml.safe_load(fh) or {}
    except OSError as exc:
        raise ConfigError(f"cannot read {path!r} ({exc.strerror}); pass a MindFormers YAML file") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise ConfigError(f"{path!r} is not valid YAML{where}; fix its syntax") from None


def config_yaml(imported: Imported, source: str, scale: str = "") -> str:
    """The workbook YAML of an import, headed by where it came from."""
    import yaml
    how = f" --scale {scale}" if scale else ""
    return (f"# Imported from {source} by `python -m helpers import-config{how}` (the same command prints the "
            f"mapping table).\n" + yaml.safe_dump(imported.config, sort_keys=False))
