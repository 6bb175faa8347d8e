"""The workbook settings MindFormers spreads over several keys (the intermediate `mf.*` values of the key
tables): global batch, betas, clipping, MLP width, grouped heads, rotary base and scaling, evaluation cadence,
fine-tuning weights, data source."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from helpers.config import from_dict
from helpers.mindformers.values import NULL

Note = tuple[str, Any, str, str]          # (source, value, workbook key, why) → a table row
Refusal = tuple[str, Any, str, str]       # (source, value, why, what --scale does instead)

M = "model.model_config."
_GELU = ("gelu", "fast_gelu", "gelu_new", "gelu_pytorch_tanh")
_SWIGLU = ("silu", "swiglu", "fusedswiglu")


def _mlp(raw: dict, out: dict, refusals: list) -> None:
    act = raw.get("mf.hidden_act")
    gpt2 = raw.get("mf.family") == "gpt2" or out.get("model.mlp") in ("gelu", "gelu_tanh")
    if act in _SWIGLU and not gpt2:
        out["model.mlp"] = "swiglu"
    elif act in _GELU and gpt2:
        out["model.mlp"] = "gelu_tanh"
    elif act is not None:
        refusals.append((f"{M}hidden_act", act, "this activation with this family's MLP is not in the workbook "
                                                "(SwiGLU for LLaMA-like, GELU for GPT-2); use silu or gelu", ""))
    d_model = out.get("model.d_model", from_dict({}).model.d_model)
    if "mf.expand_ratio" in raw and "model.mlp_hidden" not in out:
        out["model.mlp_hidden"] = raw["mf.expand_ratio"] * d_model
    if "mf.multiple_of" in raw and "model.mlp_hidden" not in out and out.get("model.mlp") == "swiglu":
        width = int(raw.get("mf.ffn_dim_multiplier", 1.0) * int(2 * 4 * d_model / 3))
        out["model.mlp_hidden"] = raw["mf.multiple_of"] * -(-width // raw["mf.multiple_of"])


def _attention(raw: dict, out: dict, refusals: list) -> None:
    if raw.get("mf.mqa") and "mf.mqa_groups" in raw:
        out["model.n_kv_head"] = raw["mf.mqa_groups"]
    if "mf.rope_ratio" in raw:
        out["model.rope_theta"] = 10000.0 * raw["mf.rope_ratio"]
    defaults = from_dict({}).model
    d_model, n_head = out.get("model.d_model", defaults.d_model), out.get("model.n_head", defaults.n_head)
    head = raw.get("mf.head_dim")
    if head and n_head and head * n_head != d_model:
        refusals.append((f"{M}head_dim", head, f"heads of {head} ≠ hidden_size / num_heads = {d_model}/{n_head}: "
                                               f"the workbook's heads are hidden_size / num_heads wide; import with "
                                               f"--scale PRESET for a try-out", "heads of d_model / n_head"))
    fraction = raw.get("mf.rotary_fraction")
    if fraction is not None and fraction != 1.0:
        refusals.append((f"{M}rotary_pct", fraction, f"this family's rotary positions turn {fraction:g} of each "
                                                     f"head; the workbook's turn whole heads; import with --scale "
                                                     f"PRESET for a try-out", "rotary positions over whole heads"))
    head_size = d_model // max(1, n_head)
    if out.get("model.attention") == "flash" and (head_size % 16 or out.get("model.dropout", 0.0) > 0):
        out["model.attention"] = "manual"
        refusals.append((f"{M}use_flash_attention", True, f"the workbook's flash attention needs heads of a "
                                                          f"multiple of 16 (here {head_size}) and no dropout (here "
                                                          f"{out.get('model.dropout', 0.0):g}): set "
                                                          f"use_flash_attention: False",
                         "manual attention (flash is Ascend only)"))
    method = raw.get("mf.extend_method")
    factor = raw.get("mf.scaling_factor")
    if method == "PI":
        out["model.rope_scaling"], out["model.rope_scaling_factor"] = "linear", float(factor or 1.0)
    elif method not in NULL:
        refusals.append((f"{M}extend_method", method, f"rotary context extension {method} is not in the workbook "
                                                      f"(linear position interpolation, PI, is): use PI or None",
                         "no rope scaling (the try-out's context is short)"))


def _training(raw: dict, out: dict, notes: list, refusals: list) -> None:
    dp = out.get("parallel.data_parallel", 1)
    if "mf.batch_size" in raw:
        out["batch_size"] = raw["mf.batch_size"] * dp
    if "mf.beta1" in raw or "mf.beta2" in raw:
        out["betas"] = [raw.get("mf.beta1", 0.9), raw.get("mf.beta2", 0.999)]
    if "lr" not in out and "mf.optimizer_lr" in raw:
        out["lr"] = raw["mf.optimizer_lr"]
    if raw.get("mf.use_clip_grad") is False:
        out["max_grad_norm"] = 0.0
    elif "mf.use_clip_grad" in raw or "mf.max_grad_norm" in raw:
        out["max_grad_norm"] = raw.get("mf.max_grad_norm", 1.0)
    if raw.get("mf.fixed_scale") and out.get("loss_scale") == "dynamic":
        out["loss_scale"] = "static"  # a dynamic scale whose factor is 1 never moves
    if "warmup" in out and out.get("warmup_ratio"):
        notes.append(("lr_schedule.warmup_ratio", out.pop("warmup_ratio"), "not used here",
                      "warmup_steps is given, and MindFormers takes it over warmup_ratio"))
    elif out.get("warmup_ratio"):
        out.pop("warmup", None)
    if raw.get("mf.polynomial"):
        power = raw.get("mf.power", 1.0)
        if power == 1.0:
            out["schedule"] = "linear"
        else:
            refusals.append(("lr_schedule.power", power, "polynomial decay of power ≠ 1 is not one of the "
                                                         "workbook's schedules (cosine, linear = power 1, "
                                                         "constant, wsd): use power 1 or CosineWithWarmUpLR", ""))
    if raw.get("mf.do_eval") is False:
        out["eval_every"] = 0
    elif raw.get("mf.do_eval") and raw.get("mf.eval_steps", 0) > 0:
        out["eval_every"] = raw["mf.eval_steps"]


def _data(raw: dict, out: dict, notes: list) -> None:
    loader = raw.get("mf.loader")
    if raw.get("mf.dataset_dir"):
        out.update({"data.format": "mindrecord", "data.corpus": [raw["mf.dataset_dir"]]})
    elif loader is not None:
        what = ("MindRecord with no dataset_dir" if loader == "MindDataset" else
                f"{loader} reads a format the workbook does not")
        notes.append(("train_dataset.data_loader.type", loader, "data.corpus",
                      f"{what}: the workbook's corpus trains instead; set data.corpus (text, or MindRecord from "
                      f"`python -m helpers prepare --to mindrecord`)"))
    if "mf.workers" in raw:
        out["data.num_parallel_workers"] = max(1, min(raw["mf.workers"], os.cpu_count() or 1))


def _weights(raw: dict, out: dict, notes: list, refusals: list, hf_found: bool) -> None:
    folder = raw.get("mf.pretrained_dir")
    has_weights = bool(folder) and any(Path(str(folder)).glob("*.safetensors"))
    if raw.get("mf.finetune"):
        if has_weights:
            out["init_from"] = str(folder)
        else:
            notes.append(("run_mode", "finetune", "not used here",
                          "fine-tuning starts from weights; none in Hugging Face safetensors are named here: set "
                          "init_from=<a Hugging Face folder> (the run trains from scratch without it)"))
    if raw.get("mf.mcore") and folder and not hf_found and "model.n_layer" not in out:
        refusals.append(("pretrained_model_dir", folder, "the mcore model's dims come from its config.json, which "
                                                         "is not on this machine: point pretrained_model_dir at a "
                                                         "local Hugging Face folder, or import with --scale PRESET",
                         "the preset's dims (no config.json here)"))


def derive(raw: dict, hf_found: bool = False) -> tuple[dict, list[Note], list[Refusal]]:
    """The workbook settings of the raw converted values: (settings, extra table rows, refusals)."""
    out = {k: v for k, v in raw.items() if not k.startswith("mf.")}
    notes: list[Note] = []
    refusals: list[Refusal] = []
    _mlp(raw, out, refusals)
    _attention(raw, out, refusals)
    _training(raw, out, notes, refusals)
    _data(raw, out, notes)
    _weights(raw, out, notes, refusals, hf_found)
    if any(k.startswith("model.") for k in out):
        out["model.preset"] = "custom"
    return out, notes, refusals
