"""Text ↔ token ids: char (the corpus's characters), byte (256), bpe (byte-level BPE trained here on a bounded sample
of the corpus) and hf (the user's Hugging Face `tokenizer.json`, such as the one beside `init_from` weights).

A tokenizer is saved as the run's tokenizer.json; `Tokenizer.load` reads it back. Problems raise `DataError` in one
line.
"""
from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import numpy as np

from helpers.config import BUILT_IN_TOKENIZERS as BUILT_IN
from helpers.record import atomic_write_text
from helpers.run.corpus import DataError

HF_FILE = "tokenizer.json"
# End-of-text tokens by the names the common tokenizers give them, for a tokenizer.json without a
# tokenizer_config.json beside it that names its eos_token.
_EOT_NAMES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<|im_end|>", "<eos>", "<|eot_id|>")


class Tokenizer:
    """Text ↔ int32 token ids. `kind` is 'char', 'byte', 'bpe', 'hf' or 'ids'; ids are in [0, vocab_size).
    `separator` is the text put between two documents (corpus files): a newline, or a Hugging Face tokenizer's
    end-of-text token."""

    kind: str
    vocab_size: int
    separator: str = "\n"

    def encode(self, text: str) -> np.ndarray:
        """Token ids (int32, one per token) of `text`."""
        raise NotImplementedError

    def encode_many(self, texts: list[str]) -> list[np.ndarray]:
        """Token ids of each text (int32); Rust-backed tokenizers encode them in parallel on every core."""
        return [self.encode(t) for t in texts]

    def encode_after(self, texts: list[str], before: list[str]) -> list[np.ndarray]:
        """Token ids of each text as it tokenizes inside the corpus, just after the text `before` it (pieces of a
        corpus cut at line breaks or word starts). For these tokenizers a piece tokenizes alone as it does there."""
        return self.encode_many(texts)

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

    def state(self) -> dict:
        """Everything `from_state` needs to rebuild this tokenizer (JSON-safe)."""
        return {"kind": self.kind, "vocab_size": self.vocab_size, **self._state()}

    def save(self, path: Path) -> None:
        """Write the tokenizer as one JSON file."""
        atomic_write_text(Path(path), json.dumps(self.state(), ensure_ascii=False))

    @staticmethod
    def from_state(state: dict) -> Tokenizer:
        """The tokenizer `state()` described."""
        return _KINDS[state["kind"]]._from_state(state)

    @classmethod
    def load(cls, path: Path) -> Tokenizer:
        """Read a tokenizer written by `save`."""
        try:
            return Tokenizer.from_state(json.loads(Path(path).read_text(encoding="utf-8")))
        except FileNotFoundError:
            raise DataError(f"tokenizer file {str(path)!r} does not exist; pass the tokenizer.json "
                            f"of a run directory") from None
        except (ValueError, KeyError, TypeError, AttributeError):
            raise DataError(f"tokenizer file {str(path)!r} is not a tokenizer saved by the workbook; "
                            f"pass the tokenizer.json of a run directory") from None


class CharTokenizer(Tokenizer):
    kind = "char"

    def __init__(self, chars: str):
        self.chars = chars
        self.vocab_size = len(chars)
        # chars are sorted by code point, so a binary search of a code point gives its id.
        self._codes = np.frombuffer(chars.encode("utf-32-le"), dtype=np.uint32)

    @classmethod
    def of_codes(cls, codes: np.ndarray) -> CharTokenizer:
        """The tokenizer of a set of code points (uint32, any order, repeats allowed)."""
        unique = np.unique(np.asarray(codes, dtype=np.uint32))
        if not unique.size:
            raise DataError("cannot build a char tokenizer from empty text; pass a non-empty corpus")
        return cls(unique.astype("<u4").tobytes().decode("utf-32-le"))

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
    def _from_state(cls, state: dict) -> CharTokenizer:
        return cls(state["chars"])


class ByteTokenizer(Tokenizer):
    kind = "byte"
    vocab_size = 256

    def encode(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int32)

    def decode(self, ids) -> str:
        # Sampled ids can cut a multi-byte character: show U+FFFD rather than fail.
        return self._check_ids(ids).astype(np.uint8).tobytes().decode("utf-8", errors="replace")

    @classmethod
    def _from_state(cls, state: dict) -> ByteTokenizer:
        return cls()


