"""The memory lower bound's weight terms (helpers/run/footprint.py) against the model's real parameter count: with
grouped k,v heads, a SwiGLU MLP and an untied head they count every weight matrix, four copies of four bytes each."""
from __future__ import annotations

from helpers.book.planner import model_params
from helpers.config import from_dict
from helpers.run.footprint import parts


def test_weight_terms_count_grouped_kv_heads_and_an_untied_head():
    cfg = from_dict({"model": {"preset": "tiny", "n_head": 4, "n_kv_head": 1, "mlp": "swiglu", "norm": "rmsnorm",
                               "bias": False, "positions": "rope", "tie_head": False, "vocab_size": 50}})
    m = cfg.model
    _, step = parts(cfg)
    by_what = {p.what: p.nbytes for p in step}
    weights = by_what["the token embedding and the output head with their gradients and AdamW moments"] + \
        by_what["the block weights with their gradients and AdamW moments"]
    norms = (2 * m.n_layer + 1) * m.d_model  # RMSNorm gains: the only parameters outside the matrices
    assert weights == 4 * 4 * (model_params(m, 50) - norms)
    kv = m.d_model // m.n_head  # one k,v head: k and v 16 values wide, q 64; per token and layer 6·64 + 2·16 + 2·h
    assert by_what["the activations kept for backward"] == (
        m.n_layer * (6 * m.d_model + 2 * kv + 2 * m.ffn_hidden) * cfg.batch_size * m.seq_len * 4)
