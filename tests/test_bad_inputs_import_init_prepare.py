"""A sweep of bad inputs to `import-config`, `init_from`, `resume --checkpoint`, `prepare` and
`workbook --params` that tests/test_cli_bad_inputs.py and tests/test_bad_inputs.py do not hold, each as the user
meets it (a fresh process): the documented exit status (2: refused), exactly one `error:` line that names the key
or file and a fix, no traceback, no "failed unexpectedly" (the line of an unhandled exception), and nothing
half-written (the --out it was aimed at absent, the folder it read unchanged).

The Hugging Face folders are written here with safetensors.numpy and json (no torch); the MindFormers recipes are
the legacy example with one value changed. Only the `resume` cases need a trained run (one, 5 steps: marked slow).
A full disk during `prepare --to mindrecord` and `export` is filled for real on a small tmpfs (root, as CI runs).
"""
from __future__ import annotations

import json
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from tests.conftest import REPO, make_text, run_cli, small_tmpfs, snapshot, tiny_args

VOCAB, LAYERS, HEADS, D, HIDDEN = 40, 2, 2, 32, 48
LLAMA_CONFIG = {"model_type": "llama", "hidden_size": D, "intermediate_size": HIDDEN, "num_hidden_layers": LAYERS,
                "num_attention_heads": HEADS, "num_key_value_heads": HEADS, "vocab_size": VOCAB, "rms_norm_eps": 1e-5,
                "rope_theta": 500.0, "tie_word_embeddings": False, "max_position_embeddings": 64}
GPT2_CONFIG = {"model_type": "gpt2", "n_layer": LAYERS, "n_head": HEADS, "n_embd": D, "vocab_size": VOCAB,
               "n_positions": 24}
LEGACY = REPO / "configs" / "examples" / "llama2_7b_mindformers.yaml"


def llama_tensors(layers: int = LAYERS, dtype=np.float32) -> dict[str, np.ndarray]:
    """LLaMA weights in Hugging Face names and shapes (random, float32 unless `dtype`)."""
    rng = np.random.default_rng(0)

    def w(*shape):
        return (rng.standard_normal(shape) * 0.2).astype(dtype)
    t = {"model.embed_tokens.weight": w(VOCAB, D), "model.norm.weight": w(D), "lm_head.weight": w(VOCAB, D)}
    for i in range(layers):
        p = f"model.layers.{i}."
        t.update({p + "input_layernorm.weight": w(D), p + "post_attention_layernorm.weight": w(D),
                  **{p + f"self_attn.{n}_proj.weight": w(D, D) for n in "qkvo"},
                  p + "mlp.gate_proj.weight": w(HIDDEN, D), p + "mlp.up_proj.weight": w(HIDDEN, D),
                  p + "mlp.down_proj.weight": w(D, HIDDEN)})
    return t


def gpt2_tensors(layers: int = LAYERS) -> dict[str, np.ndarray]:
    """GPT-2 weights in Hugging Face names and layouts (Conv1D [in, out]), float32."""
    rng = np.random.default_rng(1)

    def w(*shape):
        return (rng.standard_normal(shape) * 0.2).astype(np.float32)
    t = {"wte.weight": w(VOCAB, D), "wpe.weight": w(24, D), "ln_f.weight": w(D), "ln_f.bias": w(D)}
    for i in range(layers):
        p = f"h.{i}."
        t.update({p + "ln_1.weight": w(D), p + "ln_1.bias": w(D), p + "ln_2.weight": w(D), p + "ln_2.bias": w(D),
                  p + "attn.c_attn.weight": w(D, 3 * D), p + "attn.c_attn.bias": w(3 * D),
                  p + "attn.c_proj.weight": w(D, D), p + "attn.c_proj.bias": w(D),
                  p + "mlp.c_fc.weight": w(D, 4 * D), p + "mlp.c_fc.bias": w(4 * D),
                  p + "mlp.c_proj.weight": w(4 * D, D), p + "mlp.c_proj.bias": w(D)})
    return t


