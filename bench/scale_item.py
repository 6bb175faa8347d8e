"""`make bench` item `scale`: the data layer at the user's size. Corpora of 10 MB to 10 GB, built by repeating the
shipped corpus (tiny shakespeare, from the registry cache), through each path: the text path with the byte
tokenizer, a BPE trained here and a Hugging Face tokenizer.json (made here with `tokenizers`, as a user's
checkpoint would bring it), and the MindRecord path (`prepare --to mindrecord`, then data.format=mindrecord).

For each: tokenization (or prepare) MB/s with a cold cache, in a child process; then the time from the training
process's creation to its first step with a warm cache, and that process's peak RSS (VmHWM), a debug-model run in
a child process. A repeated corpus has few distinct words, which flatters the BPE's word cache: real text has more.

Run as a script, this module is the child side (`tokenize`, `first-step`).
"""
from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

from child import python
from registry import MET, MISSED, MUST, NOT_MEASURED, Check, Item, Judgement, known

PATHS = ("byte", "bpe", "hf", "mindrecord")
SIZES_MB = (10, 100, 1000, 10000)
RSS_LIMIT_MB, FIRST_STEP_LIMIT_S, BPE_MB_S = 500.0, 5.0, 10.0
RECORD_SEQ = 256  # the MindRecord path's rows: fewer, longer rows than debug's 32 make `prepare` of a GB take minutes
RUN = {"model.preset": "debug", "batch_size": 8, "steps": 3, "eval_every": 0, "eval_batches": 2, "steady_after": 1,
       "warmup": 1}


# ------------------------------------------------------------------------------------------------ child side

def child_tokenize(corpus: str, setting: str) -> dict:
    """Child side: build the token file of `corpus` under data.tokenizer `setting` in $WORKBOOK_DATA_CACHE (cold)."""
    from helpers.run.token_file import TokenizerSpec, token_file
    start = time.perf_counter()
    made = token_file([Path(corpus)], TokenizerSpec(setting))
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "tokens": made.tokens, "corpus_bytes": made.corpus_bytes,
            "mb_per_s": made.corpus_bytes / 1e6 / seconds, "note": made.note}


def child_first_step(config_yaml: str, out: str) -> dict:
    """Child side: a short training run; seconds from this process's creation to its first step's row, and its
    peak RSS (bytes)."""
    import psutil
    from helpers.config import load_config
    from helpers.record import load_run
    from helpers.run.train import Trainer
    born = psutil.Process().create_time()
    stamps: list[float] = []
    Trainer(load_config(config_yaml), out, lambda row, total: stamps.append(time.time())).run()
    summary = load_run(out).summary
    return {"first_step_s": stamps[0] - born, "peak_rss_bytes": summary["peak_rss_bytes"],
            "status": summary["status"], "steps": summary["steps"]}


# ----------------------------------------------------------------------------------------------- parent side

def _corpus(folder: Path, size_mb: int) -> Path:
    """A corpus of `size_mb` MB: the registry corpus repeated (cut at the size), built once in `folder`."""
    from helpers.run.corpus import corpus_files
    path = folder / f"corpus_{size_mb}mb.txt"
    want = size_mb * 1_000_000
    if path.is_file() and path.stat().st_size == want:
        return path
    block = corpus_files(["tinyshakespeare"])[0].read_bytes()
    with open(path, "wb") as fh:
        left = want
        while left > 0:
            fh.write(block[:left])
            left -= min(left, len(block))
    return path


