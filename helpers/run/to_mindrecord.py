"""`python -m helpers prepare --to mindrecord`: any corpus the workbook knows, tokenized as a run would, written as a
MindRecord set a run reads with data.format=mindrecord: train.mindrecord and val.mindrecord (the windows a text run
of the same config trains and validates on, in order) and tokenizer.json."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from helpers.config import Config
from helpers.run.data import DataError, prepare, window_count
from helpers.run.mindrecord import TRAIN_FILE, VAL_FILE, write_rows


@dataclass(frozen=True)
class Written:
    """A MindRecord set written: its folder, rows per part, tokens per row (seq_len+1) and vocabulary."""
    folder: Path
    train_rows: int
    val_rows: int
    row_tokens: int
    vocab_size: int


def windows(tokens: np.ndarray, seq_len: int) -> np.ndarray:
    """The windows of seq_len+1 tokens at stride seq_len a text run cuts from `tokens` (int32 [count, seq_len+1])."""
    count = window_count(len(tokens), seq_len)
    starts = np.arange(count)[:, None] * seq_len
    return tokens[starts + np.arange(seq_len + 1)].astype(np.int32)


def write_corpus(cfg: Config, out: str | Path) -> Written:
    """Tokenize cfg's text corpus as a run would and write its train and val windows under folder `out`."""
    if cfg.data.format != "text":
        raise DataError(f"prepare --to mindrecord reads a text corpus, and this config's data.format is "
                        f"{cfg.data.format}; pass data.format=text with the corpus to convert")
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    prep = prepare(cfg, folder)  # writes folder/tokenizer.json
    seq_len = cfg.model.seq_len
    train, val = windows(prep.train_tokens, seq_len), windows(prep.val_tokens, seq_len)
    write_rows(folder / TRAIN_FILE, train)
    write_rows(folder / VAL_FILE, val)
    return Written(folder, len(train), len(val), seq_len + 1, prep.tokenizer.vocab_size)