def hf_folder(folder: Path, tensors: dict | None, config: dict | str | None, name: str = "model.safetensors"):
    folder.mkdir(parents=True, exist_ok=True)
    if tensors is not None:
        save_file(tensors, str(folder / name))
    if config is not None:
        (folder / "config.json").write_text(config if isinstance(config, str) else json.dumps(config),
                                            encoding="utf-8")
    return folder


def recipe(tmp: Path, name: str, *changes: tuple[str, str]) -> Path:
    """The legacy MindFormers example with each (old, new) text replaced (use_flash_attention off, so that the
    one refusal is the case's own)."""
    text = LEGACY.read_text(encoding="utf-8").replace("use_flash_attention: True", "use_flash_attention: False")
    for old, new in changes:
        assert old in text, old
        text = text.replace(old, new, 1)
    path = tmp / f"{name}.yaml"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict[str, Path]:
    """Everything the fast cases read: a corpus, recipes, Hugging Face folders, parameter files (no run trains)."""
    tmp = tmp_path_factory.mktemp("bad_inputs_58")
    w: dict[str, Path] = {"tmp": tmp}
    w["corpus"] = tmp / "corpus.txt"
    w["corpus"].write_text(make_text(3000), encoding="utf-8")
    w["empty_corpus"] = tmp / "empty.txt"
    w["empty_corpus"].write_bytes(b"")
    w["binary_corpus"] = tmp / "binary.txt"
    w["binary_corpus"].write_bytes(bytes(range(256)) * 8)
    w["afile"] = tmp / "afile.txt"
    w["afile"].write_text("a file")
    # MindFormers recipes with one absurd or broken value
    recipes = {
        "batch_1e23": [("  batch_size: 4\n  sink_mode", "  batch_size: 1.0e+23\n  sink_mode")],
        "hidden_1e32": [("hidden_size: 4096", "hidden_size: 1.0e+32")],
        "layers_1e9": [("num_layers: 32", "num_layers: 1.0e+9")],
        "heads_1e9": [("num_heads: 32", "num_heads: 1.0e+9")],
        "seq_1e12": [("seq_length: 2048", "seq_length: 1.0e+12")],
        "vocab_1e15": [("vocab_size: 32000", "vocab_size: 1.0e+15")],
        "ffn_1e30": [("multiple_of: 256", "multiple_of: 256\n    ffn_hidden_size: 1.0e+30")],
        "batch_negative": [("  batch_size: 4\n  sink_mode", "  batch_size: -4\n  sink_mode")],
        "layers_word": [("num_layers: 32", "num_layers: many")],
        "bert": [("type: LlamaConfig", "type: BertConfig")],
    }
    for name, changes in recipes.items():
        w[f"recipe_{name}"] = recipe(tmp, name, *changes)
    w["recipe_dir"] = tmp / "recipe_dir"
    w["recipe_dir"].mkdir()
    w["recipe_binary"] = tmp / "recipe_binary.yaml"
    w["recipe_binary"].write_bytes(b"\x00\x01\x02model: 1\n")
    w["recipe_list"] = tmp / "recipe_list.yaml"
    w["recipe_list"].write_text("- model\n- runner_config\n")
    # Hugging Face folders
    hf = tmp / "hf"
    w["hf_lie_layers"] = hf_folder(hf / "lie_layers", llama_tensors(), {**LLAMA_CONFIG, "num_hidden_layers": 3})
    w["hf_lie_width"] = hf_folder(hf / "lie_width", llama_tensors(), {**LLAMA_CONFIG, "hidden_size": 64})
    w["hf_lie_gpt2"] = hf_folder(hf / "lie_gpt2", gpt2_tensors(), {**GPT2_CONFIG, "n_layer": 3})
    w["hf_lie_fewer"] = hf_folder(hf / "lie_fewer", llama_tensors(3), {**LLAMA_CONFIG, "num_hidden_layers": 1})
    w["hf_config_cut"] = hf_folder(hf / "config_cut", llama_tensors(), json.dumps(LLAMA_CONFIG)[:40])
    w["hf_config_list"] = hf_folder(hf / "config_list", llama_tensors(), "[1, 2]")
    w["hf_bert"] = hf_folder(hf / "bert", llama_tensors(), {**LLAMA_CONFIG, "model_type": "bert"})
    w["hf_ints"] = hf_folder(hf / "ints", llama_tensors(dtype=np.int32), LLAMA_CONFIG)
    w["hf_empty"] = hf_folder(hf / "empty", None, LLAMA_CONFIG)
    w["hf_mismatch"] = hf_folder(hf / "mismatch", llama_tensors(), LLAMA_CONFIG)
    w["hf_relu"] = hf_folder(hf / "relu", gpt2_tensors(), {**GPT2_CONFIG, "activation_function": "relu"})
    w["hf_unknown_layout"] = hf_folder(hf / "unknown_layout", {"encoder.w": np.zeros((2, 2), np.float32)}, None)
    w["hf_garbage"] = hf_folder(hf / "garbage", None, LLAMA_CONFIG)
    (w["hf_garbage"] / "model.safetensors").write_bytes(b"not a safetensors file at all")
    w["hf_cut"] = hf_folder(hf / "cut", llama_tensors(), LLAMA_CONFIG)
    data = (w["hf_cut"] / "model.safetensors").read_bytes()
    (w["hf_cut"] / "model.safetensors").write_bytes(data[:8 + struct.unpack("<Q", data[:8])[0] // 2])
    w["hf_index_missing_shard"] = hf_folder(hf / "index_missing", None, LLAMA_CONFIG)
    (w["hf_index_missing_shard"] / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {name: "model-00001-of-00002.safetensors" for name in llama_tensors()}}))
    w["hf_a_text_file"] = hf / "weights.txt"
    w["hf_a_text_file"].write_text("weights")
    # workbook parameter files
    params = {"params_not_utf8.yaml": "steps: 10\nname: café\n".encode("latin-1"), "params_scalar.yaml": b"42\n",
              "params_steps_word.yaml": b"steps: many\n", "params_preset_list.yaml": b"preset: [nano]\n",
              "params_broken.yaml": b"steps: [10\n", "params_notebook_typo.yaml": b"01_baselin:\n  steps: 5\n",
              "params_dup.yaml": b"steps: 5\nsteps: 6\n"}
    for name, content in params.items():
        (tmp / name).write_bytes(content)
    return w


