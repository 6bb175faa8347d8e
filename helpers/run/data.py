"""Corpus → token batches: the text corpus tokenized once into a token file read in place (helpers/run/token_file.py),
or a MindRecord set streamed (helpers/run/mindrecord.py), split into train and validation, fed through MindSpore's
input pipeline.

Every user-facing problem raises `DataError` with one actionable line. MindSpore is imported only by
`train_dataset`, so preparing the data stays fast and usable without it.
"""
from __future__ import annotations

import re
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from helpers.config import Config
from helpers.run.corpus import CorpusBytes, DataError, corpus_files
from helpers.run import mindrecord
from helpers.run.token_file import TokenFile, TokenizerSpec, TokenSpan, token_file
from helpers.run.tokenizer import IdsTokenizer, Tokenizer


# ----------------------------------------------------------------------------------------------- split

@dataclass
class Prepared:
    """A corpus ready to train on: its tokenizer and, for text, the token file's train part (its first
    1 - val_fraction of tokens) and validation part (the rest), with the corpus bytes for on-the-fly tokenization; a
    MindRecord set has its rows in `records` instead."""

    tokenizer: Tokenizer
    train: TokenSpan | None
    val: TokenSpan | None
    corpus_bytes: int
    records: mindrecord.Records | None = None
    tokens: TokenFile | None = None
    corpus: CorpusBytes | None = None

    @property
    def train_tokens(self) -> np.ndarray:
        """The train token ids (a read-only memory map of the token file; empty for a MindRecord set)."""
        return self.train.tokens if self.train is not None else np.zeros(0, np.int32)

    @property
    def val_tokens(self) -> np.ndarray:
        """The validation token ids (a read-only memory map; empty for a MindRecord set)."""
        return self.val.tokens if self.val is not None else np.zeros(0, np.int32)


def prepare(cfg: Config, run_dir: Path | None = None) -> Prepared:
    """The corpus tokenized into its token file (from the cache when unchanged), split by position: the last
    val_fraction of its tokens validate (or a MindRecord set checked and opened, data.format=mindrecord). Writes the
    tokenizer as run_dir/tokenizer.json."""
    if cfg.data.format == "mindrecord":
        return _prepare_records(cfg, run_dir)
    files = corpus_files(cfg.data.corpus)
    tokens = token_file(files, TokenizerSpec(cfg.data.tokenizer, cfg.data.vocab_size, cfg.data.bpe_sample_mb))
    tokenizer = tokens.tokenizer
    _check_vocabulary(cfg, tokenizer)
    cut = int(tokens.tokens * (1.0 - cfg.data.val_fraction))
    _check_long_enough("train", cut, cfg)
    _check_long_enough("validation", tokens.tokens - cut, cfg)
    if run_dir is not None:
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        tokenizer.save(Path(run_dir) / "tokenizer.json")
    return Prepared(tokenizer, tokens.span(0, cut), tokens.span(cut, tokens.tokens), tokens.corpus_bytes,
                    tokens=tokens, corpus=CorpusBytes(files, tokenizer.separator.encode("utf-8")))


def _prepare_records(cfg: Config, run_dir: Path | None) -> Prepared:
    """A MindRecord set (`mindrecord.locate_set`): opened from its index and metadata, its validation rows read, its
    train rows streamed while the run steps. Ids only (no tokenizer.json beside it): model.vocab_size names their
    vocabulary."""
    found = mindrecord.locate_set(cfg.data.corpus[0])
    if found.tokenizer is not None:
        tokenizer = Tokenizer.load(found.tokenizer)
    elif cfg.model.vocab_size:
        tokenizer = IdsTokenizer(cfg.model.vocab_size)
    else:
        raise DataError(f"MindRecord {cfg.data.corpus[0]!r} comes without a tokenizer.json, so its vocabulary is "
                        f"unknown; set model.vocab_size to the vocabulary its ids were made with (e.g. "
                        f"model.vocab_size=32000)")
    _check_vocabulary(cfg, tokenizer)
    vocab = cfg.model.vocab_size or tokenizer.vocab_size
    records = mindrecord.open_records(found, cfg.model.seq_len, vocab, cfg.data.val_fraction,
                                      cfg.eval_batches * cfg.batch_size)
    if run_dir is not None:
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        tokenizer.save(Path(run_dir) / "tokenizer.json")
    return Prepared(tokenizer, None, None, found.size_bytes, records)


