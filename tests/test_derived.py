"""Derived figures have one home each (helpers/record.py): the data-wait share, the steady window, the memory
fraction and the declared metric columns. Every reader calls these; here they are pinned, and so is the agreement
of each caller with them."""
from __future__ import annotations

import csv
import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest

from helpers.config import from_dict
from helpers.paired import Measurement, SpeedPlan, parts
from helpers.record import (DATA_WAIT_UNMEASURED, DEVICE, METRIC_COLUMNS, RSS, MetricColumns, RecordError,
                            RecordWriter, RunRecord, data_wait_share, data_wait_text, memory_fraction, steady_mask)
from helpers.run.metrics import summarize
from helpers.tune.diagnose import diagnose
from helpers.tune.suggest import _flat_throughput
from tests.conftest import run_cli, tiny_args


def _rows(n: int, wait: float | None = 1.0) -> list[dict]:
    return [{"step": s, "step_time_ms": 10.0, "data_wait_ms": wait, "tokens": 64, "tokens_per_s": 6400.0,
             "loss": 4.0 - 0.01 * s, "loss_ema": 4.0 - 0.01 * s, "grad_norm": 1.0, "rss_bytes": 1e8}
            for s in range(1, n + 1)]


def test_data_wait_share_is_the_waits_over_the_timed_steps():
    assert data_wait_share([10.0, 30.0], [1.0, 3.0]) == pytest.approx(0.1)
    assert data_wait_share([10.0, float("nan"), 30.0], [1.0, None, 3.0]) == pytest.approx(0.1)  # untimed: left out
    assert data_wait_share([10.0, 30.0], [0.0, 0.0]) == 0.0  # measured, none


@pytest.mark.parametrize("waits", [[None, None], [1.0, None], [float("nan"), 2.0]])
def test_data_wait_share_is_unknown_not_zero_when_a_wait_was_not_measured(waits):
    """Sink mode: the device takes its batch inside the step, the loop records no wait (None): unknown, not 0."""
    assert data_wait_share([10.0, 30.0], waits) is None
    assert data_wait_share([], []) is None and data_wait_share([0.0], [0.0]) is None
    assert data_wait_text(None, sink=True) == DATA_WAIT_UNMEASURED == "n/a (sink mode)"
    assert data_wait_text(None) == "n/a" and data_wait_text(0.125) == "12.5%"


def test_every_caller_gives_none_in_sink_mode_and_the_same_share_otherwise(tmp_path):
    for wait, expect in ((1.0, 0.1), (None, None)):
        cols = MetricColumns.of_rows(_rows(12, wait))
        s = summarize(cols, 1, 3, 1e6, None)
        assert s["data_wait_share"] == (pytest.approx(expect) if expect else None)
        cfg = from_dict({}, ["steps=12", "steady_after=3"])
        record = RunRecord(tmp_path, cfg, _rows(12, wait), {"status": "ok", "steps": 12, "steady_window": [4, 12]},
                           {})
        ev = diagnose(record).evidence
        assert ev["data_wait_share"] == (pytest.approx(expect) if expect else None)
        assert ev["starved_step_share"] == (0.0 if expect else None)
        blocks = [[10.0] * 4, [10.0] * 4]
        waits = None if wait is None else [([wait] * 4, [wait] * 4)] * 2
        m = Measurement([(b, b) for b in blocks], (64.0, 64.0), waits)
        p = parts(m, SpeedPlan())
        assert p.reference.data_wait_share == (pytest.approx(expect) if expect else None)


def test_sink_mode_diagnosis_says_the_wait_is_not_measured(tmp_path):
    cfg = dataclasses.replace(from_dict({}, ["steps=12", "steady_after=3"]), dataset_sink=True)  # as on a device
    record = RunRecord(tmp_path, cfg, _rows(12, None), {"status": "ok", "steps": 12, "steady_window": [4, 12]}, {})
    d = diagnose(record)
    assert d.bottleneck == "balanced" and "data_wait_share n/a (sink mode)" in d.reasons[0], d.reasons


def test_steady_mask_is_the_one_window():
    steps = np.arange(1, 13)
    assert steps[steady_mask(steps, 4)].tolist() == list(range(4, 13))
    assert steps[steady_mask(steps, 4, (6, 7))].tolist() == [4, 5, 8, 9, 10, 11, 12]
    cols = MetricColumns.of_rows(_rows(12))
    s = summarize(cols, 1, 3, 1e6, None, profiled=(6, 7))
    assert s["steady_window"] == [4, 12] and s["speed_steps"] == 7
    cfg = from_dict({}, ["steps=12", "steady_after=3"])
    record = RunRecord(None, cfg, _rows(12), {"steady_window": [4, 12], "profiled_steps": [6, 7]}, {})
    assert record.speed_columns()["step"].tolist() == [4, 5, 8, 9, 10, 11, 12]


