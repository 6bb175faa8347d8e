"""A corpus tokenized once into a token file on disk that training reads in place (a memory map), the way nanoGPT's
`.bin` files and Megatron's indexed datasets work: memory and the time to the first step do not grow with the
corpus.

The file lives in <data cache>/tokens/<key>.bin with <key>.json beside it (dtype, token count, tokenizer, a chunk
index of byte and token offsets). The key is the corpus's fingerprint (path, size, mtime and sampled bytes: no
full read every run) and the tokenizer's settings, so a changed corpus is tokenized again. The .bin is written to a
temp name and renamed, the .json last: a killed tokenization leaves no entry, only a temp file the next build
removes; an entry whose sizes disagree is rebuilt.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import multiprocessing
import os
import sys
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from helpers.paths import CACHE_ENV
from helpers.record import RecordError, atomic_write_json, disk_full, free_bytes
from helpers.run.corpus import CorpusBytes, DataError, default_cache_dir, fingerprint
from helpers.run.tokenizer import BpeTokenizer, ByteTokenizer, CharTokenizer, Tokenizer, hf_file, load_hf

FORMAT = 1
CHUNK_BYTES = 4 << 20   # a chunk of the corpus read, checked, encoded and appended at a time
# Pieces of a chunk a Rust tokenizer encodes in parallel, each behind the character before it (exact at any size):
# a byte-level BPE of 1,024 tokens encoded 4.6 MB of text at 2.6 MB/s in 64 KB pieces, 4.5 in 16 KB, 5.9 in 4 KB
# and 1 KB (2-core Xeon VM, 2026-12-07, three passes each, interleaved).
PIECE_BYTES = 4 << 10
BAR_FROM_BYTES = 16 << 20  # smaller corpora tokenize in about a second: no progress bar
BPE_BLOCKS = 64  # a BPE sample is this many blocks spread over the corpus


@dataclass(frozen=True)
class TokenizerSpec:
    """What a token file's tokenizer is made from: data.tokenizer (char, byte, bpe or a tokenizer.json path),
    data.vocab_size (bpe) and data.bpe_sample_mb (MB of the corpus a BPE learns from)."""
    setting: str
    vocab_size: int = 512
    bpe_sample_mb: float = 8.0


@dataclass
class TokenSpan:
    """Tokens [start, stop) of a token file, memory-mapped on first use in each process (a copy sent to a map
    worker process carries the path, not the tokens)."""
    path: Path
    dtype: str
    start: int
    stop: int
    _map: np.ndarray | None = field(default=None, repr=False)

    def __getstate__(self):
        return {**self.__dict__, "_map": None}

    def __len__(self) -> int:
        return self.stop - self.start

    @property
    def tokens(self) -> np.ndarray:
        """The span's token ids (a read-only memory map)."""
        if self._map is None:
            whole = np.memmap(self.path, dtype=self.dtype, mode="r") if self.stop > 0 else np.zeros(0, self.dtype)
            self._map = whole[self.start:self.stop]
        return self._map


@dataclass
class TokenFile:
    """A tokenized corpus on disk: `tokens` ids of `dtype` in `path`, the tokenizer that made them, the corpus's
    size (bytes) and the chunk index (byte offset and token offset where each chunk starts)."""
    path: Path
    dtype: str
    tokens: int
    tokenizer: Tokenizer
    corpus_bytes: int
    chunk_bytes: np.ndarray
    chunk_tokens: np.ndarray
    note: str = ""

    def span(self, start: int, stop: int) -> TokenSpan:
        """Tokens [start, stop)."""
        return TokenSpan(self.path, self.dtype, start, stop)

    def byte_of(self, token: int) -> int:
        """The corpus byte offset where token `token` about starts (exact at chunk starts, interpolated within)."""
        k = max(0, int(np.searchsorted(self.chunk_tokens, token, side="right")) - 1)
        t0, b0 = int(self.chunk_tokens[k]), int(self.chunk_bytes[k])
        t1 = int(self.chunk_tokens[k + 1]) if k + 1 < len(self.chunk_tokens) else self.tokens
        b1 = int(self.chunk_bytes[k + 1]) if k + 1 < len(self.chunk_bytes) else self.corpus_bytes
        return b0 + (token - t0) * (b1 - b0) // max(1, t1 - t0)


