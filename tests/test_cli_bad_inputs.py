"""A sweep of bad inputs over every user command of `python -m helpers`, each as the user meets it (a fresh process):
exactly one `error:` line on stderr, no traceback, the documented exit status (2: refused, nothing written; 1: a
run that started and failed), and the folder it was aimed at unchanged.

docs/reliability.md lists these cases with their messages; tests/test_bad_inputs.py holds the in-process table of
config and data errors, tests/test_fault_suite.py the faults of real runs (races, Ctrl-C, damaged checkpoints).
"""
from __future__ import annotations

import itertools
import shutil
from pathlib import Path

import pytest

from tests.conftest import REPO, make_text, run_cli, snapshot, tiny_args

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict[str, Path]:
    """One real finished run (5 steps, a checkpoint) and the damaged, foreign and busy things made from it."""
    tmp = tmp_path_factory.mktemp("bad_inputs")
    corpus = tmp / "corpus.txt"
    corpus.write_text(make_text(3000), encoding="utf-8")
    finished = tmp / "finished"
    proc = run_cli("train", *tiny_args(corpus, 5), "--out", str(finished), "--progress", "none")
    assert proc.returncode == 0, proc.stderr[-2000:]
    w = {"corpus": corpus, "finished": finished, "tmp": tmp}

    def copy(name: str) -> Path:
        w[name] = tmp / name
        shutil.copytree(finished, w[name])
        return w[name]
    ckpt = sorted((copy("damaged") / "checkpoints").glob("step_*.ckpt"))[-1]
    ckpt.chmod(0o644)
    ckpt.write_bytes(ckpt.read_bytes()[:1000])
    for p in (copy("no_checkpoint") / "checkpoints").iterdir():
        p.unlink()
    (copy("garbage_row") / "metrics.csv").write_text((finished / "metrics.csv").read_text() + "6,abc,,,\n")
    (copy("summary_not_json") / "summary.json").write_text("{\n")
    (copy("summary_a_list") / "summary.json").write_text("[1, 2]\n")
    (copy("config_broken") / "config.yaml").write_text("steps: [\n")
    w["foreign"] = tmp / "foreign"
    w["foreign"].mkdir()
    (w["foreign"] / "notes.txt").write_text("not a run")
    w["afile"] = tmp / "afile.txt"
    w["afile"].write_text("a file")
    w["export"] = tmp / "export"
    w["export"].mkdir()
    (w["export"] / "model.safetensors").write_bytes(b"earlier export")
    w["mindrecord"] = tmp / "mindrecord"
    w["mindrecord"].mkdir()
    (w["mindrecord"] / "train.mindrecord").write_bytes(b"earlier set")
    w["tb"] = tmp / "tb"
    (w["tb"] / "finished").mkdir(parents=True)
    (w["tb"] / "finished" / "events.out.tfevents.1.host").write_bytes(b"earlier events")
    yamls = {"not_utf8.yaml": "steps: 10\nname: café\n".encode("latin-1"), "a_list.yaml": b"- 1\n- 2\n",
             "a_scalar.yaml": b"42\n", "model_scalar.yaml": b"model: 5\n", "data_list.yaml": b"data: [1, 2]\n",
             "broken.yaml": b"steps: 10\nbatch_size: [8\n", "params_list.yaml": b"- steps\n",
             "params_unknown.yaml": b"stpes: 10\n"}
    for name, content in yamls.items():
        (tmp / name).write_bytes(content)
    w["legacy"] = REPO / "configs" / "examples" / "llama2_7b_mindformers.yaml"
    legacy = w["legacy"].read_text(encoding="utf-8")
    recipes = {"multiple_of_0": ("multiple_of: 256", "multiple_of: 0"),
               "multiple_of_fraction": ("multiple_of: 256", "multiple_of: 2.5"),
               "ffn_multiplier_nan": ("multiple_of: 256", "multiple_of: 256\n    ffn_dim_multiplier: .nan"),
               "warmup_nan": ("warmup_ratio: 0.01", "warmup_ratio: .nan"),
               "layers_true": ("num_layers: 32", "num_layers: true")}
    for name, (old, new) in recipes.items():
        assert old in legacy, old
        (tmp / f"{name}.yaml").write_text(legacy.replace(old, new), encoding="utf-8")
    w["hand_written"] = tmp / "hand_written.yaml"
    w["hand_written"].write_text("# my own config\nsteps: 10\n", encoding="utf-8")
    return w


