"""The least memory a run of a config takes, counted from arrays this workbook's model and step certainly create, and
checked before MindSpore is imported: a size that cannot fit is refused in one line that names the key, instead of
numpy's "Unable to allocate 37.3 GiB for an array with shape (100000, 100000)" after the import.

Every figure is a lower bound in bytes. T = model.seq_len, B = batch_size (sequences per forward/backward pass,
all data-parallel ranks together), H = model.n_head, L = model.n_layer, d = model.d_model, kv = the width of k and of
v (model.n_kv_head × d/H; d without grouped-query attention), h = the MLP's width (model.ffn_hidden), m = its
weight matrices (3 for SwiGLU, else 2), P = parallel.data_parallel processes, V = the vocabulary where the config
fixes it (model.vocab_size; data.vocab_size for bpe; 256 for byte; a char vocabulary is known only from the corpus,
so it is left out), 4 bytes per float32, a = 2 bytes per activation
under AMP (amp_level O1-O3), else 4:

- causal masks (`run/model.py`, CausalSelfAttention): every layer builds `np.triu(np.full((T, T), -1e4, float32))`
  and keeps it: L·T²·4 per process. While the last one is built, np.full's temporary is alive as well, so the
  build peaks at (L+1)·T²·4.
- attention scores and weights: softmax(q·kᵀ) is [B, H, T, T] in every layer and is kept for the backward pass,
  and while the last layer computes it, its input scores exist too: (L+1)·B·H·T²·s, s = 2 under AMP when softmax
  is not in fp32_cells, else 4; with recompute=blocks one layer's weights are kept (2 arrays); none with
  model.attention=flash, which never forms them.
- activations kept for the backward pass, per token and layer at least 6·d + 2·kv + 2·h values: the inputs of the
  two norms (2·d), of the q,k,v Dense (d), q (d) and k (kv, both for the scores' gradient), v (kv), the attention
  output (d, the projection's input), the MLP's input (d), its hidden layer before and after its activation (h
  each): (6·d + 2·kv + 2·h)·L·B·T·a (16·d·L·B·T·a at the default 4·d GELU MLP); with recompute=blocks the block
  inputs and one block's: (L·d + 6·d + 2·kv + 2·h)·B·T·a.
- logits: LossNet casts the [B·T, V] logits to float32, and the loss's gradient of them has the same shape; the
  kernel that makes it holds both: 2·B·T·V·4.
- token embedding (and an untied output head as large), its gradient and AdamW's two moments: 4·V·d·4 per process,
  twice that with model.tie_head=false.
- block weights: at least 2·d² + 2·d·kv + m·d·h per layer (q and the projection, k and v, the MLP; 12·d² at the
  defaults), with gradient and two moments: 4·L·(2·d² + 2·d·kv + m·d·h)·4 per process.

A run needs at least max(the build's peak, the sum of the rest): the masks stay while the step runs. With
model.build (the user's own network) only the logits are ours to count. On GPU/Ascend only the masks are host
memory (numpy); the rest is device memory, whose size is not known before MindSpore is imported, so there only
the masks are checked. The limit is the project's memory gate: DEVICE_LIMIT_FRACTION of RAM
(`memory.default_memory_limit`). A config under the limit may still not fit: this counts only what is certain.
"""
from __future__ import annotations

from dataclasses import dataclass

from helpers import config as config_mod
from helpers.config import Config, ConfigError
from helpers.run.memory import DEVICE_LIMIT_FRACTION, default_memory_limit
from helpers.units import gib_text

F32 = 4  # bytes


@dataclass(frozen=True)
class Part:
    """One family of arrays: the config key that drives its size, what it is, its bytes and how they were counted."""
    key: str
    what: str
    nbytes: int
    arithmetic: str


def _vocab(cfg: Config) -> tuple[str, int]:
    """(the key that fixes the vocabulary, its size); ("", 0) when only the corpus knows it (char)."""
    if cfg.model.vocab_size:
        return "model.vocab_size", cfg.model.vocab_size
    if cfg.data.tokenizer == "bpe":
        return "data.vocab_size", cfg.data.vocab_size
    return ("data.tokenizer", 256) if cfg.data.tokenizer == "byte" else ("", 0)


