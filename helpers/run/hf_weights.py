"""Hugging Face weights in and out of the workbook's model: a GPT-2- or LLaMA-layout safetensors checkpoint loaded
into `model.GPT` (`init_from`), and the model written back in its layout (`python -m helpers export`).

A layout is data (`GPT2`, `LLAMA`): its tensor names mapped to ours, each with the transform between the two, the
model settings it needs, and its config.json keys that name our settings. GPT-2's Conv1D stores [in, out] where
nn.Dense stores [out, in]; its wpe holds n_positions rows where our `pos` holds model.seq_len (the first rows are
the ones a shorter context uses). LLaMA's Linear weights are [out, in] as ours; Hugging Face stores its q/k rows in
the 'rotate half' order that `model.positions: rope` uses, so no permutation is needed; its head is untied
(`model.tie_head: false`) unless tie_word_embeddings says otherwise; num_key_value_heads < num_attention_heads is
grouped-query attention (`model.n_kv_head`). Qwen2 is LLaMA's layout with a bias on q, k and v (`model.qkv_bias`).
The rotary settings come from rope_theta/rope_scaling, or from transformers 5's rope_parameters, which holds both.
safetensors' NumPy API only: no torch.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from helpers.config import ConfigError, ModelConfig

WEIGHTS_FILE, CONFIG_FILE = "model.safetensors", "config.json"


class WeightsError(ConfigError):
    """Weights that cannot go into the model as configured; the message is one line naming what and the fix."""


@dataclass(frozen=True)
class Layout:
    """A checkpoint layout. marker: a name ending only this layout has; tensors: their name ({i} = block index) →
    (our parameter name, transform); model: the workbook settings the model needs for it (a tuple: any of those
    values, the first one suggested); settings: their
    config.json key → our key; prefix: an optional leading part of their names; ignored: name endings that are
    buffers, not weights; head / embedding: their output-layer and token-embedding names (a tied model takes a head
    equal to the embedding, an untied one maps it to `head_weight`); activations: config.json activation → model.mlp."""
    name: str
    marker: str
    tensors: dict[str, tuple[str, str]]
    model: dict[str, object]
    settings: dict[str, str]
    prefix: str = ""
    ignored: tuple[str, ...] = ()
    head: str = "lm_head.weight"
    embedding: str = ""
    activations: dict[str, str] = field(default_factory=dict)


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
           "model.positions": "learned", "model.tie_head": True, "model.n_kv_head": 0},
    settings={"n_layer": "model.n_layer", "n_head": "model.n_head", "n_embd": "model.d_model",
              "vocab_size": "model.vocab_size"},
    prefix="transformer.",
    ignored=(".attn.bias", ".attn.masked_bias"),  # causal-mask buffers that older GPT-2 files carry
    embedding="wte.weight",
    activations={"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"},
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
               "model.mlp": "swiglu"}
# the rotary settings are read by `_rope`, from rope_theta/rope_scaling or rope_parameters
LLAMA_SETTINGS = {"num_hidden_layers": "model.n_layer", "num_attention_heads": "model.n_head",
                  "num_key_value_heads": "model.n_kv_head", "hidden_size": "model.d_model",
                  "vocab_size": "model.vocab_size", "intermediate_size": "model.mlp_hidden",
                  "rms_norm_eps": "model.rms_eps", "tie_word_embeddings": "model.tie_head"}
LLAMA = Layout(
    name="LLaMA",
    marker="self_attn.q_proj.weight",
    tensors=LLAMA_TENSORS,
    model={**LLAMA_MODEL, "model.qkv_bias": False},
    settings=LLAMA_SETTINGS,
    prefix="model.",
    ignored=("rotary_emb.inv_freq",),
    embedding="embed_tokens.weight",
)
QWEN2 = Layout(
    name="Qwen2",
    marker="self_attn.q_proj.bias",
    tensors={**LLAMA_TENSORS, **{f"layers.{{i}}.self_attn.{n}_proj.bias": (f"blocks.{{i}}.attn.{n}.bias", "same")
                                 for n in "qkv"}},
    model={**LLAMA_MODEL, "model.qkv_bias": True},
    settings=LLAMA_SETTINGS,
    prefix="model.",
    ignored=("rotary_emb.inv_freq",),
    embedding="embed_tokens.weight",
)
LAYOUTS = (GPT2, QWEN2, LLAMA)  # Qwen2 before LLaMA: its names are LLaMA's and the q,k,v biases
ROPE_TYPES = {"default": "none", "linear": "linear"}  # Hugging Face rope_type → model.rope_scaling


def _to_ours(transform: str, theirs: np.ndarray, seq_len: int) -> np.ndarray:
    if transform == "conv1d" and theirs.ndim == 2:
        return np.ascontiguousarray(theirs.T)
    if transform == "positions" and theirs.ndim == 2:  # fewer rows than seq_len: a shape mismatch, reported
        return np.ascontiguousarray(theirs[None, :seq_len])
    return theirs


def _to_theirs(transform: str, ours: np.ndarray) -> np.ndarray:
    if transform == "conv1d":
        return np.ascontiguousarray(ours.T)
    if transform == "positions":
        return np.ascontiguousarray(ours[0])
    return ours


def expand(layout: Layout, n_layer: int, tie_head: bool = True) -> dict[str, tuple[str, str]]:
    """The layout's table for `n_layer` blocks: their name → (our name, transform); an untied model's head too."""
    out = {}
    for theirs, (ours, transform) in layout.tensors.items():
        for i in range(n_layer) if "{i}" in theirs else [0]:
            out[theirs.format(i=i)] = (ours.format(i=i), transform)
    if not tie_head:
        out[layout.head] = ("head_weight", "same")
    return out


def _files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    files = sorted(path.glob("*.safetensors")) if path.is_dir() else []
    if not files:
        what = "has no .safetensors file" if path.is_dir() else "does not exist"
        raise WeightsError(f"init_from={str(path)!r} {what}; pass a .safetensors file or a folder holding them")
    return files


def read_tensors(path: str | Path) -> dict[str, np.ndarray]:
    """Every tensor of a .safetensors file, or of all such files in a folder (a sharded checkpoint), by name."""
    from safetensors.numpy import load_file
    tensors: dict[str, np.ndarray] = {}
    for file in _files(Path(path)):
        try:
            tensors.update(load_file(str(file)))
        except Exception as exc:  # safetensors raises its own error types, and TypeError for bfloat16 in NumPy
            why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise WeightsError(f"cannot read {str(file)!r} as safetensors ({why}); pass an uncorrupted float32 or "
                               f"float16 .safetensors file (NumPy has no bfloat16: convert such a file first)") from None
    return tensors


def file_settings(path: str | Path) -> dict:
    """The checkpoint's config.json beside it (a folder's, or the file's folder's), or {} when there is none."""
    path = Path(path)
    config = (path if path.is_dir() else path.parent) / CONFIG_FILE
    try:
        return json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def names_of(path: str | Path) -> list[str]:
    """The tensor names of the checkpoint at `path` (a file or a folder of them), read without loading them."""
    from safetensors import safe_open
    names: list[str] = []
    for file in _files(Path(path)):
        try:
            with safe_open(str(file), framework="np") as fh:
                names += list(fh.keys())
        except Exception as exc:  # noqa: BLE001  safetensors' own error types
            raise WeightsError(f"cannot read {str(file)!r} as safetensors ({str(exc).splitlines()[0]}); pass an "
                               f"uncorrupted .safetensors file") from None
    return names


def _rope(settings: dict) -> dict:
    """The rotary settings of a config.json: transformers 5's rope_parameters (rope_type, rope_theta, factor, …),
    else rope_theta and rope_scaling; Hugging Face's defaults (theta 10000, no scaling) where it names none.
    model.rope_scaling holds the file's rope_type as it is when the workbook has no such scaling."""
    params = {**(settings.get("rope_scaling") or {}), **(settings.get("rope_parameters") or {})}
    if any(isinstance(v, dict) for v in params.values()):  # one set per attention type (Gemma-style)
        return {"model.rope_scaling": f"per-layer-type ({', '.join(params)})"}
    kind = params.get("rope_type", params.get("type", "default"))
    out = {"model.rope_theta": float(params.get("rope_theta", settings.get("rope_theta", 10000.0))),
           "model.rope_scaling": ROPE_TYPES.get(kind, kind)}
    if kind == "linear":
        out["model.rope_scaling_factor"] = float(params.get("factor", 1.0))
    return out