def _check_vocabulary(cfg: Config, tokenizer: Tokenizer) -> None:
    """A model whose vocabulary (model.vocab_size; 0 takes the tokenizer's) holds every id the tokenizer makes."""
    if cfg.model.vocab_size and tokenizer.vocab_size > cfg.model.vocab_size:
        raise DataError(f"the tokenizer ({tokenizer.kind}) has {tokenizer.vocab_size} tokens and the model's "
                        f"vocabulary model.vocab_size={cfg.model.vocab_size} is smaller; use the model's own "
                        f"tokenizer or set model.vocab_size={tokenizer.vocab_size} (0 takes the tokenizer's)")


def _check_long_enough(part: str, n_tokens: int, cfg: Config) -> None:
    seq_len = cfg.model.seq_len
    if n_tokens < seq_len + 1:
        raise DataError(f"the {part} part of the corpus has {n_tokens} tokens, fewer than model.seq_len+1 = "
                        f"{seq_len + 1} (data.val_fraction={cfg.data.val_fraction}); use a longer corpus "
                        f"or a smaller model.seq_len")


def window_count(n_tokens: int, seq_len: int) -> int:
    """Windows of seq_len+1 tokens at stride seq_len that fit in n_tokens tokens."""
    return max(0, (n_tokens - 1) // seq_len)


# -------------------------------------------------------------------------------------------- pipeline

class DataGate:
    """Lets a run's input pipeline work only while its arm steps, when two arms take turns on one machine.

    In a run of its own the pipeline works while the steps run (and fills its prefetch queue ahead of them). When a
    round's two arms take turns (helpers/run/pair.py, helpers/run/arm.py), the arm that waits would otherwise go on
    reading and mapping samples during the other arm's steps and meet no data wait of its own when its turn comes:
    the round would hide exactly the stalls a run of it pays. So the source and the map ops wait while the gate is
    closed, and the simulated storage latency (`data.source_delay_ms`) counts only time while it is open. Work
    already in flight when it closes (one sample per worker) finishes. Map workers in processes
    (data.python_multiprocessing) get an always-open copy: the gated source still paces them.
    """

    def __init__(self, is_open: bool = False):
        self._cond = threading.Condition()
        self._open = is_open
        self._opened_at = time.monotonic()
        self._open_s = 0.0

    def __reduce__(self):  # a copy in another process cannot see this one's state: it never blocks
        return _AlwaysOpen, ()

    @property
    def is_open(self) -> bool:
        """Whether the pipeline may work now."""
        return self._open

    def open(self) -> None:
        with self._cond:
            if not self._open:
                self._open, self._opened_at = True, time.monotonic()
                self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            if self._open:
                self._open_s += time.monotonic() - self._opened_at
                self._open = False

    @contextmanager
    def held(self) -> Iterator[None]:
        """The pipeline held for the with-block, then open again if it was: work of the arm's step loop that no
        step waits on (a validation pass, a checkpoint). Left open, the pipeline read ahead meanwhile, and the
        workbook's short runs, validating every few steps, banked batches that hid their stalls from the steps
        measured after them (a slow-storage round read ×3.4 against ×4.2 in long runs of its own)."""
        was = self._open
        self.close()
        try:
            yield
        finally:
            if was:
                self.open()

    def open_seconds(self) -> float:
        """Seconds the gate has been open in all (s)."""
        with self._cond:
            return self._open_s + (time.monotonic() - self._opened_at if self._open else 0.0)

    def wait(self) -> None:
        """Return once the gate is open."""
        with self._cond:
            self._cond.wait_for(lambda: self._open)

    def sleep(self, seconds: float) -> None:
        """Sleep until the gate has been open for `seconds` more (s) — storage that serves only a running arm."""
        until = self.open_seconds() + seconds
        while True:
            self.wait()
            left = until - self.open_seconds()
            if left <= 0:
                return
            with self._cond:
                self._cond.wait(timeout=left)  # a close in between: the loop waits for the next open


class _AlwaysOpen(DataGate):
    """The gate of a run of its own (and of map workers in other processes): open, and it stays open."""

    def __init__(self):
        super().__init__(is_open=True)

    def close(self) -> None:
        pass


OPEN_GATE = _AlwaysOpen()


class _IndexSource:
    """Random-access source: sample k is window k % count, for as many samples as the run needs.

    Sleeps per sample to simulate slow storage (open-gate time only, see DataGate).
    """

    def __init__(self, count: int, samples: int, delay_s: float, gate: DataGate):
        self.count = count
        self.samples = samples
        self.delay_s = delay_s
        self.gate = gate

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, k: int):
        if self.delay_s:
            self.gate.sleep(self.delay_s)
        self.gate.wait()
        return (np.array(k % self.count, dtype=np.int64),)


