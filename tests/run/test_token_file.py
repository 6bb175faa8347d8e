"""The token file: a corpus tokenized once into the data cache, read in place; reused while the corpus is unchanged,
rebuilt when it changed or the entry is damaged; a killed or full-disk build leaves no entry; the user's Hugging Face
tokenizer.json tokenizes as it does in `tokenizers` itself."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from helpers.config import from_dict
from helpers.run import corpus, token_file
from helpers.run.corpus import CorpusBytes, DataError
from helpers.run.data import prepare
from helpers.run.token_file import TokenizerSpec
from tests.conftest import REPO, make_text, small_tmpfs, wait_for

CHINESE = "今天天气很好，我们去公园散步。"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("WORKBOOK_DATA_CACHE", str(folder))
    return folder


def _build(paths, setting="char", **spec):
    return token_file.token_file([*paths], TokenizerSpec(setting, **spec))


def _entries(cache):
    return sorted(p.stem for p in (cache / "tokens").glob("*.json"))


def _no_rebuild(*args, **kwargs):
    raise AssertionError("tokenized again")


@pytest.mark.parametrize("setting", ["char", "byte", "bpe"])
def test_chunked_parallel_tokens_equal_the_whole_text_encoded(tmp_path, cache, monkeypatch, setting):
    """Chunks of a few KB (cut at line breaks, or at a word's start in a line longer than two chunks) encoded in
    worker processes give the ids of the whole text encoded at once."""
    text = make_text(6000) + CHINESE * 50 + "word " * 3000 + "\n" + make_text(3000, seed=1)
    path = tmp_path / "c.txt"
    path.write_text(text, encoding="utf-8")
    monkeypatch.setattr(token_file, "CHUNK_BYTES", 4096)
    monkeypatch.setattr(token_file, "BAR_FROM_BYTES", 0)  # the worker pool and the bar, even for this size
    got = _build([path], setting, vocab_size=300)
    assert len(got.chunk_bytes) > 10
    assert np.array_equal(got.span(0, got.tokens).tokens, got.tokenizer.encode(text))
    assert got.tokenizer.decode(got.span(0, got.tokens).tokens) == text


def test_reused_while_unchanged_rebuilt_when_changed(tmp_path, cache, monkeypatch):
    path = tmp_path / "c.txt"
    path.write_text(make_text(3000), encoding="utf-8")
    first = _build([path])
    monkeypatch.setattr(token_file, "_build", _no_rebuild)
    assert np.array_equal(_build([path]).span(0, first.tokens).tokens, first.span(0, first.tokens).tokens)
    monkeypatch.undo()
    monkeypatch.setenv("WORKBOOK_DATA_CACHE", str(cache))
    stat = path.stat()
    changed = "Z" + path.read_text(encoding="utf-8")[1:]  # same size, same mtime: only the bytes differ
    path.write_text(changed, encoding="utf-8")
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    second = _build([path])
    assert second.tokenizer.decode(second.span(0, 1).tokens) == "Z"
    assert second.path != first.path and not first.path.exists()  # the old entry can never be read again: pruned
    # a change that no sampled block holds (mid-file, same size) is told by the file's mtime: the key holds it
    big = tmp_path / "big.txt"
    big.write_text("ab" * (1 << 19), encoding="utf-8")  # 1 MiB; bytes 300,000-300,001 lie between sampled blocks
    whole = _build([big])
    text = big.read_text(encoding="utf-8")
    big.write_text(text[:300_000] + "ZZ" + text[300_002:], encoding="utf-8")
    stat = big.stat()
    os.utime(big, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))  # a later mtime, whatever the clock
    edited = _build([big])
    assert edited.path != whole.path and "ZZ" in edited.tokenizer.decode(edited.span(299_990, 300_010).tokens)


def test_damaged_entry_is_rebuilt(tmp_path, cache, capfd):
    path = tmp_path / "c.txt"
    path.write_text(make_text(3000), encoding="utf-8")
    first = _build([path])
    want = first.span(0, first.tokens).tokens.copy()
    with open(first.path, "r+b") as fh:
        fh.truncate(first.path.stat().st_size // 2)
    again = _build([path])
    assert "damaged" in capfd.readouterr().err and np.array_equal(again.span(0, again.tokens).tokens, want)
    meta = first.path.with_suffix(".json")
    meta.write_text("{not json", encoding="utf-8")
    assert np.array_equal(_build([path]).span(0, again.tokens).tokens, want)


def test_a_killed_tokenization_leaves_no_entry_and_restarts_cleanly(tmp_path, cache):
    path = tmp_path / "big.txt"
    with open(path, "w", encoding="utf-8") as fh:
        block = make_text(200_000)
        for _ in range(40):  # ≈ 46 MB: tokenizing takes seconds
            fh.write(block)
    code = ("from pathlib import Path; from helpers.run.token_file import token_file, TokenizerSpec; "
            f"token_file([Path({str(path)!r})], TokenizerSpec('char'))")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    child = subprocess.Popen([sys.executable, "-c", code], env=env, stderr=subprocess.DEVNULL)
    parts = lambda: list((cache / "tokens").glob(".*.tmp")) if (cache / "tokens").is_dir() else []
    assert wait_for(lambda: any(p.stat().st_size > 0 for p in parts()), 60)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    assert parts() and not _entries(cache)  # a half file under a temp name, no entry
    whole = _build([path])
    assert whole.tokens == path.stat().st_size and not parts() and len(_entries(cache)) == 1


@pytest.mark.ci_required  # needs root to mount the tmpfs: CI runs as root, so a skip there is a failure
def test_a_full_disk_leaves_no_half_file_and_says_how_much_is_needed(tmp_path, monkeypatch):
    with small_tmpfs(tmp_path / "small", "1m") as mnt:
        monkeypatch.setenv("WORKBOOK_DATA_CACHE", str(mnt))
        path = tmp_path / "c.txt"
        path.write_text(make_text(200_000), encoding="utf-8")  # ≈ 1.2 MB: 2.4 MB of uint16 ids
        with pytest.raises(DataError, match=r"has 1 MB free and the token file needs up to 2 MB.*free disk space"):
            _build([path], "byte")
        # the check before writing passed (as where free space is misreported): the write itself fills the disk
        monkeypatch.setattr(token_file, "free_bytes", lambda folder: 1 << 40)
        with pytest.raises(DataError, match=r"needs up to 2 MB; free disk space or set WORKBOOK_DATA_CACHE"):
            _build([path], "byte")
        assert [p.name for p in (mnt / "tokens").iterdir() if not p.name.endswith(".lock")] == []


def _hf_tokenizer(folder, text, vocab_size=300, eos="<|endoftext|>"):
    """A byte-level BPE tokenizer.json saved by `tokenizers` itself, with an end-of-text token and a
    tokenizer_config.json naming it, as transformers saves them."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    hf = Tokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<unk>", "<s>", eos], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    hf.train_from_iterator([text], trainer=trainer)
    folder.mkdir(parents=True, exist_ok=True)
    hf.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": eos}), encoding="utf-8")
    return hf