def train(w, *sets: str) -> list[str]:
    return ["train", *tiny_args(w["corpus"], 5, *sets), "--out", str(w["tmp"] / "no_run"), "--progress", "none"]


def init_from(w, name: str, *sets: str) -> list[str]:
    return train(w, f"init_from={w[name]}", *sets)


LLAMA_SETS = ("model.norm=rmsnorm", "model.bias=false", "model.qkv=separate", "model.positions=rope",
              "model.mlp=swiglu", f"model.d_model={D}", f"model.mlp_hidden={HIDDEN}", f"model.n_layer={LAYERS}",
              "model.n_head=2", "model.rms_eps=1e-05", "model.tie_head=false", "model.rope_theta=500.0")


def import_config(w, name: str, *extra: str) -> list[str]:
    return ["import-config", str(w[name]), "--out", str(w["tmp"] / "imported.yaml"), *extra]


def prepare(w, *sets: str, out: str = "mr_new") -> list[str]:
    return ["prepare", "--to", "mindrecord", "--set", "model.preset=debug", *[a for s in sets for a in ("--set", s)],
            "--out", str(w["tmp"] / out)]


def workbook(w, params: str) -> list[str]:
    return ["workbook", "--params", str(w["tmp"] / params), "--out", str(w["tmp"] / "report")]


