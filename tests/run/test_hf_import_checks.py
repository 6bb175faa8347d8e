"""What a Hugging Face checkpoint says is honoured, checked or refused before it trains: config.json keys
the model cannot compute (a sliding window shorter than the context, GPT-2's per-layer score scaling, another
LayerNorm epsilon, an activation the workbook lacks, a key nobody reads), an unreadable config.json, a config.json
that contradicts its weights, the files transformers would not read, tensors that are not float or not finite; and
the advice of every refusal, followed to its end, reaching a match or "cannot be imported". Fixtures are written
here with safetensors.numpy and json."""
from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
from safetensors.numpy import save_file

from helpers.config import ConfigError, from_dict, with_changes
from helpers.run.hf_weights import WeightsError, load_into, model_settings, write_checkpoint
from tests.conftest import mindspore_on_cpu
from tests.run.test_hf_weights import D, HEADS, LAYERS, LLAMA_CONFIG, SEQ, VOCAB, gelu_tanh, gpt, gpt2_tensors, \
    llama_tensors, model_cfg, params_of, reference_logits

GPT2_CONFIG = {"model_type": "gpt2", "n_layer": LAYERS, "n_head": HEADS, "n_embd": D, "vocab_size": VOCAB,
               "n_positions": 24}


@pytest.fixture(scope="module", autouse=True)
def pynative():
    mindspore_on_cpu("pynative")


