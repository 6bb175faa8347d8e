"""GPT/LLaMA-style decoder on plain `mindspore.nn`, plus the loss wrapper and size/FLOP arithmetic.

Written with Primitive instances and `.astype()` instead of functional ops, because AMP O1 rewrites the
model source and fails on functional `ops.cast`/`ops.mean` (`NameError: cast_opt` in MindSpore 2.10).
"""
from __future__ import annotations

import dataclasses
import importlib
import math

import numpy as np
import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops
from mindspore.common.initializer import Normal, initializer
from mindspore.ops.auto_generate import SplitWithSize

from helpers.config import Config, ModelConfig
from helpers.run.kernels import NATIVE, native_ops


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


class _LayerNormManualFn(nn.Cell):
    """ops.LayerNorm forward with a hand-written backward (same math as LayerNormGrad).

    MindSpore's CPU LayerNormGrad led the nano step's profile here; the same gradient from a dozen elementwise/reduce
    ops is the alternative (`bench/bench.py speed` times it: arm norm_backward=manual). Parameter-free, so the
    bprop returns the parameters' gradients as ordinary input gradients.
    """

    def __init__(self, eps: float):
        super().__init__()
        self.eps = eps
        self.layer_norm = ops.LayerNorm(begin_norm_axis=-1, begin_params_axis=-1, epsilon=eps)
        self.mean = ops.ReduceMean(keep_dims=True)
        self.sum = ops.ReduceSum(keep_dims=False)
        self.rsqrt = ops.Rsqrt()

    def construct(self, x, gamma, beta):
        return self.layer_norm(x, gamma, beta)[0]

    def bprop(self, x, gamma, beta, out, dout):
        _, mean, var = self.layer_norm(x, gamma, beta)  # CPU LayerNorm's 3rd output is the variance
        rstd = self.rsqrt(var + self.eps)
        xhat = (x - mean) * rstd
        g = dout * gamma
        dx = rstd * (g - self.mean(g, -1) - xhat * self.mean(g * xhat, -1))
        rows = tuple(range(x.ndim - 1))
        return dx, self.sum(dout * xhat, rows), self.sum(dout, rows)


class LayerNorm(nn.LayerNorm):
    """nn.LayerNorm (same parameters, names and fp32 protection under AMP) computed by a chosen implementation:
    `mindspore` (its own op), `manual` (hand-written backward) or `native` (the C++ kernels)."""

    def __init__(self, dim: int, eps: float, impl: str):
        super().__init__((dim,), epsilon=eps)
        self.impl = impl
        if impl == "manual":
            self.fn = _LayerNormManualFn(eps)
        elif impl == "native":
            self.fn = native_ops()["layernorm"]
            self.eps_t = Tensor(np.array([eps], np.float32))

    def construct(self, x):
        gamma, beta = self.gamma.astype(x.dtype), self.beta.astype(x.dtype)
        if self.impl == "manual":
            return self.fn(x, gamma, beta)
        if self.impl == "native":
            return self.fn(x, gamma, beta, self.eps_t)[0]
        return self.layer_norm(x, gamma, beta)[0]


class _GeluManualFn(nn.Cell):
    """Exact GELU x·Φ(x) as erf arithmetic, with a hand-written backward Φ(x) + x·φ(x).

    Same math as nn.GELU(approximate=False); its CPU GeLU/GeLUGrad kernels are far slower than Erf + a few
    elementwise ops on the nano shape (measured: bench/bench.py speed).
    """

    def __init__(self):
        super().__init__()
        self.erf = ops.Erf()
        self.exp = ops.Exp()

    def construct(self, x):
        return 0.5 * x * (1.0 + self.erf(x * 0.7071067811865476))

    def bprop(self, x, out, dout):
        cdf = 0.5 * (1.0 + self.erf(x * 0.7071067811865476))
        pdf = self.exp(-0.5 * x * x) * 0.3989422804014327
        return (dout * (cdf + x * pdf),)


def make_gelu(cfg: ModelConfig, native: bool) -> nn.Cell | object:
    """The MLP's GELU: GPT-2's tanh approximation (mlp=gelu_tanh), else the exact erf as the native kernel, the
    hand-written formulation, or nn.GELU(approximate=False)."""
    if cfg.mlp == "gelu_tanh":  # no native or hand-written tanh form: MindSpore's own
        return nn.GELU(approximate=True)
    if native:
        return native_ops()["gelu"]
    if cfg.gelu == "erf_manual":
        return _GeluManualFn()
    return nn.GELU(approximate=False)