class _SliceWindow:
    """Map op for tokenize=ahead: window index → (x, y) cut from the train part of the token file."""

    def __init__(self, train: TokenSpan, seq_len: int, gate: DataGate):
        self.train = train
        self.seq_len = seq_len
        self.gate = gate

    def __call__(self, index):
        self.gate.wait()
        start = int(index) * self.seq_len
        window = self.train.tokens[start:start + self.seq_len + 1].astype(np.int32)
        return window[:-1], window[1:]


class _TokenizeWindow:
    """Map op for tokenize=on_the_fly: window index → (x, y) by encoding a span of the corpus bytes where the token
    file says that window's tokens came from (exactly there at each chunk start, interpolated within)."""

    def __init__(self, corpus: CorpusBytes, tokens: TokenFile, n_train: int, tokenizer: Tokenizer, seq_len: int,
                 gate: DataGate):
        self.corpus = corpus
        self.tokens = tokens
        self.tokenizer = tokenizer
        self.seq_len = seq_len
        self.gate = gate
        self.end = tokens.byte_of(n_train)  # the train part's bytes end where its last token's do
        # A first guess at the bytes that hold seq_len+1 tokens, with slack for denser passages.
        self.span = int((seq_len + 1) * tokens.corpus_bytes / max(1, tokens.tokens) * 1.25) + 16

    def __call__(self, index):
        self.gate.wait()
        start = self.tokens.byte_of(int(index) * self.seq_len)
        need, span = self.seq_len + 1, self.span
        while True:  # ends: the train part has >= seq_len+1 tokens (prepare checked)
            text = self.corpus.read(start, min(start + span, self.end)).decode("utf-8", errors="ignore")
            ids = self.tokenizer.encode(text)
            if len(ids) >= need:
                window = ids[:need]
                return window[:-1], window[1:]
            if start + span >= self.end:
                start = max(0, start - span)  # too close to the end: move the window back
            span *= 2


class _RowWindow:
    """Map op for a MindRecord row: (input_ids[, labels]) of seq_len+1 tokens → (x, y) = (ids[:-1], targets[1:]).
    MindDataset reads ahead while a DataGate is closed; this op is where the pipeline waits."""

    def __init__(self, gate: DataGate):
        self.gate = gate

    def __call__(self, ids, labels=None):
        self.gate.wait()
        return ids[:-1], (ids if labels is None else labels)[1:]


class _RankRows:
    """Batch map op for data parallel: keep rank r's contiguous rows [r*b, (r+1)*b) of the global batch."""

    def __init__(self, rank: int, rows: int):
        self.start, self.stop = rank * rows, (rank + 1) * rows

    def __call__(self, x, y):
        return x[self.start:self.stop], y[self.start:self.stop]