def folder_with(folder, tensors, config=None, name="model.safetensors"):
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / name))
    if config is not None:
        (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return folder


def refusal(call) -> str:
    with pytest.raises(WeightsError) as err:
        call()
    message = str(err.value)
    assert "\n" not in message
    return message


def load(folder, m=None):
    m = m or model_cfg()
    net = gpt(m)
    return net, load_into(net, m, str(folder))


def qwen2_tensors() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(5)
    biases = {f"model.layers.{i}.self_attn.{n}_proj.bias": (rng.standard_normal(D) * 0.2).astype(np.float32)
              for i in range(LAYERS) for n in "qkv"}
    return {**llama_tensors(), **biases}


# --- config.json keys: honoured, checked, refused ---

def test_a_sliding_window_shorter_than_the_context_asks_for_a_context_within_it(tmp_path):
    """Mistral's sliding_window 16 at seq 64 imported as full attention (12.5 max |logit diff| against transformers);
    within a context no longer than the window the two are the same attention, and the export's context stays
    inside the window."""
    folder = folder_with(tmp_path / "mistral", llama_tensors(),
                         {**LLAMA_CONFIG, "model_type": "mistral", "sliding_window": 16})
    m = with_changes(from_dict({}), {**model_settings(folder), "model.seq_len": 64}).model
    message = refusal(lambda: load(folder, m))
    assert message.endswith("is a Mistral checkpoint; the model must match it: set model.seq_len=16")
    m = with_changes(from_dict({}), {**model_settings(folder), "model.seq_len": 16}).model
    net, loaded = load(folder, m)
    assert loaded.layout == "LLaMA"
    exported = json.loads(write_checkpoint(tmp_path / "out", params_of(net), m).with_name("config.json").read_text())
    assert exported["max_position_embeddings"] <= 16 and exported["model_type"] == "llama"


def test_qwen2_sliding_layers_bound_the_context_only_when_the_window_is_on(tmp_path):
    config = {**LLAMA_CONFIG, "model_type": "qwen2", "tie_word_embeddings": False, "sliding_window": 8,
              "max_window_layers": 1}
    off = folder_with(tmp_path / "off", qwen2_tensors(), config)
    m = with_changes(from_dict({}), {**model_settings(off), "model.seq_len": 16}).model
    load(off, m)  # use_sliding_window false: no window, whatever sliding_window says
    on = folder_with(tmp_path / "on", qwen2_tensors(), {**config, "use_sliding_window": True})
    assert refusal(lambda: load(on, m)).endswith("set model.seq_len=8")


@pytest.mark.parametrize("key, value", [("scale_attn_by_inverse_layer_idx", True), ("layer_norm_epsilon", 0.5),
                                        ("scale_attn_weights", False), ("n_experts", 4)])
def test_gpt2_keys_the_model_cannot_compute_are_refused_by_name(tmp_path, key, value):
    """scale_attn_by_inverse_layer_idx (2.06 max |logit diff|) and layer_norm_epsilon 0.5 (8.07) were imported as
    if absent; a key no GPT-2 configuration reads was too."""
    folder = folder_with(tmp_path, gpt2_tensors(), {**GPT2_CONFIG, key: value})
    for call in (lambda: model_settings(folder), lambda: load(folder)):
        message = refusal(call)
        assert f"{key}={json.dumps(value)}" in message and "cannot be imported" in message


GELU_ERF = np.vectorize(lambda x: 0.5 * x * (1 + math.erf(x / math.sqrt(2))))


@pytest.mark.parametrize("activation, act", [("gelu_new", gelu_tanh), ("gelu_fast", gelu_tanh), ("gelu", GELU_ERF),
                                             ("relu2", lambda x: np.maximum(x, 0) ** 2)])
def test_each_gpt2_activation_the_table_maps_computes_transformers_function(tmp_path, activation, act):
    """transformers' ACT2FN formulas: gelu_new/gelu_fast the tanh approximation, gelu the exact erf, relu2 relu(x)²."""
    import mindspore as ms
    folder = folder_with(tmp_path, gpt2_tensors(), {**GPT2_CONFIG, "activation_function": activation})
    m = with_changes(from_dict({}), {**model_settings(folder), "model.seq_len": SEQ}).model
    net, _ = load(folder, m)
    ids = np.random.default_rng(3).integers(0, VOCAB, (2, SEQ)).astype(np.int32)
    want = reference_logits(gpt2_tensors(), ids, act)
    assert np.abs(net(ms.Tensor(ids)).asnumpy() - want).max() < 1e-4 and np.abs(want).max() > 1.0


def test_the_export_writes_each_value_it_assumed(tmp_path):
    written = write_checkpoint(tmp_path, params_of(gpt(model_cfg())), model_cfg())
    exported = json.loads(written.with_name("config.json").read_text())
    assert {k: exported[k] for k in ("layer_norm_epsilon", "scale_attn_weights", "scale_attn_by_inverse_layer_idx",
                                     "tie_word_embeddings", "n_inner", "activation_function")} == {
        "layer_norm_epsilon": 1e-5, "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
        "tie_word_embeddings": True, "n_inner": 4 * D, "activation_function": "gelu_new"}


def test_an_unreadable_config_json_is_refused_not_taken_as_absent(tmp_path):
    """Cut in half, the file used to read as no config.json: the LLaMA below trained with theta 10000, not 5e5."""
    text = json.dumps({**LLAMA_CONFIG, "rope_theta": 5e5})
    folder = folder_with(tmp_path, llama_tensors())
    (folder / "config.json").write_text(text[: len(text) // 2], encoding="utf-8")
    for call in (lambda: model_settings(folder), lambda: load(folder)):
        message = refusal(call)
        assert "config.json cannot be read" in message and "cannot be imported" in message


def test_a_config_json_that_contradicts_its_weights_is_refused_naming_both(tmp_path):
    """3 layers in config.json and 2 in the weights: believed first (model.n_layer=3), contradicted at load."""
    folder = folder_with(tmp_path / "gpt2", gpt2_tensors(), {**GPT2_CONFIG, "n_layer": 3})
    message = refusal(lambda: model_settings(folder))
    assert "does not describe its weights (n_layer=3 where the weights hold 2)" in message
    folder = folder_with(tmp_path / "llama", llama_tensors(kv_heads=2), {**LLAMA_CONFIG, "num_key_value_heads": 1})
    assert "num_key_value_heads=1 where the weights hold 2" in refusal(lambda: model_settings(folder))


def test_an_activation_the_workbook_lacks_is_refused_not_suggested(tmp_path):
    """relu was 'set model.mlp=relu', which the config refuses ('did you mean relu2?'): a loop of advice."""
    folder = folder_with(tmp_path, gpt2_tensors(), {**GPT2_CONFIG, "activation_function": "relu"})
    message = refusal(lambda: model_settings(folder))
    assert 'activation_function="relu" is none of the MLPs the workbook computes' in message
    assert "cannot be imported" in message and "set model.mlp" not in message


def test_settings_this_config_refuses_with_its_others_are_named_with_the_reason(tmp_path):
    """GPT-2's learned positions into a model with linear rope scaling: setting model.positions=learned alone is
    refused by the config, so the line says which other setting stands in the way instead of `set`."""
    folder = folder_with(tmp_path, gpt2_tensors(), GPT2_CONFIG)
    m = from_dict({"model": {"preset": "tiny", "seq_len": SEQ, "positions": "rope", "rope_scaling": "linear",
                             "rope_scaling_factor": 2.0}}).model
    message = refusal(lambda: load(folder, m))
    assert "model.positions=learned" in message and "which this config's other settings do not allow" in message
    assert "set model.positions=rope or model.rope_scaling=none" in message and "cannot be imported" not in message


# --- the files and tensors read ---

def test_only_the_file_transformers_reads_is_loaded_and_the_others_are_named(tmp_path):
    """A stale model_old.safetensors beside model.safetensors overrode it (folders were read whole, sorted)."""
    good = gpt2_tensors(seed=0)
    folder = folder_with(tmp_path, good, GPT2_CONFIG)
    save_file(gpt2_tensors(seed=9), str(folder / "model_old.safetensors"))
    net, loaded = load(folder)
    assert np.array_equal(params_of(net)["tok.embedding_table"], good["wte.weight"])
    assert loaded.ignored_files == ("model_old.safetensors",)


def test_a_sharded_checkpoint_is_read_through_its_index(tmp_path):
    t = gpt2_tensors()
    names = sorted(t)
    shards = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    folder = tmp_path / "sharded"
    folder.mkdir()
    for shard, held in shards.items():
        save_file({n: t[n] for n in held}, str(folder / shard))
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {n: shard for shard, held in shards.items() for n in held}}))
    save_file(gpt2_tensors(seed=9), str(folder / "consolidated.safetensors"))
    net, loaded = load(folder)
    assert np.array_equal(params_of(net)["tok.embedding_table"], t["wte.weight"])
    assert loaded.ignored_files == ("consolidated.safetensors",)
    (folder / "model-00002-of-00002.safetensors").unlink()
    assert "names shards the folder lacks (model-00002-of-00002.safetensors)" in refusal(lambda: load(folder))


