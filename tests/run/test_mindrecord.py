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
    assert (prep.records.train_rows, prep.records.val_rows, prep.tokenizer.kind) == (36, 4, "ids")
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
    assert "row 0 has input_ids of 17 tokens; model.seq_len=32 needs 33" in message and "model.seq_len=16" in message
    big = write_columns(tmp_path / "big.mindrecord", {"input_ids": rows + 99})
    message = _one_line(MindRecordError, records_cfg(cfg, big, vocab_size=30))
    assert "row 0 holds token id 99 in input_ids, beyond the model's vocabulary of 30" in message
    ignore = write_columns(tmp_path / "ignore.mindrecord", {"input_ids": rows, "labels": rows - 100})
    assert "holds id -100 in labels" in _one_line(MindRecordError, records_cfg(cfg, ignore, vocab_size=30))
    assert "model.vocab_size to the vocabulary" in _one_line(DataError, records_cfg(cfg, big))
    (tmp_path / "text.mindrecord").write_text("not a mindrecord")
    assert "is not a readable MindRecord" in _one_line(MindRecordError,
                                                       records_cfg(cfg, tmp_path / "text.mindrecord", vocab_size=30))
    (tmp_path / "empty").mkdir()
    assert "has no .mindrecord file" in _one_line(MindRecordError, records_cfg(cfg, tmp_path / "empty"))


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


# ------------------------------------------------------------------------------------- sets opened, not read

def numbered_rows(rows: int, vocab: int) -> np.ndarray:
    """Rows of 33 ids whose first id is the row's number (rows <= vocab), so a batch shows which rows it holds."""
    return ((np.arange(rows)[:, None] + np.arange(33)[None, :]) % vocab).astype(np.int32)


def trained_rows(cfg, prep) -> list[int]:
    """The row numbers (first ids) of every row the run's batches hold, in the order they come."""
    return [int(v) for x, _ in batches(cfg, prep) for v in x[:, 0]]


def test_a_shard_set_trains_on_every_row_of_every_shard_once(tmp_path):
    from mindspore.mindrecord import FileWriter
    ids = numbered_rows(100, 200)
    writer = FileWriter(str(tmp_path / "wiki.mindrecord"), shard_num=3, overwrite=True)  # as MindFormers writes
    writer.add_schema({"input_ids": {"type": "int32", "shape": [-1]},
                       "attention_mask": {"type": "int32", "shape": [-1]}}, "pretrain")
    writer.write_raw_data([{"input_ids": row, "attention_mask": np.ones_like(row)} for row in ids])
    writer.commit()
    cfg = records_cfg(text_cfg("unused", **{"data": {"val_fraction": 0.2}}), tmp_path, vocab_size=200)
    prep = prepare(cfg)
    assert prep.records.train.files == tuple(str(tmp_path / f"wiki.mindrecord{i}") for i in range(3))
    assert (prep.records.train_rows, prep.records.val_rows) == (80, 20)
    trained = trained_rows(cfg, prep)  # 10 steps of 8: one epoch of the 80 train rows
    held = [int(v) for v in prep.records.val_windows(20)[0][:, 0]]
    assert len(trained) == len(set(trained)) == 80 and sorted(trained + held) == list(range(100))


def test_a_folder_of_several_files_trains_on_all_of_them_in_name_order(tmp_path):
    from helpers.run.mindrecord import RowWriter, locate_set
    ids = numbered_rows(90, 200)
    for name, part in (("part10.mindrecord", ids[50:]), ("part2.mindrecord", ids[:50])):  # 2 before 10
        writer = RowWriter(tmp_path / name, 33)
        writer.write(part)
        writer.commit()
    found = locate_set(str(tmp_path))
    assert found.train == [str(tmp_path / "part2.mindrecord"), str(tmp_path / "part10.mindrecord")]
    cfg = records_cfg(text_cfg("unused", **{"data": {"val_fraction": 0.2, "shuffle_buffer": 1}}), tmp_path,
                      vocab_size=200)
    prep = prepare(cfg)
    assert trained_rows(cfg, prep) == list(range(72)) + list(range(8))  # 80 rows: an epoch of 72, then 8 more
    assert [int(v) for v in val_batches(cfg, prep)[0][0][:, 0]] == list(range(72, 80))


