"""What the import does with each key of a Hugging Face config.json, one declaration per key per architecture (GPT-2,
LLaMA, Mistral, Qwen2): honoured (it sets workbook keys), checked (the workbook computes with one value of it and
refuses any other), ignored (with the reason it changes nothing the weights compute), or refused. A key in no table
is refused by name. The keys are those transformers' configuration classes read (tests/data/hf_config_keys.json
holds the lists, with the transformers versions they were read from), and the common keys config.json files carry.

A key left out of config.json takes transformers' default (`Key.default`), except the shape-bearing dims, which are
read from the weights' shapes (FROM_WEIGHTS), so that a config.json never has to be believed over its tensors.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable

HONOURED, CHECKED, IGNORED, REFUSED = "honoured", "checked", "ignored", "refused"
ABSENT = object()  # no default: transformers has none, or the key only matters when present
FROM_WEIGHTS = object()  # a shape-bearing dim: left out of config.json, it is read from the tensors


class Unreadable(ValueError):
    """An honoured key whose value the workbook cannot compute with; the message names the key and why."""


@dataclass(frozen=True)
class AtMost:
    """A bound a checkpoint puts on a workbook value (model.seq_len within a position table or attention window)."""
    limit: int


@dataclass(frozen=True)
class Key:
    """One config.json key of one architecture. how: HONOURED, CHECKED, IGNORED or REFUSED; why: what it means
    here; sets: the workbook keys an honoured key sets; read: (value, the completed config.json) → {workbook key:
    value}, None where another key of its group reads it; assumed: the value a checked key must have (ok: a test of
    its own where the value depends on other keys); default: transformers' value when the file leaves it out."""
    how: str
    why: str
    sets: str = ""
    read: Callable[[Any, dict], dict] | None = None
    assumed: Any = None
    ok: Callable[[Any, dict], bool] | None = None
    default: Any = ABSENT

    def accepts(self, value: Any, config: dict) -> bool:
        """A checked key: whether the workbook computes with `value`."""
        return self.ok(value, config) if self.ok else value == self.assumed


@dataclass(frozen=True)
class Architecture:
    """A config.json model_type the import knows: its name, the tensor layout its weights are in, and its own keys
    (`keys` adds the ones every architecture shares)."""
    name: str
    layout: str
    own: dict[str, Key]

    @property
    def keys(self) -> dict[str, Key]:
        """Every key of this architecture's table: its own and the common ones."""
        return {**self.own, **COMMON}


def show(value: Any) -> str:
    """A config.json value as the file spells it (true, null, "gelu")."""
    return json.dumps(value)


def _honoured(sets: str, why: str, read=None, default=ABSENT) -> Key:
    return Key(HONOURED, why, sets=sets, read=read, default=default)


def _dim(sets: str, why: str, read=None) -> Key:
    return Key(HONOURED, why, sets=sets, read=read or (lambda v, c: {sets: v}), default=FROM_WEIGHTS)


def _checked(assumed: Any, why: str, ok=None) -> Key:
    return Key(CHECKED, why, assumed=assumed, ok=ok)


def _ignored(why: str) -> Key:
    return Key(IGNORED, why)


def _refused(why: str) -> Key:
    return Key(REFUSED, why)


def _window(window: Any, key: str) -> dict:
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise Unreadable(f"{key}={show(window)} is not a window of whole tokens")
    return {"model.seq_len": AtMost(window)}


# config.json activation → model.mlp, for GPT-2 (the first name of each is what the export writes); the tanh
# approximations are one formula (gelu_fast spells √(2/π) as 0.7978845608)
ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu_python_tanh": "gelu_tanh",
               "gelu_fast": "gelu_tanh", "gelu": "gelu", "gelu_python": "gelu", "relu2": "relu2"}


def _activation(value: Any, _: dict) -> dict:
    if value not in ACTIVATIONS:
        raise Unreadable(f"activation_function={show(value)} is none of the MLPs the workbook computes "
                         f"({', '.join(sorted(set(ACTIVATIONS.values())))}: transformers' "
                         f"{', '.join(ACTIVATIONS)})")
    return {"model.mlp": ACTIVATIONS[value]}