def import_config(w, recipe: str) -> list[str]:
    """`import-config` argv of the legacy example with one value changed (see `world`) into a new file."""
    return ["import-config", str(w["tmp"] / f"{recipe}.yaml"), "--out", str(w["tmp"] / f"{recipe}_out.yaml")]


_fresh = itertools.count()


def train(w, *sets, out=None):
    """`train` argv of a 5-step debug run into `out` (a new folder of its own by default)."""
    out = out or f"new_run_{next(_fresh)}"
    return ["train", *tiny_args(w["corpus"], 5, *sets), "--out", str(w["tmp"] / out), "--progress", "none"]


# name: (argv from the world, exit status, words the line holds, the folder that must stay as it was or None)
CASES = {
    # train: config values
    "train: unknown key": (lambda w: train(w, "amp_levl=O2"), 2, ["did you mean 'amp_level'"], None),
    "train: unknown section key": (lambda w: train(w, "model.d_modl=64"), 2, ["did you mean 'model.d_model'"], None),
    "train: steps 0": (lambda w: train(w, "steps=0"), 2, ["steps=0 is out of range", ">= 1"], None),
    "train: steps 1e20": (lambda w: train(w, "steps=1e20"), 2, ["is out of range", "<= 1000000000"], None),
    "train: steps a word": (lambda w: train(w, "steps=many"), 2, ["steps='many' must be a whole number"], None),
    "train: steps a fraction": (lambda w: train(w, "steps=2.5"), 2, ["must be a whole number"], None),
    "train: seed negative": (lambda w: train(w, "seed=-1"), 2, ["seed=-1 is out of range", ">= 0"], None),
    "train: seed above 2^32-1": (lambda w: train(w, "seed=4294967296"), 2,
                                 ["seed=4294967296 is out of range", "<= 4294967295"], None),
    "train: section not a mapping": (lambda w: train(w, "model=5"), 2,
                                     ["config section 'model' must be a mapping"], None),
    "train: data section a list": (lambda w: train(w, "data=[1, 2]"), 2,
                                   ["config section 'data' must be a mapping"], None),
    "train: monitor section a word": (lambda w: train(w, "monitor=off"), 2,
                                      ["config section 'monitor' must be a mapping"], None),
    "train: override without =": (lambda w: [*train(w), "--set", "steps"], 2, ["must look like key=value"], None),
    "train: lr not a number": (lambda w: train(w, "lr=fast"), 2, ["lr='fast' must be a number"], None),
    "train: lr negative": (lambda w: train(w, "lr=-1"), 2, ["lr=-1.0 is out of range"], None),
    "train: amp level typo": (lambda w: train(w, "amp_level=o2"), 2, ["did you mean 'O2'"], None),
    "train: bf16 on CPU": (lambda w: train(w, "amp_level=O2", "amp_dtype=bf16"), 2,
                           ["bf16 does not run on CPU"], None),
    "train: n_head not dividing": (lambda w: train(w, "model.preset=nano", "model.n_head=3"), 2,
                                   ["does not divide model.d_model"], None),
    "train: batch 0": (lambda w: train(w, "batch_size=0"), 2, ["batch_size=0 is out of range"], None),
    "train: threads negative": (lambda w: train(w, "threads=-2"), 2, ["threads=-2 is out of range"], None),
    "train: schedule typo": (lambda w: train(w, "schedule=cosin"), 2, ["did you mean 'cosine'"], None),
    "train: bool not a bool": (lambda w: train(w, "compile_cache=maybe"), 2, ["must be true or false"], None),
    "train: workers above cores": (lambda w: train(w, "data.num_parallel_workers=999"), 2, ["cores"], None),
    "train: seq_len beyond memory": (lambda w: train(w, "model.seq_len=100000000"), 2,
                                     ["cannot fit in memory"], None),
    "train: resume_from missing": (lambda w: train(w, "resume_from=/no/such/run"), 2, ["does not exist"], None),
    "train: init_from missing": (lambda w: train(w, "init_from=/no/such/weights"), 2, ["does not exist"], None),
    "train: model.build missing": (lambda w: train(w, "model.build=no_such_module:build"), 2,
                                   ["cannot be imported"], None),
    # train: config files
    "train: config file missing": (lambda w: [*train(w), "--config", str(w["tmp"] / "nope.yaml")], 2,
                                   ["does not exist"], None),
    "train: config a folder": (lambda w: [*train(w), "--config", str(w["foreign"])], 2, ["is a folder"], None),
    "train: config not YAML": (lambda w: [*train(w), "--config", str(w["tmp"] / "broken.yaml")], 2,
                               ["is not valid YAML at line"], None),
    "train: config not UTF-8": (lambda w: [*train(w), "--config", str(w["tmp"] / "not_utf8.yaml")], 2,
                                ["is not UTF-8 text", "save it as UTF-8"], None),
    "train: config a YAML list": (lambda w: [*train(w), "--config", str(w["tmp"] / "a_list.yaml")], 2,
                                  ["must be a mapping of key: value at its top level"], None),
    "train: config a scalar": (lambda w: [*train(w), "--config", str(w["tmp"] / "a_scalar.yaml")], 2,
                               ["must be a mapping of key: value at its top level"], None),
    "train: config section a scalar": (lambda w: [*train(w), "--config", str(w["tmp"] / "model_scalar.yaml")], 2,
                                       ["config section 'model' must be a mapping"], None),
    "train: config section a list": (lambda w: [*train(w), "--config", str(w["tmp"] / "data_list.yaml")], 2,
                                     ["config section 'data' must be a mapping"], None),
    # train: --out
    "train: --out a file": (lambda w: train(w, out="afile.txt"), 2, ["choose a writable --out folder"], "afile"),
    "train: --out under a file": (lambda w: train(w, out="afile.txt/run"), 2,
                                  ["choose a writable --out folder"], "afile"),
    "train: --out a finished run": (lambda w: train(w, out="finished"), 2,
                                    ["already holds a finished run", "--replace"], "finished"),
    "train: --out a run without checkpoint": (lambda w: train(w, out="no_checkpoint"), 2,
                                              ["already holds a finished run"], "no_checkpoint"),
    "train: missing corpus": (lambda w: ["train", *tiny_args(w["tmp"] / "no_corpus.txt", 5), "--out",
                                         str(w["tmp"] / "failed_run"), "--progress", "none"], 1,
                              ["does not exist", "run recorded as failed"], None),
    # resume
    "resume: missing folder": (lambda w: ["resume", str(w["tmp"] / "nowhere")], 2, ["does not exist"], None),
    "resume: not a run": (lambda w: ["resume", str(w["foreign"])], 2, ["is not a run record"], "foreign"),
    "resume: a file": (lambda w: ["resume", str(w["afile"])], 2, ["does not exist"], "afile"),
    "resume: finished run": (lambda w: ["resume", str(w["finished"])], 2,
                             ["is finished", "pass --steps N"], "finished"),
    "resume: fewer steps": (lambda w: ["resume", str(w["finished"]), "--steps", "4"], 2,
                            ["is finished", "N > 5"], "finished"),
    "resume: steps 0": (lambda w: ["resume", str(w["finished"]), "--steps", "0"], 2,
                        ["steps=0 is out of range"], "finished"),
    "resume: steps 1e20": (lambda w: ["resume", str(w["finished"]), "--steps", str(10 ** 20)], 2,
                           ["is out of range"], "finished"),
    "resume: damaged checkpoint": (lambda w: ["resume", str(w["damaged"]), "--steps", "10"], 2,
                                   ["is damaged", "no intact checkpoint is left"], "damaged"),
    "resume: rows, no checkpoint": (lambda w: ["resume", str(w["no_checkpoint"]), "--steps", "10"], 2,
                                    ["left no checkpoint to continue from", "--replace"], "no_checkpoint"),
    "resume: unknown --checkpoint": (lambda w: ["resume", str(w["finished"]), "--steps", "10", "--checkpoint",
                                                "step_000004.ckpt"], 2,
                                     ["is not one of the checkpoints", "step_000005.ckpt"], "finished"),
    "resume: garbage metrics row": (lambda w: ["resume", str(w["garbage_row"]), "--steps", "10"], 2,
                                    ["metrics.csv", "is unreadable"], "garbage_row"),
    # show and diagnose
    "show: missing folder": (lambda w: ["show", str(w["tmp"] / "nowhere")], 2, ["does not exist"], None),
    "show: not a run": (lambda w: ["show", str(w["foreign"])], 2, ["is not a run record"], None),
    "show: garbage metrics row": (lambda w: ["show", str(w["garbage_row"])], 2,
                                  ["metrics.csv", "is unreadable"], "garbage_row"),
    "show: summary not JSON": (lambda w: ["show", str(w["summary_not_json"])], 2, ["is unreadable"], None),
    "show: summary a list": (lambda w: ["show", str(w["summary_a_list"])], 2, ["is not a JSON object"], None),
    "show: config broken": (lambda w: ["show", str(w["config_broken"])], 2, ["cannot be read"], None),
    "diagnose: missing folder": (lambda w: ["diagnose", str(w["tmp"] / "nowhere")], 2, ["does not exist"], None),
    "diagnose: garbage metrics row": (lambda w: ["diagnose", str(w["garbage_row"])], 2,
                                      ["is unreadable"], "garbage_row"),
    # export
    "export: missing source": (lambda w: ["export", str(w["tmp"] / "nowhere"), "--out", str(w["tmp"] / "hf")], 2,
                               ["holds no checkpoint to export"], None),
    "export: not a run": (lambda w: ["export", str(w["foreign"]), "--out", str(w["tmp"] / "hf")], 2,
                          ["holds no checkpoint to export"], "foreign"),
    "export: damaged checkpoint": (lambda w: ["export", str(w["damaged"]), "--out", str(w["tmp"] / "hf")], 2,
                                   ["is damaged", "no intact checkpoint"], "damaged"),
    "export: --out a file": (lambda w: ["export", str(w["finished"]), "--out", str(w["afile"])], 2,
                             ["is a file", "into a folder"], "afile"),
    "export: --out holds an export": (lambda w: ["export", str(w["finished"]), "--out", str(w["export"])], 2,
                                      ["already holds an export", "--replace"], "export"),
    "export: --out a run": (lambda w: ["export", str(w["finished"]), "--out", str(w["no_checkpoint"])], 2,
                            ["holds a run record"], "no_checkpoint"),
    # prepare
    "prepare: --out a file": (lambda w: ["prepare", "--to", "mindrecord", "--out", str(w["afile"])], 2,
                              ["is a file"], "afile"),
    "prepare: --out a run": (lambda w: ["prepare", "--to", "mindrecord", "--out", str(w["finished"])], 2,
                             ["holds a run record", "folder of its own"], "finished"),
    "prepare: --out holds a set": (lambda w: ["prepare", "--to", "mindrecord", "--set",
                                              f"data.corpus={w['corpus']}", "--out", str(w["mindrecord"])], 2,
                                   ["already holds a MindRecord set", "--replace"], "mindrecord"),
    "prepare: unknown key": (lambda w: ["prepare", "--to", "mindrecord", "--set", "dta.corpus=x", "--out",
                                        str(w["tmp"] / "mr")], 2, ["unknown config key"], None),
    # profile
    "profile: --steps 0": (lambda w: ["profile", *tiny_args(w["corpus"], 5), "--steps", "0", "--out",
                                      str(w["tmp"] / "p")], 2, ["--steps 0 is out of range"], None),
    "profile: --steps negative": (lambda w: ["profile", "--steps", "-3", "--out", str(w["tmp"] / "p")], 2,
                                  ["--steps -3 is out of range"], None),
    "profile: --start negative": (lambda w: ["profile", "--start", "-1", "--out", str(w["tmp"] / "p")], 2,
                                  ["--start -1 is out of range"], None),
    "profile: --top 0": (lambda w: ["profile", "--top", "0", "--out", str(w["tmp"] / "p")], 2,
                         ["--top 0 is out of range"], None),
    "profile: --out with =": (lambda w: ["profile", "--out", str(w["tmp"] / "a=b")], 2, ["'='"], None),
    "profile: --out a finished run": (lambda w: ["profile", *tiny_args(w["corpus"], 30), "--steps", "2", "--out",
                                                 str(w["finished"])], 2, ["already holds a finished run"],
                                      "finished"),
    # tensorboard
    "tensorboard: missing source": (lambda w: ["tensorboard", str(w["tmp"] / "nowhere"), "--out",
                                               str(w["tmp"] / "tb_new")], 2, ["does not exist"], None),
    "tensorboard: foreign source": (lambda w: ["tensorboard", str(w["foreign"]), "--out",
                                               str(w["tmp"] / "tb_new")], 2, ["is neither a run folder"], None),
    "tensorboard: --out holds events": (lambda w: ["tensorboard", str(w["finished"]), "--out", str(w["tb"])], 2,
                                        ["already holds a TensorBoard log folder", "--replace"], "tb"),
    "tensorboard: --out a file": (lambda w: ["tensorboard", str(w["finished"]), "--out", str(w["afile"])], 2,
                                  ["is a file"], "afile"),
    # import-config
    "import-config: missing source": (lambda w: ["import-config", str(w["tmp"] / "nope.yaml"), "--out",
                                                 str(w["tmp"] / "c.yaml")], 2, ["nope.yaml"], None),
    "import-config: source not YAML": (lambda w: ["import-config", str(w["tmp"] / "broken.yaml"), "--out",
                                                  str(w["tmp"] / "c.yaml")], 2, ["YAML"], None),
    "import-config: multiple_of 0": (lambda w: import_config(w, "multiple_of_0"), 2,
                                     ["model.model_config.multiple_of=0", "whole number ≥ 1"], None),
    "import-config: multiple_of a fraction": (lambda w: import_config(w, "multiple_of_fraction"), 2,
                                              ["multiple_of=2.5", "whole number"], None),
    "import-config: ffn_dim_multiplier NaN": (lambda w: import_config(w, "ffn_multiplier_nan"), 2,
                                              ["ffn_dim_multiplier=nan", "finite number > 0"], None),
    "import-config: warm-up NaN": (lambda w: import_config(w, "warmup_nan"), 2, ["warmup_ratio=nan", ">= 0"], None),
    "import-config: num_layers true": (lambda w: import_config(w, "layers_true"), 2,
                                       ["num_layers=True", "whole number"], None),
    "import-config: --out a folder": (lambda w: ["import-config", str(w["legacy"]), "--out", str(w["foreign"])], 2,
                                      ["is a folder"], "foreign"),
    "import-config: --out an existing file": (lambda w: ["import-config", str(w["legacy"]), "--out",
                                                         str(w["hand_written"])], 2,
                                              ["already exists", "--replace"], "hand_written"),
    # autotune and workbook
    "autotune: budget 0": (lambda w: ["autotune", "--budget-min", "0", "--out", str(w["tmp"] / "at")], 2,
                           ["budget"], None),
    "autotune: budget negative": (lambda w: ["autotune", "--budget-min", "-5", "--out", str(w["tmp"] / "at")], 2,
                                  ["budget"], None),
    "autotune: target without objective": (lambda w: ["autotune", "--budget-min", "1", "--target-val-loss", "2",
                                                      "--out", str(w["tmp"] / "at")], 2,
                                           ["is for --objective time_to_target"], None),
    "autotune: unknown key": (lambda w: ["autotune", "--budget-min", "1", "--set", "stpes=3", "--out",
                                         str(w["tmp"] / "at")], 2, ["did you mean 'steps'"], None),
    "workbook: params file missing": (lambda w: ["workbook", "--params", str(w["tmp"] / "nope.yaml"), "--out",
                                                 str(w["tmp"] / "report")], 2, ["does not exist"], None),
    "workbook: params a list": (lambda w: ["workbook", "--params", str(w["tmp"] / "params_list.yaml"), "--out",
                                           str(w["tmp"] / "report")], 2, ["mapping"], None),
    "workbook: unknown parameter": (lambda w: ["workbook", "--params", str(w["tmp"] / "params_unknown.yaml"),
                                               "--out", str(w["tmp"] / "report")], 2,
                                    ["did you mean 'steps'"], None),
    "workbook: notebooks folder missing": (lambda w: ["workbook", "--notebooks", str(w["tmp"] / "nowhere"), "--out",
                                                      str(w["tmp"] / "report")], 2, ["does not exist"], None),
    "workbook: timeout 0": (lambda w: ["workbook", "--notebook-timeout", "0", "--out", str(w["tmp"] / "report")], 2,
                            ["timeout", "positive"], None),
}