# name: (argv from the world, exit status, words the line holds (the key or file, and the fix), paths under tmp that
# must not exist afterwards, the world entry that must be unchanged or None)
NOTHING = ("no_run", "imported.yaml", "mr_new", "report")
CASES = {
    # import-config: absurd sizes, broken sources
    "import-config: batch_size 1e23": (lambda w: import_config(w, "recipe_batch_1e23"), 2,
                                       ["runner_config.batch_size", "≤ 16,777,216", "fix the value"]),
    "import-config: hidden_size 1e32": (lambda w: import_config(w, "recipe_hidden_1e32"), 2,
                                        ["hidden_size", "≤ 1,048,576", "model.d_model", "fix the value"]),
    "import-config: num_layers 1e9": (lambda w: import_config(w, "recipe_layers_1e9"), 2,
                                      ["num_layers", "≤ 65,536", "model.n_layer"]),
    "import-config: num_heads 1e9": (lambda w: import_config(w, "recipe_heads_1e9"), 2,
                                     ["num_heads", "≤ 65,536", "model.n_head"]),
    "import-config: seq_length 1e12": (lambda w: import_config(w, "recipe_seq_1e12"), 2,
                                       ["seq_length", "model.seq_len", "fix the value"]),
    "import-config: vocab_size 1e15": (lambda w: import_config(w, "recipe_vocab_1e15"), 2,
                                       ["vocab_size", "model.vocab_size", "fix the value"]),
    "import-config: ffn_hidden_size 1e30": (lambda w: import_config(w, "recipe_ffn_1e30"), 2,
                                            ["ffn_hidden_size", "model.mlp_hidden"]),
    "import-config: batch_size negative": (lambda w: import_config(w, "recipe_batch_negative"), 2,
                                           ["batch_size", ">= 1"]),
    "import-config: num_layers a word": (lambda w: import_config(w, "recipe_layers_word"), 2,
                                         ["num_layers", "fix it"]),
    "import-config: not a causal LM": (lambda w: import_config(w, "recipe_bert"), 2,
                                       ["BertConfig", "cannot be imported"]),
    "import-config: source a folder": (lambda w: import_config(w, "recipe_dir"), 2, ["recipe_dir"]),
    "import-config: source binary": (lambda w: import_config(w, "recipe_binary"), 2, ["recipe_binary.yaml"]),
    "import-config: source a list": (lambda w: import_config(w, "recipe_list"), 2, ["mapping"]),
    "import-config: --out under a file": (lambda w: ["import-config", str(LEGACY), "--out",
                                                     str(w["afile"] / "c.yaml")], 2, ["afile.txt"]),
    # train with absurd sizes and buffers
    "train: batch_size 1e23": (lambda w: train(w, "batch_size=1e23"), 2, ["batch_size=", "<= 16777216"]),
    "train: d_model 1e32": (lambda w: train(w, "model.d_model=1e32"), 2, ["model.d_model=", "<= 1048576"]),
    "train: n_layer 1e9": (lambda w: train(w, "model.n_layer=1000000000"), 2, ["model.n_layer=", "<= 65536"]),
    "train: mlp_hidden 1e12": (lambda w: train(w, "model.mlp_hidden=1000000000000"), 2,
                               ["model.mlp_hidden=", "<= 16777216"]),
    "train: grad_accum_steps 1e12": (lambda w: train(w, "grad_accum_steps=1000000000000"), 2,
                                     ["grad_accum_steps=", "<= 1048576"]),
    "train: shuffle_buffer 1e11": (lambda w: train(w, "data.shuffle_buffer=1e11"), 2,
                                   ["data.shuffle_buffer=", "<= 16777216", "in memory"]),
    # init_from: Hugging Face folders that lie, are cut, or are not weights: refused before MindSpore
    "init_from: config.json 3 layers, weights 2": (lambda w: init_from(w, "hf_lie_layers"), 2,
                                                   ["num_hidden_layers=3 where the weights hold 2", "fix config.json"]),
    "init_from: config.json 1 layer, weights 3": (lambda w: init_from(w, "hf_lie_fewer"), 2,
                                                  ["num_hidden_layers=1 where the weights hold 3"]),
    "init_from: config.json width 64, weights 32": (lambda w: init_from(w, "hf_lie_width"), 2,
                                                    ["hidden_size=64 where the weights hold 32"]),
    "init_from: GPT-2 config.json 3 layers": (lambda w: init_from(w, "hf_lie_gpt2"), 2,
                                              ["n_layer=3 where the weights hold 2"]),
    "init_from: config.json cut short": (lambda w: init_from(w, "hf_config_cut"), 2,
                                         ["config.json cannot be read", "restore the file"]),
    "init_from: config.json a list": (lambda w: init_from(w, "hf_config_list"), 2,
                                      ["config.json is a JSON list", "restore the file"]),
    "init_from: model_type bert": (lambda w: init_from(w, "hf_bert"), 2, ["model_type=", "bert"]),
    "init_from: int32 tensors": (lambda w: init_from(w, "hf_ints"), 2, ["I32", "model.safetensors"]),
    "init_from: folder without weights": (lambda w: init_from(w, "hf_empty"), 2, ["model.safetensors"]),
    "init_from: model does not match": (lambda w: init_from(w, "hf_mismatch"), 2,
                                        ["LLaMA checkpoint", "set model.norm=rmsnorm"]),
    "init_from: relu activation": (lambda w: init_from(w, "hf_relu"), 2, ["activation_function", "relu"]),
    "init_from: unknown layout": (lambda w: init_from(w, "hf_unknown_layout"), 2, ["unknown_layout"]),
    "init_from: not a safetensors file": (lambda w: init_from(w, "hf_garbage"), 2, ["model.safetensors"]),
    "init_from: safetensors cut short": (lambda w: init_from(w, "hf_cut"), 2, ["model.safetensors"]),
    "init_from: index names a missing shard": (lambda w: init_from(w, "hf_index_missing_shard"), 2,
                                               ["model-00001-of-00002.safetensors"]),
    "init_from: a text file": (lambda w: init_from(w, "hf_a_text_file"), 2, ["weights.txt"]),
    "init_from: matching settings, lying config.json": (lambda w: init_from(w, "hf_lie_layers", *LLAMA_SETS), 2,
                                                        ["num_hidden_layers=3 where the weights hold 2"]),
    # prepare
    "prepare: data.format mindrecord": (lambda w: prepare(w, f"data.corpus={w['corpus']}", "data.format=mindrecord"),
                                        2, ["data.format", "data.format=text"]),
    "prepare: shuffle_buffer 1e11": (lambda w: prepare(w, f"data.corpus={w['corpus']}", "data.shuffle_buffer=1e11"),
                                     2, ["data.shuffle_buffer=", "<= 16777216"]),
    "prepare: empty corpus": (lambda w: prepare(w, f"data.corpus={w['empty_corpus']}"), 2, ["empty.txt"]),
    "prepare: binary corpus": (lambda w: prepare(w, f"data.corpus={w['binary_corpus']}"), 2,
                               ["binary.txt", "UTF-8"]),
    "prepare: corpus a folder": (lambda w: prepare(w, f"data.corpus={w['tmp'] / 'hf'}"), 2, ["hf"]),
    "prepare: --out under a file": (lambda w: prepare(w, f"data.corpus={w['corpus']}", out="afile.txt/mr"), 2,
                                    ["afile.txt"]),
    "prepare: seq_len 1e12": (lambda w: prepare(w, f"data.corpus={w['corpus']}", "model.seq_len=1000000000000"), 2,
                              ["model.seq_len=", "<= 1073741824"]),
    # workbook --params
    "workbook: params not UTF-8": (lambda w: workbook(w, "params_not_utf8.yaml"), 2, ["params_not_utf8.yaml"]),
    "workbook: params a scalar": (lambda w: workbook(w, "params_scalar.yaml"), 2, ["mapping"]),
    "workbook: params steps a word": (lambda w: workbook(w, "params_steps_word.yaml"), 2,
                                      ["steps='many'", "whole number"]),
    "workbook: params preset a list": (lambda w: workbook(w, "params_preset_list.yaml"), 2, ["preset"]),
    "workbook: params not YAML": (lambda w: workbook(w, "params_broken.yaml"), 2, ["params_broken.yaml"]),
    "workbook: params notebook typo": (lambda w: workbook(w, "params_notebook_typo.yaml"), 2,
                                       ["01_baselin", "did you mean"]),
    "workbook: params duplicate key": (lambda w: workbook(w, "params_dup.yaml"), 2, ["steps", "line"]),
}
KEPT = {"import-config: --out under a file": "afile", "prepare: --out under a file": "afile",
        "init_from: config.json 3 layers, weights 2": "hf_lie_layers", "init_from: safetensors cut short": "hf_cut"}


