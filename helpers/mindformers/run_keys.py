"""The training keys of a MindFormers YAML (runner, optimizer, schedule, evaluation, parallel layout, data,
context, top level) mapped onto the workbook's config, or noted with why they have no meaning here."""
from __future__ import annotations

from typing import Any

from helpers.mindformers.model_keys import experts
from helpers.mindformers.values import Refused, flag, nothing, off, one_process, only, to

_ADAMW = ("AdamW", "AdamWeightDecay", "FP32StateAdamWeightDecay", "FusedAdamWeightDecay", "AdamWeightDecayX",
          "PmaAdamW")


def _optimizer(v: Any) -> dict:
    if str(v).lower() not in {name.lower() for name in _ADAMW}:
        raise Refused(f"the workbook trains with AdamW; use one of {', '.join(_ADAMW)}")
    return {}


# MindFormers' schedules (mindformers/core/lr) → the workbook's; polynomial is linear at power 1.
SCHEDULES = {"CosineWithWarmUpLR": "cosine", "CosineAnnealingLR": "cosine", "LinearWithWarmUpLR": "linear",
             "ConstantWarmUpLR": "constant", "PolynomialWithWarmUpLR": "mf.polynomial",
             "WarmUpStableDecayLR": "wsd", "cosine": "cosine", "linear": "linear", "constant": "constant",
             "constant_with_warmup": "constant", "polynomial": "mf.polynomial"}


def _schedule(v: Any) -> dict:
    if v not in SCHEDULES:
        raise Refused(f"the import maps the schedules {', '.join(SCHEDULES)}; pick one of those")
    return {"schedule": SCHEDULES[v]} if not SCHEDULES[v].startswith("mf.") else {"mf.polynomial": True}


def _betas(v: Any) -> dict:
    if not isinstance(v, (list, tuple)) or len(v) != 2:
        raise ValueError(v)
    return {"mf.beta1": float(v[0]), "mf.beta2": float(v[1])}


def _scale_sense(v: Any) -> dict:
    """A number is a fixed loss scale (1 = none); a mapping is a loss-scale cell (keys below)."""
    value = float(v)
    return {"loss_scale": "none"} if value == 1.0 else {"loss_scale": "static", "loss_scale_value": value}


def _scale_factor(v: Any) -> dict:
    if v in (1, 1.0):
        return {"mf.fixed_scale": True}
    if v not in (2, 2.0):
        raise Refused("the workbook's dynamic scale moves by ×2 (or stays put at scale_factor 1): set 2 or 1")
    return {}


def _run_mode(v: Any) -> dict:
    if v not in ("train", "finetune"):
        raise Refused(f"run_mode {v!r} is not training; the workbook trains: start from a pretrain or finetune "
                      f"recipe (run_mode train or finetune)")
    return {"mf.finetune": True} if v == "finetune" else {}


def _input_columns(v: Any) -> dict:
    if not isinstance(v, (list, tuple)) or "input_ids" not in v:
        raise Refused("the workbook reads input_ids (labels are input_ids shifted by one)")
    return {}


def _loader(v: Any) -> dict:
    return {"mf.loader": v}


def _eval_steps(v: Any) -> dict:
    return {"mf.eval_steps": int(v)}


def _context_mode(v: Any) -> dict:
    return {"mode": "pynative" if v in (1, "PYNATIVE_MODE") else "graph"}


def _total_steps(v: Any) -> dict:
    return {"steps": int(v)} if v is not None and int(v) > 0 else {}


_PROFILE = (nothing, "python -m helpers profile")
_LOADER_DETAIL = (nothing, "a detail of MindFormers' loader; the workbook reads data.corpus")
_MEGATRON = (nothing, "a Megatron dataset setting (a .bin/.idx the workbook does not read)")
_TOKEN_MASKS = (nothing, "the workbook's causal mask covers each whole window: no padding or per-document masks")

