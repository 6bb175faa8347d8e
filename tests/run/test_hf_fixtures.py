"""Checkpoints saved by transformers itself (tests/data/hf_fixtures, made by tests/data/make_hf_fixtures.py): LLaMA
with grouped-query attention, LLaMA whose config.json keeps its theta in transformers 5's rope_parameters, LLaMA with
linear rope scaling, and a tied Qwen2 with q,k,v bias. Imported into the workbook's model each gives transformers'
logits; exported again it is the same tensors and settings (and transformers loads the export back:
roundtrip_check.json, from the generator's check)."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from helpers.config import from_dict, with_changes
from helpers.run.hf_weights import file_settings, layout_of, load_into, model_settings, read_tensors, to_ours, \
    write_checkpoint
from tests.conftest import mindspore_on_cpu

FIXTURES = Path(__file__).resolve().parents[1] / "data" / "hf_fixtures"
NAMES = ["llama_gqa", "llama_rope_parameters", "llama_linear_rope", "qwen2"]
IDS = np.load(FIXTURES / "ids.npy")


@pytest.fixture(scope="module", autouse=True)
def pynative():
    mindspore_on_cpu("pynative")


def model_of(folder: Path):
    """The workbook model settings a checkpoint asks for, at the fixtures' context length."""
    cfg = from_dict({"model": {"seq_len": IDS.shape[1]}})
    return with_changes(cfg, {**model_settings(folder), "model.seq_len": IDS.shape[1]}).model


def imported(folder: Path, m=None):
    """The workbook's GPT for model settings `m` (default: the checkpoint's) holding the checkpoint's weights;
    given `m`, its weights are set without the settings check, to see what a wrong setting would compute."""
    import mindspore as ms
    from helpers.run.model import GPT
    m = m or model_of(folder)
    net = GPT(m, m.vocab_size, False)
    if m == model_of(folder):
        load_into(net, m, str(folder))
    else:
        tensors = read_tensors(folder)
        params = {p.name: p for p in net.get_parameters()}
        for name, value in to_ours(tensors, layout_of(list(tensors), str(folder)),
                                   {k: p.shape for k, p in params.items()}, m, str(folder)).items():
            params[name].set_data(ms.Tensor(value))
    return net


def logits(net) -> np.ndarray:
    import mindspore as ms
    return net(ms.Tensor(IDS)).asnumpy()


def export_all(out: str | Path) -> None:
    """Each fixture imported and written back by the workbook into out/<name> (the generator's check loads these in
    transformers)."""
    for name in NAMES:
        folder = FIXTURES / name
        net = imported(folder)
        write_checkpoint(Path(out) / name, {p.name: p.asnumpy() for p in net.get_parameters()}, model_of(folder))


@pytest.mark.parametrize("name", NAMES)
def test_checkpoint_saved_by_transformers_gives_its_logits(name):
    folder = FIXTURES / name
    want = np.load(folder / "logits.npy")
    got = logits(imported(folder))
    assert np.abs(got - want).max() < 1e-4 and np.abs(want).max() > 1.0


def test_each_fixture_asks_for_its_own_setting():
    wanted = {name: model_settings(FIXTURES / name) for name in NAMES}
    assert [wanted[n]["model.n_kv_head"] for n in NAMES] == [2, 4, 1, 2]
    assert wanted["llama_rope_parameters"]["model.rope_theta"] == 5e5  # read from rope_parameters
    assert "rope_theta" not in file_settings(FIXTURES / "llama_rope_parameters")
    assert (wanted["llama_linear_rope"]["model.rope_scaling"], wanted["llama_linear_rope"]["model.rope_scaling_factor"]
            ) == ("linear", 4.0)
    assert (wanted["qwen2"]["model.qkv_bias"], wanted["qwen2"]["model.tie_head"], wanted["qwen2"]["model.rope_theta"]
            ) == (True, True, 1e6)


def test_a_wrong_theta_scaling_grouping_or_bias_moves_the_logits_beyond_the_tolerance():
    """The comparison above can fail: theta 10000 (what a config.json with rope_parameters read as before), no
    rope scaling, or the Qwen2 biases dropped each move the logits by far more than 1e-4."""
    cases = [("llama_rope_parameters", {"rope_theta": 10000.0}), ("llama_linear_rope", {"rope_scaling": "none",
                                                                                         "rope_scaling_factor": 1.0})]
    for name, change in cases:
        folder = FIXTURES / name
        want = np.load(folder / "logits.npy")
        assert np.abs(logits(imported(folder, dataclasses.replace(model_of(folder), **change))) - want).max() > 1e-3
    folder = FIXTURES / "qwen2"
    net = imported(folder)
    for p in net.get_parameters():
        if p.name.endswith(".bias"):
            p.set_data(p.value() * 0)
    assert np.abs(logits(net) - np.load(folder / "logits.npy")).max() > 1e-3


@pytest.mark.parametrize("name", NAMES)
def test_export_then_import_is_exact(tmp_path, name):
    folder = FIXTURES / name
    net = imported(folder)
    written = write_checkpoint(tmp_path / name, {p.name: p.asnumpy() for p in net.get_parameters()}, model_of(folder))
    original, back = read_tensors(folder), read_tensors(written)
    assert sorted(back) == sorted(original) and all(np.array_equal(back[k], original[k]) for k in original)
    assert model_settings(written.parent) == model_settings(folder)
    exported = json.loads((written.parent / "config.json").read_text())
    assert exported["rope_parameters"]["rope_theta"] == file_settings(folder)["rope_parameters"]["rope_theta"]
    assert np.array_equal(logits(imported(written.parent)), logits(net))


def test_transformers_loaded_the_workbooks_exports():
    """The generator's check (make_hf_fixtures.py check) as committed: every export loaded back in transformers
    within 1e-4 of its fixture's logits."""
    record = json.loads((FIXTURES / "roundtrip_check.json").read_text())
    assert sorted(record["max_abs_logit_diff"]) == sorted(NAMES)
    assert record["passed"] and max(record["max_abs_logit_diff"].values()) < 1e-4
    assert int(record["transformers"].split(".")[0]) >= 5