ROPE_TYPES = {"default": "none", "linear": "linear"}  # Hugging Face rope_type → model.rope_scaling


def _rope(config: dict) -> dict:
    """The rotary settings as transformers 5 reads them: rope_scaling (the legacy key) or rope_parameters, its
    rope_theta else the top-level rope_theta else 10000, and a partial_rotary_factor of 1 (every dimension pair
    turns)."""
    params = config.get("rope_scaling") or config.get("rope_parameters") or {}
    if not isinstance(params, dict) or any(isinstance(v, dict) for v in params.values()):
        raise Unreadable(f"rope_parameters/rope_scaling={show(params)} is not one set of rotary settings (per-layer "
                         f"sets are for other architectures)")
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in ROPE_TYPES:
        raise Unreadable(f"rope_parameters/rope_scaling scales rotary positions with rope type {show(kind)}, which "
                         f"the workbook's model does not implement (model.rope_scaling: none or linear)")
    partial = params.get("partial_rotary_factor", config.get("partial_rotary_factor"))
    if partial not in (None, 1, 1.0):
        raise Unreadable(f"partial_rotary_factor={show(partial)} turns only part of each head; the workbook's rotary "
                         f"embedding turns every dimension pair")
    out = {"model.rope_theta": params.get("rope_theta", config.get("rope_theta", 10000.0)),
           "model.rope_scaling": ROPE_TYPES[kind]}
    if kind == "linear":
        out["model.rope_scaling_factor"] = params.get("factor", 1.0)
    return out


def _qwen2_window(_: Any, config: dict) -> dict:
    """Qwen2's sliding window as transformers reads it: sliding_window only with use_sliding_window, on the layers
    layer_types marks sliding (by default those from max_window_layers on)."""
    types = config.get("layer_types")
    if types is not None and (not isinstance(types, list)
                              or set(types) - {"full_attention", "sliding_attention"}):
        raise Unreadable(f"layer_types={show(types)} names attention other than full_attention and "
                         f"sliding_attention")
    window = config.get("sliding_window") if config.get("use_sliding_window") else None
    if window is None:
        return {}
    if types is None:
        types = ["sliding_attention" if i >= config.get("max_window_layers", 28) else "full_attention"
                 for i in range(config.get("num_hidden_layers", 0))]
    return _window(window, "sliding_window") if "sliding_attention" in types else {}


DROPOUT = "a training setting: the run's model.dropout applies"
FRESH_INIT = "the spread of freshly initialised weights; every weight comes from the file"
TOKENS = "a token id for generation and padding; the weights do not depend on it (data.tokenizer reads the tokenizer's)"
GENERATION = "a generation default (transformers now keeps these in generation_config.json)"
KERNEL = "which attention or expert kernel transformers runs: the same values"
NO_ROPE = "GPT-2's positions are a learned table; transformers' GPT-2 reads no rotary setting"
ROPE_GROUP = "read with rope_parameters, as transformers 5 reads it (rope_scaling first, then rope_parameters)"
SEQ_BOUND = "model.seq_len (at most)"

_GENERATION_KEYS = (
    "max_length", "min_length", "do_sample", "early_stopping", "num_beams", "temperature", "top_k", "top_p",
    "typical_p", "repetition_penalty", "length_penalty", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size",
    "bad_words_ids", "num_return_sequences", "output_scores", "return_dict_in_generate", "forced_bos_token_id",
    "forced_eos_token_id", "remove_invalid_values", "exponential_decay_length_penalty", "suppress_tokens",
    "begin_suppress_tokens", "epsilon_cutoff", "eta_cutoff", "encoder_repetition_penalty", "num_assistant_tokens",
    "num_assistant_tokens_schedule", "assistant_confidence_threshold", "assistant_lookbehind", "target_lookbehind",
    "num_beam_groups", "diversity_penalty")