RUN_KEYS: dict[str, tuple] = {
    # top level
    "run_mode": (_run_mode, "finetune: init_from when pretrained_model_dir holds Hugging Face weights"),
    "use_legacy": (lambda v: {"mf.mcore": not v}, "False = the mcore schema (Hugging Face names)"),
    "pretrained_model_dir": (lambda v: {"mf.pretrained_dir": v}, "mcore: the Hugging Face folder of config.json "
                                                                 "(dims) and weights"),
    "seed": (to("seed", int), ""),
    "do_eval": (flag("mf.do_eval"), "evaluation while training; false: the workbook validates only at the end"),
    "eval_step_interval": (_eval_steps, "→ eval_every (steps)"),
    "eval_epoch_interval": (nothing, "evaluation per epoch: epochs are not known at import; eval_step_interval "
                                     "sets the cadence"),
    # runner
    "runner_config.batch_size": (to("mf.batch_size", int, bound="batch_size"), "per device; × data_parallel = global"),
    "runner_config.gradient_accumulation_steps": (to("grad_accum_steps", int), ""),
    "runner_config.epochs": (nothing, "steps come from lr_schedule.total_steps, else set steps: epochs × "
                                      "dataset rows is not known at import"),
    "runner_config.sink_mode": (nothing, "the workbook feeds and times every step from the host"),
    "runner_config.sink_size": (nothing, "the workbook feeds and times every step from the host"),
    "runner_wrapper.type": (nothing, "the workbook's own step Cells (helpers/run/step.py)"),
    "runner_wrapper.scale_sense": (_scale_sense, "a fixed loss scale; 1 = none"),
    "runner_wrapper.scale_sense.type": (lambda v: {"loss_scale": "dynamic" if "Dynamic" in str(v) else "static"},
                                        ""),
    "runner_wrapper.scale_sense.loss_scale_value": (to("loss_scale_value", float), ""),
    "runner_wrapper.scale_sense.scale_window": (to("loss_scale_window", int), ""),
    "runner_wrapper.scale_sense.scale_factor": (_scale_factor, "×2 as here; 1 = a scale that never moves (static)"),
    "runner_wrapper.sens": (_scale_sense, "a fixed loss scale; 1 = none"),
    "runner_wrapper.use_clip_grad": (flag("mf.use_clip_grad"), "true: clip at max_grad_norm (1.0 unless given)"),
    "runner_wrapper.max_grad_norm": (to("mf.max_grad_norm", float), ""),
    "runner_wrapper.enable_check_overflow": (nothing, "overflow is checked whenever a loss scale is on"),
    # optimizer and schedule
    "optimizer.type": (_optimizer, "AdamW (nn.AdamWeightDecay) here"),
    "optimizer.betas": (_betas, "→ betas"),
    "optimizer.beta1": (to("mf.beta1", float), ""), "optimizer.beta2": (to("mf.beta2", float), ""),
    "optimizer.eps": (to("eps", float), ""),
    "optimizer.weight_decay": (to("weight_decay", float), ""),
    "optimizer.learning_rate": (to("mf.optimizer_lr", float), "unless lr_schedule.learning_rate is given"),
    "lr_schedule.type": (_schedule, "cosine, linear (polynomial at power 1), constant or wsd"),
    "lr_schedule.learning_rate": (to("lr", float), ""),
    "lr_schedule.lr_end": (to("min_lr", float), ""), "lr_schedule.min_lr": (to("min_lr", float), ""),
    "lr_schedule.end_learning_rate": (to("min_lr", float), ""),
    "lr_schedule.power": (to("mf.power", float), "polynomial decay power; 1 = linear"),
    "lr_schedule.warmup_steps": (to("warmup", int), ""),
    "lr_schedule.warmup_ratio": (to("warmup_ratio", float), "kept as a ratio: a later --set steps= recomputes it"),
    "lr_schedule.warmup_lr_init": (only((0, 0.0, None), "warm-up starts at lr 0 here: set it to 0"), ""),
    "lr_schedule.total_steps": (_total_steps, "-1 (the dataset's size): the workbook's steps stay"),
    "lr_schedule.decay_steps": (nothing, "the decay runs to the last step here"),
    "lr_schedule.decay_ratio": (to("cooldown_frac", float), "WarmUpStableDecayLR: the share of the final decay"),
    "lr_scale": (off("lr_scale (learning rate scaled by the global batch)"), ""),
    "lr_scale_factor": (nothing, "the LR is taken as given (lr_scale is off)"),
    "layer_scale": (off("layer_scale (layer-wise LR decay)"), ""),
    "layer_decay": (nothing, "layer-wise LR decay; see layer_scale"),
    # parallel, recompute
    "parallel_config.data_parallel": (to("parallel.data_parallel", int), ""),
    "parallel_config.model_parallel": (one_process("model_parallel (tensor parallel)"), ""),
    "parallel_config.pipeline_stage": (one_process("pipeline_stage (pipeline stages)"), ""),
    "parallel_config.context_parallel": (one_process("context_parallel"), ""),
    "parallel_config.expert_parallel": (one_process("expert_parallel"), ""),
    "parallel_config.seq_split_num": (one_process("seq_split_num (sequence splitting)"), ""),
    "parallel_config.use_seq_parallel": (nothing, "sequence parallel splits the activations of tensor-parallel "
                                                  "layers: nothing without model_parallel > 1 (refused on its own)"),
    "parallel_config.micro_batch_num": (nothing, "pipeline micro-batches: no pipeline here"),
    "parallel_config.vocab_emb_dp": (nothing, "the embedding is replicated (data parallel only)"),
    "parallel_config.gradient_aggregation_group": (nothing, "all-reduce fusion is parallel.comm_fusion"),
    "parallel_config.optimizer_shard": (nothing, "optimizer sharding: the planner's optimizer_shard what-if"),
    "parallel_config.mem_coeff": (nothing, "a pipeline memory balance setting: no pipeline here"),
    "micro_batch_interleave_num": (one_process("micro_batch_interleave_num"), ""),
    "parallel.parallel_mode": (nothing, "data parallel through msrun (parallel.data_parallel)"),
    "parallel.gradients_mean": (flag("parallel.gradients_mean"), ""),
    "parallel.loss_repeated_mean": (nothing, "the loss is one mean over the global batch here"),
    "parallel.enable_parallel_optimizer": (nothing, "optimizer sharding: the planner's optimizer_shard what-if, "
                                                    "not a run setting"),
    "parallel.auto_pipeline": (nothing, "no pipeline here"),
    "recompute_config.recompute": (lambda v: {"recompute": "blocks" if v else "none"}, ""),
    "recompute_config.select_recompute": (nothing, "selective recompute is not here: whole blocks or none"),
    # context
    "context.mode": (_context_mode, "0 graph, 1 pynative"),
    "context.device_target": (to("device_target"), ""),
    "context.jit_config.jit_level": (to("jit_level"), ""), "context.jit_level": (to("jit_level"), ""),
    "context.memory_optimize_level": (to("memory_optimize"), ""),
    "context.max_device_memory": (nothing, "the planner estimates memory; nothing is capped"),
    "context.enable_graph_kernel": (off("enable_graph_kernel (its compiler is not on CPU)"), ""),
    # data
    "train_dataset.data_loader.type": (_loader, "MindDataset → data.format mindrecord; other loaders: the "
                                                "workbook's corpus (data.corpus)"),
    "train_dataset.data_loader.dataset_dir": (to("mf.dataset_dir"), "empty: the workbook's corpus"),
    "train_dataset.data_loader.shuffle": (lambda v: {} if v else {"data.shuffle_buffer": 1}, "false = buffer 1"),
    "train_dataset.input_columns": (_input_columns, "input_ids; attention_mask, position_ids and loss_mask "
                                                    "are not read (one causal mask over each whole window)"),
    "train_dataset.num_parallel_workers": (to("mf.workers", int), "capped at the cores"),
    "train_dataset.python_multiprocessing": (flag("data.python_multiprocessing"), ""),
    "train_dataset.prefetch_size": (to("data.prefetch", int), ""),
    "train_dataset.batch_size": (nothing, "MindFormers takes runner_config.batch_size"),
    "train_dataset.seed": (nothing, "the data order follows seed here"),
    "train_dataset.data_loader.config.seq_length": (nothing, "the window is model.seq_len"),
    "train_dataset.data_loader.config.data_path": (_MEGATRON[0], "a Megatron .bin/.idx: the workbook reads "
                                                                 "data.corpus (text, or MindRecord from "
                                                                 "`python -m helpers prepare`)"),
    **{f"train_dataset.data_loader.config.{k}": _MEGATRON for k in (
        "seed", "random_seed", "split", "eod", "pad", "num_dataset_builder_threads")},
    **{f"train_dataset.data_loader.config.{k}": _TOKEN_MASKS for k in (
        "eod_mask_loss", "reset_position_ids", "create_attention_mask", "reset_attention_mask",
        "create_compressed_eod_mask", "eod_pad_length")},
    **{f"train_dataset.data_loader.{k}": _LOADER_DETAIL for k in (
        "datasets_type", "sizes", "data_files", "handler", "load_func", "path", "split", "num_samples", "phase",
        "version", "origin_columns", "use_broadcast_data", "shuffle_seed", "column_names", "stage")},
    **{f"train_dataset.data_loader.{k}": _TOKEN_MASKS for k in (
        "create_attention_mask", "create_compressed_eod_mask", "compressed_eod_mask_length")},
    **{f"train_dataset.{k}": (nothing, "an instruction-data setting of MindFormers' loader (prompt/answer "
                                       "lengths); the workbook's windows are model.seq_len tokens of data.corpus")
       for k in ("max_source_length", "max_target_length", "max_seq_length", "ignore_pad_token_for_loss")},
    "moe_config.expert_num": (experts, ""),
}


def grouped_lr(v: Any) -> dict:
    """Per-group learning rates (grouped_lr_schedule) are not in the workbook; a try-out keeps lr_schedule."""
    raise Refused("grouped_lr_schedule (a learning rate per parameter group) is not in the workbook: remove it and "
                  "keep lr_schedule, or import with --scale PRESET", reduced="lr_schedule for every weight")