@pytest.mark.parametrize("style", ["byte-level", "metaspace"])
def test_a_tokenizer_json_cut_into_small_pieces_gives_the_ids_of_the_whole_text(tmp_path, cache, monkeypatch, style):
    """Chunks of 4 KB and pieces of 200 bytes, each encoded behind the character before it: the ids of the whole
    text encoded at once, for GPT-2's byte-level pre-tokenizer and for SentencePiece's Metaspace (which marks the
    start of every input with '▁': encoded alone, each piece gained a token)."""
    text = make_text(6000) + CHINESE * 50 + "word " * 3000 + "\n" + make_text(3000, seed=1)
    path = tmp_path / "c.txt"
    path.write_text(text, encoding="utf-8")
    folder = tmp_path / "tok"
    folder.mkdir()
    hf = _hf_tokenizer(folder, text) if style == "byte-level" else _llama_tokenizer(folder, text)
    monkeypatch.setattr(token_file, "CHUNK_BYTES", 4096)
    monkeypatch.setattr(token_file, "PIECE_BYTES", 200)
    got = _build([path], str(folder / "tokenizer.json"))
    assert len(got.chunk_bytes) > 10
    assert got.span(0, got.tokens).tokens.tolist() == hf.encode(text, add_special_tokens=False).ids


