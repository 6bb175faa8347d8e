"""The tensor layouts of Hugging Face checkpoints the workbook's model takes (`GPT2`, `LLAMA`, `QWEN2`), as data: their
tensor names mapped to ours with the transform between the two, the model settings each layout needs, and where the
dims a config.json states can be read off the tensors' shapes.

GPT-2's Conv1D stores [in, out] where nn.Dense stores [out, in]; its wpe holds n_positions rows where our `pos` holds
model.seq_len (the first rows are the ones a shorter context uses). LLaMA's Linear weights are [out, in] as ours;
Hugging Face stores its q/k rows in the 'rotate half' order that `model.positions: rope` uses, so no permutation is
needed. Mistral's weights are LLaMA's layout. Qwen2 is LLaMA's layout with a bias on q, k and v (`model.qkv_bias`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from helpers.run.weights_error import WeightsError


@dataclass(frozen=True)
class Layout:
    """A checkpoint layout. marker: a name ending only this layout has; tensors: their name ({i} = block index) →
    (our parameter name, transform); model: the workbook settings the model needs for it (a tuple: any of those
    values, the first one suggested); prefix: an optional leading part of their names; ignored: name endings that
    are buffers, not weights; head / embedding: their output-layer and token-embedding names (a tied model takes a
    head equal to the embedding, an untied one maps it to `head_weight`); blocks: the config.json key counting the
    blocks and the pattern of a block's names; dims: config.json key → (tensor, axis) holding that dim; kv: the
    tensor whose rows are the key/value heads × head size (grouped-query layouts)."""
    name: str
    marker: str
    tensors: dict[str, tuple[str, str]]
    model: dict[str, object]
    blocks: tuple[str, str]
    dims: dict[str, tuple[str, int]] = field(default_factory=dict)
    prefix: str = ""
    ignored: tuple[str, ...] = ()
    head: str = "lm_head.weight"
    embedding: str = ""
    kv: str = ""


# what every Hugging Face layout here computes without: the workbook's levers that change the function
PLAIN = {"model.qk_norm": False, "model.logit_softcap": 0.0}

GPT2 = Layout(
    name="GPT-2",
    marker="attn.c_attn.weight",
    tensors={
        "wte.weight": ("tok.embedding_table", "same"),
        "wpe.weight": ("pos", "positions"),
        "h.{i}.ln_1.weight": ("blocks.{i}.norm1.gamma", "same"),
        "h.{i}.ln_1.bias": ("blocks.{i}.norm1.beta", "same"),
        "h.{i}.attn.c_attn.weight": ("blocks.{i}.attn.qkv.weight", "conv1d"),
        "h.{i}.attn.c_attn.bias": ("blocks.{i}.attn.qkv.bias", "same"),
        "h.{i}.attn.c_proj.weight": ("blocks.{i}.attn.proj.weight", "conv1d"),
        "h.{i}.attn.c_proj.bias": ("blocks.{i}.attn.proj.bias", "same"),
        "h.{i}.ln_2.weight": ("blocks.{i}.norm2.gamma", "same"),
        "h.{i}.ln_2.bias": ("blocks.{i}.norm2.beta", "same"),
        "h.{i}.mlp.c_fc.weight": ("blocks.{i}.mlp.up.weight", "conv1d"),
        "h.{i}.mlp.c_fc.bias": ("blocks.{i}.mlp.up.bias", "same"),
        "h.{i}.mlp.c_proj.weight": ("blocks.{i}.mlp.down.weight", "conv1d"),
        "h.{i}.mlp.c_proj.bias": ("blocks.{i}.mlp.down.bias", "same"),
        "ln_f.weight": ("norm.gamma", "same"),
        "ln_f.bias": ("norm.beta", "same"),
    },
    model={"model.norm": "layernorm", "model.bias": True, "model.qkv": ("fused", "fused_slice"),
           "model.positions": "learned", "model.tie_head": True, "model.n_kv_head": 0, **PLAIN},
    blocks=("n_layer", r"h\.(\d+)\."),
    dims={"vocab_size": ("wte.weight", 0), "n_embd": ("wte.weight", 1), "n_positions": ("wpe.weight", 0),
          "n_inner": ("h.0.mlp.c_fc.weight", 1)},
    prefix="transformer.",
    ignored=(".attn.bias", ".attn.masked_bias"),  # causal-mask buffers that older GPT-2 files carry
    embedding="wte.weight",
)

LLAMA_TENSORS = {
    "embed_tokens.weight": ("tok.embedding_table", "same"),
    "layers.{i}.input_layernorm.weight": ("blocks.{i}.norm1.weight", "same"),
    "layers.{i}.self_attn.q_proj.weight": ("blocks.{i}.attn.q.weight", "same"),
    "layers.{i}.self_attn.k_proj.weight": ("blocks.{i}.attn.k.weight", "same"),
    "layers.{i}.self_attn.v_proj.weight": ("blocks.{i}.attn.v.weight", "same"),
    "layers.{i}.self_attn.o_proj.weight": ("blocks.{i}.attn.proj.weight", "same"),
    "layers.{i}.post_attention_layernorm.weight": ("blocks.{i}.norm2.weight", "same"),
    "layers.{i}.mlp.gate_proj.weight": ("blocks.{i}.mlp.gate.weight", "same"),
    "layers.{i}.mlp.up_proj.weight": ("blocks.{i}.mlp.up.weight", "same"),
    "layers.{i}.mlp.down_proj.weight": ("blocks.{i}.mlp.down.weight", "same"),
    "norm.weight": ("norm.weight", "same"),
}
LLAMA_MODEL = {"model.norm": "rmsnorm", "model.bias": False, "model.qkv": "separate", "model.positions": "rope",
               "model.mlp": "swiglu", **PLAIN}
LLAMA_SHAPES = dict(blocks=("num_hidden_layers", r"layers\.(\d+)\."),
                    dims={"vocab_size": ("embed_tokens.weight", 0), "hidden_size": ("embed_tokens.weight", 1),
                          "intermediate_size": ("layers.0.mlp.up_proj.weight", 0)},
                    kv="layers.0.self_attn.k_proj.weight")
LLAMA = Layout(
    name="LLaMA",
    marker="self_attn.q_proj.weight",
    tensors=LLAMA_TENSORS,
    model={**LLAMA_MODEL, "model.qkv_bias": False},
    prefix="model.",
    ignored=("rotary_emb.inv_freq",),
    embedding="embed_tokens.weight",
    **LLAMA_SHAPES,
)
QWEN2 = Layout(
    name="Qwen2",
    marker="self_attn.q_proj.bias",
    tensors={**LLAMA_TENSORS, **{f"layers.{{i}}.self_attn.{n}_proj.bias": (f"blocks.{{i}}.attn.{n}.bias", "same")
                                 for n in "qkv"}},
    model={**LLAMA_MODEL, "model.qkv_bias": True},
    prefix="model.",
    ignored=("rotary_emb.inv_freq",),
    embedding="embed_tokens.weight",
    **LLAMA_SHAPES,
)
LAYOUTS = (GPT2, QWEN2, LLAMA)  # Qwen2 before LLaMA: its names are LLaMA's and the q,k,v biases


def layout_of(names: list[str], where: str) -> Layout:
    """The layout whose marker the names carry; a one-line WeightsError for one the workbook does not know."""
    for layout in LAYOUTS:
        if any(n.endswith(layout.marker) for n in names):
            return layout
    raise WeightsError(f"init_from={where!r} is in no layout the workbook knows (names such as "
                       f"{', '.join(sorted(names)[:3])}); pass a GPT-2-layout (wte, h.N.attn.c_attn, …) or "
                       f"LLaMA-layout (model.embed_tokens, model.layers.N.self_attn.q_proj, …) checkpoint")


def expand(layout: Layout, n_layer: int, tie_head: bool = True) -> dict[str, tuple[str, str]]:
    """The layout's table for `n_layer` blocks: their name → (our name, transform); an untied model's head too."""
    out = {}
    for theirs, (ours, transform) in layout.tensors.items():
        for i in range(n_layer) if "{i}" in theirs else [0]:
            out[theirs.format(i=i)] = (ours.format(i=i), transform)
    if not tie_head:
        out[layout.head] = ("head_weight", "same")
    return out


def dims_of(layout: Layout, shapes: dict[str, tuple[int, ...]]) -> tuple[dict[str, int], int]:
    """The dims the tensors hold, in config.json's names (the block count only when the blocks are 0..n-1), and the
    key/value rows of a grouped-query layout (0 when it has none)."""
    named = {k.removeprefix(layout.prefix): s for k, s in shapes.items() if not k.endswith(layout.ignored)}
    key, pattern = layout.blocks
    found = sorted({int(m.group(1)) for n in named if (m := re.match(pattern, n))})
    out = {key: len(found)} if found and found == list(range(len(found))) else {}
    out.update({k: named[t][axis] for k, (t, axis) in layout.dims.items() if t in named and len(named[t]) > axis})
    kv = named.get(layout.kv, ())
    return out, (kv[0] if kv else 0)
