"""Hugging Face weights in and out of the workbook's model: a GPT-2-, LLaMA-, Mistral- or Qwen2-layout safetensors
checkpoint loaded into `model.GPT` (`init_from`), and the model written back in its layout (`python -m helpers
export`).

Everything a checkpoint says is checked before any tensor data is read (`inspect`): the files are the ones
transformers reads (`hf_files`), each tensor is float, config.json is readable and each of its keys is honoured,
checked or ignored as its architecture's table says (`hf_config_keys`), its model_type agrees with the tensors'
layout (`hf_layouts`), and its dims agree with the tensors' shapes. What the model must then change is named in one
line of `set key=value` that the config accepts, or, when no value fits, the line says it cannot be imported.
Loading reads every tensor as float32 and refuses a NaN or infinity by name. safetensors' format only: no torch.
"""
from __future__ import annotations

import errno
import json
import os
import shutil
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from helpers.config import ConfigError, ModelConfig, from_dict
from helpers.run.hf_config_keys import ACTIVATIONS, ARCHITECTURES, BY_LAYOUT, Architecture, AtMost, assumed_values, \
    completed, read_config, show
from helpers.run.hf_files import WEIGHTS_FILE, Files, Stored, few, files_of, floats_only, load, stored
from helpers.run.hf_layouts import GPT2, LAYOUTS, LLAMA, QWEN2, Layout, dims_of, expand, layout_of
from helpers.run.weights_error import WeightsError

