"""Parallel planner: per-device memory ESTIMATE (bytes) for a model size and a DP/TP/PP strategy, the usual
strategy for a size, and the msrun command lines for N nodes.

Everything here is arithmetic, not measurement:
- weights: params x bytes(dtype) / (tp*pp); gradients the same;
- AdamW state: mixed precision keeps an fp32 master copy + two fp32 moments (12 B/param), fp32 training
  the two moments (8 B/param); divided by tp*pp, and by dp too with optimizer sharding (ZeRO-1 style,
  MindSpore's `enable_parallel_optimizer`);
- activations per layer (Korthikanti et al. 2022, 16-bit, tensor parallel without sequence parallel):
  s*b*h*(10 + 24/tp + 5*a*s/(h*tp)) bytes, where grouped-query attention keeps k and v (2*s*b*h each of the 24)
  at kv/a of their size: 24 becomes 20 + 4*kv/a (kv = key/value heads, a = attention heads); with full recompute
  only each layer's input, 2*s*b*h bytes, plus one layer's full set while it is recomputed; fp32 activations
  double it. With 1F1B pipelining the first stage holds pp micro-batches of its n_layer/pp layers = n_layer
  layers' worth; plus fp32 logits 4*s*b*vocab/tp. Framework, workspace and fragmentation are not modelled.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}
GB = 10**9


@dataclass(frozen=True)
class ModelShape:
    """Size and dims of a decoder (n_params in parameters; dims in elements; n_kv_head 0 = n_head)."""
    name: str
    n_params: float
    n_layer: int
    d_model: int
    n_head: int
    seq_len: int
    vocab: int
    n_kv_head: int = 0


# LLaMA-family shapes (published configs).
MODELS = {
    "7B": ModelShape("7B", 7e9, 32, 4096, 32, 4096, 32000),
    "13B": ModelShape("13B", 13e9, 40, 5120, 40, 4096, 32000),
    "30B": ModelShape("30B", 32.5e9, 60, 6656, 52, 2048, 32000),
    "70B": ModelShape("70B", 70e9, 80, 8192, 64, 4096, 32000, n_kv_head=8),
}


@dataclass(frozen=True)
class Strategy:
    """Parallel degrees and memory knobs (micro_batch in sequences per device)."""
    dp: int = 1
    tp: int = 1
    pp: int = 1
    micro_batch: int = 1
    recompute: bool = False
    dtype: str = "fp16"
    optimizer_shard: bool = False

    @property
    def devices(self) -> int:
        return self.dp * self.tp * self.pp


@dataclass
class MemoryEstimate:
    """Estimated bytes per device."""
    params: float
    grads: float
    optimizer: float
    activations: float

    @property
    def model_state(self) -> float:
        return self.params + self.grads + self.optimizer

    @property
    def total(self) -> float:
        return self.model_state + self.activations


def activation_bytes(m: ModelShape, s: Strategy) -> float:
    """Estimated activation bytes per device for one training step (see module docstring)."""
    sbh = m.seq_len * s.micro_batch * m.d_model
    kv_share = (m.n_kv_head or m.n_head) / m.n_head
    full = sbh * (10 + (20 + 4 * kv_share) / s.tp + 5 * m.n_head * m.seq_len / (m.d_model * s.tp))
    layers = 2 * sbh * m.n_layer + full if s.recompute else full * m.n_layer
    scale = DTYPE_BYTES[s.dtype] / 2  # the formula counts 16-bit activations
    return scale * layers + 4 * m.seq_len * s.micro_batch * m.vocab / s.tp


def estimate(m: ModelShape, s: Strategy) -> MemoryEstimate:
    """Per-device memory estimate (bytes) of `m` trained with AdamW under strategy `s`."""
    shard = s.tp * s.pp
    width = DTYPE_BYTES[s.dtype]
    adam = 8 if s.dtype == "fp32" else 12
    optimizer = m.n_params * adam / shard / (s.dp if s.optimizer_shard else 1)
    return MemoryEstimate(params=m.n_params * width / shard, grads=m.n_params * width / shard,
                          optimizer=optimizer, activations=activation_bytes(m, s))


def recommend(n_params: float) -> str:
    """The usual strategy for a model size: 1-7B DP + recompute, 13-30B DP + TP 2-4, 70B+ DP + TP + PP."""
    if n_params < 1e9:
        return "DP (the model fits one device; recompute only if activations do not)"
    if n_params <= 10e9:
        return "DP + recompute (+ optimizer sharding when Adam state does not fit)"
    if n_params <= 40e9:
        return "DP + TP 2-4 (TP inside a node) + recompute"
    return "DP + TP (8, inside a node) + PP (across nodes) + recompute"


def plan_rows(m: ModelShape, strategies: list[Strategy], device_bytes: float) -> list[dict]:
    """One row per strategy: degrees, estimated GB per device of each part, and whether it fits."""
    rows = []
    for s in strategies:
        e = estimate(m, s)
        rows.append({"model": m.name, **asdict(s), "devices": s.devices,
                     "params_GB": e.params / GB, "grads_GB": e.grads / GB, "optimizer_GB": e.optimizer / GB,
                     "activations_GB": e.activations / GB, "total_GB": e.total / GB,
                     "fits": e.total <= device_bytes})
    return rows


def eight_by_40gb(m: ModelShape = MODELS["7B"], micro_batch: int = 1) -> list[dict]:
    """The 8 x 40 GB example: strategies for 8 devices of 40 GB each."""
    options = [Strategy(dp=8), Strategy(dp=8, recompute=True),
               Strategy(dp=8, recompute=True, optimizer_shard=True), Strategy(dp=4, tp=2, recompute=True),
               Strategy(dp=4, tp=2, recompute=True, optimizer_shard=True), Strategy(dp=2, tp=4, recompute=True),
               Strategy(dp=1, tp=8), Strategy(dp=2, tp=2, pp=2, recompute=True)]
    return plan_rows(m, [Strategy(**{**asdict(o), "micro_batch": micro_batch}) for o in options], 40 * GB)


def msrun_commands(nodes: int, devices_per_node: int, master_addr: str, master_port: int,
                   config_path: str, run_dir: str) -> list[str]:
    """The exact msrun line to run on each of `nodes` nodes (node_rank 0 is the master)."""
    from helpers.spawn.msrun import msrun_command
    return [" ".join(msrun_command(config_path, run_dir, devices_per_node, master_port, nodes=nodes,
                                   node_rank=r, master_addr=master_addr)) for r in range(nodes)]


def shape_of(cfg, n_params: int, vocab: int) -> ModelShape:
    """A ModelShape for a workbook Config and its counted parameters (e.g. the nano preset)."""
    m = cfg.model
    return ModelShape(m.preset, float(n_params), m.n_layer, m.d_model, m.n_head, m.seq_len, vocab, m.n_kv_head)


def model_params(m, vocab: int) -> int:
    """Trainable parameters of the workbook's model (helpers/run/model.py `GPT`) at the dims of ModelConfig `m` with
    a vocabulary of `vocab` tokens, by arithmetic (no model is built): k and v have n_kv_head heads, biases on
    every Dense (model.bias) or on q, k, v only (model.qkv_bias), an untied head its own vocab × d_model."""
    d = m.d_model
    kv = m.kv_heads * (d // m.n_head)  # the width of k and of v
    norm = 2 * d if m.norm == "layernorm" else d  # nn.LayerNorm always has a bias; RMSNorm a weight only
    bias = 1 if m.bias else 0
    attn = 2 * d * d + 2 * d * kv + (d + 2 * kv) * int(m.bias or m.qkv_bias) + d * bias
    hidden = m.ffn_hidden
    if m.mlp == "swiglu":
        mlp = 3 * d * hidden
    else:
        mlp = 2 * d * hidden + bias * (hidden + d)
    positions = m.seq_len * d if m.positions == "learned" else 0  # rotary positions have no table
    head = 0 if m.tie_head else vocab * d
    return vocab * d + head + positions + m.n_layer * (2 * norm + attn + mlp) + norm


def config_plan(cfg, vocab: int = 0) -> tuple[ModelShape, Strategy]:
    """The planner's model shape and strategy for a workbook Config at its full size (an imported recipe, e.g.):
    DP = parallel.data_parallel, micro-batch = sequences per device, recompute, dtype of its AMP setting. vocab:
    tokens in the vocabulary when model.vocab_size is 0 (the tokenizer's)."""
    m = cfg.model
    vocab = m.vocab_size or vocab
    if not vocab:
        raise ValueError("model.vocab_size is 0 (the tokenizer's); pass the vocabulary size as vocab")
    shape = ModelShape(m.preset, float(model_params(m, vocab)), m.n_layer, m.d_model, m.n_head, m.seq_len, vocab,
                       m.n_kv_head)
    dtype = "fp32" if cfg.amp_level == "O0" else cfg.amp_dtype
    return shape, Strategy(dp=cfg.parallel.data_parallel, micro_batch=cfg.micro_batch_per_device,
                           recompute=cfg.recompute == "blocks", dtype=dtype)


def config_estimate(cfg, vocab: int = 0) -> MemoryEstimate:
    """Per-device memory ESTIMATE (bytes) of a workbook Config at its full size (`config_plan`, `estimate`)."""
    return estimate(*config_plan(cfg, vocab))