def make_norm(cfg: ModelConfig, native: bool) -> nn.Cell:
    """LayerNorm (always with a bias in MindSpore; native kernels, hand-written or MindSpore backward) or RMSNorm."""
    if cfg.norm == "rmsnorm":
        return RMSNorm(cfg.d_model, cfg.rms_eps)
    if native:
        return LayerNorm(cfg.d_model, 1e-5, "native")
    if cfg.norm_backward == "manual":
        return LayerNorm(cfg.d_model, 1e-5, "manual")
    return nn.LayerNorm((cfg.d_model,), epsilon=1e-5)


def _dense(d_in: int, d_out: int, bias: bool, std: float, native: bool, bias_op: str = "bias_add") -> nn.Dense:
    """nn.Dense with weights drawn from N(0, std) (std 0: zeros); with native kernels its BiasAdd (and BiasAddGrad,
    ≈ 0.2 ms per call on CPU) is the native `bias_op` ('bias_add', or 'bias_gelu' = bias add and exact GELU in one
    kernel). Same parameters and names."""
    dense = nn.Dense(d_in, d_out, weight_init=Normal(std) if std else "zeros", bias_init="zeros", has_bias=bias)
    if native and bias:
        dense.bias_add = native_ops()[bias_op]  # nn.Dense.construct calls self.bias_add(x, self.bias) on 2-D x
    return dense


class Rotary(nn.Cell):
    """Rotary position embedding in the 'rotate half' layout (GPT-NeoX, Hugging Face LLaMA): dimensions i and
    i + head/2 of each head turn together by the angle position × theta^(-2i/head). Applied to q and k only, so
    the score of two positions depends on their distance, and each vector keeps its norm. scale: linear rope
    scaling, positions divided by it."""

    def __init__(self, head_dim: int, seq_len: int, theta: float, scale: float = 1.0):
        super().__init__()
        freqs = theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
        # linear rope scaling (model.rope_scaling=linear): position p turns as p / scale
        angles = (np.arange(seq_len, dtype=np.float64) / scale)[:, None] * freqs[None, :]
        angles = np.concatenate([angles, angles], axis=-1)[None, None]  # [1, 1, T, head]
        self.cos = Tensor(np.cos(angles).astype(np.float32))
        self.sin = Tensor(np.sin(angles).astype(np.float32))
        self.split = ops.Split(axis=-1, output_num=2)
        self.concat = ops.Concat(axis=-1)

    def construct(self, x):
        x1, x2 = self.split(x)
        return x * self.cos.astype(x.dtype) + self.concat((-x2, x1)) * self.sin.astype(x.dtype)


