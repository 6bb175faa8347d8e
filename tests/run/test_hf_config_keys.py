"""The config.json key table: every key transformers' GPT-2, LLaMA, Mistral and Qwen2 configuration classes read
(tests/data/hf_config_keys.json, extracted from the transformers 5.25.0 and 4.57.6 wheels) is declared for its
architecture; the shape-bearing keys are the ones read off the weights; the export writes every key it honours and
the value of every key it checks; and the generated reference page lists them all."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers.config import from_dict
from helpers.run.hf_config_keys import ARCHITECTURES, CHECKED, COMMON, FROM_WEIGHTS, HONOURED
from helpers.run.hf_keys_reference import keys_markdown
from helpers.run.hf_layouts import GPT2, LLAMA, QWEN2
from helpers.run.hf_weights import hf_config

KEYS = json.loads((Path(__file__).resolve().parents[1] / "data" / "hf_config_keys.json").read_text())
LAYOUTS = {"GPT-2": GPT2, "LLaMA": LLAMA, "Qwen2": QWEN2}


def transformers_keys(model_type: str) -> set[str]:
    """Every key the transformers versions of the key file read for this model_type."""
    legacy = KEYS["legacy"]
    return {*KEYS["classes"][model_type], *KEYS["common"], *KEYS["popped"], *KEYS["generation"],
            *legacy["classes"][model_type], *legacy["common"], *legacy["generation"],
            *KEYS["also_in_files"]["all"], *KEYS["also_in_files"].get(model_type, {})}


@pytest.mark.parametrize("model_type", ["gpt2", "llama", "mistral", "qwen2"])
def test_every_key_of_the_configuration_class_is_in_the_table(model_type):
    assert KEYS["transformers"] == "5.25.0" and KEYS["legacy"]["transformers"] == "4.57.6"
    assert sorted(transformers_keys(model_type) - set(ARCHITECTURES[model_type].keys)) == []


def test_no_key_is_declared_both_for_an_architecture_and_for_all():
    assert {name: sorted(set(arch.own) & set(COMMON)) for name, arch in ARCHITECTURES.items()} == {
        name: [] for name in ARCHITECTURES}


@pytest.mark.parametrize("model_type", ["gpt2", "llama", "mistral", "qwen2"])
def test_the_keys_left_to_the_weights_are_the_ones_the_layout_reads_off_its_tensors(model_type):
    arch = ARCHITECTURES[model_type]
    layout = LAYOUTS[arch.layout]
    read_off = {*layout.dims, layout.blocks[0], *(["num_key_value_heads"] if layout.kv else [])}
    assert {k for k, key in arch.own.items() if key.default is FROM_WEIGHTS} == read_off


@pytest.mark.parametrize("model_type, model", [
    ("gpt2", {"mlp": "gelu_tanh"}),
    ("llama", {"norm": "rmsnorm", "bias": False, "qkv": "separate", "positions": "rope", "mlp": "swiglu",
               "n_kv_head": 2, "tie_head": False, "rope_scaling": "linear", "rope_scaling_factor": 2.0}),
    ("qwen2", {"norm": "rmsnorm", "bias": False, "qkv": "separate", "positions": "rope", "mlp": "swiglu",
               "qkv_bias": True})])
def test_the_export_writes_every_key_it_honours_and_each_checked_value(model_type, model):
    m = from_dict({"model": {"preset": "custom", "n_layer": 2, "n_head": 4, "d_model": 32, "seq_len": 16,
                             "rms_eps": 1e-5, **model}}).model
    written = hf_config(m, 40)
    keys = ARCHITECTURES[model_type].own
    assert written["model_type"] == model_type
    assert sorted(k for k, key in keys.items() if key.how == HONOURED and key.read and k not in written) == []
    assert {k: written.get(k) for k, key in keys.items() if key.how == CHECKED and key.ok is None} == {
        k: key.assumed for k, key in keys.items() if key.how == CHECKED and key.ok is None}
    assert sorted(set(written) - set(ARCHITECTURES[model_type].keys)) == []


def test_the_reference_page_lists_every_key_of_every_architecture():
    page = keys_markdown()
    for model_type, arch in ARCHITECTURES.items():
        assert f"## {arch.name} (`model_type: {model_type}`)" in page
        assert [k for k in arch.keys if f"`{k}`" not in page] == []
