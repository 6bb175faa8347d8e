"""Typed run configuration: dataclasses, YAML on disk, `key=value` overrides, one-line errors.

Every knob lives here with its allowed values, so a typo or an impossible value fails before any
training starts (and before MindSpore is imported), naming the key, the value and what is allowed.
"""
from __future__ import annotations

import dataclasses
import difflib
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, get_args, get_origin, get_type_hints

import yaml

from helpers.bounded_yaml import YamlRefused, load_file, load_text
from helpers.paths import absolute


class ConfigError(ValueError):
    """A bad configuration value; the message is one actionable line."""


def _knob(default, help: str, choices=None, ge=None, gt=None, le=None, default_factory=None):
    meta = {"help": help, "choices": choices, "ge": ge, "gt": gt, "le": le}
    if default_factory is not None:
        return field(default_factory=default_factory, metadata=meta)
    return field(default=default, metadata=meta)


# Bounds on sizes far beyond any model or batch: a value past them is a typo or a unit slip (1e23), and is
# refused naming the key before the planner prints 1e25 GB or MindSpore fails in its own words. Under them, a
# model's parameter count (layers × (4·d_model² + 3·d_model·mlp_hidden) + vocab × d_model) stays within int64.
MAX_LAYERS = 1 << 16           # 65,536 blocks
MAX_HEADS = 1 << 16            # 65,536 attention heads
MAX_WIDTH = 1 << 20            # model.d_model 1,048,576
MAX_MLP = 1 << 24              # model.mlp_hidden 16,777,216 (16 × the widest d_model)
MAX_SEQ_LEN = 1 << 30          # tokens of context
MAX_VOCAB = 1 << 36            # token ids
MAX_BATCH = 1 << 24            # sequences per pass (16,777,216)
MAX_ACCUM = 1 << 20            # micro-batches per optimizer step
MAX_SHUFFLE_BUFFER = 1 << 24   # rows MindSpore's shuffle holds in memory (16,777,216)


# Model presets: `nano` is nanoGPT's CPU config (4 layers, 4 heads, d_model 128, ctx 64). `debug` is tiny with one
# block (as torchtitan's debugmodel): for smoke tests and the test suite, where a run's cost is mostly compiling its
# graph, and one block compiles in about two thirds of tiny's time (~0.8-1.0 s against ~1.2-1.4 s on 2 cores).
PRESETS: dict[str, dict[str, Any]] = {
    "debug": {"n_layer": 1, "n_head": 2, "d_model": 64, "seq_len": 32},
    "tiny": {"n_layer": 2, "n_head": 2, "d_model": 64, "seq_len": 32},
    "nano": {"n_layer": 4, "n_head": 4, "d_model": 128, "seq_len": 64},
    "small": {"n_layer": 6, "n_head": 6, "d_model": 384, "seq_len": 256},
}