def one_line(proc: subprocess.CompletedProcess, code: int, words: list[str]) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error: ")]
    assert proc.returncode == code, proc.stderr[-3000:]
    assert len(errors) == 1 and len(lines) == 1, lines
    assert "unexpectedly" not in errors[0] and "Traceback" not in proc.stderr, errors
    for word in words:
        assert word in errors[0], errors[0]
    return errors[0]


def test_the_sweep_is_wide():
    assert len(CASES) + len(RESUME_CASES) >= 40
    assert {name.split(":")[0] for name in [*CASES, *RESUME_CASES]} >= {"import-config", "init_from", "resume",
                                                                        "prepare", "workbook"}


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_is_one_actionable_line(name, world):
    argv, code, words = CASES[name]
    kept = world[KEPT[name]] if name in KEPT else None
    before = snapshot(kept) if kept is not None and kept.is_dir() else kept.read_bytes() if kept else None
    proc = run_cli(*argv(world), timeout=120)
    left = [name for name in NOTHING if (world["tmp"] / name).exists()]
    for name in left:  # not to spoil the next case
        path = world["tmp"] / name
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    one_line(proc, code, words)
    assert left == [], f"written: {left}"
    if kept is not None:
        assert (snapshot(kept) if kept.is_dir() else kept.read_bytes()) == before


