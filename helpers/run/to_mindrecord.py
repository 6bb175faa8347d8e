"""`python -m helpers prepare --to mindrecord`: any corpus the workbook knows, tokenized as a run would, written as a
MindRecord set a run reads with data.format=mindrecord: train.mindrecord and val.mindrecord (the windows a text run
of the same config trains and validates on, in order) and tokenizer.json.

Windows are cut from the token file and written CHUNK_ROWS at a time, so memory does not grow with the corpus. The
set is written into <out>/.partial and its files moved into <out> once all are whole; the temp folder goes last. A
folder with a .partial in it is never taken for a set (`mindrecord.locate_set`), so a `prepare` that is killed, fails
or fills the disk leaves nothing a run would read, and the next `prepare` into that folder starts it afresh.
"""
from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from helpers.config import Config
from helpers.record import disk_full, free_bytes
from helpers.run.data import DataError, prepare, window_count
from helpers.run.mindrecord import PARTIAL, TRAIN_FILE, VAL_FILE, MindRecordError, RowWriter

CHUNK_ROWS = 10_000  # windows cut and handed to FileWriter at a time
ROW_OVERHEAD_BYTES = 96  # page and index bytes a row takes beside its ids (measured: 91 for 65-id rows)
WRITER_FLOOR_BYTES = 10 << 20  # FileWriter refuses to write on a disk with less free (MindSpore's kMinFreeDiskSize)


@dataclass(frozen=True)
class Written:
    """A MindRecord set written: its folder, rows per part, tokens per row (seq_len+1) and vocabulary."""
    folder: Path
    train_rows: int
    val_rows: int
    row_tokens: int
    vocab_size: int


def window_chunks(tokens: np.ndarray, seq_len: int, rows: int = CHUNK_ROWS):
    """The windows of seq_len+1 tokens at stride seq_len a text run cuts from `tokens`, `rows` windows at a time
    (int32 [≤rows, seq_len+1]); only each chunk's tokens are read from a memory-mapped token file."""
    count = window_count(len(tokens), seq_len)
    for first in range(0, count, rows):
        n = min(rows, count - first)
        span = np.asarray(tokens[first * seq_len:(first + n) * seq_len + 1], np.int32)
        yield np.lib.stride_tricks.sliding_window_view(span, seq_len + 1)[::seq_len]


def set_bytes(rows: int, row_tokens: int, vocab: int) -> int:
    """About the disk bytes of a set of `rows` windows of `row_tokens` ids (bytes): MindRecord stores an id in 1, 2
    or 4 bytes as the vocabulary needs, plus ROW_OVERHEAD_BYTES a row."""
    id_bytes = 1 if vocab <= 1 << 7 else 2 if vocab <= 1 << 15 else 4
    return rows * (row_tokens * id_bytes + ROW_OVERHEAD_BYTES)


def write_corpus(cfg: Config, out: str | Path) -> Written:
    """Tokenize cfg's text corpus as a run would and write its train and val windows as a set in folder `out`
    (module docstring: through <out>/.partial). MindRecordError, before writing, when the disk has too little room
    for the set (`set_bytes` and the WRITER_FLOOR_BYTES MindSpore keeps free), and when it fills while writing; the
    temp folder is removed on any failure."""
    if cfg.data.format != "text":
        raise DataError(f"prepare --to mindrecord reads a text corpus, and this config's data.format is "
                        f"{cfg.data.format}; pass data.format=text with the corpus to convert")
    folder = Path(out)
    partial = folder / PARTIAL
    shutil.rmtree(partial, ignore_errors=True)  # a stopped earlier prepare's: the caller is the folder's writer
    partial.mkdir(parents=True)
    try:
        prep = prepare(cfg, partial)  # writes partial/tokenizer.json
        seq_len, vocab = cfg.model.seq_len, prep.tokenizer.vocab_size
        parts = {TRAIN_FILE: prep.train_tokens, VAL_FILE: prep.val_tokens}
        counts = {name: window_count(len(tokens), seq_len) for name, tokens in parts.items()}
        need, free = set_bytes(sum(counts.values()), seq_len + 1, vocab), free_bytes(folder)
        if free < need + WRITER_FLOOR_BYTES:
            raise MindRecordError(_no_room(folder, need, free))
        try:
            _write_parts(partial, parts, seq_len, sum(counts.values()))
        except (OSError, RuntimeError) as exc:
            if _disk_full(exc, folder):  # the disk filled while writing: what is free once .partial is gone
                shutil.rmtree(partial, ignore_errors=True)
                raise MindRecordError(_no_room(folder, need, _real_free(folder, free))) from None
            raise
        for name in sorted(os.listdir(partial)):
            os.replace(partial / name, folder / name)
        partial.rmdir()
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return Written(folder, counts[TRAIN_FILE], counts[VAL_FILE], seq_len + 1, vocab)


def _write_parts(partial: Path, parts: dict[str, np.ndarray], seq_len: int, total: int) -> None:
    """Each part's windows as one MindRecord file in `partial`, with a progress bar (rows, rows/s, ETA) on stderr
    when it is a terminal."""
    from tqdm import tqdm
    with tqdm(total=total, unit=" rows", unit_scale=True, desc="prepare", file=sys.stderr, disable=None,
              mininterval=1.0) as bar:
        for name, tokens in parts.items():
            bar.set_postfix_str(f"writing {name}")
            writer = RowWriter(partial / name, seq_len + 1)
            for chunk in window_chunks(tokens, seq_len):
                writer.write(chunk)
                bar.update(len(chunk))
            bar.set_postfix_str(f"indexing {name}")
            writer.commit()


def _disk_full(exc: BaseException, folder: Path) -> bool:
    """Whether a write error is the disk filling: an OSError's errno, MindSpore's own words (its RuntimeError names
    no errno: "No free disk to be used while writing mindrecord files"), or the disk near MindSpore's floor now (read
    from the disk itself, not `free_bytes`, which the check before writing used)."""
    if disk_full(exc):
        return True
    try:
        return shutil.disk_usage(folder).free < 2 * WRITER_FLOOR_BYTES
    except OSError:
        return False


def _real_free(folder: Path, measured: int) -> int:
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return measured


def _mb(size: int, up: bool = False) -> str:
    """Bytes as whole MB, rounded up for a size needed (a set of 0.2 MB needs "about 1 MB", never "0 MB")."""
    return f"{-(-size // 1_000_000):,}" if up else f"{size / 1e6:,.0f}"


def _no_room(folder: Path, need: int, free: int) -> str:
    return (f"no room for the MindRecord set on the disk of {str(folder)!r} (disk full: {_mb(free)} MB were "
            f"free, the set needs about {_mb(need, True)} MB and MindSpore's writer {WRITER_FLOOR_BYTES >> 20} MB "
            f"more); free disk space or pass an --out folder on a disk with room")