def test_a_folder_without_the_files_transformers_reads_is_refused_naming_what_it_holds(tmp_path):
    folder = folder_with(tmp_path, gpt2_tensors(), name="weights.safetensors")
    message = refusal(lambda: load(folder))
    assert "has neither model.safetensors nor model.safetensors.index.json" in message
    assert "it holds weights.safetensors" in message
    load(folder / "weights.safetensors")  # the file itself, as the line says


def test_a_tensor_that_is_not_float_is_refused_naming_it_and_its_file(tmp_path):
    """int8 tensors were cast to float32 and trained ('nan at step 1, likely cause: learning rate too high')."""
    t = gpt2_tensors()
    t["h.0.attn.c_proj.weight"] = (t["h.0.attn.c_proj.weight"] * 100).astype(np.int8)
    folder = folder_with(tmp_path / "int8", t, GPT2_CONFIG)
    for call in (lambda: model_settings(folder), lambda: load(folder)):
        assert "h.0.attn.c_proj.weight (I8, model.safetensors) is not float" in refusal(call)
    masks = {f"h.{i}.attn.bias": np.tril(np.ones((1, 1, 24, 24), np.uint8)) for i in range(LAYERS)}
    load(folder_with(tmp_path / "masks", {**gpt2_tensors(), **masks}, GPT2_CONFIG))  # buffers, not weights


def test_a_weight_holding_a_nan_is_refused_naming_it_and_its_file(tmp_path):
    t = gpt2_tensors()
    t["h.1.mlp.c_fc.weight"][3, 5] = np.nan
    folder = folder_with(tmp_path, t, GPT2_CONFIG)
    message = refusal(lambda: load(folder))
    assert "tensor 'h.1.mlp.c_fc.weight' in model.safetensors holds 1 NaN and 0 infinite values" in message


