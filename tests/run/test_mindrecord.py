"""MindRecord data (data.format=mindrecord): `prepare --to mindrecord` writes the windows a text run trains on, a run
on them trains the same loss curve, and each bad file is one line."""
from __future__ import annotations

import numpy as np
import pytest

from helpers.config import from_dict, to_dict
from helpers.record import load_run
from helpers.run.data import DataError, prepare, train_dataset, val_batches
from helpers.run.mindrecord import MindRecordError
from helpers.run.to_mindrecord import write_corpus
from tests.conftest import make_text, run_cli, tiny_args


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("mr") / "text.txt"
    path.write_text(make_text(3000), encoding="utf-8")
    return path


def text_cfg(corpus, **extra):
    return from_dict({"model": {"preset": "debug"}, "data": {"corpus": [str(corpus)]}, "batch_size": 8, "steps": 10,
                      "steady_after": 3, "eval_batches": 2, **extra})


def records_cfg(cfg, where, **model):
    data = {**to_dict(cfg)["data"], "corpus": [str(where)], "format": "mindrecord"}
    return from_dict({**to_dict(cfg), "data": data, "model": {**to_dict(cfg)["model"], **model}})


def batches(cfg, prep):
    return list(train_dataset(cfg, prep).create_tuple_iterator(num_epochs=1, output_numpy=True))


def write_columns(path, columns: dict[str, np.ndarray]):
    """A MindRecord file with exactly these int32 columns (rows of each array)."""
    from mindspore.mindrecord import FileWriter
    writer = FileWriter(str(path), shard_num=1, overwrite=True)
    writer.add_schema({c: {"type": "int32", "shape": [-1]} for c in columns}, "test")
    n = len(next(iter(columns.values())))
    writer.write_raw_data([{c: a[i] for c, a in columns.items()} for i in range(n)])
    writer.commit()
    return path


def test_prepare_writes_the_windows_a_text_run_trains_and_validates_on(corpus, tmp_path):
    cfg = text_cfg(corpus)
    written = write_corpus(cfg, tmp_path / "set")
    assert (written.row_tokens, written.vocab_size) == (33, 30) and written.train_rows > 100
    text, records = prepare(cfg), prepare(records_cfg(cfg, tmp_path / "set"))
    assert records.records.train_rows == written.train_rows and not records.records.has_labels
    a, b = batches(cfg, text), batches(cfg, records)
    assert len(a) == len(b) == 10
    assert all(np.array_equal(p, q) for x, y in zip(a, b) for p, q in zip(x, y))  # same rows, same shuffled order
    assert all(np.array_equal(p, q) for x, y in zip(val_batches(cfg, text), val_batches(cfg, records))
               for p, q in zip(x, y))


def test_a_file_with_labels_and_no_val_file_holds_out_its_last_rows(tmp_path):
    ids = np.arange(40 * 33).reshape(40, 33).astype(np.int32) % 50
    labels = (ids + 1) % 50
    path = write_columns(tmp_path / "theirs.mindrecord", {"input_ids": ids, "labels": labels})
    cfg = records_cfg(text_cfg("unused", **{"data": {"val_fraction": 0.1}}), path, vocab_size=50)
    prep = prepare(cfg)
    assert (prep.records.train_rows, len(prep.records.val_ids), prep.tokenizer.kind) == (36, 4, "ids")
    x, y = batches(cfg, prep)[0]
    assert np.array_equal(y, (x + 2) % 50)  # targets are labels[1:] = input_ids[1:] + 1, and ids count up by 1
    vx, vy = val_batches(cfg, prep)[0]
    assert np.array_equal(vx[0], ids[36, :-1]) and np.array_equal(vy[0], labels[36, 1:])


def _one_line(exc_type, cfg) -> str:
    with pytest.raises(exc_type) as err:
        prepare(cfg)
    assert "\n" not in str(err.value)
    return str(err.value)


def test_bad_files_get_one_line_each(corpus, tmp_path):
    cfg = text_cfg(corpus)
    rows = np.zeros((20, 33), np.int32)
    wrong = write_columns(tmp_path / "cols.mindrecord", {"tokens": rows})
    assert "has columns ['tokens'] and no input_ids" in _one_line(MindRecordError, records_cfg(cfg, wrong, vocab_size=30))
    short = write_columns(tmp_path / "short.mindrecord", {"input_ids": rows[:, :17]})
    message = _one_line(MindRecordError, records_cfg(cfg, short, vocab_size=30))
    assert "input_ids rows of 17 tokens; model.seq_len=32 needs 33" in message and "model.seq_len=16" in message
    big = write_columns(tmp_path / "big.mindrecord", {"input_ids": rows + 99})
    message = _one_line(MindRecordError, records_cfg(cfg, big, vocab_size=30))
    assert "token id 99 in input_ids, beyond the model's vocabulary of 30" in message
    ignore = write_columns(tmp_path / "ignore.mindrecord", {"input_ids": rows, "labels": rows - 100})
    assert "holds id -100 in labels" in _one_line(MindRecordError, records_cfg(cfg, ignore, vocab_size=30))
    assert "model.vocab_size to the vocabulary" in _one_line(DataError, records_cfg(cfg, big))
    (tmp_path / "text.mindrecord").write_text("not a mindrecord")
    assert "is not a readable MindRecord" in _one_line(MindRecordError,
                                                       records_cfg(cfg, tmp_path / "text.mindrecord", vocab_size=30))
    (tmp_path / "empty").mkdir()
    assert "has no .mindrecord file" in _one_line(DataError, records_cfg(cfg, tmp_path / "empty"))


@pytest.mark.slow
def test_mindrecord_trains_the_same_loss_curve_as_its_text(corpus, tmp_path):
    folder = tmp_path / "set"
    proc = run_cli("prepare", "--to", "mindrecord", *tiny_args(corpus, 12), "--out", str(folder))
    assert proc.returncode == 0 and "data.format=mindrecord" in proc.stdout, proc.stderr[-2000:]
    runs = {}
    for name, extra in (("text", []), ("mindrecord", ["data.format=mindrecord", f"data.corpus={folder}"])):
        args = tiny_args(corpus, 12, *extra)
        proc = run_cli("train", *args, "--out", str(tmp_path / name), "--progress", "none")
        assert proc.returncode == 0, proc.stderr[-2000:]
        runs[name] = load_run(tmp_path / name)
    text, records = ([r["loss"] for r in runs[k].metrics] for k in ("text", "mindrecord"))
    assert len(text) == 12 and text[-1] < text[0] - 0.3
    assert np.allclose(text, records, rtol=0, atol=1e-5)
    assert abs(runs["text"].summary["val_loss"] - runs["mindrecord"].summary["val_loss"]) < 1e-5