# PreTrainedConfig's keys (transformers 5 and 4.x), the keys its initialiser takes out of config.json, and the
# generation defaults that older config.json files carry: the same for every architecture
COMMON: dict[str, Key] = {
    **{k: _ignored(GENERATION) for k in _GENERATION_KEYS},
    "transformers_version": _ignored("the transformers version that wrote the file"),
    "architectures": _ignored("class names; the tensor names decide the layout (a task head's tensors are refused "
                              "at load as unknown)"),
    "output_hidden_states": _ignored("what transformers' forward returns, not what it computes"),
    "output_attentions": _ignored("what transformers' forward returns, not what it computes"),
    "return_dict": _ignored("what transformers' forward returns, not what it computes"),
    "torchscript": _ignored("a PyTorch export setting"),
    "dtype": _ignored("the storage dtype; each tensor's own dtype is checked (F32, F16 and BF16 are read as float32)"),
    "torch_dtype": _ignored("transformers 4's name for dtype: each tensor's own dtype is checked"),
    "use_bfloat16": _ignored("a TensorFlow-era storage setting; each tensor's own dtype is checked"),
    "chunk_size_feed_forward": _ignored("read by other architectures (feed-forward in chunks: the same values)"),
    "is_encoder_decoder": _checked(False, "the workbook's model is decoder-only"),
    "is_decoder": _ignored("these architectures are decoders whatever it says"),
    "add_cross_attention": _checked(False, "cross-attention needs an encoder; the workbook's model is decoder-only"),
    "cross_attention_hidden_size": _ignored("an encoder-decoder setting, read only with add_cross_attention"),
    "tie_encoder_decoder": _ignored("an encoder-decoder setting; there is no encoder"),
    "pruned_heads": _checked({}, "pruned heads leave blocks with fewer heads than others; the workbook's blocks are "
                                 "alike", ok=lambda v, c: not v),
    "id2label": _ignored("a classification head's labels; the language-model head does not use them"),
    "label2id": _ignored("a classification head's labels; the language-model head does not use them"),
    "num_labels": _ignored("a classification head's size; the language-model head does not use it"),
    "problem_type": _ignored("a classification head's loss; the language-model head does not use it"),
    "finetuning_task": _ignored("a note of the task a classification head was tuned on"),
    "task_specific_params": _ignored("pipeline defaults for generation tasks"),
    "tokenizer_class": _ignored("the tokenizer's class; data.tokenizer reads tokenizer.json"),
    "prefix": _ignored("a text prefix for pipelines"),
    **{k: _ignored(TOKENS) for k in ("bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id",
                                     "decoder_start_token_id")},
    "tf_legacy_loss": _ignored("a TensorFlow loss setting"),
    "use_cache": _ignored("the key/value cache of generation: the same values"),
    "_name_or_path": _ignored("where the checkpoint was loaded from"),
    "name_or_path": _ignored("where the checkpoint was loaded from"),
    "_commit_hash": _ignored("where the checkpoint was loaded from"),
    **{k: _ignored(KERNEL) for k in ("attn_implementation", "_attn_implementation", "_attn_implementation_internal",
                                     "_attn_implementation_autoset", "experts_implementation",
                                     "_experts_implementation", "_experts_implementation_internal")},
    "per_layer_config": _refused("settings that differ by layer; the workbook's blocks are alike"),
    "quantization_config": _refused("quantized weights; the workbook takes float tensors only"),
}

