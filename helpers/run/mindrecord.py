"""MindRecord token data, as MindSpore Transformers keeps pre-training data: rows of `input_ids` (and `labels`, when
present) of model.seq_len+1 tokens each; the model reads ids[:-1] and predicts labels[1:] (ids[1:] without labels).

A set is opened from MindRecord's own headers (row counts, columns), never by reading all its rows: a sample of rows
spread over it is checked, the validation windows the run needs are read, and the train rows stream from disk while
the run steps, each row checked as it passes. Written chunk by chunk with MindSpore's FileWriter (`RowWriter`). Each
problem is one MindRecordError line naming the file, and the row where one row is at fault.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from helpers import folder_lock

INPUT_IDS, LABELS = "input_ids", "labels"
TRAIN_FILE, VAL_FILE, TOKENIZER_FILE = "train.mindrecord", "val.mindrecord", "tokenizer.json"
PARTIAL = ".partial"  # `prepare` writes a set into this folder inside --out and moves it into place once whole
SAMPLE_ROWS = 256  # rows spread over a set whose lengths and ids are checked before the run starts
# FileWriter's commit holds one raw page's index entries in memory: 3.1 M rows of 65 ids peaked at 3.9 GB RSS with
# MindSpore's 32 MB pages, at 0.64 GB with 1 MB pages (the same as for 1 M rows), and read as fast.
PAGE_BYTES = 1 << 20
_POSITION = "_stream_position"  # the column that carries each streamed row's position to the check
_SHARDS = re.compile(r"\.mindrecord\d*$")  # name.mindrecord, and FileWriter's shards name.mindrecord0 … N


class MindRecordError(ValueError):
    """A MindRecord set the run cannot read as token windows; one line naming the file, the problem and the fix."""


# ------------------------------------------------------------------------------------------------ locate

@dataclass(frozen=True)
class SetFiles:
    """Where a MindRecord set's parts are: its train files in read order, its val file (a `prepare` folder's; None:
    the last rows of the train files validate), its tokenizer.json (None: ids only), and the train files' size
    (bytes)."""
    train: list[str]
    val: list[str] | None
    tokenizer: Path | None
    size_bytes: int


def locate_set(path: str) -> SetFiles:
    """The files of the set at `path`: one MindRecord file; a folder written by `prepare` (its train.mindrecord,
    val.mindrecord and tokenizer.json); or any other folder, whose MindRecord files all train (FileWriter's shards
    name.mindrecord0 … N included, in shard order). MindRecordError for a missing path, a folder without MindRecord
    files, or one `prepare` is writing or did not finish."""
    where = Path(path).expanduser()
    if where.is_file():
        return _set_files([where], None, None)
    if not where.is_dir():
        raise MindRecordError(f"MindRecord {path!r} does not exist; pass a .mindrecord file or a folder written by "
                              f"`python -m helpers prepare --to mindrecord`")
    if (where / PARTIAL).exists():
        raise MindRecordError(_unfinished(where))
    if (where / TRAIN_FILE).is_file():
        val, tokenizer = where / VAL_FILE, where / TOKENIZER_FILE
        return _set_files([where / TRAIN_FILE], [val] if val.is_file() else None,
                          tokenizer if tokenizer.is_file() else None)
    files = _mindrecord_files(where)
    if not files:
        raise MindRecordError(f"folder {path!r} has no .mindrecord file; pass a folder written by `python -m helpers "
                              f"prepare --to mindrecord`, a folder of MindRecord files or one .mindrecord file")
    return _set_files(files, None, None)


def _set_files(train: list[Path], val: list[Path] | None, tokenizer: Path | None) -> SetFiles:
    return SetFiles([str(p) for p in train], None if val is None else [str(p) for p in val], tokenizer,
                    sum(p.stat().st_size for p in train))


def _mindrecord_files(folder: Path) -> list[Path]:
    """A folder's MindRecord files: *.mindrecord, shards *.mindrecord<N>, and any other file with its .db index
    beside it; by name, numbers counted as numbers (shard 2 before shard 10)."""
    found = [p for p in folder.iterdir() if p.is_file() and not p.name.startswith(".") and p.suffix != ".db"
             and (_SHARDS.search(p.name) or p.with_name(p.name + ".db").is_file())]
    return sorted(found, key=lambda p: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", p.name)])


def _unfinished(folder: Path) -> str:
    """Why a folder with a `prepare` temp folder in it is no set: being written, or left by a stopped `prepare`."""
    pid = folder_lock.holder(folder)
    if pid:
        return (f"folder {str(folder)!r} is being written by `python -m helpers prepare` (pid {pid}); wait for it "
                f"to finish, then train on it")
    return (f"folder {str(folder)!r} holds a MindRecord set that `prepare` did not finish (it was stopped or failed "
            f"while writing); write it again with `python -m helpers prepare --to mindrecord --out {folder} "
            f"--replace`")


# -------------------------------------------------------------------------------------------------- open

@dataclass(frozen=True)
class Rows:
    """Rows [start, start + count) of MindRecord `files` (of `file_rows` rows each) read as one sequence in file
    order, with the `columns` the run reads (input_ids, and labels when the files have them)."""
    files: tuple[str, ...]
    file_rows: tuple[int, ...]
    columns: tuple[str, ...]
    start: int
    count: int

    def where(self, k: int) -> tuple[str, int]:
        """(file, row in that file counted from 0) of row `k` of these rows."""
        at = self.start + k
        ends = np.cumsum(self.file_rows)
        i = int(np.searchsorted(ends, at, side="right"))
        return self.files[i], at - (int(ends[i - 1]) if i else 0)

    def read(self, ks: np.ndarray) -> dict[str, list[np.ndarray]]:
        """Rows `ks` (increasing) of these rows, per column, as they are stored (unchecked: lengths may differ).
        MindDataset reads them through its index; the other rows are not read."""
        import mindspore.dataset as ds
        sampler = ds.SubsetSampler([self.start + int(k) for k in ks])
        rows = ds.MindDataset(list(self.files), columns_list=list(self.columns), sampler=sampler)
        out: dict[str, list[np.ndarray]] = {c: [] for c in self.columns}
        for item in rows.create_dict_iterator(num_epochs=1, output_numpy=True):
            for c in self.columns:
                out[c].append(np.asarray(item[c]))
        return out


@dataclass(frozen=True)
class Records:
    """A checked MindRecord set opened for one run: its train rows, its validation rows, the row length (seq_len+1)
    and vocabulary they are checked against, and the validation windows read for the run (`held`, of
    `val_windows`)."""
    train: Rows
    val: Rows
    seq_len: int
    vocab: int
    held: tuple[np.ndarray, np.ndarray]

    @property
    def train_rows(self) -> int:
        """Rows that train (rows)."""
        return self.train.count

    @property
    def val_rows(self) -> int:
        """Rows that validate (rows)."""
        return self.val.count

    @property
    def has_labels(self) -> bool:
        """Whether the train rows have a labels column (the targets), else targets are input_ids."""
        return LABELS in self.train.columns

    def val_windows(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """(inputs, targets), int32 [n, seq_len+1]: `n` windows spread evenly over the validation rows (window i is
        row i*count//n, or row i % count when n > count); targets are the labels, else the inputs. The windows read
        when the set was opened are returned as they are; another n reads its rows."""
        if len(self.held[0]) == n:
            return self.held
        return _windows(self.val, n, self.seq_len, self.vocab)


def open_records(found: SetFiles, seq_len: int, vocab: int, val_fraction: float, val_rows: int) -> Records:
    """Open the set `found` for a run of rows of seq_len+1 tokens and ids in [0, vocab): row counts and columns from
    the files' headers, the lengths and ids of up to SAMPLE_ROWS rows spread over the train files checked, and the
    `val_rows` validation windows the run evaluates on read (and checked). Validation rows are the val file's, or
    without one the last val_fraction of the train rows (which then do not train). No other row is read."""
    train = _rows(found.train)
    if found.val is not None:
        val = _rows(found.val)
    else:
        n_val = max(1, int(train.count * val_fraction))
        if train.count - n_val < 1:
            raise MindRecordError(f"MindRecord {found.train[0]!r} has {train.count} rows, too few to hold out "
                                  f"data.val_fraction={val_fraction} for validation; write more rows or a "
                                  f"{VAL_FILE} beside it")
        val = Rows(train.files, train.file_rows, train.columns, train.count - n_val, n_val)
        train = Rows(train.files, train.file_rows, train.columns, 0, train.count - n_val)
    whole = Rows(train.files, train.file_rows, train.columns, 0, sum(train.file_rows))
    sample = np.unique(np.linspace(0, whole.count - 1, min(SAMPLE_ROWS, whole.count)).round().astype(np.int64))
    read = whole.read(sample)
    for column in whole.columns:
        _stacked(whole, sample, column, read[column], seq_len, vocab)
    return Records(train, val, seq_len, vocab, _windows(val, val_rows, seq_len, vocab))


def _rows(files: list[str]) -> Rows:
    """All rows of `files`, from their headers: MindRecordError for a file MindSpore cannot read, without input_ids,
    with columns other than the first file's, or for no rows at all."""
    import mindspore.dataset as ds
    counts, first = [], None
    for path in files:
        try:
            header = ds.MindDataset([path], shuffle=False)
            columns, rows = sorted(header.get_col_names()), header.get_dataset_size()
        except (RuntimeError, ValueError, TypeError) as exc:
            raise MindRecordError(f"{path!r} is not a readable MindRecord file ({_why(exc)}); pass a .mindrecord "
                                  f"file with its .db index beside it, e.g. one written by `python -m helpers "
                                  f"prepare --to mindrecord`") from None
        if INPUT_IDS not in columns:
            raise MindRecordError(f"MindRecord {path!r} has columns {columns} and no {INPUT_IDS}; the workbook reads "
                                  f"{INPUT_IDS} (and {LABELS} if present): write it with those columns")
        if first is not None and columns != first[1]:
            raise MindRecordError(f"MindRecord {path!r} has columns {columns} and {first[0]!r} has {first[1]}; the "
                                  f"files of one set are read together and need the same columns: pass files "
                                  f"written alike")
        first = first or (path, columns)
        counts.append(rows)
    if not sum(counts):
        raise MindRecordError(f"MindRecord {files[0]!r} has no rows; write token windows into it")
    return Rows(tuple(files), tuple(counts), tuple(c for c in (INPUT_IDS, LABELS) if c in first[1]), 0, sum(counts))


def _why(exc: BaseException) -> str:
    """MindSpore's own reason in one of its multi-line errors (its [ERROR] line), else the last line."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    error = [line.removeprefix("[ERROR]").strip() for line in lines if line.startswith("[ERROR]")]
    return (error or lines or [type(exc).__name__])[-1][:160]


def _windows(rows: Rows, n: int, seq_len: int, vocab: int) -> tuple[np.ndarray, np.ndarray]:
    """`Records.val_windows` read from disk: only the picked rows, each once, checked."""
    if n == 0:
        empty = np.zeros((0, seq_len + 1), np.int32)
        return empty, empty
    picks = np.arange(n) * rows.count // n if n <= rows.count else np.arange(n) % rows.count
    distinct = np.unique(picks)
    read = rows.read(distinct)
    arrays = {c: _stacked(rows, distinct, c, read[c], seq_len, vocab) for c in rows.columns}
    at = np.searchsorted(distinct, picks)
    return arrays[INPUT_IDS][at], arrays.get(LABELS, arrays[INPUT_IDS])[at]


def _stacked(rows: Rows, ks: np.ndarray, column: str, read: list[np.ndarray], seq_len: int,
             vocab: int) -> np.ndarray:
    """Rows `ks` of `column` as int32 [len(ks), seq_len+1], once each has been checked."""
    for k, ids in zip(ks, read):
        problem = _row_problem(rows, int(k), column, ids, seq_len, vocab)
        if problem:
            raise MindRecordError(problem)
    return np.stack(read).astype(np.int32)


def _row_problem(rows: Rows, k: int, column: str, ids: np.ndarray, seq_len: int, vocab: int) -> str | None:
    """The one line that refuses row `k` of `rows` (its `column` is another length than seq_len+1, or holds an id
    outside [0, vocab)), naming its file and row; None when the row is fine."""
    if ids.shape != (seq_len + 1,):
        file, row = rows.where(k)
        return (f"MindRecord {file!r} row {row} has {column} of {ids.size} tokens; model.seq_len={seq_len} needs "
                f"{seq_len + 1} (inputs and their next-token targets): set model.seq_len={ids.size - 1} or write "
                f"the file again for this seq_len")
    low, high = int(ids.min()), int(ids.max())
    if low >= 0 and high < vocab:
        return None
    file, row = rows.where(k)
    if low < 0:
        return (f"MindRecord {file!r} row {row} holds id {low} in {column} (an ignore index?); the workbook's loss "
                f"counts every token: write ids in 0..vocab-1 (or no {LABELS} column)")
    return (f"MindRecord {file!r} row {row} holds token id {high} in {column}, beyond the model's vocabulary of "
            f"{vocab} (model.vocab_size, or the tokenizer's): set model.vocab_size>={high + 1} or write the file "
            f"with this model's tokenizer")


# ------------------------------------------------------------------------------------------------ stream

class _Positions:
    """Random-access source of the stream's positions 0 … samples-1, one per streamed row."""

    def __init__(self, samples: int):
        self.samples = samples

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, k: int):
        return (np.array(k, dtype=np.int64),)


