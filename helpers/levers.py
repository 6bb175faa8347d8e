"""One declaration per config key: what a round that changes it needs and what the key is to the rest of the house.

Each key says how a speed round on it is measured (two arm processes stepping in turns, whole runs, or paired inside
each rank of one msrun launch) and why, whether it is part of the compiled graph (the compile cache's folder is
named after those keys), whether it changes what the model learns per token (a speed round on it warns and points
to the convergence objective), whether a time-to-target round may change it with the rest of the recipe, and whether
every round holds it equal in both arms; and which keys a round may change together (GROUPS).
Each auto-tuner family declares the keys its candidates may change (FAMILIES). A lever's troubleshooting rows are
declared where the rows are, as each row's `levers` in tune/troubleshooting.yaml (a test holds them to this registry
and to the row's fix text; `tune.diagnose.troubleshooting_by_lever` gives them per key), and its MindFormers keys
where the import's tables are (helpers/mindformers/; `mindformers.reference.keys_by_lever`). docs/reference/levers.md
shows all of it per key.
`tune/speed_path.py`, `run/startup.py`, `tune/convergence.py`, `tune/round_spec.py`, the auto-tuners and the generated
page docs/reference/levers.md read these answers from here; `tests/test_levers.py` fails on a config key with no
declaration, so a new key is declared once instead of taking a default in each of them.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

PAIRED, PROCESSES, RUNS = "paired", "processes", "runs"
PER_GRAPH = "per graph"  # runs on a one-process best; paired inside each rank when the best is data parallel


@dataclass(frozen=True)
class Lever:
    """What one config key is to a round. measured: PROCESSES, RUNS or PER_GRAPH; why: why it needs a process or a
    run of its own ("" for a model, batch or optimizer key); in_graph: part of the compiled graph; learning: changes
    what the model learns per token; recipe: part of a time-to-target recipe; fixed: held equal in both arms."""
    measured: str
    why: str = ""
    in_graph: bool = True
    learning: bool = False
    recipe: bool = False
    fixed: bool = False


GRAPH = Lever(PROCESSES)  # the model, the step, the optimizer: two processes, one compiled graph each
HOST = Lever(PROCESSES, in_graph=False)  # set by the host around the graph (schedule, monitors, evaluation)
LEARNING_HOST = replace(HOST, learning=True, recipe=True)  # the learning-rate schedule, set by the host every step
LEARNING_GRAPH = replace(GRAPH, learning=True)  # optimizer settings inside the graph
DATA_WHY = ("the dataset engine's settings (prefetch, autotune, seed) are process-wide, and each arm's pipeline and "
            "worker threads are then its own")
DATA = Lever(PROCESSES, DATA_WHY, in_graph=False)
DATA_VOCAB = Lever(PROCESSES, DATA_WHY)  # decides the tokenizer, hence the vocabulary the graph is built for
DP_WHY = "data parallel runs are msrun processes"
FUSION = Lever(PER_GRAPH, "all-reduce fusion only exists in a data-parallel run (msrun processes)")
PROFILER = Lever(RUNS, "the profiler is process-wide", in_graph=False)

LEVERS: dict[str, Lever] = {
    **{f"model.{k}": GRAPH for k in (
        "preset", "n_layer", "n_head", "n_kv_head", "d_model", "seq_len", "vocab_size", "norm", "mlp", "positions",
        "rope_theta", "rope_scaling", "rope_scaling_factor", "qk_norm", "zero_init_proj", "logit_softcap",
        "tie_head", "mlp_hidden", "rms_eps", "qkv", "dense_act", "bias", "qkv_bias", "norm_backward", "gelu",
        "kernels", "lazy_inline", "build", "attention", "ballast", "ballast_every")},
    "model.dropout": LEARNING_GRAPH,
    "data.corpus": DATA,
    **{f"data.{k}": DATA_VOCAB for k in ("format", "tokenizer", "vocab_size", "bpe_sample_mb")},
    **{f"data.{k}": DATA for k in ("val_fraction", "tokenize", "num_parallel_workers", "python_multiprocessing",
                                   "order", "shuffle_buffer", "prefetch", "source_delay_ms", "autotune")},
    "parallel.data_parallel": Lever(RUNS, DP_WHY),
    "parallel.gradients_mean": Lever(RUNS, DP_WHY),
    "parallel.comm_fusion": FUSION,
    "parallel.fusion_size_mb": FUSION,
    "parallel.fusion_indices": FUSION,
    "parallel.master_port": Lever(RUNS, DP_WHY, in_graph=False),
    "parallel.comm_profile_steps": Lever(RUNS, DP_WHY, in_graph=False),
    "monitor.grad_norm_limit": GRAPH,
    "monitor.grad_norm_action": GRAPH,
    **{f"monitor.{k}": HOST for k in ("lr_factor", "spike_ratio", "memory_window", "memory_slope_limit",
                                      "overfit_evals", "throughput_window")},
    "monitor.callbacks": GRAPH,
    "monitor.profile_steps": PROFILER,
    "monitor.profile_start": PROFILER,
    "batch_size": replace(GRAPH, recipe=True),
    "grad_accum_steps": replace(GRAPH, recipe=True),
    "steps": replace(HOST, recipe=True, fixed=True),
    **{k: LEARNING_HOST for k in ("lr", "warmup", "warmup_ratio", "schedule", "min_lr")},
    "cooldown_frac": replace(HOST, recipe=True),
    "optimizer": GRAPH,
    "muon_lr": HOST,
    "muon_momentum": GRAPH,
    "muon_ns_steps": GRAPH,
    **{k: LEARNING_GRAPH for k in ("weight_decay", "betas", "eps", "max_grad_norm")},
    "grad_norm": GRAPH,
    **{k: HOST for k in ("eval_every", "eval_batches", "target_val_loss", "max_time_s")},
    "seed": replace(GRAPH, fixed=True),  # in the graph only through random ops (run/startup.py `_graph_keys`)
    "steady_after": replace(HOST, fixed=True),
    "mode": Lever(PROCESSES, "the execution mode is process-wide (ms.set_context)"),
    "jit_level": Lever(PROCESSES, "grouped with mode, which is process-wide"),
    "memory_optimize": Lever(PROCESSES, "the device memory pool is process-wide (ms.runtime.set_memory)"),
    "dataset_sink": Lever(PROCESSES, "sink mode hands the device its own queue (process-wide on Ascend/GPU)"),
    "compile_cache": Lever(RUNS, "the compile cache is process-wide and measured by process start-up",
                           in_graph=False),
    "compile_cache_path": Lever(RUNS, "the compile cache is process-wide", in_graph=False),
    **{k: GRAPH for k in ("amp_level", "amp_dtype", "fp32_cells", "loss_scale", "loss_scale_value",
                          "loss_scale_window", "recompute")},
    "device_target": Lever(PROCESSES, "the device is process-wide (ms.set_device)"),
    "threads": Lever(PROCESSES, "op threads can be set once per process"),
    "checkpoint_every": HOST,
    "keep_checkpoints": HOST,
    "resume_from": replace(HOST, fixed=True),
    "init_from": GRAPH,
}


def keys_where(**wanted) -> tuple[str, ...]:
    """The declared keys whose Lever fields equal `wanted` (e.g. in_graph=False), in declaration order."""
    return tuple(k for k, lever in LEVERS.items() if all(getattr(lever, f) == v for f, v in wanted.items()))


# The auto-tuners' families and the keys a candidate of each may change: the speed tuner (tune/autotune.py) in its
# search order, then the time-to-target tuner's (tune/ttq_levers.py, tune/ttq_search.py). A candidate that
# changes a key its family does not declare fails when it is made (autotune.Candidate).
SPEED_FAMILIES: dict[str, tuple[str, ...]] = {
    "execution": ("mode", "jit_level", "model.attention"),
    "batch": ("batch_size", "grad_accum_steps"),
    "data": ("data.num_parallel_workers", "data.autotune", "dataset_sink", "data.order"),
    "threads": ("threads",),
    "amp": ("amp_level", "amp_dtype", "loss_scale"),
    "recompute": ("recompute", "memory_optimize"),
    "data_parallel": ("parallel.data_parallel", "parallel.comm_fusion"),
}
TIME_TO_TARGET_FAMILIES: dict[str, tuple[str, ...]] = {
    "optimizer": ("optimizer",),
    "architecture": ("model.positions", "model.mlp", "model.qk_norm", "model.zero_init_proj", "model.logit_softcap"),
    "recipe": keys_where(recipe=True, fixed=False) + ("steps",),
}
FAMILIES = {**SPEED_FAMILIES, **TIME_TO_TARGET_FAMILIES}


def families_of(key: str) -> tuple[str, ...]:
    """The tuner families whose candidates may change `key` (() for none)."""
    return tuple(f for f, keys in FAMILIES.items() if key in keys)


# Keys a round may change together, each group with why one without the other changes the recipe.
GROUPS: dict[frozenset[str], str] = {
    frozenset({"batch_size", "grad_accum_steps"}): "same tokens per optimizer step, a different memory/speed trade",
    frozenset({"amp_level", "loss_scale"}): "fp16 without loss scaling underflows gradients: AMP and its scaler are "
                                           "one decision",
    frozenset({"amp_level", "amp_dtype"}): "the low-precision dtype means nothing at O0",
    frozenset({"mode", "jit_level"}): "jit_level is the compile level in graph mode but 'wrap the step in ms.jit "
                                      "or not' in PyNative",
    frozenset({"schedule", "cooldown_frac"}): "the trapezoid schedule's cool-down length means nothing under "
                                              "another schedule",
}

