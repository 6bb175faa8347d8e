"""Notebook 15 (bring your own training): an imported MindFormers recipe as tables (its mapping, the planner at full
size), the recipe's CPU try-out config, and weights in and out of the Hugging Face layout."""
from __future__ import annotations

from dataclasses import asdict, replace
from pathlib import Path

import pandas as pd

from helpers.book.planner import GB, config_plan, plan_rows
from helpers.config import Config, from_dict, with_changes
from helpers.mindformers import Imported, import_mindformers, read_yaml, scaled
from helpers.paths import REPO_ROOT

EXAMPLE_RECIPE = REPO_ROOT / "configs" / "examples" / "qwen2_5_0_5b_mcore.yaml"


def load_recipe(path: str | Path = "") -> Imported:
    """A MindFormers YAML imported as written (`mindformers.import_mindformers`); '' = the committed Qwen2.5-0.5B
    recipe in the mcore layout."""
    path = str(path or EXAMPLE_RECIPE)
    return import_mindformers(read_yaml(path), source=path)


def recipe_table(imported: Imported) -> pd.DataFrame:
    """The mapping table: each source key, its value, the workbook key it set (or "not used here") and why."""
    return pd.DataFrame([{**asdict(r), "value": str(r.value)} for r in imported.rows]).set_index("source")


def recipe_plan(imported: Imported, device_gb: float = 64.0) -> pd.DataFrame:
    """The planner's per-device ESTIMATE (GB) of the recipe at full size, as imported and with optimizer sharding,
    against devices of `device_gb` GB."""
    shape, strategy = config_plan(from_dict(imported.config))
    rows = plan_rows(shape, [strategy, replace(strategy, optimizer_shard=True)], device_gb * GB)
    return pd.DataFrame(rows).drop(columns=["model"]).assign(params_B=shape.n_params / 1e9)


def tryout_config(imported: Imported, preset: str, steps: int, corpus: str, batch_size: int) -> Config:
    """The recipe at a preset's dims on CPU (`mindformers.scaled`), for `steps` steps of `batch_size` sequences
    without accumulation on `corpus`; warm-up and evaluation spaced as `study.base_config` spaces them."""
    cfg = from_dict(scaled(imported, preset).config)
    return with_changes(cfg, {"steps": steps, "warmup": max(1, steps // 5), "warmup_ratio": 0.0, "eval_every": max(1, steps // 5),
                              "eval_batches": 5, "steady_after": max(1, min(5, steps // 3)), "batch_size": batch_size,
                              "grad_accum_steps": 1, "data.corpus": [corpus]})


def from_weights(cfg: Config, weights: str | Path) -> Config:
    """cfg starting from a Hugging Face GPT-2-, LLaMA- or Qwen2-layout checkpoint: its dims and knobs
    (`hf_weights.model_settings`) and init_from."""
    from helpers.run.hf_weights import model_settings
    return with_changes(cfg, {**model_settings(weights), "init_from": str(weights)})


def export_weights(run_dir: str | Path, folder: str | Path) -> Path:
    """A run's model (its last checkpoint) written to `folder` as Hugging Face safetensors (its layout) + config.json."""
    from helpers.run.hf_weights import export_checkpoint
    export_checkpoint(run_dir, folder)
    return Path(folder)