def _save_bf16(path, tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Write tensors as BF16 (the upper half of each float32, as torch stores it; safetensors.numpy cannot) and
    return the float32 values they hold."""
    header, data, kept = {}, b"", {}
    for name, value in tensors.items():
        upper = (np.ascontiguousarray(value, np.float32).view(np.uint32) >> 16).astype("<u2")
        header[name] = {"dtype": "BF16", "shape": list(value.shape), "data_offsets": [len(data), len(data) +
                                                                                      upper.nbytes]}
        data += upper.tobytes()
        kept[name] = (upper.astype(np.uint32) << 16).view(np.float32)
    text = json.dumps(header).encode()
    path.write_bytes(len(text).to_bytes(8, "little") + text + data)
    return kept


def test_bfloat16_weights_load_as_the_float32_values_they_hold(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(GPT2_CONFIG))
    kept = _save_bf16(tmp_path / "model.safetensors", gpt2_tensors())
    net, _ = load(tmp_path)
    assert np.array_equal(params_of(net)["blocks.0.attn.qkv.weight"], kept["h.0.attn.c_attn.weight"].T)
    assert not np.array_equal(kept["wte.weight"], gpt2_tensors()["wte.weight"])  # bf16 really dropped bits


# --- advice that converges ---

def _set(message: str) -> dict[str, object]:
    """The `set key=value …` a refusal ends with, as overrides."""
    tail = re.search(r"set ((?:[\w.]+=\S+ ?)+)$", message)
    assert tail, message
    return dict(pair.split("=", 1) for pair in tail.group(1).split())


def _follow(folder, cfg, steps: int = 4) -> tuple[str, dict]:
    """Load `folder` into cfg's model and apply what each refusal says, until it loads ('match', with the model it
    loaded into) or a refusal says it cannot be imported ('refused'); advice the config refuses fails the test."""
    for _ in range(steps):
        try:
            load(folder, cfg.model)
            return "match", vars(cfg.model)
        except WeightsError as exc:
            if "cannot be imported" in str(exc):
                return "refused", {}
            try:
                cfg = with_changes(cfg, _set(str(exc)))
            except ConfigError as bad:
                pytest.fail(f"the advice of {exc} is refused by the config: {bad}")
    pytest.fail(f"no match or refusal after {steps} rounds of advice")


REFUSED = ("refused", {})
BAD = {  # name: (tensors, config.json, where following the messages must end: refused, or a match with these settings)
    "gpt2 relu": (gpt2_tensors, {**GPT2_CONFIG, "activation_function": "relu"}, REFUSED),
    "gpt2 exact gelu, 4 heads": (gpt2_tensors, {**GPT2_CONFIG, "activation_function": "gelu", "n_head": 4},
                                 ("match", {"mlp": "gelu", "n_head": 4})),
    "gpt2 short position table": (lambda: gpt2_tensors(n_positions=12), {**GPT2_CONFIG, "n_positions": 12},
                                  ("match", {"seq_len": 12, "mlp": "gelu_tanh"})),
    "gpt2 epsilon 0.5": (gpt2_tensors, {**GPT2_CONFIG, "layer_norm_epsilon": 0.5}, REFUSED),
    "gpt2 untied head": (lambda: {**gpt2_tensors(), "lm_head.weight": gpt2_tensors()["wte.weight"] + 1}, GPT2_CONFIG,
                         REFUSED),
    "llama rms epsilon 0.5": (llama_tensors, {**LLAMA_CONFIG, "rms_norm_eps": 0.5}, REFUSED),
    "llama theta 1": (llama_tensors, {**LLAMA_CONFIG, "rope_theta": 1.0}, REFUSED),
    "llama linear factor 0.5": (llama_tensors, {**LLAMA_CONFIG, "rope_scaling": {"rope_type": "linear",
                                                                                 "factor": 0.5}}, REFUSED),
    "llama 3 heads": (llama_tensors, {**LLAMA_CONFIG, "num_attention_heads": 3, "num_key_value_heads": 3}, REFUSED),
    "llama 3 layers of 2": (llama_tensors, {**LLAMA_CONFIG, "num_hidden_layers": 3}, REFUSED),
    "llama one kv head, theta 5e5": (lambda: llama_tensors(kv_heads=1),
                                     {**LLAMA_CONFIG, "num_key_value_heads": 1, "rope_theta": 5e5},
                                     ("match", {"n_kv_head": 1, "rope_theta": 5e5, "rms_eps": 1e-5})),
    "mistral window 16": (llama_tensors, {**LLAMA_CONFIG, "model_type": "mistral", "sliding_window": 16},
                          ("match", {"seq_len": 16, "rope_theta": 500.0})),
    "qwen2 window 8": (qwen2_tensors, {**LLAMA_CONFIG, "model_type": "qwen2", "use_sliding_window": True,
                                       "sliding_window": 8, "max_window_layers": 0},
                       ("match", {"seq_len": 8, "qkv_bias": True})),
}


def _ends(got: tuple[str, dict], want: tuple[str, dict]) -> tuple[str, dict]:
    """The end reached, with the model's values of the settings `want` names."""
    return got[0], {k: got[1].get(k) for k in want[1]}


@pytest.mark.parametrize("name", BAD)
def test_following_each_refusal_ends_in_a_match_or_cannot_be_imported(tmp_path, name):
    """From a model of other dims and knobs (tiny, seq 64), and from what model_settings says: each line's `set …`
    is accepted by the config, and following them ends where the checkpoint allows."""
    make, config, end = BAD[name]
    folder = folder_with(tmp_path, make(), config)
    start = from_dict({"model": {"preset": "tiny", "seq_len": 64}})
    assert _ends(_follow(folder, start), end) == end
    try:
        settings = model_settings(folder)
    except WeightsError as exc:
        assert "cannot be imported" in str(exc) and end == REFUSED
        return
    assert _ends(_follow(folder, with_changes(start, settings)), end) == end