# ------------------------------------------------------------------------------------------- resume (one run)

@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """One finished 5-step run, another run beside it, and copies of the first with one file edited or cut."""
    tmp = tmp_path_factory.mktemp("resume_58")
    corpus = tmp / "corpus.txt"
    corpus.write_text(make_text(3000), encoding="utf-8")
    r = {"tmp": tmp}
    for name in ("finished", "other"):
        proc = run_cli("train", *tiny_args(corpus, 5), "--out", str(tmp / name), "--progress", "none")
        assert proc.returncode == 0, proc.stderr[-2000:]
        r[name] = tmp / name

    def copy(name: str, file: str, content: bytes | None = None, append: bytes = b"") -> None:
        r[name] = tmp / name
        shutil.copytree(r["finished"], r[name])
        path = r[name] / file
        path.chmod(0o644)
        path.write_bytes((path.read_bytes() if content is None else content) + append)
    copy("config_unknown_key", "config.yaml", append=b"stpes: 3\n")
    copy("config_wrong_type", "config.yaml", (r["finished"] / "config.yaml").read_bytes().replace(
        b"\nsteps: 5\n", b"\nsteps: five\n"))
    copy("config_not_yaml", "config.yaml", b"steps: [\n")
    copy("summary_cut", "summary.json", (r["finished"] / "summary.json").read_bytes()[:120])
    copy("summary_empty", "summary.json", b"")
    copy("summary_not_utf8", "summary.json", b'{"status": "ok\xff"}')
    copy("summary_garbage", "summary.json", b'{"status": "ok",\n "steps": x}\n')
    copy("env_cut", "env.json", (r["finished"] / "env.json").read_bytes()[:30])
    ckpt = sorted((r["finished"] / "checkpoints").glob("step_*.ckpt"))[-1]
    copy("ckpt_empty", f"checkpoints/{ckpt.name}", b"")
    r["ckpt"] = ckpt
    return r