class _RustTokenizer(Tokenizer):
    """A `tokenizers.Tokenizer` (Rust): encodes without its special-token template (no BOS at each chunk)."""

    def __init__(self, hf, separator: str = "\n"):
        self._hf = hf
        self.separator = separator
        self.vocab_size = max(hf.get_vocab(with_added_tokens=True).values()) + 1

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self._hf.encode(text, add_special_tokens=False).ids, dtype=np.int32)

    def encode_many(self, texts: list[str]) -> list[np.ndarray]:
        return [np.asarray(e.ids, dtype=np.int32) for e in self._hf.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids) -> str:
        return self._hf.decode(self._check_ids(ids).tolist(), skip_special_tokens=False)

    def _state(self) -> dict:
        return {"hf": json.loads(self._hf.to_str()), "separator": self.separator}

    @classmethod
    def _from_state(cls, state: dict):
        from tokenizers import Tokenizer as HfTokenizer
        return cls(HfTokenizer.from_str(json.dumps(state["hf"])), state.get("separator", "\n"))


class BpeTokenizer(_RustTokenizer):
    """Byte-level BPE trained here: every string (Chinese included) encodes without unknown tokens and decodes
    exactly. Its pre-tokenizer is `WORDS`, a pattern of ASCII classes that Python's `re` and the Rust tokenizer read
    alike, so text is split into words here and each distinct word is encoded once (`_WordCache`): about twice
    the Rust tokenizer's own speed on one core, with the same ids. A BPE saved before it had `WORDS` (no
    "words" in its state) encodes through the Rust tokenizer alone."""
    kind = "bpe"

    def __init__(self, hf, separator: str = "\n", words: str | None = None):
        super().__init__(hf, separator)
        self.words = words
        self._cache = _WordCache(hf, words) if words == WORDS else None

    def __getstate__(self):
        return {**self.__dict__, "_cache": None}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._cache = _WordCache(self._hf, self.words) if self.words == WORDS else None

    @classmethod
    def train(cls, texts: list[str], vocab_size: int) -> BpeTokenizer:
        """A BPE of at most `vocab_size` tokens learned from `texts` (a bounded sample of the corpus)."""
        from tokenizers import Regex, Tokenizer as RustTokenizer, decoders, models, pre_tokenizers, trainers
        hf = RustTokenizer(models.BPE())
        hf.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(WORDS), "isolated"),
                                                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        hf.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False, special_tokens=[],
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        hf.train_from_iterator(texts, trainer=trainer)
        return cls(hf, words=WORDS)

    def encode(self, text: str) -> np.ndarray:
        return self._cache.encode(text) if self._cache is not None else super().encode(text)

    def encode_many(self, texts: list[str]) -> list[np.ndarray]:
        return [self._cache.encode(t) for t in texts] if self._cache is not None else super().encode_many(texts)

    def _state(self) -> dict:
        return {**super()._state(), "words": self.words}

    @classmethod
    def _from_state(cls, state: dict) -> BpeTokenizer:
        from tokenizers import Tokenizer as RustTokenizer
        return cls(RustTokenizer.from_str(json.dumps(state["hf"])), state.get("separator", "\n"), state.get("words"))


# GPT-2's split (letters, digits, other symbols, each with one leading space; runs of space) in ASCII classes only:
# non-ASCII letters group with the symbols, and both regex engines agree on every character.
_S = r"[ \t\n\r\f\v]"
WORDS = rf" ?[A-Za-z]+| ?[0-9]+| ?[^ \t\n\r\f\vA-Za-z0-9]+|{_S}+(?![^ \t\n\r\f\v])|{_S}+"