@dataclass
class ModelConfig:
    preset: str = _knob("nano", "dims preset; explicit dims override it", choices=[*PRESETS, "custom"])
    n_layer: int = _knob(4, "transformer blocks", ge=1, le=MAX_LAYERS)
    n_head: int = _knob(4, "attention heads (must divide d_model)", ge=1, le=MAX_HEADS)
    n_kv_head: int = _knob(0, "key/value heads for grouped-query attention; 0 = n_head (multi-head attention); "
                              "must divide n_head", ge=0, le=MAX_HEADS)
    d_model: int = _knob(128, "hidden size", ge=1, le=MAX_WIDTH)
    seq_len: int = _knob(64, "context length in tokens", ge=1, le=MAX_SEQ_LEN)
    vocab_size: int = _knob(0, "0 = take the tokenizer's vocabulary size", ge=0, le=MAX_VOCAB)
    norm: str = _knob("layernorm", "normalisation cell", choices=["layernorm", "rmsnorm"])
    mlp: str = _knob("gelu", "feed-forward type: GELU (exact erf), GELU with GPT-2's tanh approximation "
                             "(gelu_tanh, for GPT-2 weights through init_from), SwiGLU (LLaMA), or ReLU² "
                             "(relu(x)², the small-GPT speed records' MLP)",
                     choices=["gelu", "gelu_tanh", "swiglu", "relu2"])
    positions: str = _knob("learned", "position information: a learned table added to the token embedding "
                                      "(learned, nanoGPT/GPT-2), or rotary embeddings of q and k (rope, LLaMA)",
                           choices=["learned", "rope"])
    rope_theta: float = _knob(10000.0, "rotary base: head-dimension pair i turns by position × theta^(-2i/head)",
                              gt=1.0)
    rope_scaling: str = _knob("none", "rotary context scaling: none, or linear (positions divided by "
                                      "rope_scaling_factor, Hugging Face's 'linear' rope type)",
                              choices=["none", "linear"])
    rope_scaling_factor: float = _knob(1.0, "model.rope_scaling=linear: rotary positions are divided by this",
                                       ge=1.0)
    qk_norm: bool = _knob(False, "RMS-normalise each head's q and k (no gain) before attention scores (QK-norm)")
    zero_init_proj: bool = _knob(False, "initialise the output projections (attention out, MLP down) to zero: each "
                                        "block starts as the identity")
    logit_softcap: float = _knob(0.0, "soft-cap the output logits at ±cap: cap·tanh(logits/cap); 0 = off",
                                 ge=0.0)
    tie_head: bool = _knob(True, "output head tied to the token embedding (nanoGPT, GPT-2); false = a head weight "
                                 "of its own (LLaMA)")
    mlp_hidden: int = _knob(0, "feed-forward width; 0 = 4·d_model (SwiGLU: 8/3·d_model rounded up to a multiple "
                               "of 8)", ge=0, le=MAX_MLP)
    rms_eps: float = _knob(1e-6, "RMSNorm epsilon (model.norm=rmsnorm)", gt=0.0, le=0.1)
    qkv: str = _knob("fused", "q,k,v projection: one Dense split by ops.Split (fused), one Dense cut by "
                              "strided slices (fused_slice), or three Dense cells (separate)",
                     choices=["fused", "fused_slice", "separate"])
    dense_act: bool = _knob(False, "GELU inside the MLP's first Dense cell (Linear+activation as one Cell)")
    dropout: float = _knob(0.0, "dropout probability", ge=0.0, le=0.9)
    bias: bool = _knob(True, "bias in Dense and LayerNorm cells")
    qkv_bias: bool = _knob(False, "bias on the q, k, v projections only (Qwen2); model.bias=true already puts a bias "
                                  "on every Dense")
    # Formulations: same math, different MindSpore ops (tests/run/test_kernels.py compares values and gradients).
    norm_backward: str = _knob("manual", "LayerNorm backward: MindSpore's LayerNormGrad, or hand-written from "
                                         "elementwise/reduce ops (same gradient, faster on CPU; amp_level=O1 "
                                         "always takes MindSpore's, its source rewrite refuses the other)",
                               choices=["mindspore", "manual"])
    gelu: str = _knob("erf_manual", "exact-erf GELU: nn.GELU(approximate=False) (mindspore), or erf arithmetic "
                                    "with a hand-written backward (erf_manual; same values, faster on CPU)",
                      choices=["mindspore", "erf_manual"])
    kernels: str = _knob("auto", "LayerNorm, GELU and causal softmax as native C++ CPU kernels (native/, built by "
                                 "`make kernels`), MindSpore's ops, or auto = native on CPU in fp32 when the "
                                 "library is built and current, else mindspore", choices=["auto", "mindspore", "native"])
    lazy_inline: bool = _knob(True, "compile one block's graph and reuse it for every block (mindspore.lazy_inline, "
                                    "inlined again at the front end: the steps run the same graph); on CPU "
                                    "compile ×0.86 at nano's 4 blocks, ×0.66 at small's 6")
    build: str = _knob("", "your own network: 'pkg.module:function(cfg, vocab_size) -> nn.Cell'")
    attention: str = _knob("manual", "attention: BatchMatMul + mask + Softmax (manual), or the fused "
                                     "ops.flash_attention_score (flash; Ascend only, fp16/bf16 AMP, head size a "
                                     "multiple of 16)", choices=["manual", "flash"])
    ballast: int = _knob(0, "test-only: width of an extra MatMul [tokens, d_model] × [d_model, ballast] whose output "
                            "enters the loss multiplied by zero (a real cost of known size for bench.py power); "
                            "0 = off", ge=0)
    ballast_every: int = _knob(0, "test-only: run the ballast only in every k-th step, as its own MatMul outside the "
                                  "step's graph (an intermittent cost of known size for bench.py validity; none while "
                                  "model.ballast is 0); 0 = inside every step's graph", ge=0)

    @property
    def kv_heads(self) -> int:
        """Key/value heads: n_kv_head, or n_head when it is 0 (multi-head attention)."""
        return self.n_kv_head or self.n_head

    @property
    def ffn_hidden(self) -> int:
        """The feed-forward width: mlp_hidden, or 4·d_model (SwiGLU: 8/3·d_model rounded up to a multiple of 8)."""
        if self.mlp_hidden:
            return self.mlp_hidden
        return 8 * ((8 * self.d_model // 3 + 7) // 8) if self.mlp == "swiglu" else 4 * self.d_model


BUILT_IN_TOKENIZERS = ("char", "byte", "bpe")


@dataclass
class DataConfig:
    corpus: list[str] = _knob(None, "registry names (tinyshakespeare) or UTF-8 text file paths, each a document; "
                                    "with format=mindrecord one MindRecord set: a folder written by `python -m "
                                    "helpers prepare --to mindrecord`, a .mindrecord file, or a folder of MindRecord "
                                    "files (every file trains, shards of a set included)",
                              default_factory=lambda: ["tinyshakespeare"])
    format: str = _knob("text", "corpus format: text (tokenized here), or mindrecord (token ids in input_ids, and "
                                "labels if present, rows of model.seq_len+1, read with MindSpore's MindDataset)",
                        choices=["text", "mindrecord"])
    tokenizer: str = _knob("char", "char (vocab from corpus), byte (256), bpe (trained here on a sample of the "
                                   "corpus), or a Hugging Face tokenizer.json: the file or a folder holding it (such "
                                   "as the init_from folder)")
    vocab_size: int = _knob(512, "BPE vocabulary size (bpe only)", ge=260)
    bpe_sample_mb: float = _knob(8.0, "MB of the corpus, in blocks spread over it, that a bpe tokenizer learns from "
                                      "(bpe only)", gt=0.0)
    val_fraction: float = _knob(0.1, "last fraction of tokens held out for validation", gt=0.0, le=0.5)
    tokenize: str = _knob("ahead", "tokenize the corpus once ahead, or in the pipeline's map op",
                          choices=["ahead", "on_the_fly"])
    num_parallel_workers: int = _knob(1, "workers of the map op", ge=1)
    python_multiprocessing: bool = _knob(False, "map op in processes instead of threads")
    order: str = _knob("shuffle_first", "shuffle window indices before the map op, or map then shuffle",
                       choices=["map_first", "shuffle_first"])
    shuffle_buffer: int = _knob(4096, "shuffle buffer in samples; MindSpore's shuffle holds this many rows in "
                                      "memory, so a larger value is refused before it starts", ge=1,
                                le=MAX_SHUFFLE_BUFFER)
    prefetch: int = _knob(16, "pipeline prefetch size in batches", ge=1)
    source_delay_ms: float = _knob(0.0, "sleep per sample in the source: simulates slow storage", ge=0.0)
    autotune: bool = _knob(False, "MindSpore's dataset autotune (ds.config.set_enable_autotune): it tunes the "
                                  "pipeline's workers and prefetch while the run trains")


@dataclass
class ParallelConfig:
    data_parallel: int = _knob(1, "data-parallel processes started through msrun; batch_size is the global "
                                  "batch, split evenly over them", ge=1)
    gradients_mean: bool = _knob(True, "average (true) or sum (false) the all-reduced gradients")
    comm_fusion: str = _knob("none", "all-reduce fusion: none (MindSpore's default), size (buckets of "
                                     "fusion_size_mb) or index (split at fusion_indices)",
                             choices=["none", "size", "index"])
    fusion_size_mb: int = _knob(32, "bucket size for comm_fusion=size, in MB", ge=1)
    fusion_indices: list[int] = _knob(None, "parameter indices where comm_fusion=index starts a new "
                                            "all-reduce, increasing", default_factory=list)
    master_port: int = _knob(0, "msrun master port; 0 = pick a free one", ge=0, le=65535)
    comm_profile_steps: int = _knob(5, "steps after warm-up profiled to measure all-reduce time; 0 = off",
                                    ge=0)


@dataclass
class MonitorConfig:
    grad_norm_limit: float = _knob(0.0, "grad-norm alarm threshold; 0 = off", ge=0.0)
    grad_norm_action: str = _knob("log", "on a grad-norm alarm: log it; clip at the limit from step 1; "
                                  "scale the LR of later steps by lr_factor; or stop the run",
                                  choices=["log", "clip", "lower_lr", "stop"])
    lr_factor: float = _knob(0.5, "LR multiplier applied per lower_lr alarm", gt=0.0, le=1.0)
    spike_ratio: float = _knob(0.25, "loss spike: loss above its running EMA by this fraction", gt=0.0)
    memory_window: int = _knob(50, "steps in the RSS-slope window of the memory-growth alarm", ge=5)
    memory_slope_limit: float = _knob(262144.0, "memory-growth alarm: RSS slope in bytes/step; 0 = off", ge=0.0)
    overfit_evals: int = _knob(3, "overfit alarm: val PPL rising over this many evals while train loss falls",
                               ge=2)
    throughput_window: int = _knob(20, "steps over which loss drop per 1k tokens is measured", ge=2)
    callbacks: list[str] = _knob(None, "your callbacks: 'pkg.module:factory', factory(cfg) -> fn(row) -> "
                                       "alarm text or None", default_factory=list)
    profile_steps: int = _knob(0, "steps profiled by MindSpore's profiler; 0 = off", ge=0)
    profile_start: int = _knob(0, "first profiled step; 0 = the first steady step (steady_after + 1)", ge=0)


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    monitor: MonitorConfig = field(default_factory=MonitorConfig)
    # Each rank's micro-batch is batch_size / parallel.data_parallel; see global_batch, micro_batch_per_device.
    batch_size: int = _knob(12, "sequences per forward/backward pass over all ranks; global batch = batch_size × "
                                "grad_accum_steps", ge=1, le=MAX_BATCH)
    grad_accum_steps: int = _knob(1, "micro-batches accumulated per optimizer step", ge=1, le=MAX_ACCUM)
    steps: int = _knob(300, "optimizer steps", ge=1, le=10**9)
    lr: float = _knob(1e-3, "peak learning rate", gt=0.0, le=1e4)
    warmup: int = _knob(100, "linear LR warm-up in steps", ge=0)
    warmup_ratio: float = _knob(0.0, "linear LR warm-up as a share of steps; > 0 replaces warmup with "
                                     "round(warmup_ratio × steps), so a later steps= keeps the share", ge=0.0, le=1.0)
    schedule: str = _knob("cosine", "LR decay after warm-up: cosine, linear, constant, or wsd (warm-up, stable "
                                    "at lr, then linear decay to min_lr over the last cooldown_frac of the steps)",
                          choices=["cosine", "linear", "constant", "wsd"])
    cooldown_frac: float = _knob(0.2, "schedule=wsd: fraction of the steps spent in the final linear decay",
                                 gt=0.0, le=1.0)
    min_lr: float = _knob(1e-4, "LR at the end of the decay", ge=0.0)
    optimizer: str = _knob("adamw", "adamw, or muon: momentum then a Newton–Schulz orthogonalisation of each "
                                    "hidden 2-D weight's update (the blocks' Dense weights), AdamW (lr, betas) for "
                                    "the embeddings, norms, biases and head", choices=["adamw", "muon"])
    muon_lr: float = _knob(0.02, "optimizer=muon: peak learning rate of the Muon weights (the schedule's shape "
                                 "scales it as it scales lr)", gt=0.0, le=10.0)
    muon_momentum: float = _knob(0.95, "optimizer=muon: Nesterov momentum of the Muon weights", ge=0.0, le=0.999)
    muon_ns_steps: int = _knob(5, "optimizer=muon: Newton–Schulz iterations per update (fp32)", ge=1, le=20)
    weight_decay: float = _knob(0.1, "AdamW weight decay on matrices", ge=0.0)
    betas: list[float] = _knob(None, "AdamW betas [beta1, beta2]", default_factory=lambda: [0.9, 0.99])
    eps: float = _knob(1e-8, "AdamW epsilon", gt=0.0)
    max_grad_norm: float = _knob(1.0, "clip the global gradient norm to this; 0 = no clipping", ge=0.0)
    grad_norm: str = _knob("flat", "how the global gradient norm is computed: a square-sum per tensor then AddN "
                                   "(per_tensor), or one square-sum over all gradients flattened into one vector "
                                   "(flat; same value, fewer ops)", choices=["per_tensor", "flat"])
    eval_every: int = _knob(100, "steps between validation passes; 0 = only at the end", ge=0)
    eval_batches: int = _knob(20, "validation batches per pass", ge=1)
    # Time to quality: an arm trains until it is good enough, or until a cap (its schedule's steps, or seconds).
    target_val_loss: float = _knob(0.0, "end the run (status ok) at the first validation pass with val loss ≤ "
                                        "this, in nats/token; 0 = off", ge=0.0)
    max_time_s: float = _knob(0.0, "end the run (status ok, a validation pass made) once this many wall seconds "
                                   "have passed since its process started; 0 = off", ge=0.0)
    seed: int = _knob(1337, "seed for init, data order and dropout", ge=0, le=2**32 - 1)
    steady_after: int = _knob(5, "first steps (compile, warm-up) left out of steady-state statistics", ge=1)
    mode: str = _knob("graph", "MindSpore execution mode", choices=["graph", "pynative"])
    jit_level: str = _knob("O0", "graph compile level (graph mode; pynative wraps the step in ms.jit "
                                 "unless 'none'); O2 = whole-graph sinking, Ascend only",
                           choices=["none", "O0", "O1", "O2"])
    memory_optimize: str = _knob("O0", "device memory pool level (ms.runtime.set_memory(optimize_level=…)): O0 "
                                       "favours speed, O1 reuses memory harder (Ascend only)", choices=["O0", "O1"])
    dataset_sink: bool = _knob(False, "sink mode: the device pulls batches itself (ms.data_sink), one per step "
                                      "(Ascend/GPU only; data_wait_ms is then not measured)")
    compile_cache: bool = _knob(True, "reuse compiled graphs across processes of the same config (one cache folder "
                                      "per config; the step is a Cell, which trains the same warm as cold)")
    compile_cache_path: str = _knob("", "compile cache folder; '' = compile/ in the cache folder "
                                          "($WORKBOOK_DATA_CACHE, else data/cache), a subfolder per config")
    amp_level: str = _knob("O0", "mixed precision level", choices=["O0", "O1", "O2", "O3"])
    amp_dtype: str = _knob("fp16", "low-precision dtype for amp_level O1-O3", choices=["fp16", "bf16"])
    fp32_cells: list[str] = _knob(None, "cells kept in fp32 under AMP",
                                  default_factory=lambda: ["layernorm", "softmax"])
    loss_scale: str = _knob("none", "loss scaling", choices=["none", "static", "dynamic"])
    loss_scale_value: float = _knob(1024.0, "static scale, or the dynamic scale's start", gt=0.0)
    loss_scale_window: int = _knob(1000, "finite steps before the dynamic scale doubles", ge=1)
    recompute: str = _knob("none", "recompute activations of each block in backward",
                           choices=["none", "blocks"])
    device_target: str = _knob("CPU", "device", choices=["CPU", "GPU", "Ascend"])
    threads: int = _knob(0, "CPU op threads; 0 = MindSpore's default", ge=0)
    checkpoint_every: int = _knob(0, "steps between checkpoints; 0 = only at the end", ge=0)
    keep_checkpoints: int = _knob(2, "how many recent checkpoints to keep", ge=1)
    resume_from: str = _knob("", "run directory or .ckpt file to continue from")
    init_from: str = _knob("", "Hugging Face weights to start from (step 1, fresh optimizer): one .safetensors "
                               "file, or a folder with model.safetensors or model.safetensors.index.json; GPT-2, "
                               "LLaMA, Mistral or Qwen2 layout; '' = random init")

    # Derived values: one home each, read everywhere.
    @property
    def global_batch(self) -> int:
        """Sequences per optimizer step over every rank and accumulated micro-batch (batch_size × grad_accum_steps)."""
        return self.batch_size * self.grad_accum_steps

    @property
    def warmup_steps(self) -> int:
        """Warm-up steps: round(warmup_ratio × steps) when warmup_ratio > 0, else warmup."""
        return round(self.warmup_ratio * self.steps) if self.warmup_ratio else self.warmup

    @property
    def micro_batch_per_device(self) -> int:
        """Sequences one process computes per forward/backward pass (batch_size / parallel.data_parallel)."""
        return self.batch_size // self.parallel.data_parallel

    @property
    def tokens_per_step(self) -> int:
        """Tokens per optimizer step (global batch × model.seq_len)."""
        return self.global_batch * self.model.seq_len

    @property
    def tokens_per_micro_batch(self) -> int:
        """Tokens one process computes per forward/backward pass (micro_batch_per_device × model.seq_len): the M of
        the model's matmuls."""
        return self.micro_batch_per_device * self.model.seq_len


FP32_CELL_CHOICES = ("layernorm", "softmax")
SECTIONS = {"model": ModelConfig, "data": DataConfig, "parallel": ParallelConfig, "monitor": MonitorConfig}


def _fields(cls) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in fields(cls)}


def all_keys() -> list[str]:
    """Every settable key, dotted for sections (e.g. 'model.n_layer', 'batch_size')."""
    keys = []
    for name in _fields(Config):
        if name in SECTIONS:
            keys += [f"{name}.{sub}" for sub in _fields(SECTIONS[name])]
        else:
            keys.append(name)
    return keys


def _suggest(key: str) -> str:
    keys = all_keys()
    leaf_to_key = {k.split(".")[-1]: k for k in keys}
    close = difflib.get_close_matches(key, keys, n=1, cutoff=0.6)
    if not close:
        leaf = difflib.get_close_matches(key.split(".")[-1], list(leaf_to_key), n=1, cutoff=0.6)
        close = [leaf_to_key[leaf[0]]] if leaf else []
    return f"; did you mean '{close[0]}'?" if close else f"; known keys: {', '.join(keys)}"


def _coerce(key: str, value: Any, typ: Any) -> Any:
    """Convert a YAML/CLI value to the field's type, or raise a one-line ConfigError."""
    origin = get_origin(typ)
    if origin is list:
        (item,) = get_args(typ)
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()] if value.strip() else []
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}={value!r} must be a list, e.g. {key}=[a, b]")
        return [_coerce(f"{key}[{i}]", v, item) for i, v in enumerate(value)]
    if typ is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "1", "0"):
            return value.lower() in ("true", "yes", "1")
        raise ConfigError(f"{key}={value!r} must be true or false")
    if typ is int:
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ConfigError(f"{key}={value!r} must be a whole number")
        try:
            number = float(value)
        except ValueError:
            raise ConfigError(f"{key}={value!r} must be a whole number") from None
        if not number.is_integer():
            raise ConfigError(f"{key}={value!r} must be a whole number")
        return int(number)
    if typ is float:
        if isinstance(value, bool):
            raise ConfigError(f"{key}={value!r} must be a number")
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{key}={value!r} must be a number") from None
    if typ is str:
        if isinstance(value, (dict, list)):
            raise ConfigError(f"{key}={value!r} must be a single value")
        return "" if value is None else str(value)
    raise ConfigError(f"{key}: unsupported type {typ}")


