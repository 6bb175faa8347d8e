"""Hugging Face weights in and out of the workbook's model: a GPT-2-layout safetensors checkpoint loaded into
`model.GPT` (`init_from`), and the model written back in that layout (`python -m helpers export`).

A layout is data (`GPT2`): its tensor names mapped to ours, each with the transform between the two. GPT-2's
Conv1D stores [in, out] where nn.Dense stores [out, in]; its wpe holds n_positions rows where our `pos` holds
model.seq_len (the first rows are the ones a shorter context uses). A LLaMA-layout file is recognised and refused:
it needs an untied output head and a free SwiGLU width, which the model does not have (its rotary positions, the
'rotate half' layout of Hugging Face's LLaMA, it has). safetensors' NumPy API only: no torch at run time.
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
    """A checkpoint layout. tensors: their name ({i} = block index) → (our parameter name, transform); prefix: an
    optional leading part of their names; ignored: name endings that are buffers, not weights; tied_head: their
    output-layer name, which must equal the token embedding (our head is tied to it)."""
    name: str
    tensors: dict[str, tuple[str, str]]
    prefix: str = ""
    ignored: tuple[str, ...] = ()
    tied_head: str = ""
    activations: dict[str, str] = field(default_factory=dict)  # config.json activation_function → model.mlp


GPT2 = Layout(
    name="GPT-2",
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
    prefix="transformer.",
    ignored=(".attn.bias", ".attn.masked_bias"),  # causal-mask buffers that older GPT-2 files carry
    tied_head="lm_head.weight",
    activations={"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"},
)

# Layouts recognised by a name ending, that the model cannot take yet: what it lacks.
REFUSED = {".self_attn.q_proj.weight": ("LLaMA", "an output head of its own (lm_head: this model ties its head to the "
                                                 "token embedding) and the checkpoint's SwiGLU width "
                                                 "(intermediate_size: this model derives it from d_model); its rotary "
                                                 "positions are there (model.positions: rope)")}


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


def expand(layout: Layout, n_layer: int) -> dict[str, tuple[str, str]]:
    """The layout's table for `n_layer` blocks: their name → (our name, transform)."""
    out = {}
    for theirs, (ours, transform) in layout.tensors.items():
        for i in range(n_layer) if "{i}" in theirs else [0]:
            out[theirs.format(i=i)] = (ours.format(i=i), transform)
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


# config.json keys of a GPT-2 checkpoint → the workbook keys that must match them.
SETTINGS = {"n_layer": "model.n_layer", "n_head": "model.n_head", "n_embd": "model.d_model",
            "vocab_size": "model.vocab_size"}


def model_settings(path: str | Path, layout: Layout = GPT2) -> dict:
    """The workbook settings a GPT-2 checkpoint needs (dims from its config.json when present, activation, norm,
    biases, fused q,k,v), as {dotted key: value} for `config.with_changes`."""
    settings = file_settings(path)
    act = settings.get("activation_function", "gelu_new")
    out = {ours: settings[theirs] for theirs, ours in SETTINGS.items() if theirs in settings}
    return {**out, "model.preset": "custom", "model.norm": "layernorm", "model.bias": True, "model.qkv": "fused",
            "model.mlp": layout.activations.get(act, act)}


def layout_of(names: list[str], where: str) -> Layout:
    """GPT2 when the names are GPT-2's; a one-line WeightsError for a layout the model cannot take or does not know."""
    for ending, (layout, lacks) in REFUSED.items():
        if any(n.endswith(ending) for n in names):
            raise WeightsError(f"init_from={where!r} is a {layout}-layout checkpoint, which needs {lacks}; "
                               f"use a GPT-2-layout checkpoint")
    if not any(n.endswith("attn.c_attn.weight") for n in names):
        raise WeightsError(f"init_from={where!r} is in no layout the workbook knows (names such as "
                           f"{', '.join(sorted(names)[:3])}); pass a GPT-2-layout checkpoint (wte, h.N.attn.c_attn, …)")
    return GPT2


def mismatched(layout: Layout, m: ModelConfig, settings: dict) -> list[str]:
    """The settings (key=value) the model must change to match a GPT-2 checkpoint whose config.json holds
    `settings` (its activation and heads, when present); [] when it matches."""
    act = settings.get("activation_function", "gelu_new")
    wanted = {"model.norm": "layernorm", "model.bias": True, "model.mlp": layout.activations.get(act, act)}
    if "n_head" in settings:
        wanted["model.n_head"] = settings["n_head"]
    have = {"model.norm": m.norm, "model.bias": m.bias, "model.mlp": m.mlp, "model.n_head": m.n_head}
    wrong = [f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in wanted.items() if have[k] != v]
    if m.qkv == "separate":
        wrong.append("model.qkv=fused")
    return wrong


def check_model(layout: Layout, m: ModelConfig, settings: dict, where: str) -> None:
    """One WeightsError line naming the settings to change when the model does not match the checkpoint."""
    wrong = mismatched(layout, m, settings)
    if wrong:
        act = settings.get("activation_function", "gelu_new")
        raise WeightsError(f"init_from={where!r} is a {layout.name} checkpoint (activation {act}); the model must "
                           f"match it: set {' '.join(wrong)}")