class _StreamCheck:
    """Map op right after the source: passes each train row on as it is, and stops the stream at the first row
    `_row_problem` refuses, naming its file and row. The row's position comes beside it, so the map may have any
    number of workers (MindSpore's autotune adds some to map ops while a run trains)."""

    def __init__(self, records: Records):
        self.train, self.seq_len, self.vocab = records.train, records.seq_len, records.vocab

    def __call__(self, *columns):
        *rows, position = columns
        k = int(position) % self.train.count
        for column, ids in zip(self.train.columns, rows):
            problem = _row_problem(self.train, k, column, ids, self.seq_len, self.vocab)
            if problem:
                raise MindRecordError(problem)
        return tuple(rows) if len(rows) > 1 else rows[0]


def source(records: Records, samples: int, workers: int):
    """(dataset, its columns): the train rows in file order, epochs laid end to end, `samples` rows in all, read by
    `workers` MindDataset workers, each row's lengths and ids checked as it streams (`_StreamCheck`; its error
    reaches the caller wrapped by MindSpore: `data.pipeline_error` reads it back). The last epoch is cut short by
    num_samples, not by .take(), which reads and maps the rest of an epoch before its iterator ends."""
    import mindspore.dataset as ds
    train, columns = records.train, list(records.train.columns)

    def rows(n: int):
        return ds.MindDataset(list(train.files), columns_list=columns, shuffle=False, num_samples=n,
                              num_parallel_workers=workers)

    full, rest = divmod(samples, train.count)
    parts = ([rows(train.count).repeat(full)] if full else []) + ([rows(rest)] if rest else [])
    stream = parts[0] if len(parts) == 1 else parts[0] + parts[1]
    # A generator: MindSpore's autotune never gives GeneratorOp more workers, so positions stay in order.
    positions = ds.GeneratorDataset(_Positions(samples), [_POSITION], shuffle=False, python_multiprocessing=False)
    checked = ds.zip((stream, positions)).map(operations=_StreamCheck(records), input_columns=[*columns, _POSITION],
                                              output_columns=columns, num_parallel_workers=1)
    return checked, columns


# ------------------------------------------------------------------------------------------------- write

class RowWriter:
    """One MindRecord file of token windows (an input_ids column of `row_tokens` int32 ids a row) at `path`, with
    its index `path`.db, written chunk by chunk: memory holds the chunk being written, and at commit MindSpore's
    index build holds one page's entries (pages of PAGE_BYTES, or two rows where a row is larger)."""

    def __init__(self, path: str | Path, row_tokens: int):
        from mindspore.mindrecord import FileWriter
        self.path, self.rows = Path(path), 0
        self._writer = FileWriter(str(path), shard_num=1, overwrite=True)
        self._writer.set_page_size(max(PAGE_BYTES, 2 * 4 * row_tokens))
        self._writer.add_schema({INPUT_IDS: {"type": "int32", "shape": [-1]}}, "token windows")

    def write(self, ids: np.ndarray) -> None:
        """Append the rows of `ids`, int32 [rows, row_tokens]."""
        self._writer.write_raw_data([{INPUT_IDS: row} for row in np.asarray(ids, np.int32)])
        self.rows += len(ids)

    def commit(self) -> None:
        """Finish the file and write its index (seconds for millions of rows)."""
        self._writer.commit()
