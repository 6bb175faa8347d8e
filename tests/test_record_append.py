"""metrics.csv is appended to, never rewritten: a kill mid-append costs no whole row, a resume keeps the rows up to
its checkpoint once, a key with no column is refused, the summary read back from the file equals the one the rows
give, and long curves are drawn as buckets that keep a spike."""
from __future__ import annotations

import math
import os
import random
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from helpers.config import dump, from_dict
from helpers.record import (BUFFER_ROWS, METRIC_COLUMNS, MetricColumns, MetricRows, RecordError, RecordWriter,
                            kept_rows, load_run, read_metric_columns, read_metric_rows, rows_to_csv)
from helpers.run.metrics import summarize
from tests.conftest import REPO, wait_for

ROWS = 20000


def _row(step: int, rng: random.Random) -> dict:
    """A row as the train loop makes it: a validation pass every 500 steps, a NaN loss now and then, no data wait
    measured on some steps."""
    step_ms = 20.0 + rng.random() * 5.0
    loss = float("nan") if step % 4999 == 0 else 5.0 - step / ROWS + rng.random() * 0.1
    val = loss + 0.1 if step % 500 == 0 else None
    return {"step": step, "step_time_ms": step_ms, "data_wait_ms": None if step % 7 == 0 else rng.random(),
            "tokens": 1024, "tokens_per_s": 1024 / (step_ms / 1000.0), "loss": loss, "loss_ema": 5.0 - step / ROWS,
            "grad_norm": rng.random() * 2.0, "loss_scale": 1.0, "overflow": int(math.isnan(loss)), "lr": 1e-3,
            "rss_bytes": 500_000_000 + step, "device_memory_bytes": None, "val_loss": val,
            "val_ppl": math.exp(val) if val is not None else None, "loss_drop_per_ktok": None,
            "elapsed_s": step * 0.025, "alarms": "loss_spike" if step % 1000 == 0 else None}


def _rows(n: int, first: int = 1, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    return [_row(step, rng) for step in range(first, first + n)]


def _started(run) -> RecordWriter:
    writer = RecordWriter(run)
    writer.start(dump(from_dict({})), {}, {"status": "ok", "status_reason": ""})
    return writer


def _write(run, rows: list[dict]) -> RecordWriter:
    writer = _started(run)
    for row in rows:
        writer.add(row, now=0.0)
    writer.flush()
    return writer


def test_rows_are_appended_to_what_is_written_never_rewritten(tmp_path):
    path = tmp_path / "run" / "metrics.csv"
    writer = _started(tmp_path / "run")
    rows = _rows(3 * BUFFER_ROWS + 10)
    writer.add(rows[0], now=100.0)  # the first row is written at once
    first, inode = path.read_bytes(), path.stat().st_ino
    assert first == rows_to_csv(rows[:1]).encode()
    for row in rows[1:BUFFER_ROWS + 1]:  # within the flush cadence: appended every BUFFER_ROWS rows
        writer.add(row, now=101.0)
    grown = path.read_bytes()
    assert grown.startswith(first) and grown == rows_to_csv(rows[:BUFFER_ROWS + 1]).encode()
    for row in rows[BUFFER_ROWS + 1:]:
        writer.add(row, now=102.0)
    writer.add(_row(len(rows) + 1, random.Random(1)), now=106.0)  # 5 s after the last flush: flushed
    assert path.stat().st_ino == inode and path.read_bytes().startswith(grown)
    assert [r["step"] for r in read_metric_rows(path)] == list(range(1, len(rows) + 2))
    assert not hasattr(writer, "rows") and writer.last_row["step"] == len(rows) + 1


def test_a_line_cut_short_by_a_kill_is_no_row_and_a_resume_goes_on_cleanly(tmp_path):
    run = tmp_path / "run"
    rows = _rows(2000)
    _write(run, rows)
    with open(run / "metrics.csv", "a", encoding="utf-8") as fh:
        fh.write("2001,21.5,0.3,1024,47627.9,4.9")  # a kill inside the next append
    record = load_run(run)
    assert len(record.metrics) == 2000 and record.metrics[-1]["step"] == 2000
    assert len(record.columns("step")) == 2000 and record.metrics == read_metric_rows(run / "metrics.csv")
    kept = kept_rows(run / "metrics.csv", 1500)  # a resume from the checkpoint after step 1500
    assert kept.last == read_metric_rows(run / "metrics.csv")[1499] and kept.after
    before = (run / "metrics.csv").read_bytes()
    writer = RecordWriter(run)
    writer.start_later(dump(from_dict({})), {}, {"status": "running", "status_reason": ""}, kept=kept)
    assert (run / "metrics.csv").read_bytes() == before  # nothing written before the resume's first row
    new = _rows(100, first=1501, seed=7)
    for row in new:
        writer.add(row, now=0.0)
    writer.flush()
    assert read_metric_rows(run / "metrics.csv") == read_metric_rows_of(rows[:1500] + new, tmp_path)
    assert (run / "metrics.csv").read_text().count("\n") == 1 + 1600  # every line whole, no step twice


def read_metric_rows_of(rows: list[dict], tmp_path) -> list[dict]:
    """`rows` as they read back from a metrics.csv."""
    path = tmp_path / "expected.csv"
    path.write_text(rows_to_csv(rows))
    return read_metric_rows(path)


WRITER_CHILD = """
import random, sys
from helpers.record import RecordWriter
from tests.test_record_append import _row
writer, rng = RecordWriter(sys.argv[1], flush_every_s=0.0), random.Random(0)
for step in range(1, 10**7):
    writer(_row(step, rng), 0)
"""


def test_a_writer_killed_with_sigkill_mid_run_leaves_whole_consecutive_rows(tmp_path):
    run = tmp_path / "run"
    child = subprocess.Popen([sys.executable, "-c", WRITER_CHILD, str(run)], cwd=REPO,
                             env=dict(os.environ, PYTHONPATH=str(REPO)))
    try:
        assert wait_for(lambda: (run / "metrics.csv").is_file() and (run / "metrics.csv").stat().st_size > 200_000,
                        60, poll_s=0.01)
        time.sleep(0.05)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    rows = read_metric_rows(run / "metrics.csv")
    assert len(rows) > 500 and [r["step"] for r in rows] == list(range(1, len(rows) + 1))
    cols = read_metric_columns(run / "metrics.csv")
    assert cols["step"].tolist() == list(range(1, len(rows) + 1))


def test_a_failed_append_is_written_over_by_the_next(tmp_path):
    run = tmp_path / "run"
    writer = _write(run, _rows(10))
    with open(run / "metrics.csv", "a", encoding="utf-8") as fh:
        fh.write("11,20.5,0.1,1024\n12,2")  # part of an append the disk refused, as if a whole row got through
    for row in _rows(5, first=11, seed=3):
        writer.add(row, now=0.0)
    writer.flush()
    assert [r["step"] for r in read_metric_rows(run / "metrics.csv")] == list(range(1, 16))


def test_a_row_key_with_no_column_is_refused_naming_it(tmp_path):
    writer = _write(tmp_path / "run", _rows(3))
    before = (tmp_path / "run" / "metrics.csv").read_bytes()
    with pytest.raises(RecordError, match=r"^a row of step 4 has 'lr_scaled', which its file has no column for .*"
                                          r"METRIC_COLUMNS in helpers/record.py"):
        writer.add({**_rows(1, first=4)[0], "lr_scaled": 1e-4}, now=0.0)
    writer.flush()
    assert (tmp_path / "run" / "metrics.csv").read_bytes() == before
    with pytest.raises(RecordError, match="'extra'"):
        rows_to_csv([{"step": 1, "extra": 2}])


def test_a_resume_of_an_older_records_columns_writes_them_as_todays(tmp_path):
    old = tmp_path / "old.csv"
    columns = [c for c in METRIC_COLUMNS if c != "elapsed_s"]  # a record written before elapsed_s existed
    old.write_text(rows_to_csv([{k: v for k, v in r.items() if k != "elapsed_s"} for r in _rows(30)], columns))
    writer = RecordWriter(tmp_path / "run")
    writer.start_later(dump(from_dict({})), {}, {"status": "running", "status_reason": ""}, kept=kept_rows(old, 20))
    writer.add(_rows(1, first=21)[0], now=0.0)
    rows = read_metric_rows(tmp_path / "run" / "metrics.csv")
    assert [r["step"] for r in rows] == list(range(1, 22))
    assert rows[19]["elapsed_s"] is None and rows[20]["elapsed_s"] == 21 * 0.025
    assert rows[:20] == [{**r, "elapsed_s": None} for r in read_metric_rows(old)[:20]]


def _summary_of_dicts(rows: list[dict], start: int, warmup: int, profiled: tuple[int, int]) -> dict:
    """The summary figures as they were computed from a list of row dicts before metrics.csv was appended to."""
    steady = [r for r in rows if r["step"] >= start + warmup and not profiled[0] <= r["step"] <= profiled[1]]
    times = np.array([r["step_time_ms"] for r in steady if r["step_time_ms"] is not None], dtype=np.float64)
    times = times[np.isfinite(times)]
    waits = [r["data_wait_ms"] for r in steady if r["step_time_ms"] is not None]
    total_ms = float(times.sum())
    losses = [r["loss"] for r in rows if r.get("loss") is not None]
    evals = [r for r in rows if r.get("val_loss") is not None]
    norms = np.array([r["grad_norm"] for r in rows], dtype=np.float64)
    return {"steps": rows[-1]["step"], "tokens_per_s": sum(r["tokens"] for r in steady) / (total_ms / 1000.0),
            "step_time_ms": float(np.median(times)), "step_time_ms_p10": float(np.percentile(times, 10)),
            "step_time_ms_p90": float(np.percentile(times, 90)),
            "steady_window": [steady[0]["step"], steady[-1]["step"]], "speed_steps": len(steady),
            "compile_s": next(r for r in rows if r["step"] == start)["step_time_ms"] / 1000.0,
            # a step whose wait was not measured makes the share unknown (record.data_wait_share), not smaller
            "data_wait_share": None if None in waits else sum(waits) / total_ms,
            "loss_first": losses[0], "loss_last": losses[-1],
            "val_loss": evals[-1]["val_loss"], "val_ppl": evals[-1]["val_ppl"],
            "grad_norm_max": float(norms[np.isfinite(norms)].max())}


def test_the_summary_read_back_from_the_file_equals_the_one_of_the_row_dicts(tmp_path):
    rows = _rows(ROWS)
    rows[-1]["loss"] = float("nan")  # a NaN loss is a value: loss_last is NaN, not the loss before it
    writer = _write(tmp_path / "run", rows)
    for start, warmup, profiled in ((1, 10, (200, 209)), (5001, 0, (0, -1))):
        want = _summary_of_dicts(read_metric_rows(tmp_path / "run" / "metrics.csv"), start, warmup, profiled)
        for cols in (writer.columns(), MetricColumns.of_rows(rows)):
            got = summarize(cols, start, warmup, 1e6, 1e12, profiled if profiled[1] >= 0 else None)
            for key, value in want.items():
                assert type(got[key]) is type(value) and (got[key] == value or math.isnan(value)), key
            assert math.isnan(got["loss_last"])


def test_load_run_reads_no_row_until_asked_and_refuses_a_garbage_last_row(tmp_path):
    run = tmp_path / "run"
    _write(run, _rows(500))
    record = load_run(run)
    assert isinstance(record.metrics, MetricRows) and record.metrics._rows is None
    assert len(record.metrics) == 500 and record.metrics._rows is None  # counted, not parsed
    assert record.speed_columns("data_wait_ms")["step"][0] == 6  # after steady_after=5 (the default config)
    assert record.metrics._rows is None and record.speed_rows()[0]["step"] == 6
    with open(run / "metrics.csv", "a", encoding="utf-8") as fh:
        fh.write("501,abc,,,\n")
    with pytest.raises(RecordError, match=r"metrics.csv' is unreadable \(could not convert string to float"):
        load_run(run)


def test_bucketed_curves_keep_a_one_step_spike_in_their_band():
    from matplotlib.figure import Figure

    from helpers.book.plots import bucketed, draw
    steps = np.arange(1, ROWS + 1, dtype=np.float64)
    values = np.full(ROWS, 2.0)
    values[12345] = 9.0
    values[100] = np.nan
    curve = bucketed(steps, values, 500)
    assert len(curve.x) == 500 and curve.hi.max() == 9.0 and curve.lo.min() == 2.0
    assert curve.y.max() < 2.5  # the mean smooths the spike away; the band keeps it
    assert np.all(np.diff(curve.x) > 0) and 1 <= curve.x[0] and curve.x[-1] <= ROWS
    short = bucketed(steps[:300], values[:300], 500)  # short enough: the points themselves
    assert len(short.x) == 299 and np.array_equal(short.y, short.hi)
    ax = Figure().add_subplot()
    draw(ax, curve)
    draw(ax, short)
    assert len(ax.lines) == 2 and len(ax.collections) == 1  # a band for the bucketed curve only
