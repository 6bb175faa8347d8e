"""Every bad input the workbook knows about, as one table: how to trigger it, the words of its one-line error,
and how early it is caught. docs/reliability.md lists the same cases with the messages users see.

Stages, earliest first:
  config   — raised while the config / parameters are read: nothing is written, MindSpore is never imported;
  data     — raised by the corpus check that `Trainer.run` does before importing MindSpore: the run folder
             holds a 'failed' record with the reason and no metrics rows;
  workbook — raised by a Workbook / workbook-run operation before it starts any run: ledger and folders unchanged;
  launch   — raised before msrun starts (no msrun_logs/);
  preflight — raised by the checks `train`, `profile` and `launch` make once the config is read, before anything is
             written or MindSpore is imported: the paths it reads, the modules it names, its memory, the --out folder.
"""
from __future__ import annotations

import functools
import socket

import pytest

from helpers.config import ConfigError, from_dict, load_config
from helpers.run.data import DataError
from helpers.run.outdir import claim
from helpers.run.preflight import preflight
from helpers.spawn.msrun import check_port
from helpers.record import RecordError, load_run
from helpers.tune.rounds import RoundError, Workbook
from helpers.run.train import Trainer
from helpers.book.notebooks import NOTEBOOKS_DIR, WorkbookError, check_params, discover, notebook_parameters
from tests.conftest import make_text, run_cli, tiny_args

ERRORS = (ConfigError, DataError, RecordError, RoundError, WorkbookError)


def tiny(corpus):
    """A valid tiny config on `corpus` (a path or registry name)."""
    return from_dict({"model": {"preset": "debug"}, "data": {"corpus": [str(corpus)]}, "batch_size": 8, "steps": 5,
                      "steady_after": 2, "eval_every": 0, "eval_batches": 2})


# --------------------------------------------------------------------------------------------- triggers

def config(*overrides):
    return lambda tmp: from_dict({}, list(overrides))


def bad_yaml_file(tmp):
    path = tmp / "bad.yaml"
    path.write_text("steps: 10\nbatch_size: [8\n")
    return load_config(path)


def corpus_bytes(content: bytes | None, name: str = "corpus.txt"):
    """Train on a corpus file with `content` (None: the file is missing), in this process, up to the error."""
    def trigger(tmp):
        path = tmp / name
        if content is not None:
            path.write_bytes(content)
        return Trainer(tiny(path), tmp / "run").run()
    return trigger


def corpus_name(name):
    return lambda tmp: Trainer(tiny(name), tmp / "run").run()


def corrupt_cache(tmp):
    """The test points WORKBOOK_DATA_CACHE at tmp/cache; a cached download there has the wrong hash."""
    (tmp / "cache").mkdir()
    (tmp / "cache" / "tinyshakespeare.txt").write_text(make_text(2000))  # plausible text, wrong hash
    return Trainer(tiny("tinyshakespeare"), tmp / "run").run()


def open_workbook(setup):
    def trigger(tmp):
        folder = tmp / "book"
        setup(folder)
        return Workbook.open(folder)
    return trigger


def foreign_folder(folder):
    folder.mkdir()
    (folder / "notes.txt").write_text("someone else's folder")


def unreadable_marker(folder):
    folder.mkdir()
    (folder / "workbook.json").write_text("{truncated")


def create_over_foreign(tmp):
    foreign_folder(tmp / "book")
    return Workbook.create(tmp / "book", tiny(tmp / "c.txt"))


def two_variable_round(tmp):
    wb = Workbook.create(tmp / "book", tiny(tmp / "c.txt"))
    return wb.candidate("mixed", {"batch_size": 16, "lr": 0.01})


@functools.cache
def notebook_defaults() -> dict:
    return {p.stem: notebook_parameters(p) for p in discover(NOTEBOOKS_DIR)}


def notebook_param(**given):
    return lambda tmp: check_params(given, notebook_defaults())


def port_in_use(tmp):
    with socket.socket() as busy:
        busy.bind(("", 0))
        busy.listen()
        return check_port(busy.getsockname()[1])


def foreign_run_dir(tmp):
    (tmp / "notarun").mkdir()
    return load_run(tmp / "notarun")


def checked(*overrides):
    """The preflight checks of `train`/`launch` on the default config with `overrides`."""
    return lambda tmp: preflight(from_dict({}, list(overrides)))