def _cfg(corpus, **changes):
    base = {"model": {"seq_len": 16}, "data": {"corpus": [str(c) for c in corpus]}, "batch_size": 4, "steps": 6,
            "steady_after": 1, "eval_batches": 2, "seed": 7}
    return from_dict(base, changes)


def test_a_hugging_face_tokenizer_json_tokenizes_as_tokenizers_does(tmp_path, cache):
    """Each corpus file is a document, ended by the tokenizer's end-of-text token; the ids are the tokenizer's, and
    they decode back to the text."""
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text(make_text(2000) + CHINESE, encoding="utf-8")
    b.write_text(make_text(2000, seed=3), encoding="utf-8")
    hf = _hf_tokenizer(tmp_path / "tok", a.read_text() + b.read_text())
    prep = prepare(_cfg([a, b], **{"data.tokenizer": str(tmp_path / "tok")}), tmp_path / "run")
    eot = hf.token_to_id("<|endoftext|>")
    want = (hf.encode(a.read_text(), add_special_tokens=False).ids + [eot]
            + hf.encode(b.read_text(), add_special_tokens=False).ids)
    assert prep.tokenizer.kind == "hf" and prep.tokenizer.vocab_size == hf.get_vocab_size()
    assert list(np.concatenate([prep.train_tokens, prep.val_tokens])) == want
    assert prep.tokenizer.decode(prep.train_tokens[:200]) == hf.decode(want[:200], skip_special_tokens=False)
    assert json.loads((tmp_path / "run" / "tokenizer.json").read_text())["kind"] == "hf"  # the run keeps its own copy
    # the file itself names the same tokenizer as its folder
    same = prepare(_cfg([a, b], **{"data.tokenizer": str(tmp_path / "tok" / "tokenizer.json")}))
    assert np.array_equal(same.train_tokens, prep.train_tokens)


def test_a_tokenizer_larger_than_the_model_vocabulary_is_refused(tmp_path, cache):
    path = tmp_path / "a.txt"
    path.write_text(make_text(2000), encoding="utf-8")
    _hf_tokenizer(tmp_path / "tok", path.read_text(), vocab_size=300)
    cfg = _cfg([path], **{"data.tokenizer": str(tmp_path / "tok"), "model.vocab_size": 280})
    with pytest.raises(DataError, match=r"has \d{3} tokens and the model's vocabulary model.vocab_size=280 is "
                                        r"smaller; use the model's own tokenizer or set model.vocab_size=\d{3}"):
        prepare(cfg)


def test_a_broken_tokenizer_json_is_one_line(tmp_path, cache):
    path = tmp_path / "a.txt"
    path.write_text(make_text(2000), encoding="utf-8")
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "tokenizer.json").write_text('{"model": 3}', encoding="utf-8")
    with pytest.raises(DataError, match="is not a Hugging Face tokenizer.json"):
        prepare(_cfg([path], **{"data.tokenizer": str(tmp_path / "tok")}))
    with pytest.raises(DataError, match="neither char, byte, bpe nor a Hugging Face tokenizer.json"):
        token_file.token_file([path], TokenizerSpec(str(tmp_path / "nothing")))


def test_bpe_learns_from_a_bounded_sample_and_says_how_large(tmp_path, cache, capfd):
    path = tmp_path / "c.txt"
    path.write_text(make_text(200_000), encoding="utf-8")  # ≈ 1.0 MB
    got = _build([path], "bpe", vocab_size=300, bpe_sample_mb=0.1)
    assert "bpe learned its 300 tokens from 0.1 MB of the 1.0 MB corpus (64 blocks" in got.note
    assert got.note in capfd.readouterr().err
    sample = token_file.bpe_sample(CorpusBytes([path]), 100_000)
    assert len(sample) == 64 and 0.9e5 <= sum(len(t) for t in sample) <= 1e5