def to_ours(tensors: dict[str, np.ndarray], layout: Layout, expected: dict[str, tuple], seq_len: int, n_layer: int,
            where: str) -> dict[str, np.ndarray]:
    """Their tensors as our parameters (float32), checked against `expected` (our name → shape); a key or shape
    mismatch is one line listing them."""
    table = expand(layout, n_layer)
    named = {k.removeprefix(layout.prefix): v for k, v in tensors.items() if not k.endswith(layout.ignored)}
    head = named.pop(layout.tied_head, None)
    if head is not None and ("wte.weight" not in named or not np.array_equal(head, named["wte.weight"])):
        raise WeightsError(f"init_from={where!r} has an output layer ({layout.tied_head}) that differs from its token "
                           f"embedding; the workbook's head is tied to the embedding, so it cannot take an untied one")
    unknown, missing = sorted(set(named) - set(table)), sorted(set(table) - set(named))
    ours, shapes = {}, []
    for theirs, (name, transform) in table.items():
        if theirs not in named:
            continue
        value = _to_ours(transform, named[theirs], seq_len).astype(np.float32)
        if value.shape != tuple(expected[name]):
            shapes.append(f"{theirs} {tuple(named[theirs].shape)} → {name} needs {tuple(expected[name])}")
        ours[name] = value
    if unknown or missing or shapes:
        raise WeightsError(f"init_from={where!r} does not fit the model ({layout.name} layout, model.n_layer={n_layer}): "
                           f"key mismatch: {_listed('unknown', unknown)}, {_listed('missing', missing)}; "
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
    positions: tuple[int, int]  # (model.seq_len, the file's n_positions)


def load_into(net, cfg_model: ModelConfig, path: str) -> Loaded:
    """Set the parameters of `net` (a `model.GPT` built for `cfg_model`) from the checkpoint at `path`."""
    import mindspore as ms
    tensors = read_tensors(path)
    layout = layout_of(list(tensors), path)
    check_model(layout, cfg_model, file_settings(path), path)
    params = {p.name: p for p in net.get_parameters()}
    ours = to_ours(tensors, layout, {k: p.shape for k, p in params.items()}, cfg_model.seq_len, cfg_model.n_layer,
                   path)
    for name, value in ours.items():
        params[name].set_data(ms.Tensor(value))
    wpe = next(v for k, v in tensors.items() if k.endswith("wpe.weight"))
    return Loaded(layout.name, len(ours), (cfg_model.seq_len, int(wpe.shape[0])))


def from_ours(params: dict[str, np.ndarray], m: ModelConfig, layout: Layout = GPT2) -> dict[str, np.ndarray]:
    """Our parameters (name → array) in the layout's names and shapes, prefix included; the head stays tied
    (not written, as Hugging Face saves a tied GPT-2)."""
    wrong = mismatched(layout, m, {"activation_function": _activation(layout, m.mlp)})
    if wrong or m.mlp not in layout.activations.values():
        raise WeightsError(f"this run's model has no {layout.name} layout: {layout.name} needs model.norm=layernorm, "
                           f"model.bias=true, fused q,k,v and a GELU MLP (a LLaMA-like model waits for an untied "
                           f"head and a LLaMA layout)")
    missing = [ours for ours, _ in expand(layout, m.n_layer).values() if ours not in params]
    if missing:
        raise WeightsError(f"the checkpoint lacks {_listed('', missing)} of the model's parameters; export a "
                           f"checkpoint of the workbook's own model (not model.build)")
    return {layout.prefix + theirs: _to_theirs(transform, np.asarray(params[ours], np.float32))
            for theirs, (ours, transform) in expand(layout, m.n_layer).items()}


def _activation(layout: Layout, mlp: str) -> str:
    return next((act for act, ours in layout.activations.items() if ours == mlp), mlp)


def hf_config(m: ModelConfig, vocab: int, layout: Layout = GPT2) -> dict:
    """The config.json Hugging Face's GPT-2 classes read for these dims."""
    return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": vocab,
            "n_positions": m.seq_len, "n_ctx": m.seq_len, "n_embd": m.d_model, "n_layer": m.n_layer,
            "n_head": m.n_head, "activation_function": _activation(layout, m.mlp), "layer_norm_epsilon": 1e-5,
            "resid_pdrop": m.dropout, "embd_pdrop": m.dropout, "attn_pdrop": m.dropout, "tie_word_embeddings": True}


def write_checkpoint(out: str | Path, params: dict[str, np.ndarray], m: ModelConfig) -> Path:
    """Write `params` (our names) as out/model.safetensors in GPT-2 layout, with its config.json; returns the file."""
    from safetensors.numpy import save_file
    theirs = from_ours(params, m)
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(theirs, str(folder / WEIGHTS_FILE), metadata={"format": "np"})
    vocab = int(params["tok.embedding_table"].shape[0])
    (folder / CONFIG_FILE).write_text(json.dumps(hf_config(m, vocab), indent=2) + "\n", encoding="utf-8")
    return folder / WEIGHTS_FILE


def export_checkpoint(source: str | Path, out: str | Path) -> tuple[Path, Path]:
    """Write the model of a run (its last checkpoint) or of one .ckpt file of a run in GPT-2 layout to folder `out`;
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