def _file_model(layout: Layout, settings: dict) -> dict:
    """The workbook settings the file's config.json names (GPT-2's activation → model.mlp, then dims and knobs, and
    a rotary layout's rope settings)."""
    out = {}
    if layout.activations:
        act = settings.get("activation_function", "gelu_new")
        out["model.mlp"] = layout.activations.get(act, act)
    out.update({ours: settings[theirs] for theirs, ours in layout.settings.items() if theirs in settings})
    if settings and layout.model.get("model.positions") == "rope":
        out.update(_rope(settings))
    return out


def model_settings(path: str | Path) -> dict:
    """The workbook settings a checkpoint needs (its layout's fixed knobs, then the dims and knobs its config.json
    names), as {dotted key: value} for `config.with_changes`."""
    names = names_of(path)
    layout = layout_of(names, str(path))
    settings = file_settings(path)
    _refuse_unsupported(layout, settings, str(path))
    fixed = {k: v[0] if isinstance(v, tuple) else v for k, v in layout.model.items()}
    out = {"model.preset": "custom", **fixed, **_file_model(layout, settings)}
    if "model.tie_head" not in out:  # no config.json: a head of its own when the file has one
        out["model.tie_head"] = not any(n.endswith(layout.head) for n in names)
    return out


def layout_of(names: list[str], where: str) -> Layout:
    """The layout whose marker the names carry; a one-line WeightsError for one the workbook does not know."""
    for layout in LAYOUTS:
        if any(n.endswith(layout.marker) for n in names):
            return layout
    raise WeightsError(f"init_from={where!r} is in no layout the workbook knows (names such as "
                       f"{', '.join(sorted(names)[:3])}); pass a GPT-2-layout (wte, h.N.attn.c_attn, …) or "
                       f"LLaMA-layout (model.embed_tokens, model.layers.N.self_attn.q_proj, …) checkpoint")