class _CountingFile:
    """A file whose reads are counted (bytes) in `reads`."""

    def __init__(self, handle, reads):
        self._handle, self._reads = handle, reads

    def read(self, n=-1):
        data = self._handle.read(n)
        self._reads.append(len(data))
        return data

    def __getattr__(self, name):
        return getattr(self._handle, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._handle.close()


def test_the_cache_never_reads_a_corpus_whole_to_know_it(tmp_path, cache, monkeypatch):
    """A cache hit reads the fingerprint's sampled blocks (well under 1 MB), not the corpus."""
    path = tmp_path / "c.txt"
    path.write_text(make_text(1_000_000), encoding="utf-8")  # ≈ 6 MB
    _build([path], "byte")
    reads = []
    monkeypatch.setattr(corpus, "open", lambda *a, **k: _CountingFile(open(*a, **k), reads), raising=False)
    monkeypatch.setattr(token_file, "_build", _no_rebuild)
    start = time.perf_counter()
    _build([path], "byte")
    assert time.perf_counter() - start < 1.0 and 0 < sum(reads) < 1 << 18


def _llama_tokenizer(folder, text):
    """A SentencePiece-style (Metaspace) BPE of 64 tokens, as small as the LLaMA fixture's vocabulary, with its
    special tokens where LLaMA keeps them (<unk> 0, <s> 1, </s> 2) and tokenizer_config.json naming </s>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    hf = Tokenizer(models.BPE(unk_token="<unk>"))
    hf.pre_tokenizer = pre_tokenizers.Metaspace()
    hf.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=64, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False)
    hf.train_from_iterator([text], trainer=trainer)
    hf.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}), encoding="utf-8")
    return hf


@pytest.mark.slow
def test_init_from_a_llama_checkpoint_trains_on_its_own_tokenizer(tmp_path, cache):
    """A LLaMA checkpoint saved by transformers, with its tokenizer.json beside it: data.tokenizer names the same
    folder as init_from, the run trains, and the windows the model is fed are cut from the tokenizer's own ids."""
    import shutil
    from helpers.config import dump, with_changes
    from helpers.record import load_run
    from helpers.run.data import train_dataset
    from helpers.run.hf_weights import model_settings
    from tests.conftest import run_cli
    checkpoint = tmp_path / "llama"
    shutil.copytree(REPO / "tests" / "data" / "hf_fixtures" / "llama_gqa", checkpoint)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(make_text(20000), encoding="utf-8")
    hf = _llama_tokenizer(checkpoint, corpus.read_text(encoding="utf-8"))
    cfg = with_changes(from_dict({}), {**model_settings(checkpoint), "model.seq_len": 32, "init_from": str(checkpoint),
                                       "data.corpus": [str(corpus)], "data.tokenizer": str(checkpoint),
                                       "batch_size": 4, "steps": 4, "eval_every": 0, "eval_batches": 2,
                                       "steady_after": 1, "warmup": 1})
    prep = prepare(cfg)
    ids = hf.encode(corpus.read_text(encoding="utf-8"), add_special_tokens=False).ids
    windows = {tuple(ids[s:s + 33]) for s in range(0, len(ids) - 32, 32)}
    batches = train_dataset(cfg, prep).create_tuple_iterator(num_epochs=1, output_numpy=True)
    for x, y in batches:
        assert all(tuple(np.append(rx, ry[-1])) in windows for rx, ry in zip(x, y))
    (tmp_path / "run.yaml").write_text(dump(cfg), encoding="utf-8")
    proc = run_cli("train", "--config", str(tmp_path / "run.yaml"), "--out", str(tmp_path / "run"), "--progress",
                   "none")
    assert proc.returncode == 0, proc.stderr[-2000:]
    record = load_run(tmp_path / "run")
    assert record.summary["status"] == "ok" and record.summary["init_from"]["path"] == str(checkpoint)
    saved = json.loads((tmp_path / "run" / "tokenizer.json").read_text(encoding="utf-8"))
    assert saved["kind"] == "hf" and saved["vocab_size"] == 64 and saved["separator"] == "</s>"