GPT2_KEYS: dict[str, Key] = {
    "model_type": _checked("gpt2", "names this table; the weights must be in the GPT-2 layout"),
    "vocab_size": _dim("model.vocab_size", "the token embedding's rows"),
    "n_positions": _dim(SEQ_BOUND, "the learned position table's rows; the model's context may use its first "
                                   "model.seq_len rows", read=lambda v, c: {"model.seq_len": AtMost(v)}),
    "n_embd": _dim("model.d_model", "the hidden size"),
    "n_layer": _dim("model.n_layer", "the blocks"),
    "n_head": _honoured("model.n_head", "attention heads", lambda v, c: {"model.n_head": v}, default=12),
    "n_inner": _dim("model.mlp_hidden", "the MLP width (null: 4 × n_embd)",
                    read=lambda v, c: {"model.mlp_hidden": 4 * c.get("n_embd", 768) if v is None else v}),
    "activation_function": _honoured("model.mlp", "gelu_new, gelu_pytorch_tanh, gelu_python_tanh and gelu_fast "
                                                  "→ gelu_tanh; gelu and gelu_python → gelu; relu2 → relu2; any other "
                                                  "is refused", _activation, default="gelu_new"),
    "resid_pdrop": _ignored(DROPOUT),
    "embd_pdrop": _ignored(DROPOUT),
    "attn_pdrop": _ignored(DROPOUT),
    "layer_norm_epsilon": _checked(1e-5, "the workbook's LayerNorm epsilon is fixed: it has no knob for it"),
    "initializer_range": _ignored(FRESH_INIT),
    **{k: _ignored("GPT2DoubleHeadsModel's multiple-choice head; the language-model head does not use it")
       for k in ("summary_type", "summary_use_proj", "summary_activation", "summary_proj_to_labels",
                 "summary_first_dropout")},
    "scale_attn_weights": _checked(True, "the workbook scales attention scores by 1/√head_size"),
    "scale_attn_by_inverse_layer_idx": _checked(False, "the workbook does not scale block i's scores by 1/(i+1)"),
    "reorder_and_upcast_attn": _ignored("the same scores computed in another order, in float32: the same values"),
    "tie_word_embeddings": _checked(True, "the workbook's GPT-2 layout ties the output head to wte"),
    "n_ctx": _ignored("a legacy copy of n_positions that transformers no longer reads"),
    "rope_theta": _ignored(NO_ROPE),
    "rope_scaling": _ignored(NO_ROPE),
    "partial_rotary_factor": _ignored(NO_ROPE),
}

# the keys LLaMA, Mistral and Qwen2 share (num_key_value_heads: null means num_attention_heads)
_LLAMA_LIKE: dict[str, Key] = {
    "vocab_size": _dim("model.vocab_size", "the token embedding's rows"),
    "hidden_size": _dim("model.d_model", "the hidden size"),
    "intermediate_size": _dim("model.mlp_hidden", "the SwiGLU width"),
    "num_hidden_layers": _dim("model.n_layer", "the blocks"),
    "num_attention_heads": _honoured("model.n_head", "query heads", lambda v, c: {"model.n_head": v}, default=32),
    "num_key_value_heads": _dim("model.n_kv_head", "key/value heads (grouped-query attention when fewer)",
                                read=lambda v, c: {"model.n_kv_head": v if v is not None else
                                                   c.get("num_attention_heads", 32)}),
    "hidden_act": _checked("silu", "the workbook's SwiGLU gates with SiLU (model.mlp=swiglu)"),
    "max_position_embeddings": _ignored("rotary positions have no table: the run's model.seq_len sets the context "
                                        "(the run records both as init_from.positions)"),
    "initializer_range": _ignored(FRESH_INIT),
    "rms_norm_eps": _honoured("model.rms_eps", "the RMSNorm epsilon", lambda v, c: {"model.rms_eps": v},
                              default=1e-6),
    "tie_word_embeddings": _honoured("model.tie_head", "the output head tied to the token embedding",
                                     lambda v, c: {"model.tie_head": v}, default=False),
    "rope_parameters": _honoured("model.rope_theta, model.rope_scaling, model.rope_scaling_factor",
                                 "rope_type default or linear, rope_theta, factor; other rope types are refused",
                                 lambda v, c: _rope(c), default=None),
    "rope_theta": _honoured("model.rope_theta", ROPE_GROUP),
    "rope_scaling": _honoured("model.rope_scaling, model.rope_scaling_factor", ROPE_GROUP),
    "partial_rotary_factor": _checked(1.0, "the workbook's rotary embedding turns every dimension pair of a head",
                                      ok=lambda v, c: v in (None, 1, 1.0)),
    "attention_dropout": _ignored(DROPOUT),
    "head_dim": _checked("hidden_size / num_attention_heads", "the workbook's heads are hidden_size / "
                                                              "num_attention_heads wide (d_model / n_head)",
                         ok=lambda v, c: v is None or v * c.get("num_attention_heads", 32) == c.get("hidden_size",
                                                                                                 4096)),
}

