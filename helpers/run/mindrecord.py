"""MindRecord token data, as MindSpore Transformers keeps pre-training data: rows of `input_ids` (and `labels`, when
present) of model.seq_len+1 tokens each; the model reads ids[:-1] and predicts labels[1:] (ids[1:] without labels).
Written with MindSpore's FileWriter, checked and read with MindDataset. Each bad file is one MindRecordError line.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

INPUT_IDS, LABELS = "input_ids", "labels"
TRAIN_FILE, VAL_FILE = "train.mindrecord", "val.mindrecord"


class MindRecordError(ValueError):
    """A MindRecord file the run cannot read as token windows; one line naming the file, the problem and the fix."""


def write_rows(path: str | Path, ids: np.ndarray) -> Path:
    """Write token windows `ids` [rows, seq_len+1] as one MindRecord file `path` (and its index `path`.db)."""
    from mindspore.mindrecord import FileWriter
    writer = FileWriter(str(path), shard_num=1, overwrite=True)
    writer.add_schema({INPUT_IDS: {"type": "int32", "shape": [-1]}}, "token windows")
    writer.write_raw_data([{INPUT_IDS: row} for row in np.asarray(ids, np.int32)])
    writer.commit()
    return Path(path)


def columns_of(path: str) -> list[str]:
    """The columns of a MindRecord file; MindRecordError when it is none."""
    import mindspore.dataset as ds
    try:
        return list(ds.MindDataset(path, shuffle=False).get_col_names())
    except (RuntimeError, ValueError, TypeError) as exc:
        why = str(exc).strip().splitlines()[-1][:160] if str(exc).strip() else type(exc).__name__
        raise MindRecordError(f"{path!r} is not a readable MindRecord file ({why}); pass a .mindrecord file with "
                              f"its .db index beside it, e.g. one written by `python -m helpers prepare --to "
                              f"mindrecord`") from None


def read_rows(path: str, seq_len: int, vocab: int) -> tuple[np.ndarray, np.ndarray | None]:
    """(input_ids, labels or None), each int32 [rows, seq_len+1], of a MindRecord file, after checking its columns,
    its row length against model.seq_len and its ids against the model's vocabulary `vocab`."""
    import mindspore.dataset as ds
    columns = columns_of(path)
    if INPUT_IDS not in columns:
        raise MindRecordError(f"MindRecord {path!r} has columns {columns} and no {INPUT_IDS}; the workbook reads "
                              f"{INPUT_IDS} (and {LABELS} if present): write it with those columns")
    wanted = [c for c in (INPUT_IDS, LABELS) if c in columns]
    rows: dict[str, list] = {c: [] for c in wanted}
    for item in ds.MindDataset(path, columns_list=wanted, shuffle=False).create_dict_iterator(num_epochs=1,
                                                                                              output_numpy=True):
        for c in wanted:
            rows[c].append(np.asarray(item[c]).ravel())
    arrays = {c: _stacked(path, c, rows[c], seq_len) for c in wanted}
    for c, array in arrays.items():
        _check_ids(path, c, array, vocab)
    return arrays[INPUT_IDS], arrays.get(LABELS)


def _stacked(path: str, column: str, rows: list[np.ndarray], seq_len: int) -> np.ndarray:
    if not rows:
        raise MindRecordError(f"MindRecord {path!r} has no rows; write token windows into it")
    lengths = sorted({len(r) for r in rows})
    if lengths != [seq_len + 1]:
        have = lengths[0] if len(lengths) == 1 else f"{lengths[0]}..{lengths[-1]}"
        raise MindRecordError(f"MindRecord {path!r} has {column} rows of {have} tokens; model.seq_len={seq_len} "
                              f"needs {seq_len + 1} (inputs and their next-token targets): set model.seq_len="
                              f"{lengths[0] - 1} or write the file again for this seq_len")
    return np.stack(rows).astype(np.int32)


def _check_ids(path: str, column: str, ids: np.ndarray, vocab: int) -> None:
    low, high = int(ids.min()), int(ids.max())
    if low < 0:
        raise MindRecordError(f"MindRecord {path!r} holds id {low} in {column} (an ignore index?); the workbook's "
                              f"loss counts every token: write ids in 0..vocab-1 (or no {LABELS} column)")
    if high >= vocab:
        raise MindRecordError(f"MindRecord {path!r} holds token id {high} in {column}, beyond the model's vocabulary "
                              f"of {vocab} (model.vocab_size, or the tokenizer's): set model.vocab_size>={high + 1} "
                              f"or write the file with this model's tokenizer")


@dataclass
class Records:
    """A checked MindRecord set for one run: the train file and how many of its first rows train, whether it has
    labels, and the validation windows (input_ids and targets, int32 [rows, seq_len+1]) held in memory."""
    train_file: str
    train_rows: int
    has_labels: bool
    val_ids: np.ndarray
    val_labels: np.ndarray


def open_records(train_file: str, val_file: str | None, seq_len: int, vocab: int, val_fraction: float) -> Records:
    """Check a set and hold its validation windows: `val_file`'s rows, or without one the last val_fraction of the
    train file's rows (which then do not train)."""
    ids, labels = read_rows(train_file, seq_len, vocab)
    if val_file is not None:
        val_ids, val_labels = read_rows(val_file, seq_len, vocab)
        n_train = len(ids)
    else:
        n_train = len(ids) - max(1, int(len(ids) * val_fraction))
        if n_train < 1:
            raise MindRecordError(f"MindRecord {train_file!r} has {len(ids)} rows, too few to hold out "
                                  f"data.val_fraction={val_fraction} for validation; write more rows or a "
                                  f"{VAL_FILE} beside it")
        val_ids, val_labels = ids[n_train:], None if labels is None else labels[n_train:]
    targets = val_ids if val_labels is None else val_labels
    return Records(train_file, n_train, labels is not None, val_ids, targets)


def source(records: Records, samples: int, workers: int):
    """MindDataset of the train rows in file order, epochs laid end to end, `samples` rows in all."""
    import mindspore.dataset as ds
    columns = [INPUT_IDS, LABELS] if records.has_labels else [INPUT_IDS]
    rows = ds.MindDataset(records.train_file, columns_list=columns, shuffle=False, num_samples=records.train_rows,
                          num_parallel_workers=workers)
    epochs = -(-samples // records.train_rows)
    return (rows.repeat(epochs) if epochs > 1 else rows).take(samples), columns