def test_the_sweep_is_wide():
    commands = {name.split(":")[0] for name in CASES}
    assert len(CASES) >= 60 and {"train", "resume", "show", "export", "import-config", "prepare", "profile",
                                 "tensorboard", "autotune", "workbook", "diagnose"} <= commands


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_on_the_command_line_is_one_line(name, world):
    argv, code, words, kept = CASES[name]
    before = snapshot(world[kept]) if kept and world[kept].is_dir() else None
    before_file = world[kept].read_bytes() if kept and world[kept].is_file() else None
    proc = run_cli(*argv(world), timeout=120)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == code, proc.stderr[-3000:]
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert "unexpectedly" not in lines[0] and "Traceback" not in proc.stderr, lines
    for word in words:
        assert word in lines[0], lines[0]
    if before is not None:
        assert snapshot(world[kept]) == before
    if before_file is not None:
        assert world[kept].read_bytes() == before_file


def test_prepare_of_a_missing_corpus_leaves_no_folder_behind(world):
    out = world["tmp"] / "mr_of_nothing"
    proc = run_cli("prepare", "--to", "mindrecord", "--set", f"data.corpus={world['tmp'] / 'no_corpus.txt'}",
                   "--out", str(out))
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and "does not exist" in lines[0], lines
    assert not out.exists()