LLAMA_KEYS: dict[str, Key] = {
    "model_type": _checked("llama", "names this table; the weights must be in the LLaMA layout"),
    **_LLAMA_LIKE,
    "pretraining_tp": _ignored("transformers 5 does not read it; 4.x split the same matmuls into this many slices: "
                               "the same values"),
    "attention_bias": _checked(False, "the workbook's LLaMA has no bias on q, k, v, o (model.qkv_bias puts one on "
                                      "q, k, v only: Qwen2's layout)"),
    "mlp_bias": _checked(False, "the workbook's SwiGLU has no biases"),
}

MISTRAL_KEYS: dict[str, Key] = {
    "model_type": _checked("mistral", "names this table; the weights must be in the LLaMA layout"),
    **_LLAMA_LIKE,
    "sliding_window": _honoured(SEQ_BOUND, "each token attends to the last sliding_window tokens; within a context "
                                           "no longer than the window that is full causal attention, the workbook's",
                                lambda v, c: {} if v is None else _window(v, "sliding_window"), default=4096),
}

QWEN2_KEYS: dict[str, Key] = {
    "model_type": _checked("qwen2", "names this table; the weights must be in the Qwen2 layout"),
    **_LLAMA_LIKE,
    "use_sliding_window": _honoured(SEQ_BOUND, "sliding_window applies only when true, on the layers layer_types "
                                               "marks sliding_attention; the context must then fit in the window",
                                    _qwen2_window, default=False),
    "sliding_window": _honoured(SEQ_BOUND, "read with use_sliding_window", default=4096),
    "max_window_layers": _honoured(SEQ_BOUND, "read with use_sliding_window: the first sliding layer when "
                                              "layer_types is left out", default=28),
    "layer_types": _honoured(SEQ_BOUND, "read with use_sliding_window: full_attention or sliding_attention per "
                                        "layer; other kinds are refused"),
}

ARCHITECTURES = {"gpt2": Architecture("GPT-2", "GPT-2", GPT2_KEYS),
                 "llama": Architecture("LLaMA", "LLaMA", LLAMA_KEYS),
                 "mistral": Architecture("Mistral", "LLaMA", MISTRAL_KEYS),
                 "qwen2": Architecture("Qwen2", "Qwen2", QWEN2_KEYS)}
BY_LAYOUT = {"GPT-2": "gpt2", "LLaMA": "llama", "Qwen2": "qwen2"}  # model_type when config.json names none


def completed(arch: Architecture, config: dict, dims: dict) -> dict:
    """config.json as transformers reads it: its keys, transformers' defaults for the ones it leaves out, and the
    weights' dims (`dims`, in config.json's names) for the shape-bearing ones it leaves out."""
    defaults = {k: key.default for k, key in arch.own.items() if key.default not in (ABSENT, FROM_WEIGHTS)}
    return {**defaults, **{k: v for k, v in dims.items() if k not in config}, **config}


def read_config(arch: Architecture, config: dict) -> tuple[dict, list[str]]:
    """The workbook settings a completed config.json sets (honoured keys), and the problems that refuse it: keys in
    no table, refused keys, checked keys at other values, honoured values the workbook cannot compute with."""
    settings: dict = {}
    problems: list[str] = []
    keys = arch.keys
    for name in [*(k for k in keys if k in config), *(k for k in config if k not in keys)]:  # the table's order
        key, value = keys.get(name), config[name]
        if key is None:
            problems.append(f"{name}={show(value)} is a key no {arch.name} configuration reads")
        elif key.how == REFUSED and value not in (None, {}, []):
            problems.append(f"{name}={show(value)} is refused ({key.why})")
        elif key.how == CHECKED and not key.accepts(value, config):
            assumed = "cannot be honoured" if key.ok else f"is not {show(key.assumed)}, the value the workbook " \
                                                          f"computes with"
            problems.append(f"{name}={show(value)} {assumed} ({key.why})")
        elif key.how == HONOURED and key.read is not None:
            try:
                settings.update(key.read(value, config))
            except Unreadable as exc:
                problems.append(str(exc))
    return settings, problems


def assumed_values(arch: Architecture) -> dict:
    """The values of the architecture's own checked keys that have one (model_type included): what an export writes
    for them, so that the file says what the workbook computed."""
    return {k: key.assumed for k, key in arch.own.items() if key.how == CHECKED and key.ok is None}