def _hf_tokenizer(folder: Path, corpus: Path) -> Path:
    """A user's tokenizer: byte-level BPE with GPT-2's pre-tokenizer and an end-of-text token, trained by
    `tokenizers` on the corpus's first MB and saved as tokenizer.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    target = folder / "user_tokenizer"
    if (target / "tokenizer.json").is_file():
        return target
    hf = Tokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1024, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    with open(corpus, "rb") as fh:
        hf.train_from_iterator([fh.read(1_000_000).decode("utf-8", errors="ignore")], trainer=trainer)
    target.mkdir(parents=True, exist_ok=True)
    hf.save(str(target / "tokenizer.json"))
    return target


def _child(env: dict, *args: str) -> dict:
    return json.loads(python(__file__, *args, env=env).strip().splitlines()[-1])


def _run_config(folder: Path, changes: dict) -> Path:
    from helpers.config import dump, from_dict, with_changes
    path = folder / "run.yaml"
    path.write_text(dump(with_changes(from_dict({}), {**RUN, **changes})))
    return path


def _measure(path: str, size_mb: int, folder: Path) -> dict:
    """One path at one size: its tokenization (or prepare) and its first step from the warm cache."""
    corpus = _corpus(folder, size_mb)
    work = folder / f"{path}-{size_mb}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    env = {"WORKBOOK_DATA_CACHE": str(work / "cache")}
    try:
        if path == "mindrecord":
            start = time.perf_counter()
            python("-m", "helpers", "prepare", "--to", "mindrecord", "--set", f"data.corpus={corpus}", "--set",
                   "data.tokenizer=byte", "--set", "model.preset=debug", "--set", f"model.seq_len={RECORD_SEQ}",
                   "--out", str(work / "set"), env=env)
            seconds = time.perf_counter() - start
            made = {"seconds": seconds, "mb_per_s": size_mb / seconds,
                    "what": f"prepare --to mindrecord (byte tokenizer, rows of {RECORD_SEQ + 1} ids)"}
            changes = {"data.format": "mindrecord", "data.corpus": [str(work / "set")], "model.seq_len": RECORD_SEQ}
            shutil.rmtree(work / "cache", ignore_errors=True)  # the set holds the tokens; its run needs no cache
        else:
            setting = str(_hf_tokenizer(folder, corpus)) if path == "hf" else path
            made = _child(env, "tokenize", str(corpus), setting)
            changes = {"data.corpus": [str(corpus)], "data.tokenizer": setting}
        run = _child(env, "first-step", str(_run_config(work, changes)), str(work / "run"))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {"size_mb": size_mb, "prepare": made, **run}


def item_scale(paths: list[str], sizes: list[int], slow_mb: int, folder: Path) -> dict:
    """Each path at each size (the hf and mindrecord paths up to `slow_mb`): MB/s, first step (s), peak RSS."""
    folder.mkdir(parents=True, exist_ok=True)
    out: dict = {"paths": {}, "sizes_mb": sizes, "slow_paths_up_to_mb": slow_mb, "folder": str(folder)}
    # not recorded: loads MindSpore's libraries into the page cache, so the first measured run is not the only cold one
    _measure("byte", sizes[0], folder)
    for size in sizes:
        for path in paths:
            if path in ("hf", "mindrecord") and size > slow_mb:
                continue
            got = _measure(path, size, folder)
            out["paths"].setdefault(path, []).append(got)
            print(f"  scale {path} {size} MB: {got['prepare']['mb_per_s']:.1f} MB/s, first step "
                  f"{got['first_step_s']:.1f} s, peak RSS {got['peak_rss_bytes'] / 1e6:.0f} MB", flush=True)
        corpus = folder / f"corpus_{size}mb.txt"
        if size >= 1000:
            corpus.unlink(missing_ok=True)  # GB corpora: rebuilt in a minute, not worth the disk
    return out


def rows(r: dict) -> list[tuple[str, str]]:
    return [(f"{path} at {m['size_mb']:,} MB",
             f"{m['prepare']['mb_per_s']:.1f} MB/s to tokenize{' (prepare)' if path == 'mindrecord' else ''}; first "
             f"step {m['first_step_s']:.1f} s after process start (warm cache); peak RSS "
             f"{m['peak_rss_bytes'] / 1e6:,.0f} MB")
            for path, ms in r.get("paths", {}).items() for m in ms]


def _growth(key: str, limit: float, scale: float, unit: str):
    """met when, for every path, the largest size's `key` is within `limit` of its smallest size's."""
    def judge(r: dict) -> Judgement:
        lines, missed = [], False
        for path, ms in (r.get("paths") or {}).items():
            if len(ms) < 2:
                continue
            small, large = ms[0], ms[-1]
            grew = (large[key] - small[key]) / scale
            missed |= grew > limit
            lines.append(f"{path} {small['size_mb']:,} → {large['size_mb']:,} MB: {grew:+.1f} {unit}")
        if not lines:
            return Judgement(NOT_MEASURED, "no path was measured at two sizes")
        return Judgement(MISSED if missed else MET, "; ".join(lines) + f" (limit +{limit:g} {unit})")
    return judge


def _bpe_speed(r: dict) -> Judgement:
    ms = (r.get("paths") or {}).get("bpe") or []
    if not ms:
        return Judgement(NOT_MEASURED, "the bpe path was not measured")
    largest = ms[-1]
    speed = largest["prepare"]["mb_per_s"]
    return Judgement(MET if speed >= BPE_MB_S else MISSED,
                     f"byte-level BPE tokenized {largest['size_mb']:,} MB at {speed:.1f} MB/s "
                     f"({'≥' if speed >= BPE_MB_S else '<'} {BPE_MB_S:g} MB/s, training on its sample included)")


def _miss(key: str, value: float) -> dict:
    small = {"size_mb": 10, "prepare": {"mb_per_s": 20.0}, "first_step_s": 4.0, "peak_rss_bytes": 6e8}
    return {"paths": {"byte": [small, {**small, "size_mb": 10000, key: value}]}}


ITEMS = [Item("scale", "the data layer from 10 MB to 10 GB: tokenization MB/s, time to first step, peak RSS",
              lambda a: item_scale(a.scale_paths.split(","), [int(s) for s in a.scale_sizes.split(",")],
                                   a.scale_slow_mb, Path(a.scale_dir)), rows,
              (Check(MUST, f"peak RSS of the training process at the largest corpus within {RSS_LIMIT_MB:g} MB of "
                           f"the 10 MB run's, each path", _growth("peak_rss_bytes", RSS_LIMIT_MB, 1e6, "MB"),
                     miss=_miss("peak_rss_bytes", 6e8 + 9e8)),
               Check(MUST, f"first step (warm cache) at the largest corpus within {FIRST_STEP_LIMIT_S:g} s of the "
                           f"10 MB run's, each path", _growth("first_step_s", FIRST_STEP_LIMIT_S, 1.0, "s"),
                     miss=_miss("first_step_s", 30.0)),
               Check(MUST, f"byte-level BPE tokenization of the largest corpus at ≥ {BPE_MB_S:g} MB/s on the "
                           f"machine's cores", _bpe_speed,
                     miss={"paths": {"bpe": [{"size_mb": 10000, "prepare": {"mb_per_s": 4.0}}]}})),
              options=((("--scale-paths",), {"default": ",".join(PATHS), "help": "scale: comma-separated paths"}),
                       (("--scale-sizes",), {"default": ",".join(map(str, SIZES_MB)),
                                             "help": "scale: comma-separated corpus sizes in MB"}),
                       (("--scale-slow-mb",), {"type": int, "default": 1000,
                                               "help": "scale: the hf and mindrecord paths stop at this size (MB)"}),
                       (("--scale-dir",), {"default": "/tmp/workbook-scale",
                                           "help": "scale: folder for the corpora and caches (tens of GB)"})),
              check_args=lambda a: known("path", a.scale_paths.split(","), list(PATHS)),
              in_all=False)]


if __name__ == "__main__":
    side, *rest = sys.argv[1:]
    got = child_tokenize(*rest) if side == "tokenize" else child_first_step(*rest)
    print(json.dumps(got))