def test_opening_a_set_reads_its_headers_and_a_sample_not_its_rows(tmp_path):
    import time
    import mindspore.dataset as ds
    from helpers.run.mindrecord import RowWriter, locate_set, open_records
    rows, vocab = 60_000, 70_000
    path = tmp_path / "big.mindrecord"
    writer = RowWriter(path, 9)
    for first in range(0, rows, 20_000):
        writer.write((np.arange(first, first + 20_000)[:, None] + np.arange(9)).astype(np.int32))
    writer.commit()
    start = time.perf_counter()
    records = open_records(locate_set(str(path)), 8, vocab, 0.1, 40)
    opened = time.perf_counter() - start
    start = time.perf_counter()
    every = sum(1 for _ in ds.MindDataset(str(path), shuffle=False).create_tuple_iterator(num_epochs=1))
    read_all = time.perf_counter() - start
    assert every == rows and (records.train_rows, records.val_rows) == (54_000, 6_000)
    assert opened * 5 < read_all, (opened, read_all)  # measured: 0.1 s against 2 s
    for n in (40, 6_000, 15_000):  # fewer windows than rows, as many, more (cycling)
        picks = np.arange(n) * 6_000 // n if n <= 6_000 else np.arange(n) % 6_000
        inputs, targets = records.val_windows(n)
        assert inputs.shape == (n, 9) and np.array_equal(inputs[:, 0], 54_000 + picks)
        assert np.array_equal(targets, inputs)  # no labels column: the targets are the ids


def test_a_bad_row_past_the_sample_stops_the_stream_naming_its_file_and_row(tmp_path):
    from helpers.config import dump
    from helpers.run.data import pipeline_error
    from helpers.run.mindrecord import SAMPLE_ROWS, RowWriter
    ids = numbered_rows(1200, 1200)
    bad = 1000
    assert bad not in set(np.linspace(0, 1199, SAMPLE_ROWS).round().astype(int))  # not checked when opened
    ids[bad, 7] = 5000
    for name, part in (("a.mindrecord", ids[:700]), ("b.mindrecord", ids[700:])):
        writer = RowWriter(tmp_path / name, 33)
        writer.write(part)
        writer.commit()
    cfg = records_cfg(text_cfg("unused", **{"steps": 150, "data": {"shuffle_buffer": 1}}), tmp_path,
                      vocab_size=1200)
    prep = prepare(cfg)  # opens: the bad row is not read
    with pytest.raises(RuntimeError) as err:
        batches(cfg, prep)
    said = f"MindRecord {str(tmp_path / 'b.mindrecord')!r} row 300 holds token id 5000 in input_ids, beyond the " \
           f"model's vocabulary of 1200"
    message = str(pipeline_error(err.value))
    assert message.startswith(said), message
    assert pipeline_error(RuntimeError("another failure")) is None
    # a training run stops there with that line, not MindSpore's wrapper
    (tmp_path / "run.yaml").write_text(dump(cfg), encoding="utf-8")
    proc = run_cli("train", "--config", str(tmp_path / "run.yaml"), "--out", str(tmp_path / "run"), "--progress",
                   "none")
    assert proc.returncode != 0 and said in proc.stderr.splitlines()[-1], proc.stderr[-1500:]
    assert said in load_run(tmp_path / "run").summary["status_reason"]


def test_a_folder_prepare_is_writing_or_left_unfinished_is_no_set(corpus, tmp_path):
    from helpers import folder_lock
    from helpers.run.mindrecord import PARTIAL, locate_set
    folder = tmp_path / "set"
    write_corpus(text_cfg(corpus), folder)
    assert not (folder / PARTIAL).exists() and locate_set(str(folder)).val is not None
    (folder / PARTIAL).mkdir()  # as a prepare writing it again, or killed while it did
    folder_lock.hold(folder)
    try:
        with pytest.raises(MindRecordError, match=r"is being written by `python -m helpers prepare` \(pid \d+\)"):
            locate_set(str(folder))
    finally:
        folder_lock.release(folder)
    assert "that `prepare` did not finish" in _one_line(MindRecordError, records_cfg(text_cfg(corpus), folder))