def resume(r, run: str, *extra: str) -> list[str]:
    return ["resume", str(r[run]), "--steps", "10", *extra]


# name: (argv from the runs, exit status, words, the run folder that must be unchanged)
RESUME_CASES = {
    "resume: config.yaml with a hand-added key": (lambda r: resume(r, "config_unknown_key"), 2,
                                                  ["config.yaml", "unknown config key 'stpes'", "restore config.yaml",
                                                   "--replace"], "config_unknown_key"),
    "resume: config.yaml with a wrong type": (lambda r: resume(r, "config_wrong_type"), 2,
                                              ["config.yaml", "steps='five'", "restore config.yaml", "--replace"],
                                              "config_wrong_type"),
    "resume: config.yaml not YAML": (lambda r: resume(r, "config_not_yaml"), 2,
                                     ["config.yaml", "not valid YAML", "--replace"], "config_not_yaml"),
    "resume: summary.json cut short": (lambda r: resume(r, "summary_cut"), 2,
                                       ["summary.json", "cut short", "line", "restore summary.json", "--replace"],
                                       "summary_cut"),
    "resume: summary.json empty": (lambda r: resume(r, "summary_empty"), 2,
                                   ["summary.json", "cut short", "--replace"], "summary_empty"),
    "resume: summary.json not UTF-8": (lambda r: resume(r, "summary_not_utf8"), 2,
                                       ["summary.json", "UTF-8", "--replace"], "summary_not_utf8"),
    "resume: summary.json not JSON": (lambda r: resume(r, "summary_garbage"), 2,
                                      ["summary.json", "not JSON at line 2", "--replace"], "summary_garbage"),
    "resume: env.json cut short": (lambda r: resume(r, "env_cut"), 2, ["env.json", "cut short", "--replace"],
                                   "env_cut"),
    "show: config.yaml with a wrong type": (lambda r: ["show", str(r["config_wrong_type"])], 2,
                                            ["config.yaml", "steps='five'", "--replace"], "config_wrong_type"),
    "resume: --checkpoint of another run": (lambda r: resume(r, "finished", "--checkpoint",
                                                             str(r["other"] / "checkpoints" / r["ckpt"].name)), 2,
                                            ["--checkpoint", "is not one of the checkpoints", "pass one of them"],
                                            "finished"),
    "resume: --checkpoint missing path": (lambda r: resume(r, "finished", "--checkpoint",
                                                           str(r["tmp"] / "nowhere" / "step_000009.ckpt")), 2,
                                          ["step_000009.ckpt", "is not one of the checkpoints"], "finished"),
    "resume: --checkpoint a folder": (lambda r: resume(r, "finished", "--checkpoint",
                                                       str(r["finished"] / "checkpoints")), 2,
                                      ["is not one of the checkpoints"], "finished"),
    "resume: --checkpoint the run's config": (lambda r: resume(r, "finished", "--checkpoint",
                                                               str(r["finished"] / "config.yaml")), 2,
                                              ["config.yaml", "is not one of the checkpoints"], "finished"),
    "resume: --checkpoint of a finished run": (lambda r: ["resume", str(r["finished"]), "--checkpoint",
                                                          r["ckpt"].name], 2, ["is finished", "--steps"], "finished"),
    "resume: empty checkpoint file": (lambda r: resume(r, "ckpt_empty"), 2, [r"step_"], "ckpt_empty"),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(RESUME_CASES))
def test_bad_resume_is_one_actionable_line(name, runs):
    argv, code, words, kept = RESUME_CASES[name]
    before = snapshot(runs[kept])
    one_line(run_cli(*argv(runs), timeout=120), code, words)
    assert snapshot(runs[kept]) == before