CONFIG_FILE = "config.json"
KEYS_PAGE = "docs/reference/hf-config-keys.md"


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint checked up front (no tensor data read): where it was named, its files, its weights (buffers such
    as GPT-2's causal masks left out), its layout and architecture, its config.json as transformers reads it ({} when
    there is none) and the workbook settings its model needs (an AtMost value bounds a setting from above)."""
    where: str
    files: Files
    tensors: dict[str, Stored]
    layout: Layout
    arch: Architecture
    config: dict
    wanted: dict[str, Any]


def _config(path: Path, where: str) -> dict | None:
    """config.json beside the weights, None when there is none; a file that is there and unreadable is refused."""
    file = (path if path.is_dir() else path.parent) / CONFIG_FILE
    if not file.exists():
        return None
    try:
        config = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise WeightsError(f"init_from={where!r} cannot be imported: its {CONFIG_FILE} cannot be read ({why}); "
                           f"restore the file from where the checkpoint came from") from None
    if not isinstance(config, dict):
        raise WeightsError(f"init_from={where!r} cannot be imported: its {CONFIG_FILE} is a JSON "
                           f"{type(config).__name__}, not an object of key: value; restore the file")
    return config


def file_settings(path: str | Path) -> dict:
    """The checkpoint's config.json beside it (a folder's, or the file's folder's), or {} when there is none; an
    unreadable one is a WeightsError."""
    return _config(Path(path), str(path)) or {}


def _architecture(layout: Layout, config: dict | None, where: str) -> Architecture:
    model_type = (config or {}).get("model_type", BY_LAYOUT[layout.name])
    if model_type not in ARCHITECTURES:
        raise WeightsError(f"init_from={where!r} cannot be imported: its {CONFIG_FILE} has model_type="
                           f"{show(model_type)} and the workbook imports {', '.join(ARCHITECTURES)}")
    return ARCHITECTURES[model_type]


def _as_read(arch: Architecture, layout: Layout, file: dict | None, tensors: dict[str, Stored]) -> tuple[dict, dict]:
    """config.json completed as transformers reads it (defaults, and the dims it leaves out taken from the weights;
    without a config.json, the weights' dims alone), and those dims."""
    dims, kv_rows = dims_of(layout, {k: v.shape for k, v in tensors.items()})
    if file is None:
        return dict(dims), dims
    config = completed(arch, file, dims)
    heads, hidden = config.get("num_attention_heads"), config.get("hidden_size")
    head = config.get("head_dim") or (hidden // heads if heads and hidden else 0)
    if kv_rows and head:  # the k,v heads follow from k_proj's rows and the head size
        dims["num_key_value_heads"] = kv_rows // head if kv_rows % head == 0 else kv_rows / head
        config = completed(arch, file, dims)
    return config, dims


def inspect(path: str | Path) -> Checkpoint:
    """The checkpoint at `path` (a .safetensors file, or a folder as transformers reads it) with every refusal that
    needs no tensor data made: files, dtypes, config.json, its keys, its model_type and its dims against the
    weights."""
    where = str(path)
    files = files_of(Path(path), where)
    found = stored(files, where)
    layout = layout_of(list(found), where)
    tensors = floats_only({n: e for n, e in found.items() if not n.endswith(layout.ignored)}, where)  # no buffers
    file = _config(Path(path), where)
    arch = _architecture(layout, file, where)
    fits = arch.layout == layout.name
    config, dims = _as_read(arch, layout, file, tensors) if fits else (completed(arch, file, {}), {})
    settings, problems = read_config(arch, config)
    if problems:
        raise WeightsError(f"init_from={where!r} cannot be imported: in its {CONFIG_FILE} ({arch.name}), "
                           f"{'; '.join(problems)}; {KEYS_PAGE} lists what each key may be")
    if not fits:
        raise WeightsError(f"init_from={where!r} cannot be imported: its {CONFIG_FILE} says model_type="
                           f"{show(config.get('model_type'))} ({arch.layout} layout) and its tensors are in the "
                           f"{layout.name} layout; fix config.json or pass the folder these weights belong with")
    keys = arch.keys
    wrong = [f"{k}={show(file[k])} where the weights hold {held}" for k, held in dims.items()
             if file is not None and k in file and keys[k].read(file[k], config) != keys[k].read(held, config)]
    if wrong:
        raise WeightsError(f"init_from={where!r} cannot be imported: its {CONFIG_FILE} does not describe its weights "
                           f"({', '.join(wrong)}); fix config.json or pass the folder these weights belong with")
    wanted = {**layout.model, **settings}
    if file is None and layout is not GPT2:  # no word on tying: a head of its own when the file has one
        wanted["model.tie_head"] = not any(n.endswith(layout.head) for n in tensors)
    return Checkpoint(where, files, tensors, layout, arch, config if file is not None else {}, wanted)


def _unbuildable(changes: dict[str, Any], m: ModelConfig | None = None) -> str:
    """Why the config refuses the model `m` (default: the workbook's default model) with `changes` (dotted model
    keys), or '' when it accepts it."""
    model = {**(asdict(m) if m else {}), **{k.split(".", 1)[1]: v for k, v in changes.items()}}
    try:
        from_dict({"model": model})
    except ConfigError as exc:
        return str(exc)
    return ""


def _plain(wanted: dict[str, Any]) -> dict[str, Any]:
    """The settings as values to set: the first of a choice, the bound of an AtMost."""
    return {k: v[0] if isinstance(v, tuple) else v.limit if isinstance(v, AtMost) else v for k, v in wanted.items()}


def _refuse_unbuildable(ckpt: Checkpoint) -> None:
    """A checkpoint whose model the config refuses whatever else it sets cannot be imported: one line saying why."""
    problem = _unbuildable({"model.preset": "custom", **_plain(ckpt.wanted)})
    if problem:
        raise WeightsError(f"init_from={ckpt.where!r} is a {ckpt.arch.name} checkpoint and cannot be imported: the "
                           f"model it needs is one the workbook does not build ({problem})")


def model_settings(path: str | Path) -> dict:
    """The workbook settings a checkpoint needs (its layout's fixed knobs, then the dims and knobs its config.json
    and tensors give), as {dotted key: value} for `config.with_changes`; bounds such as a sliding window are checked
    when it is loaded (`check_model`)."""
    ckpt = inspect(path)
    _refuse_unbuildable(ckpt)
    return {"model.preset": "custom", **{k: v for k, v in _plain(ckpt.wanted).items()
                                        if not isinstance(ckpt.wanted[k], AtMost)}}


def _differences(wanted: dict[str, Any], m: ModelConfig, vocab: int = 0) -> dict[str, Any]:
    """The settings the model must change to have `wanted`, each with the value to set; {} when it has them.
    vocab: the vocabulary the model was built with (its model.vocab_size when 0)."""
    wrong = {}
    for key, want in wanted.items():
        name = key.split(".", 1)[1]
        have = {"mlp_hidden": m.ffn_hidden, "n_kv_head": m.kv_heads, "vocab_size": vocab or m.vocab_size}.get(
            name, getattr(m, name))
        options = want if isinstance(want, tuple) else (want,)
        if name == "n_kv_head":  # 0 means n_head: multi-head attention either way
            heads = wanted.get("model.n_head", m.n_head)
            have, options = m.n_kv_head or heads, (want or heads,)
        if isinstance(want, AtMost):
            if have > want.limit:
                wrong[key] = want.limit
        elif have not in options:
            wrong[key] = want[0] if isinstance(want, tuple) else want
    return wrong


def _text(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def check_model(ckpt: Checkpoint, m: ModelConfig, vocab: int = 0) -> None:
    """One WeightsError line naming every setting to change, with values the config accepts, when the model does
    not match the checkpoint; or saying it cannot be imported when no such values exist (vocab: the vocabulary the
    model was built with)."""
    wrong = _differences(ckpt.wanted, m, vocab)
    if not wrong:
        return
    _refuse_unbuildable(ckpt)
    what = f" (activation {ckpt.config.get('activation_function')})" if ckpt.layout is GPT2 and ckpt.config else ""
    settings = " ".join(f"{k}={_text(v)}" for k, v in wrong.items())
    problem = _unbuildable(wrong, m)
    if problem:  # the checkpoint's model is buildable; this config's other settings are what refuse it
        raise WeightsError(f"init_from={ckpt.where!r} is a {ckpt.arch.name} checkpoint{what}; the model must match "
                           f"it ({settings}), which this config's other settings do not allow: {problem}")
    raise WeightsError(f"init_from={ckpt.where!r} is a {ckpt.arch.name} checkpoint{what}; the model must match it: "
                       f"set {settings}")


def check_init_from(cfg) -> None:
    """cfg.init_from's refusals that need no tensor data, before MindSpore starts (`preflight`): its files, dtypes
    and config.json against its weights' names and shapes (`inspect`: a config.json of 3 layers over weights of 2
    is named with both counts), then the model's settings against it (`check_model`), the vocabulary only when
    model.vocab_size is set (0: the tokenizer's, known once the data is read). Nothing without init_from, nor for a
    path that is not there (`preflight.check_paths` names it)."""
    if not cfg.init_from or not Path(cfg.init_from).exists() or cfg.model.build:
        return
    ckpt = inspect(cfg.init_from)
    if not cfg.model.vocab_size:
        ckpt = replace(ckpt, wanted={k: v for k, v in ckpt.wanted.items() if k != "model.vocab_size"})
    check_model(ckpt, cfg.model)


def read_tensors(path: str | Path) -> dict[str, np.ndarray]:
    """Every tensor of the checkpoint at `path` (the files transformers reads there) as float32, by name; a tensor
    that is not float or not finite is a WeightsError naming it and its file."""
    where = str(path)
    tensors = floats_only(stored(files_of(Path(path), where), where), where)
    return {name: load(name, entry, where) for name, entry in tensors.items()}


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


def to_ours(tensors: dict[str, np.ndarray], layout: Layout, expected: dict[str, tuple], m: ModelConfig,
            where: str) -> dict[str, np.ndarray]:
    """Their tensors as our parameters (float32), checked against `expected` (our name → shape); a key or shape
    mismatch is one line listing them."""
    table = expand(layout, m.n_layer, m.tie_head)
    named = {k.removeprefix(layout.prefix): v for k, v in tensors.items() if not k.endswith(layout.ignored)}
    if m.tie_head:
        head = named.pop(layout.head, None)
        if head is not None and (layout.embedding not in named or not np.array_equal(head, named[layout.embedding])):
            raise WeightsError(f"init_from={where!r} cannot be imported: its {layout.head} differs from its token "
                               f"embedding and the model ties the two (GPT-2's layout, or tie_word_embeddings true); "
                               f"use a checkpoint whose head is its embedding, or a LLaMA, Mistral or Qwen2 one whose "
                               f"{CONFIG_FILE} says tie_word_embeddings false")
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
                           f"shape mismatch: {_listed('', shapes)}")
    return ours


def _listed(what: str, items: list[str]) -> str:
    return f"{what} {few(items) if items else 'none'}".strip()


@dataclass(frozen=True)
class Loaded:
    """What `load_into` put into the model: the layout, the tensors set, the positions used of the file's, and the
    .safetensors files beside the weights that were left out (as transformers leaves them)."""
    layout: str
    tensors: int
    positions: tuple[int, int]  # (model.seq_len, the file's n_positions / max_position_embeddings)
    ignored_files: tuple[str, ...] = ()


def load_into(net, cfg_model: ModelConfig, path: str) -> Loaded:
    """Set the parameters of `net` (a `model.GPT` built for `cfg_model`) from the checkpoint at `path`."""
    import mindspore as ms
    ckpt = inspect(path)
    check_model(ckpt, cfg_model, getattr(net, "vocab_size", 0))
    tensors = {name: load(name, entry, ckpt.where) for name, entry in ckpt.tensors.items()}
    params = {p.name: p for p in net.get_parameters()}
    ours = to_ours(tensors, ckpt.layout, {k: p.shape for k, p in params.items()}, cfg_model, path)
    for name, value in ours.items():
        params[name].set_data(ms.Tensor(value))
    wpe = next((v for k, v in tensors.items() if k.endswith("wpe.weight")), None)
    known = int(wpe.shape[0]) if wpe is not None else int(ckpt.config.get("max_position_embeddings",
                                                                           cfg_model.seq_len))
    return Loaded(ckpt.layout.name, len(ours), (cfg_model.seq_len, known), ckpt.files.ignored)


def layout_for(m: ModelConfig) -> Layout:
    """The layout this model can be written in; a one-line WeightsError when it has none."""
    for layout in LAYOUTS:
        if not _differences(layout.model, m) and (layout is not GPT2 or m.mlp in ACTIVATIONS.values()):
            return layout
    raise WeightsError("this run's model has no Hugging Face layout: GPT-2 needs model.norm=layernorm, "
                       "model.bias=true, fused q,k,v, learned positions, a tied head, a GELU or ReLU² MLP and "
                       "model.n_kv_head=0; LLaMA (Qwen2 with model.qkv_bias=true) needs model.norm=rmsnorm, "
                       "model.bias=false, model.qkv=separate, model.positions=rope and model.mlp=swiglu; both need "
                       "model.qk_norm=false and model.logit_softcap=0")


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


def _rope_config(m: ModelConfig) -> dict:
    """The rotary settings as config.json keys: transformers 5's rope_parameters, and rope_theta/rope_scaling for
    older readers."""
    linear = m.rope_scaling == "linear"
    scaling = {"rope_type": "linear", "factor": m.rope_scaling_factor} if linear else None
    return {"rope_theta": m.rope_theta, "rope_scaling": scaling,
            "rope_parameters": {"rope_type": "linear" if linear else "default", "rope_theta": m.rope_theta,
                                **({"factor": m.rope_scaling_factor} if linear else {})}}


def hf_config(m: ModelConfig, vocab: int) -> dict:
    """The config.json Hugging Face's GPT-2, LLaMA or Qwen2 classes read for this model: every value the import
    honours, and the value of each key the import checks."""
    layout = layout_for(m)
    if layout in (LLAMA, QWEN2):
        kind = {"architectures": ["LlamaForCausalLM"], **assumed_values(ARCHITECTURES["llama"])} if layout is LLAMA \
            else {"architectures": ["Qwen2ForCausalLM"], **assumed_values(ARCHITECTURES["qwen2"]),
                  "use_sliding_window": False}
        return {**kind, "vocab_size": vocab, "hidden_size": m.d_model, "intermediate_size": m.ffn_hidden,
                "num_hidden_layers": m.n_layer, "num_attention_heads": m.n_head, "num_key_value_heads": m.kv_heads,
                "head_dim": m.d_model // m.n_head, "max_position_embeddings": m.seq_len, "rms_norm_eps": m.rms_eps,
                **_rope_config(m), "tie_word_embeddings": m.tie_head}
    activation = next(act for act, ours in ACTIVATIONS.items() if ours == m.mlp)
    return {"architectures": ["GPT2LMHeadModel"], **assumed_values(ARCHITECTURES["gpt2"]), "vocab_size": vocab,
            "n_positions": m.seq_len, "n_ctx": m.seq_len, "n_embd": m.d_model, "n_layer": m.n_layer,
            "n_head": m.n_head, "n_inner": m.ffn_hidden, "activation_function": activation,
            "resid_pdrop": m.dropout, "embd_pdrop": m.dropout, "attn_pdrop": m.dropout}


def write_checkpoint(out: str | Path, params: dict[str, np.ndarray], m: ModelConfig) -> Path:
    """Write `params` (our names) as out/model.safetensors in the model's layout, with its config.json; returns the
    file."""
    from safetensors.numpy import save_file

    from helpers.record import atomic_write_text
    theirs = from_ours(params, m)
    folder = Path(out)
    target, partial = folder / WEIGHTS_FILE, folder / f".{WEIGHTS_FILE}.partial"
    need = sum(a.nbytes for a in theirs.values()) + EXPORT_SLACK_BYTES
    vocab = int(params["tok.embedding_table"].shape[0])
    try:
        folder.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(folder).free
        if free < need:  # before a byte is written: the line a full disk would end in, without the half file
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        save_file(theirs, str(partial), metadata={"format": "np"})
        atomic_write_text(folder / CONFIG_FILE, json.dumps(hf_config(m, vocab), indent=2) + "\n")
        os.replace(partial, target)
    except Exception as exc:
        partial.unlink(missing_ok=True)
        raise _export_failure(target, exc, need) from None
    return target


EXPORT_SLACK_BYTES = 64 << 10  # config.json and the safetensors header beside the tensors' bytes


def _export_failure(target: Path, exc: Exception, need: int) -> Exception:
    """A write of the export the disk refused as one RecordError line (`record.write_failure`) that says how much
    room the export needs there; any other error as it was. safetensors' own error names no errno, only the OS's
    words ("No space left on device (os error 28)")."""
    from helpers.record import RecordError, disk_full, write_failure
    full = disk_full(exc)
    if isinstance(exc, RecordError):  # config.json's atomic write: already one line naming its file
        error = exc
    elif isinstance(exc, OSError):
        error = write_failure(target, exc)
    elif full:
        error = write_failure(target, OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))
    else:
        return exc
    if not full:
        return error
    try:
        free = shutil.disk_usage(target.parent).free
    except OSError:
        free = 0
    why = getattr(error, "strerror", None) or os.strerror(errno.ENOSPC)
    room = f"{why}: the export needs about {-(-need // 1_000_000):,} MB there and {free // 1_000_000:,} MB are free"
    return RecordError(str(error).replace(f"({why})", f"({room})", 1))


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
    params = {k: v.asnumpy() for k, v in ms.load_checkpoint(str(ckpt)).items()
              if hasattr(v, "asnumpy")}  # tensors only: a checkpoint may also hold string metadata
    return ckpt, write_checkpoint(out, params, model_cfg)