def token_file(files: list[Path], spec: TokenizerSpec, cache_dir: Path | None = None) -> TokenFile:
    """The token file of `files` under `spec`: from the cache when it is there and whole, else tokenized now
    (streaming, one chunk in memory at a time, a progress bar for large corpora). One process builds a given
    entry at a time; the others wait for it and read it."""
    folder = (Path(cache_dir) if cache_dir is not None else default_cache_dir()) / "tokens"
    hf_path = hf_file(spec.setting)
    sources = [fingerprint(f) for f in files]
    key = _key(sources, spec, hf_path)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        lock = open(folder / f"{key}.lock", "a")
    except OSError as exc:
        raise DataError(f"cannot write the token cache {str(folder)!r} ({exc.strerror}); set {CACHE_ENV} to a "
                        f"writable folder") from None
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        found, damage = _cached(folder, key)
        if found is not None:
            return found
        if damage:
            print(f"note: the token cache entry {key} is damaged ({damage}); tokenizing again", file=sys.stderr)
        _remove_stale_parts(folder, key)
        _prune(folder, key)
        return _build(folder, key, files, sources, spec, hf_path)


def _key(sources: list[dict], spec: TokenizerSpec, hf_path: Path | None) -> str:
    import tokenizers
    kind = spec.setting if hf_path is None else "hf"
    parts = {"format": FORMAT, "files": sources, "tokenizer": kind}
    if kind == "bpe":
        parts.update(vocab_size=spec.vocab_size, sample_mb=spec.bpe_sample_mb, tokenizers=tokenizers.__version__)
    if hf_path is not None:
        parts.update(hf_sha256=hashlib.sha256(hf_path.read_bytes()).hexdigest(), tokenizers=tokenizers.__version__)
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:24]


def _cached(folder: Path, key: str) -> tuple[TokenFile | None, str]:
    """(the entry, '') when it is whole; (None, what is wrong) when it is damaged; (None, '') when absent."""
    meta_path, bin_path = folder / f"{key}.json", folder / f"{key}.bin"
    if not meta_path.is_file():
        return None, ""
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        size = bin_path.stat().st_size
        expected = meta["tokens"] * np.dtype(meta["dtype"]).itemsize
        if meta["format"] != FORMAT or size != expected:
            return None, f"{bin_path.name} holds {size} bytes, its index says {expected}"
        tokenizer = Tokenizer.from_state(meta["tokenizer"])
        return TokenFile(bin_path, meta["dtype"], meta["tokens"], tokenizer, meta["corpus_bytes"],
                         np.asarray(meta["chunk_bytes"], np.int64), np.asarray(meta["chunk_tokens"], np.int64),
                         meta.get("note", "")), ""
    except (OSError, ValueError, KeyError, TypeError, DataError) as exc:
        return None, (str(exc).splitlines() or [type(exc).__name__])[0][:120]


def _remove_stale_parts(folder: Path, key: str) -> None:
    """Temp files of builds of this entry that were killed (the lock is ours, so no build of it is running)."""
    for part in folder.glob(f".{key}.bin.*.tmp"):
        part.unlink(missing_ok=True)


def _prune(folder: Path, keep: str) -> None:
    """Remove the entries whose corpus files are gone or changed since (they can never be read again)."""
    seen: dict[str, dict | None] = {}

    def now(path: str) -> dict | None:
        if path not in seen:
            seen[path] = fingerprint(Path(path)) if Path(path).is_file() else None
        return seen[path]
    for meta_path in folder.glob("*.json"):
        key = meta_path.stem
        if key == keep:
            continue
        try:
            sources = json.loads(meta_path.read_text(encoding="utf-8"))["sources"]
            stale = any(now(f["path"]) != f for f in sources)
        except (OSError, ValueError, KeyError, TypeError):
            continue  # another process's entry half-read, or another format: leave it
        if stale:
            for suffix in (".json", ".bin", ".lock"):
                (folder / f"{key}{suffix}").unlink(missing_ok=True)


def _build(folder: Path, key: str, files: list[Path], sources: list[dict], spec: TokenizerSpec,
           hf_path: Path | None) -> TokenFile:
    hf = load_hf(hf_path) if hf_path is not None else None
    corpus = CorpusBytes(files, (hf.separator if hf is not None else "\n").encode("utf-8"))
    tokenizer, note = hf, ""
    if hf is None:
        tokenizer, note = _fit(spec, corpus)
    elif hf.separator == "\n":
        note = f"{hf_path} names no end-of-text token; documents are separated by a newline"
    dtype = "uint16" if tokenizer.vocab_size <= 1 << 16 else "uint32"
    need = len(corpus) * np.dtype(dtype).itemsize  # at most one token per byte
    free = free_bytes(folder)
    if free < need:
        raise DataError(_no_room(folder, need, free))
    part = folder / f".{key}.bin.{os.getpid()}.tmp"
    try:
        tokens, index = _write_tokens(part, corpus, tokenizer, dtype)
        os.replace(part, folder / f"{key}.bin")
    except OSError as exc:
        part.unlink(missing_ok=True)
        if disk_full(exc):
            raise DataError(_no_room(folder, need, free_bytes(folder))) from None
        raise DataError(f"cannot write the token cache {str(folder)!r} ({exc.strerror}); set {CACHE_ENV} to a "
                        f"writable folder") from None
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    chunk_bytes, chunk_tokens = (np.asarray(c, np.int64) for c in zip(*index)) if index else ([], [])
    meta = {"format": FORMAT, "dtype": dtype, "tokens": tokens, "corpus_bytes": len(corpus),
            "sources": sources, "tokenizer": tokenizer.state(), "note": note,
            "chunk_bytes": [int(b) for b in chunk_bytes], "chunk_tokens": [int(t) for t in chunk_tokens]}
    try:
        atomic_write_json(folder / f"{key}.json", meta)
    except RecordError as exc:
        (folder / f"{key}.bin").unlink(missing_ok=True)
        raise DataError(f"{exc}; or set {CACHE_ENV} to a folder with room") from None
    return TokenFile(folder / f"{key}.bin", dtype, tokens, tokenizer, len(corpus), np.asarray(chunk_bytes, np.int64),
                     np.asarray(chunk_tokens, np.int64), note)