def _check_range(key: str, value: Any, meta: dict) -> None:
    choices = meta.get("choices")
    if choices is not None and value not in choices:
        by_case = {str(c).lower(): str(c) for c in choices}
        close = ([by_case[str(value).lower()]] if str(value).lower() in by_case
                 else difflib.get_close_matches(str(value), list(by_case.values()), n=1))
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise ConfigError(f"{key}={value!r} is not allowed; choose one of {', '.join(map(str, choices))}{hint}")
    bounds = [("ge", ">=", lambda v, b: v >= b), ("gt", ">", lambda v, b: v > b),
              ("le", "<=", lambda v, b: v <= b)]
    for name, sign, ok in bounds:
        bound = meta.get(name)
        if bound is not None and not ok(value, bound):
            raise ConfigError(f"{key}={value!r} is out of range; it must be {sign} {bound} ({meta['help']})")


def _build(cls, data: dict, prefix: str = ""):
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'} must be a mapping of key: value, got {data!r}")
    hints = get_type_hints(cls)
    known = _fields(cls)
    kwargs = {}
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if key not in known:
            raise ConfigError(f"unknown config key '{dotted}'{_suggest(dotted)}")
        if key in SECTIONS and cls is Config:
            if value is not None and not isinstance(value, dict):
                raise ConfigError(f"config section '{key}' must be a mapping of key: value (e.g. a '{key}:' block "
                                  f"in YAML, or {key}.{_first_key(key)}=… on the command line), got {value!r}")
            section = dict(value or {})
            if key == "model":
                preset = section.get("preset", ModelConfig.preset)
                if preset in PRESETS:
                    section = {**PRESETS[preset], **section}
            kwargs[key] = _build(SECTIONS[key], section, f"{key}.")
            continue
        coerced = _coerce(dotted, value, hints[key])
        for item in coerced if isinstance(coerced, list) else [coerced]:
            _check_range(dotted, item, known[key].metadata)
        kwargs[key] = coerced
    return cls(**kwargs)


