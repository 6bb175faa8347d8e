"""Device profiler tables (Ascend op_statistic / kernel_details, GPU op types) into the CPU parser's op table.

The files in tests/data/device_profile follow the documented layouts; they are not from a real device run
(see its README)."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from helpers.record import RecordError
from helpers.run.device_profile import find_op_source, read_op_table, read_ops
from helpers.run.profile import OP_COLUMNS

DATA = Path(__file__).resolve().parent.parent / "data" / "device_profile"
OUT = "host_1234_20261130120000000_ascend_ms/ASCEND_PROFILER_OUTPUT"


def _by_name(ops):
    return {op["name"]: op for op in ops}


def test_ascend_op_statistic_sums_core_types_into_the_op_table():
    ops = read_ops("ascend_op_statistic", DATA / "ascend" / "profile" / OUT / "op_statistic.csv", steps=2)
    assert [list(op) for op in ops] == [OP_COLUMNS] * len(ops)
    names = [op["name"] for op in ops]
    assert names == ["MatMulV2", "FlashAttentionScore", "Cast", "hcom_allReduce_"]  # largest total first
    cast = _by_name(ops)["Cast"]  # one row on AI_CORE, one on AI_VECTOR_CORE
    assert cast["calls"] == 3 and cast["total_ms"] == pytest.approx(0.05) and cast["ms_per_step"] == pytest.approx(0.025)
    assert cast["avg_us"] == pytest.approx(50.0 / 3)
    assert sum(op["share"] for op in ops) == pytest.approx(1.0)
    assert _by_name(ops)["MatMulV2"]["share"] == pytest.approx(0.52632, abs=1e-4)  # the file's own Ratio(%)


def test_kernel_details_grouped_by_type_agree_with_op_statistic():
    folder = DATA / "ascend" / "profile" / OUT
    details = _by_name(read_ops("ascend_kernel_details", folder / "kernel_details.csv", steps=2))
    stats = _by_name(read_ops("ascend_op_statistic", folder / "op_statistic.csv", steps=2))
    assert set(details) == set(stats)
    for name, op in stats.items():
        assert details[name]["calls"] == op["calls"], name
        assert details[name]["total_ms"] == pytest.approx(op["total_ms"]), name


def test_gpu_op_types_read_into_the_same_columns():
    ops, what, raw = read_op_table(DATA / "gpu" / "profile", steps=2)
    assert what.startswith("GPU") and raw.name.endswith("_ascend_ms")
    assert [op["name"] for op in ops][:2] == ["MatMul", "FlashAttentionScore"]
    assert _by_name(ops)["Cast"]["calls_per_step"] == 1.5 and _by_name(ops)["MatMul"]["avg_us"] == 50.0


def test_device_table_wins_over_host_table_and_a_missing_one_says_what_to_do(tmp_path):
    profile = tmp_path / "profile"
    shutil.copytree(DATA / "ascend" / "profile", profile)
    host = profile / OUT.split("/")[0] / "FRAMEWORK"
    host.mkdir()
    (host / "cpu_op_type_info_0.csv").write_text(
        "op_type,type_occurrences,execution_frequency(per-step),total_compute_time,avg_time(ms),percent\n"
        "Launch,22,11,4.4,0.2,100\n")
    kind, _ = find_op_source(profile)
    assert kind == "ascend_op_statistic"
    (profile / OUT / "op_statistic.csv").unlink()
    assert find_op_source(profile)[0] == "ascend_kernel_details"
    (profile / OUT / "kernel_details.csv").unlink()
    ops, what, _ = read_op_table(profile, steps=2)
    assert what.startswith("host") and ops[0]["name"] == "Launch" and ops[0]["avg_us"] == pytest.approx(200.0)
    shutil.rmtree(profile / OUT.split("/")[0])
    with pytest.raises(RecordError, match="monitor.profile_steps > 0"):
        find_op_source(profile)


def test_a_changed_layout_fails_in_one_line_naming_the_columns(tmp_path):
    bad = tmp_path / "op_statistic.csv"
    bad.write_text("Device_id,OP Name,Calls\n0,MatMul,3\n")
    with pytest.raises(RecordError, match=r"lacks the column\(s\) OP Type, Count, Total Time\(us\)"):
        read_ops("ascend_op_statistic", bad, steps=1)