def _refuse_unsupported(layout: Layout, settings: dict, where: str) -> None:
    """What a LLaMA or Qwen2 config.json may ask that the model cannot do: a rotary scaling other than linear, another
    MLP activation, a head size of its own, biases beyond q, k, v, a sliding attention window."""
    if layout.model.get("model.positions") != "rope" or not settings:
        return
    kind = _rope(settings)["model.rope_scaling"]
    if kind not in ROPE_TYPES.values():
        raise WeightsError(f"init_from={where!r} scales its rotary positions with rope type {kind!r}, which the "
                           f"workbook's model does not implement (model.rope_scaling: none or linear); use a "
                           f"checkpoint without rope scaling or with linear scaling")
    act, heads = settings.get("hidden_act", "silu"), settings.get("num_attention_heads")
    if act != "silu":
        raise WeightsError(f"init_from={where!r} gates its MLP with hidden_act={act} and the workbook's SwiGLU "
                           f"(model.mlp=swiglu) with silu; use a checkpoint whose hidden_act is silu")
    head_dim, hidden = settings.get("head_dim"), settings.get("hidden_size")
    if head_dim and heads and hidden and head_dim * heads != hidden:
        raise WeightsError(f"init_from={where!r} has heads of head_dim={head_dim} and hidden_size={hidden} / "
                           f"num_attention_heads={heads} = {hidden / heads:g}; the workbook's heads are "
                           f"d_model/n_head wide: use a checkpoint with head_dim × num_attention_heads = hidden_size")
    extra = [k for k in ("attention_bias", "mlp_bias", "use_sliding_window") if settings.get(k)]
    if extra:
        raise WeightsError(f"init_from={where!r} sets {', '.join(f'{k}=true' for k in extra)}, which the workbook's "
                           f"model does not have (model.qkv_bias puts a bias on q, k, v only); use a checkpoint "
                           f"without them")


def mismatched(layout: Layout, m: ModelConfig, settings: dict, vocab: int = 0) -> list[str]:
    """The settings (key=value) the model must change to match a checkpoint of `layout` whose config.json holds
    `settings`; [] when it matches. vocab: the vocabulary the model was built with (its model.vocab_size when 0)."""
    wanted = {**layout.model, **_file_model(layout, settings)}
    wrong = []
    for key, want in wanted.items():
        name = key.split(".", 1)[1]
        have = {"mlp_hidden": m.ffn_hidden, "n_kv_head": m.kv_heads, "vocab_size": vocab or m.vocab_size}.get(
            name, getattr(m, name))
        if name == "n_kv_head":  # 0 and n_head are both multi-head attention
            want = want or settings.get("num_attention_heads", m.n_head)
        if have not in (want if isinstance(want, tuple) else (want,)):
            value = want[0] if isinstance(want, tuple) else want
            wrong.append(f"{key}={str(value).lower() if isinstance(value, bool) else value}")
    return wrong