# ---------------------------------------------------------------------------------------------- a full disk

@pytest.fixture
def small_disk(tmp_path):
    with small_tmpfs(tmp_path / "small", "1m") as folder:
        yield folder


@pytest.fixture
def tiny_disk(tmp_path):
    """64 KiB: less than the debug model's export (0.2 MB)."""
    with small_tmpfs(tmp_path / "small", "64k") as folder:
        yield folder


@pytest.mark.ci_required  # needs root to mount the tmpfs: CI runs as root, so a skip there is a failure
def test_prepare_onto_a_full_disk_is_one_line_saying_how_much(small_disk, world):
    proc = run_cli(*prepare(world, f"data.corpus={world['corpus']}", out="unused"), "--out", str(small_disk / "mr"))
    line = one_line(proc, 2, ["disk full", "small/mr", "needs about", "MB", "free disk space"])
    assert "MB were free" in line and list(small_disk.iterdir()) == []


@pytest.mark.ci_required
def test_prepare_filling_the_disk_while_writing_is_one_line(small_disk, world):
    """The check before writing passed (as where free space is misreported): MindSpore's writer then fails in its own
    words ("No free disk to be used"), which read "failed unexpectedly" before. In a process of its own: MindSpore
    keeps a file of the mount open while it lives."""
    import os
    import sys
    big = world["tmp"] / "big.txt"
    big.write_text(make_text(300_000), encoding="utf-8")
    script = ("import sys; from helpers.run import to_mindrecord; to_mindrecord.free_bytes = lambda f: 1 << 40; "
              "from helpers.cli import main; sys.exit(main(sys.argv[1:]))")
    argv = ["prepare", "--to", "mindrecord", "--set", "model.preset=debug", "--set", f"data.corpus={big}", "--out",
            str(small_disk / "mr")]
    env = dict(os.environ, GLOG_v="3", PYTHONPATH=str(REPO), WORKBOOK_DATA_CACHE=str(world["tmp"] / "cache"))
    proc = subprocess.run([sys.executable, "-c", script, *argv], capture_output=True, text=True, timeout=300,
                          cwd=REPO, env=env)
    one_line(proc, 2, ["disk full", "small/mr", "needs about", "MB", "free disk space"])
    assert list(small_disk.iterdir()) == []


@pytest.mark.slow
@pytest.mark.ci_required
def test_export_onto_a_full_disk_is_one_line_and_leaves_nothing(tiny_disk, runs):
    proc = run_cli("export", str(runs["finished"]), "--out", str(tiny_disk / "hf"))
    line = one_line(proc, 2, ["No space left on device", "model.safetensors", "needs about", "MB", "free disk space"])
    assert "small/hf" in line and list(tiny_disk.iterdir()) == []


def test_export_write_that_fills_the_disk_is_a_record_error(tmp_path, monkeypatch):
    """safetensors' own error names no errno ("No space left on device (os error 28)"): the write is one RecordError
    line saying how much the export needs, and no half file stays."""
    import errno

    from helpers.config import from_dict
    from helpers.record import RecordError
    from helpers.run import hf_weights

    def full(tensors, filename, metadata=None):
        Path(filename).write_bytes(b"half")
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr("safetensors.numpy.save_file", full)
    m = from_dict({"model": {"preset": "debug", "vocab_size": VOCAB}}).model
    rng = np.random.default_rng(0)
    params = {"tok.embedding_table": rng.standard_normal((VOCAB, m.d_model)).astype(np.float32)}
    monkeypatch.setattr(hf_weights, "from_ours", lambda p, model: {"wte.weight": p["tok.embedding_table"]})
    monkeypatch.setattr(hf_weights, "hf_config", lambda model, vocab: {})
    with pytest.raises(RecordError) as err:
        hf_weights.write_checkpoint(tmp_path / "out", params, m)
    message = str(err.value)
    assert "No space left on device" in message and "needs about 1 MB" in message and "\n" not in message
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == []
