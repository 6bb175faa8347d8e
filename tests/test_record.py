import json
import os
from pathlib import Path

import pytest

from helpers.config import dump, from_dict
from helpers.record import (RecordError, RecordWriter, atomic_write_text, load_run, read_metric_rows,
                            rows_to_csv)
from tests.conftest import run_cli


def _row(step):
    return {"step": step, "step_time_ms": 10.0, "data_wait_ms": 0.1, "tokens": 100, "tokens_per_s": 1e4,
            "loss": 3.0 - step * 0.1, "loss_ema": 3.0, "grad_norm": 1.0, "loss_scale": 1.0, "overflow": 0,
            "lr": 1e-3, "rss_bytes": 1000, "device_memory_bytes": None, "val_loss": None, "val_ppl": None}


def test_record_round_trip(tmp_path):
    cfg = from_dict({"batch_size": 3})
    writer = RecordWriter(tmp_path / "run")
    writer.start(dump(cfg), {"python": "3"}, {"status": "ok", "status_reason": ""})
    for step in (1, 2, 3):
        writer.add(_row(step), now=0.0)
    writer.flush()
    record = load_run(tmp_path / "run")
    assert record.config == cfg and record.status == "ok" and record.env == {"python": "3"}
    assert [r["step"] for r in record.metrics] == [1, 2, 3]
    assert record.metrics[0]["device_memory_bytes"] is None
    assert record.frame()["loss"].iloc[-1] == pytest.approx(2.7)


def test_atomic_write_leaves_old_file_when_interrupted(tmp_path, monkeypatch):
    target = tmp_path / "summary.json"
    atomic_write_text(target, '{"a": 1}')

    def boom(src, dst):
        raise OSError("disk full")
    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(RecordError, match=r"^cannot write '.*summary.json' \(disk full\); .*choose another --out"):
        atomic_write_text(target, '{"a": 2}')
    assert json.loads(target.read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]


def test_dead_running_process_reads_as_interrupted(tmp_path):
    writer = RecordWriter(tmp_path / "run")
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    writer.start(dump(from_dict({})), {}, {"status": "running", "status_reason": "", "pid": pid})
    record = load_run(tmp_path / "run")
    assert record.status == "interrupted" and "resume" in record.summary["status_reason"]


def test_foreign_or_missing_directory_has_clear_error(tmp_path):
    with pytest.raises(RecordError, match="does not exist"):
        load_run(tmp_path / "nope")
    (tmp_path / "foreign").mkdir()
    with pytest.raises(RecordError, match="not a run record"):
        load_run(tmp_path / "foreign")


def test_csv_empty_cells_round_trip(tmp_path):
    path = tmp_path / "m.csv"
    path.write_text(rows_to_csv([_row(1)]))
    assert read_metric_rows(path)[0]["val_loss"] is None


def test_a_record_written_at_7c15080_still_loads_and_shows():
    """Record format v1 (before the house moved into floors): load_run reads it, `show` prints it."""
    from helpers.cli import show_table
    from helpers.record import RECORD_VERSION
    old = Path(__file__).parent / "data" / "record_7c15080"
    record = load_run(old)
    assert record.status == "ok" and record.summary["steps"] == 12 and len(record.metrics) == 12
    assert record.summary["record_version"] == RECORD_VERSION and record.summary["upgraded_from"] == 1
    assert record.config.model.preset == "tiny" and record.metrics[-1]["val_loss"] is not None
    assert record.config.model.lazy_inline is False  # it ran before the key existed (config.WRITTEN_BEFORE)
    table = show_table(record)
    assert "12,747" in table and "tiny" not in table  # tokens/s as written then; the table shows the summary
    proc = run_cli("show", str(old))
    assert proc.returncode == 0 and "tokens_per_s" in proc.stdout, proc.stderr


def test_each_communication_share_has_its_own_name(tmp_path):
    """comm time ÷ step time (rankmerge) and comm ops ÷ op time (profiler) were both `comm_share`; a v1 record's
    `comm_share` was the step-time one, and diagnose must say which share it judged."""
    import json
    import shutil

    import yaml

    from helpers.tune.diagnose import diagnose
    run = tmp_path / "dp"
    shutil.copytree(Path(__file__).parent / "data" / "record_7c15080", run)
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    cfg["parallel"]["data_parallel"] = 2  # as a data-parallel run of that version recorded it
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    summary = json.loads((run / "summary.json").read_text())
    (run / "summary.json").write_text(json.dumps({**summary, "comm_share": 0.5}))
    record = load_run(run)
    assert record.summary["comm_step_share"] == 0.5 and "comm_share" not in record.summary
    d = diagnose(record)
    assert d.bottleneck == "communication-bound"
    assert d.reasons == ["communication takes 50% of step time (≥ 20%)"]
    assert d.evidence["comm_step_share"] == 0.5 and "comm_share" not in d.evidence


def test_one_rule_says_whether_a_write_error_is_a_full_disk():
    """record.disk_full, which the token cache, MindRecord prepare and the weights export all ask."""
    import errno

    from helpers.record import disk_full
    assert disk_full(OSError(errno.ENOSPC, "No space left on device"))
    assert disk_full(OSError(errno.EDQUOT, "Disk quota exceeded"))
    assert disk_full(Exception("No space left on device (os error 28)"))  # safetensors names no errno
    assert disk_full(RuntimeError("No free disk to be used while writing mindrecord files"))  # MindSpore's writer
    assert not disk_full(OSError(errno.EACCES, "Permission denied"))
    assert not disk_full(ValueError("bad header"))