def out_holds_failed_run(tmp):
    """A real failed record (a missing corpus), then a second run into its folder."""
    with pytest.raises(DataError):
        Trainer(tiny(tmp / "missing.txt"), tmp / "run").run()
    return claim(tmp / "run", tiny(tmp / "c.txt"))


def tensorboard_of_missing_folder(tmp):
    from helpers.book.tensorboard import export_tensorboard
    return export_tensorboard([tmp / "nowhere"], tmp / "tb")


# ----------------------------------------------------------------------------------------------- table

CASES = {  # name: (stage, trigger(tmp), words expected in the one-line error)
    "unknown key": ("config", config("amp_levl=O2"), ["unknown config key 'amp_levl'", "did you mean 'amp_level'"]),
    "unknown section key": ("config", config("model.d_modl=64"), ["did you mean 'model.d_model'"]),
    "wrong type (number)": ("config", config("batch_size=abc"), ["batch_size='abc' must be a whole number"]),
    "wrong type (bool)": ("config", config("compile_cache=maybe"), ["must be true or false"]),
    "negative lr": ("config", config("lr=-0.1"), ["lr=-0.1 is out of range", "must be > 0.0"]),
    "seq_len 0": ("config", config("model.seq_len=0"), ["model.seq_len=0 is out of range", ">= 1"]),
    "batch 0": ("config", config("batch_size=0"), ["batch_size=0 is out of range", ">= 1"]),
    "grad_accum 0": ("config", config("grad_accum_steps=0"), ["grad_accum_steps=0 is out of range", ">= 1"]),
    "n_head not dividing d_model": ("config", config("model.n_head=3"),
                                    ["model.n_head=3 does not divide model.d_model=128", "pick n_head among"]),
    "amp level typo": ("config", config("amp_level=o2"), ["amp_level='o2' is not allowed", "did you mean 'O2'"]),
    "bf16 on CPU": ("config", config("amp_level=O2", "amp_dtype=bf16"),
                    ["bf16 does not run on CPU", "use amp_dtype=fp16"]),
    "workers above cores": ("config", config("data.num_parallel_workers=999"),
                            ["data.num_parallel_workers=999 is above this machine's", "use at most"]),
    "config file not YAML": ("config", bad_yaml_file, ["is not valid YAML at line", "fix its syntax"]),
    "missing corpus": ("data", corpus_bytes(None), ["does not exist", "pass an existing UTF-8 text file"]),
    "empty corpus": ("data", corpus_bytes(b""), ["is empty", "pass a file that contains text"]),
    "binary corpus": ("data", corpus_bytes(bytes(range(256)) * 8), ["NUL bytes", "pass a UTF-8 text file"]),
    "non-UTF-8 corpus": ("data", corpus_bytes("café".encode("latin-1") * 100), ["is not UTF-8", "iconv"]),
    "corpus shorter than seq_len+1": ("data", corpus_bytes(b"short text\n"),
                                      ["fewer than model.seq_len+1 = 33", "use a longer corpus"]),
    "unknown corpus name": ("data", corpus_name("tinyshakespear"),
                            ["unknown corpus 'tinyshakespear'", "did you mean 'tinyshakespeare'?"]),
    "corrupt cached download": ("data", corrupt_cache, ["is corrupt", "delete it and the next run fetches it"]),
    "missing workbook folder": ("workbook", open_workbook(lambda f: None), ["does not exist", "Workbook.create"]),
    "foreign workbook folder": ("workbook", open_workbook(foreign_folder), ["is not a workbook (no workbook.json)"]),
    "unreadable workbook marker": ("workbook", open_workbook(unreadable_marker),
                                   ["is unreadable", "create a new workbook"]),
    "workbook over a foreign folder": ("workbook", create_over_foreign,
                                       ["exists and is not a workbook", "choose a new or empty folder"]),
    "round changing two variables": ("workbook", two_variable_round,
                                     ["changes 2 variables (batch_size, lr)", "change one per round"]),
    "notebook parameter wrong type": ("config", notebook_param(steps="fifty"),
                                      ["notebook parameter steps='fifty' must be a whole number"]),
    "unknown notebook parameter": ("config", notebook_param(stpes=10), ["did you mean 'steps'"]),
    "msrun port in use": ("launch", port_in_use, ["is already in use", "parallel.master_port=0"]),
    "not a run folder": ("config", foreign_run_dir, ["is not a run record", "pass the --out folder"]),
    "seq_len beyond memory": ("preflight", checked("model.preset=tiny", "model.seq_len=100000"),
                              ["model.seq_len=100000 cannot fit in memory", "GiB", "lower model.seq_len"]),
    "batch beyond memory": ("preflight", checked("model.preset=tiny", "batch_size=10000000"),
                            ["batch_size=10000000 cannot fit in memory", "activations", "lower batch_size"]),
    "d_model beyond memory": ("preflight", checked("model.d_model=1048576"),
                              ["model.d_model=1048576 cannot fit in memory", "block weights", "lower model.d_model"]),
    "vocab_size beyond memory": ("preflight", checked("model.vocab_size=10000000000"),
                                 ["model.vocab_size=10000000000 cannot fit in memory", "logits"]),
    "model.build module missing": ("preflight", checked("model.build=no_such_module:build"),
                                   ["model.build 'no_such_module:build' cannot be imported",
                                    "no module named 'no_such_module'"]),
    "callback module missing": ("preflight", checked("monitor.callbacks=[no_such_module:factory]"),
                                ["monitor.callbacks item 'no_such_module:factory' cannot be imported"]),
    "device not on this machine": ("preflight", checked("device_target=Ascend"),
                                   ["device_target=Ascend: no Ascend device here", "set device_target=CPU",
                                    "--target cpu"]),
    "resume_from missing": ("preflight", checked("resume_from=/no/such/run"),
                            ["resume_from='/no/such/run' does not exist"]),
    "--out holds a failed run": ("preflight", out_holds_failed_run,
                                 ["already holds an unfinished run (status failed, no checkpoint to resume from)",
                                  "train into another --out folder", "--replace", "Nothing was written"]),
    "tensorboard of a missing folder": ("config", tensorboard_of_missing_folder, ["nowhere' does not exist"]),
    "notebooks folder missing": ("config", lambda tmp: discover(tmp / "nowhere"),
                                 ["notebooks folder", "nowhere' does not exist"]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_is_one_actionable_line(name, tmp_path, monkeypatch):
    stage, trigger, words = CASES[name]
    (tmp_path / "c.txt").write_text(make_text(3000))
    monkeypatch.setenv("WORKBOOK_DATA_CACHE", str(tmp_path / "cache"))  # never the real corpus cache
    with pytest.raises(ERRORS) as err:
        trigger(tmp_path)
    message = str(err.value)
    assert "\n" not in message and message.strip() == message
    for word in words:
        assert word in message, message
    if stage == "data":  # caught before training: a failed record with the reason, no metrics rows
        record = load_run(tmp_path / "run")
        assert record.status == "failed" and record.metrics == []
        assert message in record.summary["status_reason"]
    if name == "round changing two variables":
        assert not (tmp_path / "book" / "rounds").exists() and not (tmp_path / "book" / "ledger.jsonl").exists()
    if name == "corrupt cached download":  # not replaced behind the user's back; the message says what to do
        assert (tmp_path / "cache" / "tinyshakespeare.txt").read_text() == make_text(2000)


# The same errors as the user sees them from the command line (a few: each is a process, ~1-2 s).
CLI_CASES = {  # name: (extra --set values, exit code, words, whether a run folder may exist)
    "unknown key": (["amp_levl=O2"], 2, "did you mean 'amp_level'", False),
    "bf16 on CPU": (["amp_level=O2", "amp_dtype=bf16"], 2, "bf16 does not run on CPU", False),
    "workers above cores": (["data.num_parallel_workers=999"], 2, "cores", False),
    "missing corpus": (["data.corpus=/nonexistent/corpus.txt"], 1, "does not exist", True),
}


@pytest.mark.parametrize("name", list(CLI_CASES))
def test_cli_prints_one_line_and_trains_nothing(name, tmp_path, small_corpus):
    sets, code, words, record = CLI_CASES[name]
    out = tmp_path / "run"
    proc = run_cli("train", *tiny_args(small_corpus, 5, *sets), "--out", str(out), "--progress", "none",
                   timeout=120)
    assert proc.returncode == code, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and words in lines[0], lines
    if record:
        assert load_run(out).status == "failed" and load_run(out).metrics == []
    else:
        assert not out.exists()