class _WordCache:
    """Encodes text as the concatenation of its words' encodings (BPE encodes each pre-tokenized word on its own),
    each distinct word through the Rust tokenizer once; at most `limit` words are kept."""

    def __init__(self, hf, pattern: str, limit: int = 1 << 20):
        self._hf = hf
        self._split = re.compile(pattern).findall
        self._ids: dict[str, list[int]] = {}
        self._limit = limit

    def encode(self, text: str) -> np.ndarray:
        words = self._split(text)
        new = [w for w in set(words) if w not in self._ids]
        if len(self._ids) + len(new) > self._limit:
            self._ids.clear()
            new = list(set(words))
        for word, enc in zip(new, self._hf.encode_batch_fast(new, add_special_tokens=False)):
            self._ids[word] = enc.ids
        return np.fromiter(itertools.chain.from_iterable(map(self._ids.__getitem__, words)), np.int32)


class HfTokenizer(_RustTokenizer):
    """The user's Hugging Face tokenizer.json; documents are separated by its end-of-text token."""
    kind = "hf"

    def encode_after(self, texts: list[str], before: list[str]) -> list[np.ndarray]:
        """Each text encoded behind the text before it, whose tokens are then dropped: a tokenizer that marks the
        start of its input (SentencePiece's Metaspace prepends '▁') would otherwise add a token at every cut."""
        out = []
        for head, enc in zip(before, self._hf.encode_batch([b + t for b, t in zip(before, texts)],
                                                           add_special_tokens=False)):
            ids = np.asarray(enc.ids, dtype=np.int32)
            if head:  # the head's tokens come first: drop those before the token of the text's first character
                first = enc.char_to_token(len(head))
                if first is None:  # a character no token covers (a normalizer dropped it): ask every offset
                    first = next((k for k, (start, _) in enumerate(enc.offsets) if start >= len(head)), len(ids))
                ids = ids[first:]
            out.append(ids)
        return out


class IdsTokenizer(Tokenizer):
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
    def _from_state(cls, state: dict) -> IdsTokenizer:
        return cls(int(state["vocab_size"]))


_KINDS = {"char": CharTokenizer, "byte": ByteTokenizer, "bpe": BpeTokenizer, "hf": HfTokenizer, "ids": IdsTokenizer}


def hf_file(setting: str) -> Path | None:
    """The tokenizer.json a `data.tokenizer` setting names (the file, or a folder holding one); None for the
    built-in kinds. DataError when the path holds none."""
    if setting in BUILT_IN:
        return None
    path = Path(setting).expanduser()
    if path.is_dir():
        path = path / HF_FILE
    if not path.is_file():
        raise DataError(f"data.tokenizer={setting!r} is neither {', '.join(BUILT_IN)} nor a Hugging Face "
                        f"tokenizer.json (a file, or a folder holding one such as the init_from folder); "
                        f"pass one of those")
    return path


def load_hf(path: Path) -> HfTokenizer:
    """The user's tokenizer.json, with its end-of-text token (from tokenizer_config.json's eos_token beside it, else
    a token of a common end-of-text name) as the document separator."""
    from tokenizers import Tokenizer as RustTokenizer
    try:
        hf = RustTokenizer.from_file(str(path))
    except Exception as exc:  # the Rust loader raises its own Exception type for any malformed file
        why = (str(exc).splitlines() or [type(exc).__name__])[0][:160]
        raise DataError(f"{str(path)!r} is not a Hugging Face tokenizer.json ({why}); pass the tokenizer.json "
                        f"saved with the model (tokenizer.save_pretrained writes it)") from None
    vocab = hf.get_vocab(with_added_tokens=True)
    if not vocab:
        raise DataError(f"{str(path)!r} has an empty vocabulary; pass the tokenizer.json saved with the model")
    eot = _eot_token(path, vocab)
    return HfTokenizer(hf, eot if eot is not None else "\n")


def _eot_token(path: Path, vocab: dict[str, int]) -> str | None:
    config = path.parent / "tokenizer_config.json"
    try:
        eos = json.loads(config.read_text(encoding="utf-8")).get("eos_token") if config.is_file() else None
    except (ValueError, OSError, AttributeError):
        eos = None
    if isinstance(eos, dict):
        eos = eos.get("content")
    if isinstance(eos, str) and eos in vocab:
        return eos
    return next((name for name in _EOT_NAMES if name in vocab), None)
