"""Grouped-query attention, the q,k,v bias and linear rope scaling in the workbook's model against a float64 NumPy
forward written from the papers (k,v heads repeated for their q heads, rotary as complex numbers), for every q,k,v
formulation and both softmax implementations; and the multi-head model keeps its parameters."""
from __future__ import annotations

import numpy as np
import pytest

from helpers.config import from_dict
from tests.conftest import mindspore_on_cpu

VOCAB, LAYERS, HEADS, KV, D, SEQ = 37, 2, 4, 2, 32, 12


@pytest.fixture(scope="module", autouse=True)
def pynative():
    mindspore_on_cpu("pynative")


def model_cfg(**model):
    knobs = {"preset": "custom", "n_layer": LAYERS, "n_head": HEADS, "n_kv_head": KV, "d_model": D, "seq_len": SEQ,
             "vocab_size": VOCAB, "norm": "rmsnorm", "mlp": "swiglu", "mlp_hidden": 40, "positions": "rope",
             "rope_theta": 500.0, "bias": False, "qkv_bias": True, "qkv": "separate", "tie_head": False,
             "rope_scaling": "linear", "rope_scaling_factor": 2.5, **model}
    return from_dict({"model": knobs}).model


def random_weights(m, seed: int = 0) -> dict[str, np.ndarray]:
    """Weights by the separate formulation's names, large enough (std 0.3) that every term moves the logits."""
    rng = np.random.default_rng(seed)
    kv = m.kv_heads * (D // HEADS)

    def w(*shape, scale=0.3):
        return (rng.standard_normal(shape) * scale).astype(np.float32)
    t = {"tok.embedding_table": w(VOCAB, D, scale=1.0), "norm.weight": 1 + w(D), "head_weight": w(VOCAB, D)}
    for i in range(LAYERS):
        p = f"blocks.{i}."
        t.update({p + "norm1.weight": 1 + w(D), p + "norm2.weight": 1 + w(D),
                  p + "attn.q.weight": w(D, D), p + "attn.q.bias": w(D), p + "attn.k.weight": w(kv, D),
                  p + "attn.k.bias": w(kv), p + "attn.v.weight": w(kv, D), p + "attn.v.bias": w(kv),
                  p + "attn.proj.weight": w(D, D), p + "mlp.gate.weight": w(40, D), p + "mlp.up.weight": w(40, D),
                  p + "mlp.down.weight": w(D, 40)})
    return t


def fused(t: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The same weights with q, k, v stacked into one Dense (q rows, then k, then v)."""
    out = {k: v for k, v in t.items() if ".attn.q." not in k and ".attn.k." not in k and ".attn.v." not in k}
    for i in range(LAYERS):
        p = f"blocks.{i}.attn."
        for kind in ("weight", "bias"):
            out[p + "qkv." + kind] = np.concatenate([t[p + n + "." + kind] for n in "qkv"])
    return out


def reference_logits(t: dict[str, np.ndarray], ids: np.ndarray, kv_heads: int, theta: float,
                     factor: float, eps: float = 1e-6, interleaved: bool = False) -> np.ndarray:
    """float64 forward: RMSNorm, q,k,v with bias, rotary at position/factor, each k,v head repeated for its
    HEADS/kv_heads consecutive q heads (interleaved: for q heads j, j + kv_heads, …, the wrong way), causal softmax,
    SwiGLU, untied head."""
    t = {k: v.astype(np.float64) for k, v in t.items()}
    hd, b, s = D // HEADS, *ids.shape

    def rms(x, name):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * t[name]

    def rotate(x):
        z = (x[..., : hd // 2] + 1j * x[..., hd // 2:]) * np.exp(
            1j * (np.arange(s) / factor)[:, None] * theta ** (-np.arange(0, hd, 2) / hd))
        return np.concatenate([z.real, z.imag], -1)

    def heads(a, n):
        return a.reshape(b, s, n, hd).transpose(0, 2, 1, 3)
    x = t["tok.embedding_table"][ids]
    causal = np.triu(np.ones((s, s), bool), k=1)
    for i in range(LAYERS):
        p = f"blocks.{i}."
        h = rms(x, p + "norm1.weight")
        q, k, v = (h @ t[p + f"attn.{n}.weight"].T + t[p + f"attn.{n}.bias"] for n in "qkv")
        q, k, v = heads(q, HEADS), heads(k, kv_heads), heads(v, kv_heads)
        q, k = rotate(q), rotate(k)
        share = (lambda a: np.tile(a, (1, HEADS // kv_heads, 1, 1))) if interleaved else (
            lambda a: np.repeat(a, HEADS // kv_heads, axis=1))
        k, v = share(k), share(v)
        scores = np.where(causal, -np.inf, q @ k.transpose(0, 1, 3, 2) / np.sqrt(hd))
        att = np.exp(scores - scores.max(-1, keepdims=True))
        att /= att.sum(-1, keepdims=True)
        x = x + (att @ v).transpose(0, 2, 1, 3).reshape(b, s, D) @ t[p + "attn.proj.weight"].T
        h = rms(x, p + "norm2.weight")
        gate = h @ t[p + "mlp.gate.weight"].T
        x = x + (gate / (1 + np.exp(-gate)) * (h @ t[p + "mlp.up.weight"].T)) @ t[p + "mlp.down.weight"].T
    return (rms(x, "norm.weight") @ t["head_weight"].T).reshape(b * s, VOCAB)


def logits_of(m, weights: dict[str, np.ndarray], ids: np.ndarray, native: bool = False) -> np.ndarray:
    import mindspore as ms
    from helpers.run.model import GPT
    net = GPT(m, VOCAB, native)
    params = {p.name: p for p in net.get_parameters()}
    assert sorted(params) == sorted(weights)
    for name, value in weights.items():
        assert tuple(params[name].shape) == value.shape, name
        params[name].set_data(ms.Tensor(value))
    return net(ms.Tensor(ids)).asnumpy()


IDS = np.random.default_rng(3).integers(0, VOCAB, (2, SEQ)).astype(np.int32)


@pytest.mark.parametrize("native", [False, True], ids=["mindspore_ops", "native_kernels"])
@pytest.mark.parametrize("qkv", ["separate", "fused", "fused_slice"])
def test_grouped_query_attention_with_qkv_bias_and_scaled_rope_matches_numpy(qkv, native):
    from helpers.run import kernels
    if native and kernels.library_problem():
        pytest.skip(kernels.library_problem())
    m = model_cfg(qkv=qkv)
    t = random_weights(m)
    got = logits_of(m, t if qkv == "separate" else fused(t), IDS, native)
    want = reference_logits(t, IDS, KV, 500.0, 2.5)
    assert np.abs(got - want).max() < 1e-5
    assert np.abs(want).max() > 1.0


def test_the_reference_tells_each_setting_apart():
    """The comparison above can fail: k,v heads shared by the wrong q heads, a missing bias or unscaled positions
    each move the logits far beyond its tolerance."""
    m = model_cfg()
    t = random_weights(m)
    got = logits_of(m, t, IDS)
    no_bias = {k: np.zeros_like(v) if k.endswith(".bias") else v for k, v in t.items()}
    for wrong in (reference_logits(t, IDS, KV, 500.0, 1.0), reference_logits(no_bias, IDS, KV, 500.0, 2.5),
                  reference_logits(t, IDS, KV, 500.0, 2.5, interleaved=True)):
        assert np.abs(got - wrong).max() > 1e-2


def test_grouped_query_attention_compiles_in_graph_mode():
    import mindspore as ms
    m = model_cfg(qkv="fused")
    t = fused(random_weights(m))
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        got = logits_of(m, t, IDS)
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)
    want = reference_logits(random_weights(m), IDS, KV, 500.0, 2.5)
    assert np.abs(got - want).max() < 1e-5


@pytest.mark.parametrize("kv", [0, HEADS])
def test_multi_head_attention_is_n_kv_head_0_or_n_head(kv):
    from helpers.run.model import GPT
    m = model_cfg(n_kv_head=kv, qkv_bias=False, qkv="fused")
    shapes = {p.name: tuple(p.shape) for p in GPT(m, VOCAB, False).get_parameters()}
    assert shapes["blocks.0.attn.qkv.weight"] == (3 * D, D) and "blocks.0.attn.qkv.bias" not in shapes