def train_dataset(cfg: Config, prep: Prepared, skip_batches: int = 0, rank: int | None = None,
                  gate: DataGate = OPEN_GATE, extra_batches: int = 0):
    """MindSpore dataset of (x, y) int32 [batch_size, seq_len] batches, y = x shifted by one token.

    rank: data parallel; every rank draws the same global batches and keeps its contiguous
    cfg.micro_batch_per_device rows, so the ranks' shards of a step together are exactly the single-process batch.
    gate: the pipeline works only while it is open (an arm of a round that takes turns, see DataGate).
    extra_batches: batches past the run's own, from the same pipeline (a round's measurement-only steps, so
    they meet the pipeline's steady state, not a second pipeline filling up beside the first). A run whose shuffle
    buffer holds all of its own samples then draws them in another order than a run without them.

    Yields cfg.steps * cfg.grad_accum_steps batches minus `skip_batches` (already consumed ones, on
    resume), cycling through the windows as many epochs as needed. Sets MindSpore's global dataset seed
    and prefetch size; the seed is read when iteration starts, so do not change it in between
    (ms.set_seed changes it too).
    """
    import mindspore.dataset as ds  # here, not at the top: importing MindSpore takes seconds

    data, batch = cfg.data, cfg.batch_size
    total = cfg.steps * cfg.grad_accum_steps + extra_batches
    if not 0 <= skip_batches < total:
        raise DataError(f"skip_batches={skip_batches} leaves no batches of the {total} this run needs "
                        f"(steps * grad_accum_steps); raise steps to train further")
    ds.config.set_seed(cfg.seed)
    ds.config.set_prefetch_size(data.prefetch)
    # MindSpore's own tuner: it changes workers and prefetch of this pipeline while it runs (global, so set
    # either way: a previous pipeline in this process must not leave it on)
    ds.config.set_enable_autotune(data.autotune)
    if prep.records is not None:  # rows in file order, then the same shuffle, map and batch as text windows
        source, columns = mindrecord.source(prep.records, total * batch, data.num_parallel_workers)
        window = _RowWindow(gate)
    else:
        source, columns, window = _window_source(cfg, prep, total * batch, gate)

    def to_xy(pipe):
        return pipe.map(operations=window, input_columns=columns, output_columns=["x", "y"],
                        num_parallel_workers=data.num_parallel_workers,
                        python_multiprocessing=data.python_multiprocessing)

    def shuffle(pipe):  # MindSpore refuses buffer_size 1, which means "no shuffle" anyway
        return pipe.shuffle(data.shuffle_buffer) if data.shuffle_buffer > 1 else pipe

    pipe = to_xy(shuffle(source)) if data.order == "shuffle_first" else shuffle(to_xy(source))
    pipe = pipe.batch(batch, drop_remainder=True)
    if rank is not None:
        pipe = pipe.map(operations=_RankRows(rank, cfg.micro_batch_per_device), input_columns=["x", "y"],
                        output_columns=["x", "y"])
    return pipe.skip(skip_batches) if skip_batches else pipe


def pipeline_error(exc: BaseException) -> Exception | None:
    """The DataError or MindRecordError a map op or source raised while the pipeline ran, read back from the
    RuntimeError MindSpore wraps it in (whose first line only says that a Python function in the dataset failed);
    None when `exc` is another error."""
    for kind in (DataError, mindrecord.MindRecordError):
        found = re.findall(rf"^{re.escape(kind.__module__)}\.{kind.__name__}: (.+)$", str(exc), re.MULTILINE)
        if found:
            return kind(found[-1])
    return None


def _window_source(cfg: Config, prep: Prepared, samples: int, gate: DataGate):
    """(source, its columns, map op) of a tokenized text: window indices, cut from the tokens or tokenized from the
    text by the map op."""
    import mindspore.dataset as ds
    data, seq_len = cfg.data, cfg.model.seq_len
    count = window_count(len(prep.train), seq_len)
    # Epochs are laid end to end in the source rather than by .repeat + .take: take() makes MindSpore
    # drain (read, map) the rest of the epoch before the iterator ends.
    # shuffle=False: GeneratorDataset shuffles random-access sources by default, which would bypass `order`.
    # Reads use the map's worker count (threads: they only sleep), so workers can hide slow storage.
    source = ds.GeneratorDataset(_IndexSource(count, samples, data.source_delay_ms / 1000.0, gate),
                                 column_names=["index"], shuffle=False,
                                 num_parallel_workers=data.num_parallel_workers, python_multiprocessing=False)
    if data.tokenize == "on_the_fly":
        return source, ["index"], _TokenizeWindow(prep.corpus, prep.tokens, len(prep.train), prep.tokenizer,
                                                  seq_len, gate)
    return source, ["index"], _SliceWindow(prep.train, seq_len, gate)


def val_batches(cfg: Config, prep: Prepared) -> list[tuple[np.ndarray, np.ndarray]]:
    """cfg.eval_batches fixed (x, y) int32 [batch_size, seq_len] batches spread evenly over the val windows (of the
    val tokens at stride seq_len, or a MindRecord set's validation rows)."""
    seq_len, batch = cfg.model.seq_len, cfg.batch_size
    n = cfg.eval_batches * batch
    if prep.records is not None:
        inputs, targets = prep.records.val_windows(n)
    else:
        count = window_count(len(prep.val_tokens), seq_len)
        picks = np.arange(n) * count // n if n <= count else np.arange(n) % count
        inputs = targets = np.stack([prep.val_tokens[s:s + seq_len + 1] for s in picks * seq_len]).astype(np.int32)
    shape = (cfg.eval_batches, batch, seq_len + 1)
    return [(np.ascontiguousarray(i[:, :-1]), np.ascontiguousarray(t[:, 1:]))
            for i, t in zip(inputs.reshape(shape), targets.reshape(shape))]
