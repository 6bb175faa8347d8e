"""GPT/LLaMA-style decoder on plain `mindspore.nn`, plus the loss wrapper and size/FLOP arithmetic.

Written with Primitive instances and `.astype()` instead of functional ops, because AMP O1 rewrites the
model source and fails on functional `ops.cast`/`ops.mean` (see shared/mindspore-cpu-facts.md).
"""
from __future__ import annotations

import importlib
import math

import numpy as np
import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops
from mindspore.common.initializer import Normal, initializer

from helpers.config import Config, ModelConfig


class RMSNorm(nn.Cell):
    """x / rms(x) * weight (LLaMA's norm)."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = Parameter(initializer("ones", (dim,), ms.float32), name="weight")
        self.eps = eps
        self.mean = ops.ReduceMean(keep_dims=True)
        self.rsqrt = ops.Rsqrt()

    def construct(self, x):
        var = self.mean(x * x, -1)
        return x * self.rsqrt(var + self.eps) * self.weight.astype(x.dtype)


def make_norm(cfg: ModelConfig) -> nn.Cell:
    """LayerNorm (always with a bias in MindSpore) or RMSNorm."""
    if cfg.norm == "rmsnorm":
        return RMSNorm(cfg.d_model)
    return nn.LayerNorm((cfg.d_model,), epsilon=1e-5)


def _dense(d_in: int, d_out: int, bias: bool, std: float) -> nn.Dense:
    return nn.Dense(d_in, d_out, weight_init=Normal(std), bias_init="zeros", has_bias=bias)


class CausalSelfAttention(nn.Cell):
    """Multi-head causal attention; q,k,v from one fused Dense split by ops.Split, or three Dense cells."""

    def __init__(self, cfg: ModelConfig, proj_std: float):
        super().__init__()
        d = cfg.d_model
        self.n_head, self.head_dim = cfg.n_head, d // cfg.n_head
        self.mode = cfg.qkv
        if cfg.qkv != "separate":
            self.qkv = _dense(d, 3 * d, cfg.bias, 0.02)
            self.split = ops.Split(axis=-1, output_num=3)
        else:
            self.q, self.k, self.v = (_dense(d, d, cfg.bias, 0.02) for _ in range(3))
        self.proj = _dense(d, d, cfg.bias, proj_std)
        self.scores = ops.BatchMatMul(transpose_b=True)
        self.mix = ops.BatchMatMul()
        self.softmax = nn.Softmax(axis=-1)
        self.transpose = ops.Transpose()
        self.reshape = ops.Reshape()
        self.scale = 1.0 / math.sqrt(self.head_dim)
        # -1e4 (not -inf) stays finite in fp16 and still zeroes the masked softmax weights.
        mask = np.triu(np.full((cfg.seq_len, cfg.seq_len), -1e4, np.float32), k=1)
        self.mask = Tensor(mask[None, None])
        self.drop = nn.Dropout(p=cfg.dropout) if cfg.dropout > 0 else None

    def _heads(self, t, b, s):
        return self.transpose(self.reshape(t, (b, s, self.n_head, self.head_dim)), (0, 2, 1, 3))

    def construct(self, x):
        b, s, d = x.shape
        if self.mode == "fused":
            q, k, v = self.split(self.qkv(x))
        elif self.mode == "fused_slice":  # the slow variant the profiler exposes (StridedSlice)
            qkv = self.qkv(x)
            q, k, v = qkv[:, :, :d], qkv[:, :, d:2 * d], qkv[:, :, 2 * d:]
        else:
            q, k, v = self.q(x), self.k(x), self.v(x)
        q, k, v = self._heads(q, b, s), self._heads(k, b, s), self._heads(v, b, s)
        att = self.scores(q, k) * self.scale + self.mask.astype(q.dtype)
        att = self.softmax(att).astype(v.dtype)
        if self.drop is not None:
            att = self.drop(att)
        y = self.transpose(self.mix(att, v), (0, 2, 1, 3))
        return self.proj(self.reshape(y, (b, s, d)))


class MLP(nn.Cell):
    """GELU (exact erf, as nanoGPT) or SwiGLU feed-forward."""

    def __init__(self, cfg: ModelConfig, proj_std: float):
        super().__init__()
        d = cfg.d_model
        self.swiglu = cfg.mlp == "swiglu"
        if self.swiglu:
            hidden = 8 * ((8 * d // 3 + 7) // 8)
            self.gate = _dense(d, hidden, False, 0.02)
            self.up = _dense(d, hidden, False, 0.02)
            self.act = nn.SiLU()
        elif cfg.dense_act:
            hidden = 4 * d
            self.up = nn.Dense(d, hidden, weight_init=Normal(0.02), bias_init="zeros", has_bias=cfg.bias,
                               activation=nn.GELU(approximate=False))
            self.act = None
        else:
            hidden = 4 * d
            self.up = _dense(d, hidden, cfg.bias, 0.02)
            self.act = nn.GELU(approximate=False)
        self.down = _dense(hidden, d, cfg.bias and not self.swiglu, proj_std)
        self.drop = nn.Dropout(p=cfg.dropout) if cfg.dropout > 0 else None

    def construct(self, x):
        if self.swiglu:
            h = self.act(self.gate(x)) * self.up(x)
        else:
            h = self.up(x) if self.act is None else self.act(self.up(x))
        out = self.down(h)
        return self.drop(out) if self.drop is not None else out


class Block(nn.Cell):
    """Pre-norm transformer block."""

    def __init__(self, cfg: ModelConfig, proj_std: float):
        super().__init__()
        self.norm1, self.norm2 = make_norm(cfg), make_norm(cfg)
        self.attn = CausalSelfAttention(cfg, proj_std)
        self.mlp = MLP(cfg, proj_std)

    def construct(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class GPT(nn.Cell):
    """Token ids [B, T] int32 → logits [B*T, vocab]; lm_head tied to the token embedding (as nanoGPT)."""

    def __init__(self, cfg: ModelConfig, vocab_size: int):
        super().__init__()
        self.vocab_size, self.d_model = vocab_size, cfg.d_model
        self.tok = nn.Embedding(vocab_size, cfg.d_model, embedding_table=Normal(0.02))
        self.pos = Parameter(initializer(Normal(0.02), (1, cfg.seq_len, cfg.d_model), ms.float32), name="pos")
        proj_std = 0.02 / math.sqrt(2 * cfg.n_layer)
        self.blocks = nn.CellList([Block(cfg, proj_std) for _ in range(cfg.n_layer)])
        self.norm = make_norm(cfg)
        self.head = ops.MatMul(transpose_b=True)
        self.reshape = ops.Reshape()
        self.drop = nn.Dropout(p=cfg.dropout) if cfg.dropout > 0 else None

    def construct(self, idx):
        x = self.tok(idx)
        x = x + self.pos.astype(x.dtype)
        if self.drop is not None:
            x = self.drop(x)
        for block in self.blocks:
            x = block(x)
        x = self.reshape(self.norm(x), (-1, self.d_model))
        return self.head(x, self.tok.embedding_table.astype(x.dtype))


class LossNet(nn.Cell):
    """Mean token cross-entropy in fp32, whatever precision the backbone computes in."""

    def __init__(self, backbone: nn.Cell, vocab_size: int):
        super().__init__(auto_prefix=False)
        self.backbone = backbone
        self.vocab_size = vocab_size
        self.loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
        self.reshape = ops.Reshape()

    def construct(self, x, y):
        logits = self.reshape(self.backbone(x), (-1, self.vocab_size)).astype(ms.float32)
        return self.loss(logits, self.reshape(y, (-1,)))


def build_model(cfg: Config, vocab_size: int) -> nn.Cell:
    """The backbone: our GPT, or the user's `model.build = 'pkg.mod:fn'` called as fn(model_cfg, vocab_size)."""
    if cfg.model.build:
        module_name, _, func_name = cfg.model.build.partition(":")
        try:
            builder = getattr(importlib.import_module(module_name), func_name)
        except (ImportError, AttributeError) as exc:
            raise ValueError(f"model.build={cfg.model.build!r} cannot be imported ({exc}); "
                             f"check the module is on PYTHONPATH and defines {func_name}") from None
        return builder(cfg.model, vocab_size)
    return GPT(cfg.model, vocab_size)


def count_params(net: nn.Cell) -> int:
    """Trainable parameters (elements)."""
    return int(sum(p.size for p in net.trainable_params()))


def flops_per_token(n_params: int, cfg: ModelConfig) -> float:
    """Training FLOPs per token: 6·N + 12·L·d·T (nanoGPT/PaLM), N without position embeddings.

    Recompute's extra forward is not counted (MFU counts useful work only).
    """
    n = n_params - cfg.seq_len * cfg.d_model
    return 6.0 * n + 12.0 * cfg.n_layer * cfg.d_model * cfg.seq_len