def parts(cfg: Config) -> tuple[Part | None, list[Part]]:
    """(the masks at the model build's peak, or None for a model of the user's; the arrays alive together in a
    training step), as the module docstring counts them."""
    m = cfg.model
    T, B, H, L, d, P = m.seq_len, cfg.batch_size, m.n_head, m.n_layer, m.d_model, cfg.parallel.data_parallel
    per = f" × {P} processes" if P > 1 else ""
    ours = not m.build
    build = Part("model.seq_len", "the causal masks while they are built", P * (L + 1) * T * T * F32,
                 f"({L} layers + 1) × {T:,}² × {F32} bytes{per}") if ours else None
    step = [Part("model.seq_len", "the causal masks", P * L * T * T * F32,
                 f"{L} layers × {T:,}² × {F32} bytes{per}")] if ours else []
    if cfg.device_target != "CPU":
        return build, step
    amp = cfg.amp_level != "O0"
    a = 2 if amp else F32
    if ours and m.attention != "flash":
        arrays = 2 if cfg.recompute == "blocks" else L + 1
        s = 2 if amp and "softmax" not in cfg.fp32_cells else F32
        step.append(Part("model.seq_len", "the attention scores and weights", arrays * B * H * T * T * s,
                         f"{arrays} arrays × batch {B} × {H} heads × {T:,}² × {s} bytes"))
    kv, h = m.kv_heads * (d // H), m.ffn_hidden
    if ours:
        layer = 6 * d + 2 * kv + 2 * h  # values per token (16·d at the defaults)
        c = f"{layer / d:.4g}"
        per_token, count = ((L * d + layer, f"({L} layers + {c})") if cfg.recompute == "blocks"
                            else (L * layer, f"{c} × {L} layers"))
        step.append(Part("batch_size", "the activations kept for backward", per_token * B * T * a,
                         f"{count} × batch {B} × {T:,} tokens × d_model {d:,} × {a} bytes"))
    vkey, V = _vocab(cfg)
    if V:
        sized = vkey.endswith("vocab_size")  # the config sets the vocabulary: name that key
        step.append(Part(vkey if sized else "batch_size", "the float32 logits and their gradient",
                         2 * B * T * V * F32, f"2 × batch {B} × {T:,} tokens × vocab {V:,} × {F32} bytes"))
        if ours:
            tables = 1 if m.tie_head else 2
            what = "the token embedding" + ("" if m.tie_head else " and the output head")
            step.append(Part(vkey if sized else "model.d_model", f"{what} with their gradients and AdamW moments",
                             P * 4 * tables * V * d * F32,
                             f"4 × {tables} × vocab {V:,} × d_model {d:,} × {F32} bytes{per}"))
    if ours:
        mats = 3 if m.mlp == "swiglu" else 2
        weights = 2 * d * d + 2 * d * kv + mats * d * h
        step.append(Part("model.d_model", "the block weights with their gradients and AdamW moments",
                         P * 4 * L * weights * F32, f"4 × {weights / (d * d):.4g} × {L} layers × {d:,}² × {F32} "
                                                    f"bytes{per}"))
    return build, step


def need_bytes(cfg: Config) -> int:
    """The least memory (bytes) a run of cfg takes: max(the build's peak, the step's arrays together)."""
    build, step = parts(cfg)
    return max(build.nbytes if build else 0, sum(p.nbytes for p in step))


def _largest_fitting(cfg: Config, key: str, limit: int) -> int | None:
    """The largest value of `key`, below its current one, at which a run of cfg fits `limit`; None if none does.
    Values stay valid: d_model a multiple of n_head, batch_size of the process count."""
    # d_model moves in whole heads (whole pairs of dims per head under rotary positions), batch in whole ranks
    step = {"model.d_model": cfg.model.n_head * (2 if cfg.model.positions == "rope" else 1),
            "batch_size": cfg.parallel.data_parallel}.get(key, 1)
    lowest = {"data.vocab_size": 260}.get(key, step)
    current = config_mod.flatten(cfg)[key]

    def fits(value: int) -> bool:
        return need_bytes(config_mod.with_changes(cfg, {key: value})) <= limit

    if not isinstance(current, int) or current <= lowest or not fits(lowest):
        return None
    lo, hi = lowest // step, current // step  # fits(lo·step); the answer is below hi·step
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid * step) else (lo, mid)
    return lo * step


def check_fits(cfg: Config, limit: int | None = None) -> None:
    """Refuse (ConfigError, one line) a config whose run cannot fit `limit` bytes (default: the memory gate's, 90%
    of RAM), naming the key that drives the largest arrays, their size, and the value of it above which no run
    can fit (below it a run may still not: the count is a lower bound)."""
    limit = default_memory_limit("CPU") if limit is None else limit
    build, step = parts(cfg)
    need = need_bytes(cfg)
    if need <= limit:
        return
    worst = build if build and build.nbytes == need else max(step, key=lambda p: p.nbytes)
    value = config_mod.flatten(cfg).get(worst.key)
    best = _largest_fitting(cfg, worst.key, limit)
    fix = f"lower {worst.key}" + (f" (it cannot fit above {best:,})" if best else "")
    raise ConfigError(f"{worst.key}={value} cannot fit in memory: {worst.what} alone take {gib_text(worst.nbytes)} "
                      f"({worst.arithmetic}), and the run needs at least {gib_text(need)}, above the limit of "
                      f"{gib_text(limit)} ({DEVICE_LIMIT_FRACTION:.0%} of RAM); {fix}")
