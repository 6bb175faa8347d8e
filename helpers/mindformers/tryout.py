"""A CPU try-out of an imported recipe (`import-config --scale PRESET`): the same recipe at a preset's dims, on
CPU, in one process; each change is a row of the mapping table. `adapt` combines it with `--target cpu`."""
from __future__ import annotations

from typing import Any

from helpers.config import PRESETS, ConfigError
from helpers.mindformers.changes import Change, changed, checked
from helpers.mindformers.importer import Imported
from helpers.mindformers.target import DEVICE_ONLY, TARGETS, on_cpu


def _cpu_tryout(dims: dict[str, Any]) -> dict[str, Change]:
    """What a try-out changes beyond the dims. It keeps the recipe's AMP (a try-out of its mechanics), with fp16 in
    place of bf16; --target cpu makes it fp32."""
    return {
        **DEVICE_ONLY,
        "parallel.data_parallel": (1, "one process; batch_size stays the recipe's global batch"),
        "amp_dtype": (lambda v, cfg: "fp16" if v == "bf16" and cfg.get("amp_level", "O0") != "O0" else v,
                      "bf16 does not run on CPU"),
        "model.vocab_size": (0, "the workbook tokenizer's vocabulary"),
        "model.mlp_hidden": (0, "the preset's own feed-forward width"),
        "model.n_kv_head": (lambda v, cfg: _grouped(v, cfg.get("model.n_head", 1), dims["n_head"]),
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
    dims = PRESETS[preset]
    changes = {"model.preset": (preset, f"the {preset} preset's dims"),
               **{f"model.{k}": (v, f"the {preset} preset") for k, v in dims.items()}, **_cpu_tryout(dims)}
    return checked(changed(imported, f"--scale {preset}", changes))


def adapt(imported: Imported, target: str = "", preset: str = "") -> Imported:
    """What `import-config --target TARGET --scale PRESET` makes of an import (either may be ''): --target cpu at
    the recipe's size fits data parallel to this machine; with --scale the try-out's one process replaces that."""
    if target and target not in TARGETS:
        raise ConfigError(f"--target {target!r} is not a target; choose one of {', '.join(TARGETS)}")
    if target == "cpu":
        imported = on_cpu(imported, parallel=not preset)
    return scaled(imported, preset) if preset else checked(imported)