def _first_key(section: str) -> str:
    return next(iter(_fields(SECTIONS[section])))


def validate(cfg: Config) -> Config:
    """Cross-field checks that no single key can express; returns cfg or raises ConfigError."""
    m = cfg.model
    if m.d_model % m.n_head:
        raise ConfigError(f"model.n_head={m.n_head} does not divide model.d_model={m.d_model}; "
                          f"pick n_head among {[h for h in range(1, m.d_model + 1) if m.d_model % h == 0][:12]}")
    if m.n_kv_head and m.n_head % m.n_kv_head:
        raise ConfigError(f"model.n_kv_head={m.n_kv_head} does not divide model.n_head={m.n_head}; pick n_kv_head "
                          f"among {[0] + [h for h in range(1, m.n_head + 1) if m.n_head % h == 0][:12]}")
    if len(cfg.betas) != 2 or not all(0.0 <= b < 1.0 for b in cfg.betas):
        raise ConfigError(f"betas={cfg.betas!r} must be two numbers in [0, 1), e.g. betas=[0.9, 0.99]")
    if cfg.min_lr > cfg.lr:
        raise ConfigError(f"min_lr={cfg.min_lr} is above lr={cfg.lr}; set min_lr <= lr")
    if cfg.target_val_loss and not cfg.eval_every:
        raise ConfigError(f"target_val_loss={cfg.target_val_loss:g} is checked at validation passes and "
                          f"eval_every=0 evaluates only at the end; set eval_every (e.g. eval_every=50)")
    if cfg.steady_after >= cfg.steps:
        raise ConfigError(f"steady_after={cfg.steady_after} leaves no steady window in steps={cfg.steps}; "
                          f"raise steps or lower steady_after")
    for cell in cfg.fp32_cells:
        if cell not in FP32_CELL_CHOICES:
            raise ConfigError(f"fp32_cells item {cell!r} is not allowed; choose from {', '.join(FP32_CELL_CHOICES)}")
    if cfg.amp_level != "O0" and cfg.amp_dtype == "bf16" and cfg.device_target == "CPU":
        raise ConfigError("amp_dtype=bf16 does not run on CPU (MindSpore's CPU MatMul/Gather kernels reject "
                          "BFloat16); use amp_dtype=fp16 or device_target=Ascend")
    cores = os.cpu_count() or 1
    if cfg.data.num_parallel_workers > cores:
        raise ConfigError(f"data.num_parallel_workers={cfg.data.num_parallel_workers} is above this machine's "
                          f"{cores} cores (MindSpore refuses it); use at most {cores}")
    if not cfg.data.corpus:
        raise ConfigError("data.corpus is empty; name 'tinyshakespeare' or give text file paths")
    _validate_parallel(cfg, cores)
    _validate_device_levers(cfg)
    _validate_recipe_levers(cfg)
    for cb in cfg.monitor.callbacks:
        if ":" not in cb:
            raise ConfigError(f"monitor.callbacks item {cb!r} must look like 'package.module:factory'")
    mon = cfg.monitor
    if mon.profile_steps:
        first = mon.profile_start or cfg.steady_after + 1
        if first + mon.profile_steps - 1 > cfg.steps:
            raise ConfigError(f"the profile window (steps {first}..{first + mon.profile_steps - 1}) ends after "
                              f"steps={cfg.steps}; raise steps to >= {first + mon.profile_steps - 1} (more leaves "
                              f"unprofiled steps to measure the profiler's overhead) or lower monitor.profile_steps")
    if m.kernels == "native" and cfg.device_target != "CPU":
        raise ConfigError(f"model.kernels=native is CPU code (native/*.cc) and cannot run on "
                          f"device_target={cfg.device_target}; use model.kernels=mindspore or auto")
    if m.kernels == "native" and cfg.amp_level != "O0":
        raise ConfigError(f"model.kernels=native computes in fp32 only and amp_level={cfg.amp_level} casts to "
                          f"{cfg.amp_dtype}; use model.kernels=mindspore or auto with AMP, or amp_level=O0")
    _validate_sources(cfg)
    if m.build and ":" not in m.build:
        raise ConfigError(f"model.build={m.build!r} must look like 'package.module:function'")
    return cfg


