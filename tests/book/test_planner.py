"""The planner's parameter arithmetic for a workbook config (`model_params`, used to size an imported recipe at full
size) against the parameters of the model really built at small dims, and against published model sizes."""
from __future__ import annotations

import dataclasses

import pytest

from helpers.book.planner import MODELS, ModelShape, Strategy, activation_bytes, config_plan, model_params
from helpers.config import from_dict


@pytest.mark.parametrize("knobs", [{}, {"mlp": "swiglu", "norm": "rmsnorm", "bias": False, "positions": "rope"},
                                   {"mlp": "gelu_tanh", "bias": False}, {"mlp": "swiglu", "d_model": 96},
                                   {"mlp": "relu2", "qk_norm": True, "logit_softcap": 30.0},
                                   {"n_head": 4, "n_kv_head": 2, "qkv_bias": True, "bias": False, "mlp": "swiglu",
                                    "norm": "rmsnorm", "positions": "rope", "tie_head": False},
                                   {"n_head": 4, "n_kv_head": 1, "qkv": "separate"}],
                         ids=["gpt", "llama", "gelu_tanh_no_bias", "swiglu_d96", "relu2_levers", "qwen2_like",
                              "gqa_separate_bias"])
def test_model_params_is_what_the_model_builds(knobs):
    import mindspore as ms
    from helpers.run.model import GPT, count_params
    ms.set_context(mode=ms.PYNATIVE_MODE)
    m = from_dict({"model": {"preset": "tiny", **knobs}}).model
    assert model_params(m, 77) == count_params(GPT(m, 77, False))


def _published(**model):
    return from_dict({"model": {"preset": "custom", "norm": "rmsnorm", "mlp": "swiglu", "bias": False,
                                "positions": "rope", "seq_len": 4096, **model}}).model


def test_published_sizes_with_grouped_kv_heads_qkv_bias_and_an_untied_head():
    # Qwen2.5-0.5B: 24 layers, d 896, 14 heads and 2 k,v heads, SwiGLU 4864, vocabulary 151936 tied, q,k,v bias
    qwen = _published(n_layer=24, d_model=896, n_head=14, n_kv_head=2, mlp_hidden=4864, vocab_size=151936,
                      qkv_bias=True)
    assert model_params(qwen, 151936) == pytest.approx(0.494e9, rel=0.01)
    # LLaMA-2-70B: 80 layers, d 8192, 64 heads and 8 k,v heads, SwiGLU 28672, vocabulary 32000 untied
    llama = _published(n_layer=80, d_model=8192, n_head=64, n_kv_head=8, mlp_hidden=28672, vocab_size=32000,
                       tie_head=False)
    assert model_params(llama, 32000) == pytest.approx(68.98e9, rel=0.01)
    # the same dims with a k,v per head are far larger: the count is not a near-miss of the wrong model
    assert model_params(dataclasses.replace(llama, n_kv_head=0), 32000) > 1.08 * 68.98e9


def test_grouped_kv_heads_shrink_the_k_v_activations_only():
    s = Strategy(micro_batch=1)
    gqa = MODELS["70B"]
    mha = dataclasses.replace(gqa, n_kv_head=0)
    sbh = 4096 * 8192
    # k and v of every layer at 8/64 of their size: 4·s·b·h·(1 − 8/64) bytes less per layer
    assert activation_bytes(mha, s) - activation_bytes(gqa, s) == pytest.approx(80 * 4 * sbh * (1 - 8 / 64))
    cfg = from_dict({"model": {"preset": "tiny", "n_head": 4, "n_kv_head": 2, "vocab_size": 50}})
    shape, _ = config_plan(cfg)
    assert isinstance(shape, ModelShape) and shape.n_kv_head == 2 and shape.n_params == model_params(cfg.model, 50)