class HeadNorm(nn.Cell):
    """QK-norm: each head's vector divided by its RMS over the head dimension (no gain)."""

    def __init__(self, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.mean = ops.ReduceMean(keep_dims=True)
        self.rsqrt = ops.Rsqrt()

    def construct(self, x):
        return x * self.rsqrt(self.mean(x * x, -1) + self.eps)


class CausalSelfAttention(nn.Cell):
    """Causal attention, multi-head or grouped-query (model.n_kv_head: each k,v head serves n_head/n_kv_head
    consecutive q heads, as Hugging Face's repeat_kv); q,k,v from one fused Dense split by ops.Split (by size under
    grouped-query attention), or three Dense cells."""

    def __init__(self, cfg: ModelConfig, proj_std: float, native: bool):
        super().__init__()
        d = cfg.d_model
        self.n_head, self.head_dim = cfg.n_head, d // cfg.n_head
        self.n_kv, self.kv_dim = cfg.kv_heads, cfg.kv_heads * self.head_dim
        self.grouped = self.n_kv != self.n_head  # False keeps the multi-head graph exactly as it was
        self.mode = cfg.qkv
        qkv_bias = cfg.bias or cfg.qkv_bias
        if cfg.qkv != "separate":
            self.qkv = _dense(d, d + 2 * self.kv_dim, qkv_bias, 0.02, native)
            # ops.SplitV has no CPU kernel; SplitWithSize (what ops.split runs) does, forward and backward
            self.split = SplitWithSize() if self.grouped else ops.Split(axis=-1, output_num=3)
        else:
            self.q = _dense(d, d, qkv_bias, 0.02, native)
            self.k, self.v = (_dense(d, self.kv_dim, qkv_bias, 0.02, native) for _ in range(2))
        self.proj = _dense(d, d, cfg.bias, proj_std, native)
        scale = cfg.rope_scaling_factor if cfg.rope_scaling == "linear" else 1.0
        self.rotary = Rotary(self.head_dim, cfg.seq_len, cfg.rope_theta, scale) if cfg.positions == "rope" else None
        self.qk_norm = HeadNorm() if cfg.qk_norm else None
        self.scores = ops.BatchMatMul(transpose_b=True)
        self.mix = ops.BatchMatMul()
        self.softmax = nn.Softmax(axis=-1)
        self.transpose = ops.Transpose()
        self.reshape = ops.Reshape()
        self.scale = 1.0 / math.sqrt(self.head_dim)
        # native: scale, causal mask and softmax in one kernel each way (no mask tensor, no Mul/Add/SoftmaxGrad)
        self.causal_softmax = native_ops()["causal_softmax"] if native else None
        self.scale_t = Tensor(np.array([self.scale], np.float32))
        # -1e4 (not -inf) stays finite in fp16 and still zeroes the masked softmax weights.
        mask = np.triu(np.full((cfg.seq_len, cfg.seq_len), -1e4, np.float32), k=1)
        self.mask = Tensor(mask[None, None])
        self.drop = nn.Dropout(p=cfg.dropout) if cfg.dropout > 0 else None
        # flash (Ascend only, config-checked): ops.flash_attention_score with its causal mode sparse_mode=2, which
        # takes the fixed 2048×2048 upper-triangle mask (1 = masked) whatever the sequence length
        self.flash = cfg.attention == "flash"
        if self.flash:
            self.causal_2048 = Tensor(np.triu(np.ones((2048, 2048), np.uint8), k=1))

    def _heads(self, t, b, s, heads):
        return self.transpose(self.reshape(t, (b, s, heads, self.head_dim)), (0, 2, 1, 3))

    def _qkv(self, x, d):
        if self.mode == "fused" and self.grouped:
            return self.split(self.qkv(x), (d, self.kv_dim, self.kv_dim), -1)
        if self.mode == "fused":
            return self.split(self.qkv(x))
        if self.mode == "fused_slice":  # the slow variant the profiler exposes (StridedSlice)
            qkv = self.qkv(x)
            return qkv[:, :, :d], qkv[:, :, d:d + self.kv_dim], qkv[:, :, d + self.kv_dim:]
        return self.q(x), self.k(x), self.v(x)

    def _softmax(self, scores, dtype):
        if self.causal_softmax is not None:
            return self.causal_softmax(scores, self.scale_t)
        return self.softmax(scores * self.scale + self.mask.astype(scores.dtype)).astype(dtype)

    def construct(self, x):
        b, s, d = x.shape
        q, k, v = self._qkv(x, d)
        q, k, v = self._heads(q, b, s, self.n_head), self._heads(k, b, s, self.n_kv), self._heads(v, b, s, self.n_kv)
        if self.qk_norm is not None:
            q, k = self.qk_norm(q), self.qk_norm(k)
        if self.rotary is not None:
            q, k = self.rotary(q), self.rotary(k)
        if self.flash:  # scale, causal mask, softmax and the value mix in one fused kernel (k,v heads may be fewer)
            y = ops.flash_attention_score(q, k, v, self.n_head, attn_mask=self.causal_2048, scalar_value=self.scale,
                                          input_layout="BNSD", sparse_mode=2)
            return self.proj(self.reshape(self.transpose(y, (0, 2, 1, 3)), (b, s, d)))
        if self.grouped:
            # the q heads of one k,v head as one [group·s, head] matrix: one BatchMatMul per k,v head, no k,v copies
            q = self.reshape(q, (b, self.n_kv, -1, self.head_dim))
            scores = self.reshape(self.scores(q, k), (b, self.n_head, s, s))
            att = self.reshape(self._softmax(scores, v.dtype), (b, self.n_kv, -1, s))
        else:
            att = self._softmax(self.scores(q, k), v.dtype)
        if self.drop is not None:
            att = self.drop(att)
        y = self.mix(att, v)
        if self.grouped:
            y = self.reshape(y, (b, self.n_head, s, self.head_dim))
        y = self.transpose(y, (0, 2, 1, 3))
        return self.proj(self.reshape(y, (b, s, d)))


class MLP(nn.Cell):
    """GELU (exact erf, as nanoGPT; or tanh-approximated, as GPT-2), SwiGLU or ReLU² feed-forward."""

    def __init__(self, cfg: ModelConfig, proj_std: float, native: bool):
        super().__init__()
        d = cfg.d_model
        self.swiglu = cfg.mlp == "swiglu"
        self.relu2 = cfg.mlp == "relu2"
        hidden = cfg.ffn_hidden
        if self.swiglu:
            self.gate = _dense(d, hidden, False, 0.02, native)
            self.up = _dense(d, hidden, False, 0.02, native)
            self.act = nn.SiLU()
        elif self.relu2:
            self.up = _dense(d, hidden, cfg.bias, 0.02, native)
            self.act = nn.ReLU()
        elif cfg.dense_act:
            self.up = nn.Dense(d, hidden, weight_init=Normal(0.02), bias_init="zeros", has_bias=cfg.bias,
                               activation=make_gelu(cfg, native))
            self.act = None
        elif native and cfg.bias and cfg.mlp == "gelu":  # bias add + exact GELU as one native kernel each way
            self.up = _dense(d, hidden, cfg.bias, 0.02, native, bias_op="bias_gelu")
            self.act = None
        else:
            self.up = _dense(d, hidden, cfg.bias, 0.02, native)
            self.act = make_gelu(cfg, native)
        self.down = _dense(hidden, d, cfg.bias and not self.swiglu, proj_std, native)
        self.drop = nn.Dropout(p=cfg.dropout) if cfg.dropout > 0 else None

    def construct(self, x):
        if self.swiglu:
            h = self.act(self.gate(x)) * self.up(x)
        elif self.relu2:
            h = self.act(self.up(x))
            h = h * h
        else:
            h = self.up(x) if self.act is None else self.act(self.up(x))
        out = self.down(h)
        return self.drop(out) if self.drop is not None else out


class Block(nn.Cell):
    """Pre-norm transformer block."""

    def __init__(self, cfg: ModelConfig, proj_std: float, native: bool):
        super().__init__()
        self.norm1, self.norm2 = make_norm(cfg, native), make_norm(cfg, native)
        self.attn = CausalSelfAttention(cfg, proj_std, native)
        self.mlp = MLP(cfg, proj_std, native)

    def construct(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class ReusedBlock(Block):
    """A Block whose graph MindSpore builds once and reuses for every block (model.lazy_inline): inlined again at
    the front end ("front", the only policy the CPU backend runs), so the steps run the same graph. On CPU, medians
    of three fresh processes: compile ×0.77 (tiny), ×0.86 (nano), ×0.66 (small); steps ×0.98–×1.01 paired; losses
    as a rerun of the same config (docs/data/2026-12-04-lazy-inline.json)."""

    @ms.lazy_inline(policy="front")
    def __init__(self, cfg: ModelConfig, proj_std: float, native: bool):
        super().__init__(cfg, proj_std, native)


class GPT(nn.Cell):
    """Token ids [B, T] int32 → logits [B*T, vocab]; the head tied to the token embedding (as nanoGPT) or a weight of
    its own (model.tie_head=false, as LLaMA). Positions: a learned table added to the embedding, or rotary in each
    attention (model.positions); logits soft-capped when model.logit_softcap > 0.

    native: the run's resolved kernels choice is native (`kernels.resolve_kernels`, made once per run; this class
    never reads cfg.kernels), else MindSpore's ops.
    """

    def __init__(self, cfg: ModelConfig, vocab_size: int, native: bool):
        super().__init__()
        self.vocab_size, self.d_model = vocab_size, cfg.d_model
        self.tok = nn.Embedding(vocab_size, cfg.d_model, embedding_table=Normal(0.02))
        self.pos = None
        if cfg.positions == "learned":
            self.pos = Parameter(initializer(Normal(0.02), (1, cfg.seq_len, cfg.d_model), ms.float32), name="pos")
        proj_std = 0.0 if cfg.zero_init_proj else 0.02 / math.sqrt(2 * cfg.n_layer)
        self.softcap = float(cfg.logit_softcap)
        self.head_weight = None  # untied (model.tie_head=false): an output head of its own, as LLaMA's lm_head
        if not cfg.tie_head:
            self.head_weight = Parameter(initializer(Normal(0.02), (vocab_size, cfg.d_model), ms.float32),
                                         name="head_weight")
        self.tanh = ops.Tanh()
        block = ReusedBlock if cfg.lazy_inline else Block
        self.blocks = nn.CellList([block(cfg, proj_std, native) for _ in range(cfg.n_layer)])
        self.norm = make_norm(cfg, native)
        self.head = ops.MatMul(transpose_b=True)
        self.reshape = ops.Reshape()
        self.drop = nn.Dropout(p=cfg.dropout) if cfg.dropout > 0 else None
        # Test-only ballast (bench.py power): real MatMul work, forward and backward, that cannot change the loss.
        # The zero is a non-trainable Parameter, not a constant, so the graph compiler cannot fold the work away.
        self.ballast = None
        if cfg.ballast and not cfg.ballast_every:  # with ballast_every it runs outside the graph (`Ballast`)
            self.ballast = Parameter(initializer(Normal(0.02), (cfg.d_model, cfg.ballast), ms.float32),
                                     name="ballast", requires_grad=False)
            self.ballast_zero = Parameter(Tensor(0.0, ms.float32), name="ballast_zero", requires_grad=False)
            self.ballast_mm, self.ballast_sum = ops.MatMul(), ops.ReduceSum()

    def construct(self, idx):
        x = self.tok(idx)
        if self.pos is not None:
            x = x + self.pos.astype(x.dtype)
        if self.drop is not None:
            x = self.drop(x)
        for block in self.blocks:
            x = block(x)
        x = self.reshape(self.norm(x), (-1, self.d_model))
        if self.ballast is not None:
            work = self.ballast_sum(self.ballast_mm(x, self.ballast.astype(x.dtype)))
            x = x + self.ballast_zero.astype(x.dtype) * work
        head = self.tok.embedding_table if self.head_weight is None else self.head_weight
        logits = self.head(x, head.astype(x.dtype))
        if self.softcap > 0:
            logits = self.softcap * self.tanh(logits / self.softcap)
        return logits


class Ballast(nn.Cell):
    """Test-only intermittent cost (model.ballast_every, bench.py validity): one real MatMul [tokens, d_model] ×
    [d_model, width] and its sum, run by the trainer inside every k-th step's timing, outside the step's graph;
    it touches no parameter of the model."""

    def __init__(self, tokens: int, d_model: int, width: int):
        super().__init__()
        self.x = Parameter(initializer(Normal(1.0), (tokens, d_model), ms.float32), name="ballast_x",
                           requires_grad=False)
        self.w = Parameter(initializer(Normal(0.02), (d_model, width), ms.float32), name="ballast_w",
                           requires_grad=False)
        self.mm, self.sum = ops.MatMul(), ops.ReduceSum()

    def construct(self):
        return self.sum(self.mm(self.x, self.w))


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


def build_model(cfg: Config, vocab_size: int, kernels: str) -> nn.Cell:
    """The backbone: our GPT, or the user's `model.build = 'pkg.mod:fn'` called as fn(model_cfg, vocab_size).
    kernels: the run's resolved choice, 'native' or 'mindspore' (`kernels.resolve_kernels`)."""
    if cfg.model.build:
        module_name, _, func_name = cfg.model.build.partition(":")
        try:
            builder = getattr(importlib.import_module(module_name), func_name)
        except (ImportError, AttributeError) as exc:
            raise ValueError(f"model.build={cfg.model.build!r} cannot be imported ({exc}); "
                             f"check the module is on PYTHONPATH and defines {func_name}") from None
        return builder(cfg.model, vocab_size)
    model_cfg = cfg.model
    if cfg.amp_level == "O1" and model_cfg.norm_backward == "manual":
        # AMP O1 rewrites the network's source and fails on the hand-written-backward LayerNorm subclass
        # ("LayerNormOpt.__init__() takes 1 positional argument but 2 were given"): it gets MindSpore's
        model_cfg = dataclasses.replace(model_cfg, norm_backward="mindspore")
    return GPT(model_cfg, vocab_size, kernels == NATIVE)


def count_params(net: nn.Cell) -> int:
    """Trainable parameters (elements)."""
    return int(sum(p.size for p in net.trainable_params()))


def flops_per_token(n_params: int, cfg: ModelConfig) -> float:
    """Training FLOPs per token: 6·N + 12·L·d·T (nanoGPT/PaLM), N without a learned position table.

    Recompute's extra forward is not counted (MFU counts useful work only).
    """
    n = n_params - (cfg.seq_len * cfg.d_model if cfg.positions == "learned" else 0)
    return 6.0 * n + 12.0 * cfg.n_layer * cfg.d_model * cfg.seq_len