def check_model(layout: Layout, m: ModelConfig, settings: dict, where: str, vocab: int = 0) -> None:
    """One WeightsError line naming every setting to change when the model does not match the checkpoint (vocab: the
    vocabulary the model was built with)."""
    _refuse_unsupported(layout, settings, where)
    wrong = mismatched(layout, m, settings, vocab)
    if wrong:
        what = f" (activation {settings.get('activation_function', 'gelu_new')})" if layout.activations else ""
        raise WeightsError(f"init_from={where!r} is a {layout.name} checkpoint{what}; the model must match it: set "
                           f"{' '.join(wrong)}")


def to_ours(tensors: dict[str, np.ndarray], layout: Layout, expected: dict[str, tuple], m: ModelConfig,
            where: str) -> dict[str, np.ndarray]:
    """Their tensors as our parameters (float32), checked against `expected` (our name → shape); a key or shape
    mismatch is one line listing them."""
    table = expand(layout, m.n_layer, m.tie_head)
    named = {k.removeprefix(layout.prefix): v for k, v in tensors.items() if not k.endswith(layout.ignored)}
    if m.tie_head:
        head = named.pop(layout.head, None)
        if head is not None and (layout.embedding not in named or not np.array_equal(head, named[layout.embedding])):
            raise WeightsError(f"init_from={where!r} has an output layer ({layout.head}) that differs from its token "
                               f"embedding and the model ties its head to the embedding; set model.tie_head=false")
    unknown, missing = sorted(set(named) - set(table)), sorted(set(table) - set(named))
    ours, shapes = {}, []
    for theirs, (name, transform) in table.items():
        if theirs not in named:
            continue
        value = _to_ours(transform, named[theirs], m.seq_len).astype(np.float32)
        if value.shape != tuple(expected[name]):
            shapes.append(f"{theirs} {tuple(named[theirs].shape)} → {name} needs {tuple(expected[name])}")
        ours[name] = value
    if unknown or missing or shapes:
        raise WeightsError(f"init_from={where!r} does not fit the model ({layout.name} layout, model.n_layer="
                           f"{m.n_layer}): key mismatch: {_listed('unknown', unknown)}, {_listed('missing', missing)}; "
                           f"shape mismatch: {_listed('', shapes) or 'none'}")
    return ours


def _listed(what: str, items: list[str], show: int = 4) -> str:
    if not items:
        return f"{what} none".strip()
    more = f" (+{len(items) - show} more)" if len(items) > show else ""
    return f"{what} {', '.join(items[:show])}{more}".strip()


@dataclass(frozen=True)
class Loaded:
    """What `load_into` put into the model: the layout, the tensors set, and the positions used of the file's."""
    layout: str
    tensors: int
    positions: tuple[int, int]  # (model.seq_len, the file's n_positions / max_position_embeddings)


def load_into(net, cfg_model: ModelConfig, path: str) -> Loaded:
    """Set the parameters of `net` (a `model.GPT` built for `cfg_model`) from the checkpoint at `path`."""
    import mindspore as ms
    tensors = read_tensors(path)
    layout = layout_of(list(tensors), path)
    settings = file_settings(path)
    check_model(layout, cfg_model, settings, path, getattr(net, "vocab_size", 0))
    params = {p.name: p for p in net.get_parameters()}
    ours = to_ours(tensors, layout, {k: p.shape for k, p in params.items()}, cfg_model, path)
    for name, value in ours.items():
        params[name].set_data(ms.Tensor(value))
    wpe = next((v for k, v in tensors.items() if k.endswith("wpe.weight")), None)
    known = int(wpe.shape[0]) if wpe is not None else int(settings.get("max_position_embeddings", cfg_model.seq_len))
    return Loaded(layout.name, len(ours), (cfg_model.seq_len, known))


def layout_for(m: ModelConfig) -> Layout:
    """The layout this model can be written in; a one-line WeightsError when it has none."""
    for layout in LAYOUTS:
        own = {"activation_function": _activation(layout, m.mlp)} if layout.activations else {}
        if not mismatched(layout, m, own) and (not layout.activations or m.mlp in layout.activations.values()):
            return layout
    raise WeightsError("this run's model has no Hugging Face layout: GPT-2 needs model.norm=layernorm, model.bias=true, "
                       "fused q,k,v, learned positions, a tied head, a GELU MLP and model.n_kv_head=0; LLaMA (Qwen2 "
                       "with model.qkv_bias=true) needs model.norm=rmsnorm, model.bias=false, model.qkv=separate, "
                       "model.positions=rope and model.mlp=swiglu")