def test_memory_fraction_divides_each_peak_by_its_own_memory():
    cpu = memory_fraction({"peak_memory_bytes": 2 * 2**30, "memory_source": RSS}, {"memory_total_bytes": 8 * 2**30})
    assert cpu.fraction == 0.25 and cpu.text() == "peak RSS is 25% of RAM"
    device = memory_fraction({"peak_memory_bytes": 2 * 2**30, "memory_source": DEVICE,
                              "device_memory_total_bytes": 4 * 2**30}, {"memory_total_bytes": 512 * 2**30})
    assert device.fraction == 0.5 and device.text() == "peak device memory is 50% of device memory"
    unknown = memory_fraction({"peak_memory_bytes": 2**30, "memory_source": DEVICE}, {"memory_total_bytes": 2**40})
    assert unknown.fraction is None and "not known" in unknown.text()  # never a device peak over host RAM


def test_suggest_judges_a_device_peak_against_device_memory(tmp_path):
    """A device peak of 60% of the device's memory is not roomy, however large the host's RAM."""
    cfg = from_dict({}, ["steps=60", "steady_after=3", "monitor.throughput_window=4"])
    rows = [{**r, "loss_drop_per_ktok": 1.0 if r["step"] < 10 else 0.0} for r in _rows(60)]
    summary = {"status": "ok", "steps": 60, "peak_memory_bytes": 6 * 2**30, "memory_source": DEVICE,
               "device_memory_total_bytes": 10 * 2**30}
    s = _flat_throughput(RunRecord(tmp_path, cfg, rows, summary, {"memory_total_bytes": 1024 * 2**30}), cfg)
    assert s is not None and "grad_accum_steps" in s.changes, s
    assert "peak device memory is 60% of device memory" in s.evidence and "peak RSS" not in s.evidence
    roomy = {**summary, "peak_memory_bytes": 2**30}
    s = _flat_throughput(RunRecord(tmp_path, cfg, rows, roomy, {"memory_total_bytes": 1024 * 2**30}), cfg)
    assert "batch_size" in s.changes and "peak device memory is 10% of device memory" in s.evidence


def test_a_row_key_that_is_not_a_declared_column_fails(tmp_path):
    writer = RecordWriter(tmp_path / "run")
    writer.start("{}\n", {}, {"status": "running"})
    with pytest.raises(RecordError, match=r"a row of step 1 has 'not_a_column', which its file has no column for"):
        writer.add({"step": 1, "loss": 1.0, "not_a_column": 2.0}, now=0.0)


@pytest.mark.slow
def test_every_key_the_training_loop_writes_is_a_declared_column(tmp_path, small_corpus):
    """A real run with monitors on (alarms, loss drop per 1k tokens, evaluations): the writer refuses a key that is
    no declared column, so the run finishing is the proof; every column the loop fills on CPU is filled."""
    out = tmp_path / "run"
    proc = run_cli("train", *tiny_args(small_corpus, 16, "eval_every=8", "monitor.grad_norm_limit=0.001",
                                       "monitor.throughput_window=4"), "--out", str(out), "--progress", "none")
    assert proc.returncode == 0, proc.stderr[-2000:]
    with open(out / "metrics.csv", encoding="utf-8", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert list(rows[0].keys()) == METRIC_COLUMNS and len(rows) == 16
    filled = {c for r in rows for c, v in r.items() if v != ""}
    assert filled == set(METRIC_COLUMNS) - {"device_memory_bytes"}, set(METRIC_COLUMNS) - filled  # CPU: no device
    assert all(math.isfinite(float(r["data_wait_ms"])) for r in rows)


def test_every_list_of_metric_or_summary_keys_is_drawn_from_the_declared_ones():
    """METRIC_COLUMNS is the one list of row keys and SUMMARY_KEYS the one list of headline summary keys: the
    progress line, the TensorBoard scalars and the summary's producer name only keys those declare."""
    from dataclasses import fields

    from helpers.book.tensorboard import SCALARS
    from helpers.book.tensorboard import SUMMARY_TEXT
    from helpers.cli import show_table
    from helpers.record import SUMMARY_DETAIL_KEYS, SUMMARY_KEYS, RunRecord
    from helpers.wire import StepRow
    assert set(SCALARS) <= set(METRIC_COLUMNS), set(SCALARS) - set(METRIC_COLUMNS)
    assert set(SUMMARY_TEXT) <= set(SUMMARY_KEYS + SUMMARY_DETAIL_KEYS)
    shown = show_table(RunRecord(Path("r"), None, [], {k: 1 for k in SUMMARY_KEYS + SUMMARY_DETAIL_KEYS + ["x"]}, {}))
    assert [line.split()[0] for line in shown.splitlines()[3:]] == [k for k in SUMMARY_KEYS + SUMMARY_DETAIL_KEYS
                                                                    if k not in ("record_version", "status",
                                                                                 "status_reason")]
    assert {f.name for f in fields(StepRow)} <= set(METRIC_COLUMNS)
    made = summarize(MetricColumns.of_rows(_rows(12)), 1, 3, 1e6, None)
    run_level = {"record_version", "status", "status_reason", "comm_step_share"}  # the writer's and rankmerge's
    assert set(SUMMARY_KEYS) - run_level <= set(made), set(SUMMARY_KEYS) - run_level - set(made)