def _no_room(folder: Path, need: int, free: int) -> str:
    return (f"the token cache {str(folder)!r} has {free / 1e6:,.0f} MB free and the token file needs up to "
            f"{need / 1e6:,.0f} MB; free disk space or set {CACHE_ENV} to a folder with room")


def _fit(spec: TokenizerSpec, corpus: CorpusBytes) -> tuple[Tokenizer, str]:
    """A built-in tokenizer for the corpus, and a note of what it learned from: char reads every character (one
    streaming pass), bpe a bounded sample."""
    if spec.setting == "byte":
        return ByteTokenizer(), ""
    if spec.setting == "char":
        codes = set()
        for _, _, text in _texts(corpus, "scanning characters"):
            codes.update(np.unique(np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)).tolist())
        return CharTokenizer.of_codes(np.fromiter(codes, np.uint32, len(codes))), ""
    if spec.vocab_size < 256:
        raise DataError(f"bpe vocab_size={spec.vocab_size} is below the 256-byte alphabet; use data.vocab_size >= 260")
    sample = bpe_sample(corpus, int(spec.bpe_sample_mb * 1e6))
    taken = sum(len(t.encode("utf-8")) for t in sample)
    note = (f"bpe learned its {spec.vocab_size} tokens from {taken / 1e6:.1f} MB of the {len(corpus) / 1e6:,.1f} MB "
            f"corpus" + (f" ({len(sample)} blocks spread over it; data.bpe_sample_mb sets how much)"
                         if taken < len(corpus) else " (all of it)"))
    print(f"note: {note}", file=sys.stderr)
    return BpeTokenizer.train(sample, spec.vocab_size), note