def from_ours(params: dict[str, np.ndarray], m: ModelConfig) -> dict[str, np.ndarray]:
    """Our parameters (name → array) in the model's layout's names and shapes, prefix included; a tied head is not
    written (as Hugging Face saves a tied GPT-2), an untied one is."""
    layout = layout_for(m)
    table = expand(layout, m.n_layer, m.tie_head)
    missing = [ours for ours, _ in table.values() if ours not in params]
    if missing:
        raise WeightsError(f"the checkpoint lacks {_listed('', missing)} of the model's parameters; export a "
                           f"checkpoint of the workbook's own model (not model.build)")
    prefix = {name: "" if name == layout.head else layout.prefix for name in table}
    return {prefix[theirs] + theirs: _to_theirs(transform, np.asarray(params[ours], np.float32))
            for theirs, (ours, transform) in table.items()}


def _activation(layout: Layout, mlp: str) -> str:
    return next((act for act, ours in layout.activations.items() if ours == mlp), mlp)


def _rope_config(m: ModelConfig) -> dict:
    """The rotary settings as config.json keys: transformers 5's rope_parameters, and rope_theta/rope_scaling for
    older readers."""
    linear = m.rope_scaling == "linear"
    scaling = {"rope_type": "linear", "factor": m.rope_scaling_factor} if linear else None
    return {"rope_theta": m.rope_theta, "rope_scaling": scaling,
            "rope_parameters": {"rope_type": "linear" if linear else "default", "rope_theta": m.rope_theta,
                                **({"factor": m.rope_scaling_factor} if linear else {})}}


def hf_config(m: ModelConfig, vocab: int) -> dict:
    """The config.json Hugging Face's GPT-2, LLaMA or Qwen2 classes read for these dims."""
    layout = layout_for(m)
    if layout in (LLAMA, QWEN2):
        kind = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "attention_bias": False,
                "mlp_bias": False} if layout is LLAMA else \
            {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "use_sliding_window": False}
        return {**kind, "vocab_size": vocab, "hidden_size": m.d_model, "intermediate_size": m.ffn_hidden,
                "num_hidden_layers": m.n_layer, "num_attention_heads": m.n_head, "num_key_value_heads": m.kv_heads,
                "head_dim": m.d_model // m.n_head, "hidden_act": "silu", "max_position_embeddings": m.seq_len,
                "rms_norm_eps": m.rms_eps, **_rope_config(m), "tie_word_embeddings": m.tie_head}
    return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": vocab,
            "n_positions": m.seq_len, "n_ctx": m.seq_len, "n_embd": m.d_model, "n_layer": m.n_layer,
            "n_head": m.n_head, "n_inner": m.ffn_hidden, "activation_function": _activation(GPT2, m.mlp),
            "layer_norm_epsilon": 1e-5,
            "resid_pdrop": m.dropout, "embd_pdrop": m.dropout, "attn_pdrop": m.dropout, "tie_word_embeddings": True}


def write_checkpoint(out: str | Path, params: dict[str, np.ndarray], m: ModelConfig) -> Path:
    """Write `params` (our names) as out/model.safetensors in the model's layout, with its config.json; returns the
    file."""
    from safetensors.numpy import save_file
    theirs = from_ours(params, m)
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(theirs, str(folder / WEIGHTS_FILE), metadata={"format": "np"})
    vocab = int(params["tok.embedding_table"].shape[0])
    (folder / CONFIG_FILE).write_text(json.dumps(hf_config(m, vocab), indent=2) + "\n", encoding="utf-8")
    return folder / WEIGHTS_FILE


def export_checkpoint(source: str | Path, out: str | Path) -> tuple[Path, Path]:
    """Write the model of a run (its last checkpoint) or of one .ckpt file of a run in its layout to folder `out`;
    returns (the checkpoint read, the .safetensors written)."""
    import mindspore as ms
    from helpers.record import load_run
    from helpers.run.checkpoints import resume_source
    try:
        run_dir, ckpt = resume_source(str(source))
    except ConfigError:
        raise WeightsError(f"{str(source)!r} holds no checkpoint to export; pass a run folder (every finished run "
                           f"has one) or one of its checkpoints/step_N.ckpt files") from None
    model_cfg = load_run(run_dir).config.model
    params = {k: v.asnumpy() for k, v in ms.load_checkpoint(str(ckpt)).items()}
    return ckpt, write_checkpoint(out, params, model_cfg)
