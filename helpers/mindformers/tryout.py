"""A CPU try-out of an imported recipe (`import-config --scale PRESET`): the same recipe at a preset's dims, on
CPU, in one process; each change is a row of the mapping table."""
from __future__ import annotations

from typing import Any

from helpers.config import PRESETS, ConfigError, flatten, from_dict
from helpers.mindformers.importer import Imported, Row, flat, nested

# What a try-out changes beyond the dims: key → (new value, or a function of the old one and the preset's dims; why).
CPU_TRYOUT: dict[str, tuple[Any, str]] = {
    "device_target": ("CPU", "a CPU try-out"),
    "parallel.data_parallel": (1, "one process; batch_size stays the recipe's global batch"),
    "jit_level": (lambda v, dims, cfg: "O1" if v == "O2" else v, "jit_level O2 is Ascend only"),
    "memory_optimize": ("O0", "an Ascend memory-pool level"),
    "model.attention": ("manual", "flash attention is Ascend only"),
    "amp_dtype": (lambda v, dims, cfg: "fp16" if v == "bf16" else v, "bf16 does not run on CPU"),
    "model.vocab_size": (0, "the workbook tokenizer's vocabulary"),
    "model.mlp_hidden": (0, "the preset's own feed-forward width"),
    "model.n_kv_head": (lambda v, dims, cfg: _grouped(v, cfg.get("model.n_head", 1), dims["n_head"]),
                        "the recipe's share of k,v heads at the preset's heads"),
    "data.format": ("text", "the workbook's corpus"),
    "data.corpus": (["tinyshakespeare"], "the workbook's corpus"),
    "init_from": ("", "full-size weights do not fit the preset's dims"),
}


def _grouped(kv: int, heads: int, preset_heads: int) -> int:
    """k,v heads at the preset's head count keeping the recipe's query heads per k,v head where they divide it, else
    one shared by all (0 = one per head, as in the recipe)."""
    if not kv or kv >= heads:
        return 0
    per_group = heads // kv
    return preset_heads // per_group if preset_heads % per_group == 0 and preset_heads >= per_group else 1


def scaled(imported: Imported, preset: str) -> Imported:
    """The same recipe at a preset's dims (model.n_layer, n_head, d_model, seq_len) on CPU, one process; the
    changes are added to the table as rows of '--scale PRESET'."""
    if preset not in PRESETS:
        raise ConfigError(f"--scale {preset!r} is not a preset; choose one of {', '.join(PRESETS)}")
    config = flat(imported.config)
    original = dict(config)
    changes = {"model.preset": (preset, f"the {preset} preset's dims"),
               **{f"model.{k}": (v, f"the {preset} preset") for k, v in PRESETS[preset].items()}, **CPU_TRYOUT}
    rows, defaults = list(imported.rows), flatten(from_dict({}))
    for key, (new, why) in changes.items():
        old = config.get(key, defaults[key])
        value = new(old, PRESETS[preset], original) if callable(new) else new
        if old != value:
            rows.append(Row(f"--scale {preset}", old, f"{key}={value}", why))
            config[key] = value
    result = nested(config)
    from_dict(result)
    return Imported(result, rows, imported.reductions)
