"""Keys and sections of a MindFormers YAML that have no meaning for a CPU workbook, each with why (a row of the
mapping table, never an error)."""
from __future__ import annotations

_PARALLEL = "a semi-auto-parallel setting (the workbook is data parallel only)"
_CONTEXT = "a context setting with no effect on what is trained"

IGNORED_KEYS: dict[str, str] = {
    **{f"context.{k}": _CONTEXT for k in (
        "save_graphs", "save_graphs_path", "device_id", "max_call_depth", "runtime_num_threads", "ascend_config",
        "mempool_block_size", "affinity_cpu_list")},
    **{f"parallel.{k}": _PARALLEL for k in (
        "full_batch", "search_mode", "strategy_ckpt_save_file", "strategy_ckpt_config", "enable_alltoall",
        "parallel_optimizer_config", "dataset_strategy", "pipeline_config")},
    **{f"recompute_config.{k}": "fine-grained recompute (whole blocks here)" for k in (
        "parallel_optimizer_comm_recompute", "mp_comm_recompute", "recompute_slice_activation",
        "select_comm_recompute")},
    **{f"train_dataset.{k}": "a loader detail of MindFormers" for k in (
        "drop_remainder", "repeat", "numa_enable", "output_columns", "construct_args_key", "tokenizer", "text_col",
        "column_order", "transforms", "text_transforms")},
    "model.arch.auto_register": "where MindFormers finds its classes",
    "trainer.type": "the workbook's trainer", "trainer.model_name": "the workbook's trainer",
    "runner_config.initial_epoch": "no epochs here", "runner_config.stop_step": "steps",
    "runner_wrapper.scale_sense.use_clip_grad": "runner_wrapper.use_clip_grad",
    "output_dir": "--out", "load_checkpoint": "init_from (Hugging Face weights)",
    "load_ckpt_format": "init_from reads Hugging Face safetensors", "src_strategy_path_or_dir": "one process, no "
    "strategy", "auto_trans_ckpt": "no sharded checkpoints", "only_save_strategy": "no strategy",
    "resume_training": "python -m helpers resume", "ignore_data_skip": "resume continues the data order exactly",
    "use_parallel": "parallel.data_parallel", "remote_save_url": "records are local",
    "auto_tune": "python -m helpers autotune", "filepath_prefix": "autotune", "autotune_per_step": "autotune",
    "transform_process_num": "checkpoint conversion", "input_data": "a generation prompt (inference)", "remove_redundancy": "checkpoints are whole here",
    "print_separate_loss": "the record's metrics table holds the loss", "train_precision_sync": "an Ascend "
    "determinism switch", "infer_precision_sync": "an Ascend determinism switch",
    **{k: "python -m helpers profile" for k in (
        "profile", "profile_start_step", "profile_stop_step", "init_start_profile", "profile_communication",
        "profile_memory", "profiler_level")},
}
# Sections the workbook has no use for at all, and why; keys inside them that do matter are checked (a converter
# named for them wins over the section).
IGNORED_SECTIONS: dict[str, str] = {
    "callbacks": "the workbook's monitors and checkpoints", "eval_callbacks": "the workbook's evaluation",
    "eval_dataset": "validation is the held-out part of the corpus", "eval_dataset_task": "as eval_dataset",
    "train_dataset_task": "restates train_dataset (a YAML alias)", "metric": "validation loss and perplexity here",
    "processor": "the workbook's tokenizers", "moe_config": "mixture of experts is not here (expert_num must be 1)",
    "monitor_config": "the workbook's monitors (monitor.*)", "kernel_launch_group": "an Ascend launch setting",
    "context.ascend_config": "Ascend only",
}