def bpe_sample(corpus: CorpusBytes, limit: int) -> list[str]:
    """Texts of about `limit` bytes in all for a BPE to learn from: the whole corpus when it is smaller, else
    `BPE_BLOCKS` blocks spread evenly over it, each cut at line breaks."""
    if len(corpus) <= limit:
        return [corpus.read(0, len(corpus)).decode("utf-8", errors="ignore")]
    block = max(1, limit // BPE_BLOCKS)
    texts = []
    for k in range(BPE_BLOCKS):
        start = corpus.cut_after(k * len(corpus) // BPE_BLOCKS, k * len(corpus) // BPE_BLOCKS + block)
        texts.append(corpus.read(start, start + block).decode("utf-8", errors="ignore"))
    return texts


def _texts(corpus: CorpusBytes, what: str):
    """(byte offset, the character before it, text) of the corpus in chunks of about CHUNK_BYTES cut at line breaks,
    checked as UTF-8 text; a progress bar (MB, MB/s, ETA) on stderr for large corpora."""
    from tqdm import tqdm
    size = len(corpus)
    with tqdm(total=size, unit="B", unit_scale=True, unit_divisor=1000, desc=what, file=sys.stderr,
              disable=size < BAR_FROM_BYTES, mininterval=1.0) as bar:
        at, before = 0, ""
        while at < size:
            end = size if at + CHUNK_BYTES >= size else corpus.cut_after(at + CHUNK_BYTES,
                                                                                 at + 2 * CHUNK_BYTES)
            data = corpus.read(at, end)
            if end < size:  # no line break in reach: cut between characters, not inside one
                data = data[:_whole_characters(data)]
                end = at + len(data)
            text = _checked_text(corpus, at, data)
            yield at, before, text
            before = text[-1:]
            bar.update(end - at)
            at = end


def _whole_characters(data: bytes) -> int:
    """The length of `data` without a UTF-8 character cut off at its end."""
    k = len(data) - 1
    while k >= max(0, len(data) - 4) and (data[k] & 0xC0) == 0x80:
        k -= 1
    if k < 0:
        return len(data)
    lead = data[k]
    width = 1 if lead < 0x80 else 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4
    return len(data) if len(data) - k >= width else k


def _checked_text(corpus: CorpusBytes, at: int, data: bytes) -> str:
    nul = data.find(b"\0")
    if nul >= 0:
        path, offset = corpus.where(at + nul)
        raise DataError(f"corpus file {str(path)!r} contains NUL bytes (a binary file?) at byte {offset}; pass a "
                        f"UTF-8 text file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        path, offset = corpus.where(at + exc.start)
        raise DataError(f"corpus file {str(path)!r} is not UTF-8 (bad byte at offset {offset}); "
                        f"convert it, e.g. iconv -f LATIN1 -t UTF-8") from None


def _write_tokens(part: Path, corpus: CorpusBytes, tokenizer: Tokenizer, dtype: str) -> tuple[int, list]:
    """Encode the corpus chunk by chunk into `part`; (tokens written, [(byte offset, token offset)] per chunk).
    A large corpus is encoded by one worker process per core, at most two chunks each in flight."""
    tokens, index = 0, []
    started = time.perf_counter()
    with open(part, "wb") as fh, _encoder(tokenizer, len(corpus)) as encode:
        for at, ids in encode(_texts(corpus, f"tokenizing ({tokenizer.kind})")):
            index.append((at, tokens))
            fh.write(ids.astype(dtype).tobytes())
            tokens += len(ids)
        fh.flush()
        os.fsync(fh.fileno())
    seconds = time.perf_counter() - started
    if len(corpus) >= BAR_FROM_BYTES:
        print(f"note: tokenized {len(corpus) / 1e6:,.1f} MB into {tokens:,} tokens in {seconds:.1f} s "
              f"({len(corpus) / 1e6 / max(seconds, 1e-9):.1f} MB/s)", file=sys.stderr)
    return tokens, index


@contextmanager
def _encoder(tokenizer: Tokenizer, size: int):
    """A function from (offset, text) chunks to (offset, ids) chunks, in order: in this process for a small corpus or
    a Hugging Face tokenizer (its Rust code uses every core already), else in worker processes (spawned: the
    caller may have threads, such as MindSpore's, that a fork would copy mid-work)."""
    workers = os.cpu_count() or 1
    if size < BAR_FROM_BYTES or tokenizer.kind in ("byte", "hf") or workers < 2:
        yield lambda chunks: ((at, _encode_text(tokenizer, text, before)) for at, before, text in chunks)
        return
    with multiprocessing.get_context("spawn").Pool(workers, _start_worker, (tokenizer.state(),)) as pool:
        def in_workers(chunks):
            pending = deque()
            for at, before, text in chunks:
                pending.append((at, pool.apply_async(_encode_in_worker, (text, before))))
                if len(pending) > 2 * workers:
                    at0, ids = pending.popleft()
                    yield at0, ids.get()
            while pending:
                at0, ids = pending.popleft()
                yield at0, ids.get()
        yield in_workers


_WORKER_TOKENIZER: Tokenizer | None = None


def _start_worker(state: dict) -> None:
    global _WORKER_TOKENIZER
    _WORKER_TOKENIZER = Tokenizer.from_state(state)


def _encode_in_worker(text: str, before: str) -> np.ndarray:
    return _encode_text(_WORKER_TOKENIZER, text, before)


def _encode_text(tokenizer: Tokenizer, text: str, before: str = "") -> np.ndarray:
    """The ids of `text`, a chunk of the corpus just after the character `before` ('' at its start): a Rust
    tokenizer's in pieces encoded in parallel, each behind the character before it (`Tokenizer.encode_after`)."""
    if tokenizer.kind in ("bpe", "hf"):
        pieces = _pieces(text)
        ids = tokenizer.encode_after(pieces, [before] + [p[-1] for p in pieces[:-1]])
        return np.concatenate(ids) if ids else np.zeros(0, np.int32)
    return tokenizer.encode(text)


def _pieces(text: str) -> list[str]:
    """`text` cut into pieces of about PIECE_BYTES at single line breaks between two non-space characters (where a
    pre-tokenizer splits anyway), for a Rust tokenizer to encode in parallel."""
    pieces, at = [], 0
    while at < len(text):
        cut = text.find("\n", at + PIECE_BYTES)
        while 0 < cut < len(text) - 1 and (text[cut - 1].isspace() or text[cut + 1].isspace()):
            cut = text.find("\n", cut + 1)
        end = len(text) if cut < 0 or cut >= len(text) - 1 else cut + 1
        pieces.append(text[at:end])
        at = end
    return pieces