# Levers that act only on a device: (is it set, the setting, what runs elsewhere, devices, what happens elsewhere).
def _device_levers(cfg: Config) -> list[tuple[bool, str, str, tuple[str, ...], str]]:
    return [
        (cfg.jit_level == "O2", "jit_level=O2", "jit_level=O1", ("Ascend",), "MindSpore accepts only O0/O1 elsewhere"),
        (cfg.memory_optimize != "O0", f"memory_optimize={cfg.memory_optimize}", "memory_optimize=O0", ("Ascend",),
         "the memory-optimize level is an Ascend memory-pool setting"),
        (cfg.dataset_sink, "dataset_sink=true", "dataset_sink=false", ("Ascend", "GPU"),
         "ms.data_sink supports Ascend/GPU; on CPU MindSpore ignores sink mode silently"),
        (cfg.model.attention == "flash", "model.attention=flash", "model.attention=manual", ("Ascend",),
         "ops.flash_attention_score has Ascend kernels only"),
    ]


def _validate_device_levers(cfg: Config) -> None:
    """Refuse a device-only lever on the wrong device, and the combinations a lever cannot run with."""
    for on, setting, fallback, devices, why in _device_levers(cfg):
        if on and cfg.device_target not in devices:
            raise ConfigError(f"{setting} needs device_target={' or '.join(devices)} ({why}); this config runs on "
                              f"{cfg.device_target}: use {fallback} or device_target={devices[0]}")
    if cfg.dataset_sink and cfg.grad_accum_steps > 1:
        raise ConfigError(f"dataset_sink=true feeds one batch per step call and cannot accumulate "
                          f"grad_accum_steps={cfg.grad_accum_steps} micro-batches; use grad_accum_steps=1")
    m = cfg.model
    if m.attention == "flash":
        if cfg.amp_level == "O0":
            raise ConfigError("model.attention=flash computes in fp16/bf16 only (ops.flash_attention_score); set "
                              "amp_level=O1 or O2 (amp_dtype fp16 or bf16) or model.attention=manual")
        if (m.d_model // m.n_head) % 16 or m.dropout > 0:
            raise ConfigError(f"model.attention=flash needs a head size that is a multiple of 16 (d_model/n_head = "
                              f"{m.d_model // m.n_head}) and model.dropout=0 (got {m.dropout}); change the dims or "
                              f"use model.attention=manual")


def _validate_sources(cfg: Config) -> None:
    """What a MindRecord corpus or Hugging Face weights cannot be combined with."""
    d = cfg.data
    if d.tokenizer not in BUILT_IN_TOKENIZERS and d.format == "text":
        path = Path(d.tokenizer).expanduser()
        if not (path.is_file() or (path / "tokenizer.json").is_file()):
            raise ConfigError(f"data.tokenizer={d.tokenizer!r} is neither {', '.join(BUILT_IN_TOKENIZERS)} nor a "
                              f"Hugging Face tokenizer.json (the file, or a folder holding one such as the init_from "
                              f"folder); pass one of those")
    if d.format == "mindrecord":
        if len(d.corpus) != 1:
            raise ConfigError(f"data.format=mindrecord reads one MindRecord set, got data.corpus={d.corpus}; pass its "
                              f"folder or its first .mindrecord file")
        if d.tokenize == "on_the_fly" or d.source_delay_ms:
            raise ConfigError("data.tokenize=on_the_fly and data.source_delay_ms act on text read here; a MindRecord "
                              "holds token ids read by MindDataset: use data.tokenize=ahead and data.source_delay_ms=0")
    if cfg.init_from and cfg.model.build:
        raise ConfigError(f"init_from loads weights into the workbook's model and model.build={cfg.model.build!r} "
                          f"builds your own; drop one of them")


def _validate_recipe_levers(cfg: Config) -> None:
    """The speed-record levers (rotary positions, Muon) against what they need of the model."""
    m = cfg.model
    if m.positions == "rope" and (m.d_model // m.n_head) % 2:
        raise ConfigError(f"model.positions=rope turns pairs of each head's dimensions and the head size "
                          f"d_model/n_head = {m.d_model // m.n_head} is odd; change the dims or use "
                          f"model.positions=learned")
    if m.rope_scaling != "none" and m.positions != "rope":
        raise ConfigError(f"model.rope_scaling={m.rope_scaling} scales rotary positions and model.positions="
                          f"{m.positions}; set model.positions=rope or model.rope_scaling=none")
    if m.rope_scaling == "none" and m.rope_scaling_factor != 1.0:
        raise ConfigError(f"model.rope_scaling_factor={m.rope_scaling_factor:g} acts only with "
                          f"model.rope_scaling=linear; set model.rope_scaling=linear or model.rope_scaling_factor=1")
    if m.build and (m.positions != "learned" or m.qk_norm or m.zero_init_proj or m.logit_softcap
                    or m.mlp == "relu2" or not m.tie_head or m.mlp_hidden or m.n_kv_head or m.qkv_bias):
        raise ConfigError(f"model.build={m.build!r} is your own network: the workbook's model levers (positions, "
                          f"qk_norm, zero_init_proj, logit_softcap, mlp=relu2, tie_head, mlp_hidden, n_kv_head, "
                          f"qkv_bias) do not reach it; leave them at their defaults")


def _validate_parallel(cfg: Config, cores: int) -> None:
    p = cfg.parallel
    if p.data_parallel == 1:
        return
    if cfg.batch_size % p.data_parallel:
        raise ConfigError(f"batch_size={cfg.batch_size} (the global batch) does not split evenly over "
                          f"parallel.data_parallel={p.data_parallel} processes; use a multiple of "
                          f"{p.data_parallel}, e.g. batch_size={max(1, cfg.batch_size // p.data_parallel) * p.data_parallel}")
    if cfg.device_target == "CPU" and p.data_parallel > cores:
        raise ConfigError(f"parallel.data_parallel={p.data_parallel} is above this machine's {cores} cores "
                          f"(each process needs a core); use parallel.data_parallel<={cores}")
    if p.comm_fusion == "index" and (not p.fusion_indices
                                     or any(b <= a for a, b in zip(p.fusion_indices, p.fusion_indices[1:]))
                                     or p.fusion_indices[0] < 1):
        raise ConfigError(f"parallel.fusion_indices={p.fusion_indices} must be increasing parameter indices "
                          f">= 1 for parallel.comm_fusion=index, e.g. parallel.fusion_indices=[5, 10]")


def parse_override(item: str) -> tuple[str, Any]:
    """'a.b=value' → ('a.b', parsed YAML value)."""
    if "=" not in item:
        raise ConfigError(f"override {item!r} must look like key=value, e.g. batch_size=16")
    key, raw = item.split("=", 1)
    key = key.strip()
    try:
        value = load_text(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    except YamlRefused as exc:
        raise ConfigError(f"override {item!r} {exc}") from None
    return key, value


def _nest(flat: dict[str, Any]) -> dict:
    nested: dict[str, Any] = {}
    for key, value in flat.items():
        head, _, tail = key.partition(".")
        if tail:
            if head not in SECTIONS:
                raise ConfigError(f"unknown config key '{key}'{_suggest(key)}")
            nested.setdefault(head, {})[tail] = value
        else:
            nested[head] = value
    return nested


def _merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for key, value in extra.items():
        if key in SECTIONS and isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = {**out[key], **value}
        else:
            out[key] = value
    return out


def from_dict(data: dict | None, overrides: dict[str, Any] | list[str] | None = None) -> Config:
    """Build and validate a Config from a (nested) dict plus flat dotted overrides."""
    if data is not None and not isinstance(data, dict):
        raise ConfigError(f"a config must be a mapping of key: value, got {data!r}")
    data = dict(data or {})
    for key in SECTIONS:  # before the overrides are merged into them
        if data.get(key) is not None and not isinstance(data[key], dict):
            raise ConfigError(f"config section '{key}' must be a mapping of key: value (e.g. a '{key}:' block in "
                              f"YAML, or {key}.{_first_key(key)}=… on the command line), got {data[key]!r}")
    if isinstance(overrides, list):
        overrides = dict(parse_override(o) for o in overrides)
    data = _merge(data, _nest(dict(overrides or {})))
    return validate(_build(Config, data))


# Keys added with a default that changed what runs: a full config written before the key existed (a record, a
# workbook's marker, a rollback point) ran as this value, not as today's default.
WRITTEN_BEFORE = {"model.lazy_inline": False}


def as_written(data: dict) -> Config:
    """The Config a record or workbook wrote (a full dump, `dump`): a WRITTEN_BEFORE key it lacks takes the value
    the code of its day ran, so an old record still says what it trained."""
    data = {k: dict(v) if isinstance(v, dict) else v for k, v in (data or {}).items()}
    for key, value in WRITTEN_BEFORE.items():
        section, name = key.split(".")
        data.setdefault(section, {}).setdefault(name, value)
    return from_dict(data)


def load_written(path: str | os.PathLike) -> Config:
    """`as_written` of a config.yaml a record or rollback point wrote; ConfigError (one line) if it cannot be read."""
    try:
        data = load_file(path)
    except OSError as exc:
        why = f"cannot be read ({exc.strerror})"
    except yaml.YAMLError:
        why = "cannot be read (not valid YAML)"
    except YamlRefused as exc:
        why = exc.problem
    else:
        return as_written(data)
    raise ConfigError(f"{str(path)!r} {why}; it belongs to a run record or rollback point: restore it, or run again "
                      f"into a new folder")


def load_config(path: str | os.PathLike | None = None,
                overrides: dict[str, Any] | list[str] | None = None) -> Config:
    """Read a YAML config (or defaults when path is None) and apply `key=value` overrides."""
    data: dict = {}
    if path is not None:
        p = Path(path)
        if p.is_dir():
            raise ConfigError(f"config file {str(p)!r} is a folder; pass a YAML file to --config")
        if not p.is_file():
            raise ConfigError(f"config file {str(p)!r} does not exist; pass an existing YAML file to --config")
        try:
            data = load_file(p) or {}
        except YamlRefused as exc:
            raise ConfigError(f"config file {str(p)!r} {exc}") from None
        except OSError as exc:
            raise ConfigError(f"config file {str(p)!r} cannot be read ({exc.strerror})") from None
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" at line {mark.line + 1}" if mark else ""
            raise ConfigError(f"config file {str(p)!r} is not valid YAML{where}; fix its syntax") from None
        if not isinstance(data, dict):
            raise ConfigError(f"config file {str(p)!r} must be a mapping of key: value at its top level, got a "
                              f"{type(data).__name__}; write it as `key: value` lines")
    return from_dict(data, overrides)


def to_dict(cfg: Config) -> dict:
    """Plain nested dict (YAML/JSON-ready)."""
    return dataclasses.asdict(cfg)


def flatten(cfg: Config | dict) -> dict[str, Any]:
    """{'model.n_layer': 4, 'batch_size': 12, ...}."""
    data = to_dict(cfg) if isinstance(cfg, Config) else cfg
    flat = {}
    for key, value in data.items():
        if key in SECTIONS and isinstance(value, dict):
            flat.update({f"{key}.{k}": v for k, v in value.items()})
        else:
            flat[key] = value
    return flat


def diff(a: Config, b: Config) -> dict[str, tuple[Any, Any]]:
    """Keys whose values differ: {'batch_size': (12, 16)}."""
    fa, fb = flatten(a), flatten(b)
    return {k: (fa[k], fb[k]) for k in fa if fa[k] != fb[k]}


def with_changes(cfg: Config, changes: dict[str, Any]) -> Config:
    """A validated copy of cfg with dotted changes applied."""
    return from_dict(to_dict(cfg), changes)


def comm_profiled(cfg: Config) -> Config:
    """cfg as each rank of a data-parallel run trains it: without a profiler window of its own (monitor.profile_steps
    0), one of parallel.comm_profile_steps steps measures the collectives, at most half the steady steps (profiled
    steps are left out of speed, so unprofiled ones must remain). The merged record keeps this config."""
    window = min(cfg.parallel.comm_profile_steps, max(0, cfg.steps - cfg.steady_after) // 2)
    return with_changes(cfg, {"monitor.profile_steps": window}) if window and not cfg.monitor.profile_steps else cfg


CACHE_KEYS = ("compile_cache", "compile_cache_path")


def speed_measured(cfg: Config, changed: Any = ()) -> Config:
    """cfg as a run whose speed is compared with another's trains it: its graph compiled in its own process (the
    compile cache off), unless the comparison is about the cache (`changed`, keys or a changes dict, holds one of
    CACHE_KEYS). A process that loaded its graph from the cache stepped faster than one that compiled the same graph
    (same losses): its steps took ×0.89–×0.92 of the time on the tiny preset, ×0.95–×0.97 on nano, so an A/A round
    whose arms raced for the cache called one arm 10% slower every time (docs/explanation/speed-rule.md, "One
    compile state")."""
    return cfg if any(k in CACHE_KEYS for k in changed) or not cfg.compile_cache \
        else with_changes(cfg, {"compile_cache": False})


def dump(cfg: Config) -> str:
    """YAML text of the full config."""
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)


def absolute_paths(cfg: Config, base: str | os.PathLike | None = None) -> Config:
    """cfg with every file path in it made absolute against `base` (default: the working directory), so the
    config means the same in a training child (which runs in the repository) and when a record is reread.

    Corpus items that name an existing file or folder under `base` become absolute; registry names stay.
    """
    corpus = [str(absolute(c, base)) if absolute(c, base).exists() else c for c in cfg.data.corpus]
    changes = {"data.corpus": corpus}
    if cfg.data.tokenizer not in BUILT_IN_TOKENIZERS and absolute(cfg.data.tokenizer, base).exists():
        changes["data.tokenizer"] = str(absolute(cfg.data.tokenizer, base))
    for key in ("compile_cache_path", "resume_from", "init_from"):
        value = getattr(cfg, key)
        if value:
            changes[key] = str(absolute(value, base))
    flat = flatten(cfg)
    changes = {k: v for k, v in changes.items() if flat[k] != v}
    return with_changes(cfg, changes) if changes else cfg
