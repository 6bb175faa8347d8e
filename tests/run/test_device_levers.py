"""Ascend/GPU levers (jit O2, memory-optimize level, sink mode, fused attention), the bf16 peak, and MindSpore's
dataset autotune: refused on CPU in one line, offered by the auto-tuner on Ascend, autotune run for real here."""
from __future__ import annotations

import pytest

from helpers.config import Config, ConfigError, from_dict, with_changes
from helpers.run.peaks import PEAK_DTYPES, measure_peak_flops, peak_dtype
from helpers.tune.autotune import candidates
from helpers.tune.diagnose import Diagnosis
from tests.conftest import mindspore_on_cpu

LEVERS = [({"jit_level": "O2"}, "Ascend"), ({"memory_optimize": "O1"}, "Ascend"),
          ({"dataset_sink": True}, "Ascend or GPU"), ({"model.attention": "flash", "amp_level": "O2"}, "Ascend")]


@pytest.mark.parametrize("changes,device", LEVERS)
def test_device_levers_are_refused_on_cpu_in_one_line_naming_the_device(changes, device):
    with pytest.raises(ConfigError) as err:
        from_dict({}, changes)
    message = str(err.value)
    assert f"needs device_target={device} " in message and "\n" not in message
    assert "this config runs on CPU" in message


@pytest.mark.parametrize("changes,device", LEVERS)
def test_device_levers_validate_on_their_device(changes, device):
    target = device.split()[0]
    cfg = from_dict({"model": {"n_head": 2}}, {**changes, "device_target": target})  # head size 64: flash-able
    assert cfg.device_target == target


def test_lever_combinations_that_cannot_run_are_refused():
    ascend = {"device_target": "Ascend"}
    with pytest.raises(ConfigError, match="fp16/bf16 only"):
        from_dict({}, {**ascend, "model.attention": "flash"})
    with pytest.raises(ConfigError, match="multiple of 16"):  # nano: 128 / 4 heads = 32 is fine; 128 / 8 = 16 too
        from_dict({"model": {"n_head": 16}}, {**ascend, "model.attention": "flash", "amp_level": "O2"})
    with pytest.raises(ConfigError, match="cannot accumulate"):
        from_dict({}, {**ascend, "dataset_sink": True, "grad_accum_steps": 2})


def test_every_dtype_the_config_can_train_in_has_a_peak_dtype():
    import mindspore as ms
    amp_dtypes = Config.__dataclass_fields__["amp_dtype"].metadata["choices"]
    for dtype in ["fp32", *amp_dtypes]:  # a new amp_dtype without a peak would fail here, not on the device
        assert peak_dtype(dtype) == getattr(ms, PEAK_DTYPES[dtype])
    assert peak_dtype("bf16") == ms.bfloat16
    with pytest.raises(ValueError, match="choose one of fp32, fp16, bf16"):
        peak_dtype("int8")


def test_bf16_peak_on_cpu_is_one_line_saying_the_device_has_no_bf16_matmul():
    mindspore_on_cpu()
    with pytest.raises(RuntimeError) as err:  # MindSpore's CPU MatMul rejects BFloat16 (measured here)
        measure_peak_flops("bf16", [(64, 64, 64)], repeats=1)
    assert str(err.value).startswith("no bf16 matmul on this device") and "\n" not in str(err.value)


def _diag(verdict: str) -> Diagnosis:
    return Diagnosis(bottleneck=verdict, reasons=["test"], evidence={"data_wait_share": 0.3}, thresholds={},
                     next_rounds=[], findings=[verdict])


ASCEND_ONLY = {"jit_O2", "flash_attention", "memory_optimize_O1", "dataset_sink"}


def test_autotuner_offers_the_ascend_levers_on_ascend_only():
    ascend = from_dict({"model": {"n_head": 2}}, {"device_target": "Ascend", "amp_level": "O2"})
    names = {c.name for c in candidates(ascend, _diag("balanced"), cores=8)[0]}
    assert ASCEND_ONLY <= names and "data_autotune" in names
    bf16 = {c.name for c in candidates(from_dict({}, {"device_target": "Ascend"}), _diag("balanced"), cores=8)[0]}
    assert "amp_O2_bf16" in bf16 and "flash_attention" not in bf16  # flash needs AMP first
    gpu = {c.name for c in candidates(from_dict({}, {"device_target": "GPU"}), _diag("data-bound"), cores=8)[0]}
    assert "dataset_sink" in gpu and not (ASCEND_ONLY - {"dataset_sink"}) & gpu
    cpu = [c for c in candidates(from_dict({}), _diag("data-bound"), cores=2)[0]]
    assert not ASCEND_ONLY & {c.name for c in cpu}
    data = [c.name for c in cpu if c.family == "data"]
    assert "data_autotune" in data and data.index("data_workers_2") < data.index("data_autotune")
    for cand in candidates(ascend, _diag("balanced"), cores=8)[0]:  # each lever is a config Ascend accepts
        if cand.name in ASCEND_ONLY:
            assert with_changes(ascend, cand.changes).device_target == "Ascend"


def test_dataset_autotune_is_switched_for_the_pipeline_and_it_still_yields_the_same_batches(tmp_path):
    import mindspore.dataset as ds
    from helpers.run.data import prepare, train_dataset
    corpus = tmp_path / "c.txt"
    corpus.write_text("the king shall speak and all the lords hear him now\n" * 300, encoding="utf-8")
    base = {"model": {"seq_len": 16}, "data": {"corpus": [str(corpus)], "num_parallel_workers": 2},
            "batch_size": 4, "steps": 6, "steady_after": 1, "eval_batches": 2, "seed": 7}
    got = {}
    for autotune in (True, False):
        cfg = from_dict(base, {"data.autotune": autotune})
        pipeline = train_dataset(cfg, prepare(cfg))
        assert ds.config.get_enable_autotune() is autotune  # MindSpore's own switch, read back
        got[autotune] = [x.tolist() for x, _ in pipeline.create_tuple_iterator(num_epochs=1, output_numpy=True)]
    assert len(got[True]) == 6 and got[True] == got[False]  # autotune changes speed knobs, not the data
