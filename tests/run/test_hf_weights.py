"""Hugging Face weights (init_from, export): a GPT-2-layout safetensors file in the workbook's model gives the logits
of an independent NumPy forward of the same weights; export → import is the identity; bad files get one line."""
from __future__ import annotations

import json

import numpy as np
import pytest
from safetensors.numpy import save_file

from helpers.config import from_dict
from helpers.run.hf_weights import WeightsError, load_into, model_settings, read_tensors, write_checkpoint
from helpers.record import load_run
from tests.conftest import mindspore_on_cpu, run_cli, tiny_args

VOCAB, LAYERS, HEADS, D, SEQ = 40, 2, 2, 32, 16


def gpt2_tensors(n_positions: int = 24, seed: int = 0) -> dict[str, np.ndarray]:
    """Random GPT-2 weights in Hugging Face names and layouts (Conv1D [in, out]), float32."""
    rng = np.random.default_rng(seed)

    def w(*shape, scale=0.2):
        return (rng.standard_normal(shape) * scale).astype(np.float32)
    t = {"wte.weight": w(VOCAB, D, scale=0.5), "wpe.weight": w(n_positions, D), "ln_f.weight": 1 + w(D),
         "ln_f.bias": w(D)}
    for i in range(LAYERS):
        p = f"h.{i}."
        t.update({p + "ln_1.weight": 1 + w(D), p + "ln_1.bias": w(D), p + "ln_2.weight": 1 + w(D),
                  p + "ln_2.bias": w(D), p + "attn.c_attn.weight": w(D, 3 * D), p + "attn.c_attn.bias": w(3 * D),
                  p + "attn.c_proj.weight": w(D, D), p + "attn.c_proj.bias": w(D),
                  p + "mlp.c_fc.weight": w(D, 4 * D), p + "mlp.c_fc.bias": w(4 * D),
                  p + "mlp.c_proj.weight": w(4 * D, D), p + "mlp.c_proj.bias": w(D)})
    return t


def gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def reference_logits(t: dict[str, np.ndarray], ids: np.ndarray, act=gelu_tanh) -> np.ndarray:
    """GPT-2's forward in float64 NumPy, written from the paper/reference code, not from the workbook's model (act:
    the MLP's activation, GPT-2's tanh GELU unless given)."""
    t = {k: v.astype(np.float64) for k, v in t.items()}

    def ln(x, name):
        mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + 1e-5) * t[name + ".weight"] + t[name + ".bias"]
    b, s = ids.shape
    hd = D // HEADS
    x = t["wte.weight"][ids] + t["wpe.weight"][:s]
    causal = np.triu(np.ones((s, s), bool), k=1)
    for i in range(LAYERS):
        p = f"h.{i}."
        qkv = ln(x, p + "ln_1") @ t[p + "attn.c_attn.weight"] + t[p + "attn.c_attn.bias"]
        q, k, v = (a.reshape(b, s, HEADS, hd).transpose(0, 2, 1, 3) for a in np.split(qkv, 3, axis=-1))
        scores = np.where(causal, -np.inf, q @ k.transpose(0, 1, 3, 2) / np.sqrt(hd))
        att = np.exp(scores - scores.max(-1, keepdims=True))
        att /= att.sum(-1, keepdims=True)
        y = (att @ v).transpose(0, 2, 1, 3).reshape(b, s, D)
        x = x + y @ t[p + "attn.c_proj.weight"] + t[p + "attn.c_proj.bias"]
        h = act(ln(x, p + "ln_2") @ t[p + "mlp.c_fc.weight"] + t[p + "mlp.c_fc.bias"])
        x = x + h @ t[p + "mlp.c_proj.weight"] + t[p + "mlp.c_proj.bias"]
    return (ln(x, "ln_f") @ t["wte.weight"].T).reshape(b * s, VOCAB)


def model_cfg(**model):
    return from_dict({"model": {"preset": "custom", "n_layer": LAYERS, "n_head": HEADS, "d_model": D,
                                "seq_len": SEQ, "vocab_size": VOCAB, "mlp": "gelu_tanh", **model}}).model


@pytest.fixture(scope="module", autouse=True)
def pynative():
    mindspore_on_cpu("pynative")


def gpt(m, native=False):
    import mindspore as ms
    from helpers.run.model import GPT
    ms.set_seed(0)
    return GPT(m, VOCAB, native)


def params_of(net) -> dict[str, np.ndarray]:
    return {p.name: p.asnumpy() for p in net.get_parameters()}


@pytest.mark.parametrize("native", [False, True], ids=["mindspore_ops", "native_kernels"])
def test_gpt2_file_loads_and_logits_match_a_numpy_forward(tmp_path, native):
    import mindspore as ms
    from helpers.run import kernels
    if native and kernels.library_problem():
        pytest.skip(kernels.library_problem())
    t = gpt2_tensors()
    # as the Hugging Face hub stores GPT-2: causal-mask buffers beside the weights, and the tied head written out
    extra = {f"h.{i}.attn.bias": np.tril(np.ones((1, 1, 24, 24), np.float32)) for i in range(LAYERS)}
    save_file({**t, **extra, "lm_head.weight": t["wte.weight"]}, str(tmp_path / "model.safetensors"))
    net = gpt(model_cfg(), native)
    loaded = load_into(net, model_cfg(), str(tmp_path))
    assert (loaded.layout, loaded.tensors, loaded.positions) == ("GPT-2", 4 + 12 * LAYERS, (SEQ, 24))
    ids = np.random.default_rng(1).integers(0, VOCAB, (3, SEQ)).astype(np.int32)
    got = net(ms.Tensor(ids)).asnumpy()
    want = reference_logits(t, ids)
    assert np.abs(got - want).max() < 1e-4
    assert np.abs(want).max() > 1.0  # the weights make real logits, not a near-zero output that matches anything


def test_export_then_import_is_the_identity(tmp_path):
    original = {"transformer." + k: v for k, v in gpt2_tensors(n_positions=SEQ).items()}
    save_file(original, str(tmp_path / "in.safetensors"))
    net = gpt(model_cfg())
    load_into(net, model_cfg(), str(tmp_path / "in.safetensors"))
    written = write_checkpoint(tmp_path / "out", params_of(net), model_cfg())
    back = read_tensors(written)
    assert sorted(back) == sorted(original)
    assert all(np.array_equal(back[k], original[k]) for k in original)
    settings = json.loads((tmp_path / "out" / "config.json").read_text())
    assert (settings["n_layer"], settings["n_embd"], settings["activation_function"]) == (LAYERS, D, "gelu_new")
    wanted = model_settings(tmp_path / "out")  # what a config needs to start from the folder
    assert {k: wanted[k] for k in ("model.n_layer", "model.n_head", "model.d_model", "model.vocab_size",
                                   "model.mlp")} == {"model.n_layer": LAYERS, "model.n_head": HEADS,
                                                     "model.d_model": D, "model.vocab_size": VOCAB,
                                                     "model.mlp": "gelu_tanh"}
    again = gpt(model_cfg())  # and our parameters survive the round trip the other way
    load_into(again, model_cfg(), str(tmp_path / "out"))
    assert all(np.array_equal(v, params_of(net)[k]) for k, v in params_of(again).items())


def _refusal(tmp_path, tensors, m=None, settings=None) -> str:
    tmp_path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    if settings is not None:
        (tmp_path / "config.json").write_text(json.dumps(settings))
    m = m or model_cfg()
    with pytest.raises(WeightsError) as err:
        load_into(gpt(m), m, str(tmp_path))
    message = str(err.value)
    assert "\n" not in message
    return message


HIDDEN = 48  # LLaMA's intermediate_size: not the model's own SwiGLU width for D (88), so model.mlp_hidden carries it


def llama_tensors(seed: int = 0, layers: int = LAYERS, kv_heads: int = HEADS) -> dict[str, np.ndarray]:
    """Random LLaMA weights in Hugging Face names and layouts (Linear [out, in], an untied head), float32."""
    rng = np.random.default_rng(seed)

    def w(*shape, scale=0.2):
        return (rng.standard_normal(shape) * scale).astype(np.float32)
    t = {"model.embed_tokens.weight": w(VOCAB, D, scale=0.5), "model.norm.weight": 1 + w(D),
         "lm_head.weight": w(VOCAB, D, scale=0.5)}
    kv = kv_heads * D // HEADS
    for i in range(layers):
        p = f"model.layers.{i}."
        t.update({p + "input_layernorm.weight": 1 + w(D), p + "post_attention_layernorm.weight": 1 + w(D),
                  **{p + f"self_attn.{n}_proj.weight": w(D, D) for n in "qo"},
                  **{p + f"self_attn.{n}_proj.weight": w(kv, D) for n in "kv"},
                  p + "mlp.gate_proj.weight": w(HIDDEN, D), p + "mlp.up_proj.weight": w(HIDDEN, D),
                  p + "mlp.down_proj.weight": w(D, HIDDEN)})
    return t


LLAMA_CONFIG = {"model_type": "llama", "hidden_size": D, "intermediate_size": HIDDEN, "num_hidden_layers": LAYERS,
                "num_attention_heads": HEADS, "num_key_value_heads": HEADS, "vocab_size": VOCAB, "rms_norm_eps": 1e-5,
                "rope_theta": 500.0, "tie_word_embeddings": False, "max_position_embeddings": 64}


def reference_llama_logits(t: dict[str, np.ndarray], ids: np.ndarray, eps: float, theta: float) -> np.ndarray:
    """LLaMA's forward in float64 NumPy (RMSNorm, rotary q/k as complex numbers over the two halves of each head,
    causal attention, SwiGLU, untied head), written from the paper and Hugging Face's description."""
    t = {k.removeprefix("model."): v.astype(np.float64) for k, v in t.items()}

    def rms(x, name):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * t[name + ".weight"]

    def rotate(x):  # [b, h, s, hd]: dims j and j + hd/2 form one complex number, turned by position × freq_j
        hd = x.shape[-1]
        z = (x[..., : hd // 2] + 1j * x[..., hd // 2:]) * np.exp(
            1j * np.arange(x.shape[-2])[:, None] * theta ** (-np.arange(0, hd, 2) / hd))
        return np.concatenate([z.real, z.imag], -1)
    b, s = ids.shape
    hd = D // HEADS
    x = t["embed_tokens.weight"][ids]
    causal = np.triu(np.ones((s, s), bool), k=1)
    for i in range(LAYERS):
        p = f"layers.{i}."
        h = rms(x, p + "input_layernorm")
        q, k, v = (((h @ t[p + f"self_attn.{n}_proj.weight"].T).reshape(b, s, HEADS, hd)).transpose(0, 2, 1, 3)
                   for n in "qkv")
        q, k = rotate(q), rotate(k)
        scores = np.where(causal, -np.inf, q @ k.transpose(0, 1, 3, 2) / np.sqrt(hd))
        att = np.exp(scores - scores.max(-1, keepdims=True))
        att /= att.sum(-1, keepdims=True)
        x = x + (att @ v).transpose(0, 2, 1, 3).reshape(b, s, D) @ t[p + "self_attn.o_proj.weight"].T
        h = rms(x, p + "post_attention_layernorm")
        gate = h @ t[p + "mlp.gate_proj.weight"].T
        x = x + (gate / (1 + np.exp(-gate)) * (h @ t[p + "mlp.up_proj.weight"].T)) @ t[p + "mlp.down_proj.weight"].T
    return (rms(x, "norm") @ t["lm_head.weight"].T).reshape(b * s, VOCAB)


def _llama_folder(folder, tensors=None, **settings):
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors or llama_tensors(), str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps({**LLAMA_CONFIG, **settings}))
    return folder


def _llama_model(folder):
    from helpers.config import with_changes
    cfg = from_dict({"model": {"seq_len": SEQ}})
    return with_changes(cfg, {**model_settings(folder), "model.seq_len": SEQ}).model


def test_llama_file_loads_and_logits_match_a_numpy_forward(tmp_path):
    import mindspore as ms
    folder = _llama_folder(tmp_path / "llama")
    m = _llama_model(folder)
    assert (m.norm, m.mlp, m.positions, m.qkv, m.bias, m.tie_head, m.ffn_hidden, m.rms_eps, m.rope_theta) == (
        "rmsnorm", "swiglu", "rope", "separate", False, False, HIDDEN, 1e-5, 500.0)
    net = gpt(m)
    loaded = load_into(net, m, str(folder))
    assert (loaded.layout, loaded.tensors, loaded.positions) == ("LLaMA", 3 + 9 * LAYERS, (SEQ, 64))
    ids = np.random.default_rng(2).integers(0, VOCAB, (3, SEQ)).astype(np.int32)
    got = net(ms.Tensor(ids)).asnumpy()
    want = reference_llama_logits(llama_tensors(), ids, 1e-5, 500.0)
    assert np.abs(got - want).max() < 1e-4 and np.abs(want).max() > 1.0


def test_llama_export_then_import_is_the_identity(tmp_path):
    folder = _llama_folder(tmp_path / "in")
    m = _llama_model(folder)
    net = gpt(m)
    load_into(net, m, str(folder))
    written = write_checkpoint(tmp_path / "out", params_of(net), m)
    back, original = read_tensors(written), llama_tensors()
    assert sorted(back) == sorted(original) and all(np.array_equal(back[k], original[k]) for k in original)
    settings = json.loads((tmp_path / "out" / "config.json").read_text())
    assert {k: settings[k] for k in LLAMA_CONFIG if k != "max_position_embeddings"} == {
        k: v for k, v in LLAMA_CONFIG.items() if k != "max_position_embeddings"}


def test_llama_files_the_model_cannot_take_are_refused_in_one_line(tmp_path):
    m = _llama_model(_llama_folder(tmp_path / "ok"))
    message = _refusal(tmp_path / "theta", llama_tensors(), m, settings={**LLAMA_CONFIG, "rope_theta": 10000.0})
    assert message.endswith("the model must match it: set model.rope_theta=10000.0")
    for rope, kind in (({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "yarn"),
                       ({"rope_scaling": {"type": "dynamic", "factor": 2.0}}, "dynamic"),
                       ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0}}, "llama3")):
        message = _refusal(tmp_path / kind, llama_tensors(), m, settings={**LLAMA_CONFIG, **rope})
        assert f'scales rotary positions with rope type "{kind}"' in message and "cannot be imported" in message
        with pytest.raises(WeightsError, match=f'rope type "{kind}"'):  # on import of its settings too
            model_settings(tmp_path / kind)
    for key, value, shown in (("hidden_act", "gelu", 'hidden_act="gelu" is not "silu", the value the workbook'),
                              ("attention_bias", True, "attention_bias=true is not false, the value the workbook"),
                              ("head_dim", 8, "head_dim=8 cannot be honoured (the workbook's heads are")):
        message = _refusal(tmp_path / key, llama_tensors(), m, settings={**LLAMA_CONFIG, key: value})
        assert "cannot be imported" in message and shown in message
    tied = _llama_model(_llama_folder(tmp_path / "tied", **{"tie_word_embeddings": True}))
    assert "differs from its token embedding" in _refusal(tmp_path / "untied", llama_tensors(), tied,
                                                          settings={**LLAMA_CONFIG, "tie_word_embeddings": True})


def test_key_and_shape_mismatches_are_listed_in_one_line(tmp_path):
    t = gpt2_tensors()
    del t["h.1.mlp.c_fc.bias"]
    t["h.0.attn.c_attn.weight"] = t["h.0.attn.c_attn.weight"][:, :D]
    t["h.9.ln_1.weight"] = np.ones(D, np.float32)
    message = _refusal(tmp_path, t)
    assert "key mismatch: unknown h.9.ln_1.weight, missing h.1.mlp.c_fc.bias" in message
    assert "shape mismatch: h.0.attn.c_attn.weight (32, 32) → blocks.0.attn.qkv.weight needs (96, 32)" in message


def test_vocabulary_of_another_size_is_named_to_set(tmp_path):
    t = gpt2_tensors()
    t["wte.weight"] = np.zeros((VOCAB + 3, D), np.float32)
    assert _refusal(tmp_path, t).endswith("set model.vocab_size=43")


def test_model_knobs_must_match_the_file(tmp_path):
    message = _refusal(tmp_path, gpt2_tensors(), model_cfg(mlp="gelu", norm="rmsnorm"),
                       settings={"activation_function": "gelu_new", "n_head": 4})
    assert message.endswith("set model.norm=layernorm model.n_head=4 model.mlp=gelu_tanh")


def test_a_model_in_neither_layout_is_not_exported(tmp_path):
    m = model_cfg(mlp="swiglu", norm="rmsnorm", bias=False)  # LLaMA-like, but learned positions and fused q,k,v
    with pytest.raises(WeightsError, match="has no Hugging Face layout: GPT-2 needs model.norm=layernorm"):
        write_checkpoint(tmp_path, params_of(gpt(m)), m)


def test_untied_head_and_unknown_layouts_are_refused(tmp_path):
    t = gpt2_tensors()
    assert "differs from its token embedding" in _refusal(tmp_path, {**t, "lm_head.weight": t["wte.weight"] + 1})
    assert "no layout the workbook knows" in _refusal(tmp_path, {"encoder.w": np.zeros(3, np.float32)})


@pytest.mark.slow
def test_training_continues_from_exported_weights(tmp_path, small_corpus):
    """A run → export (GPT-2 layout) → a new run with init_from: at lr ~0 its validation loss is the first run's,
    and a run from those weights starts at the first run's level, far below a fresh start."""
    first, folder, second = tmp_path / "a", tmp_path / "hf", tmp_path / "b"
    proc = run_cli("train", *tiny_args(small_corpus, 20), "--out", str(first), "--progress", "none")
    assert proc.returncode == 0, proc.stderr[-2000:]
    proc = run_cli("export", str(first), "--out", str(folder))
    assert proc.returncode == 0 and "model.safetensors" in proc.stdout, proc.stderr[-2000:]
    still = ["lr=1e-12", "min_lr=0", "warmup=0", f"init_from={folder}"]
    proc = run_cli("train", *tiny_args(small_corpus, 4, *still), "--out", str(second), "--progress", "none")
    assert proc.returncode == 0, proc.stderr[-2000:]
    a, b = load_run(first).summary, load_run(second).summary
    assert abs(b["val_loss"] - a["val_loss"]) < 1e-5
    assert b["loss_first"] < a["loss_first"] - 0.5
    assert b["init_from"]["layout"] == "GPT-2" and b["init_from"]["path"] == str(folder)


def test_a_mismatch_names_every_key_to_set_in_one_line(tmp_path):
    """Layers, k,v heads and the rotary base of transformers 5's rope_parameters, all in one line."""
    m = _llama_model(_llama_folder(tmp_path / "ok"))
    file = {k: v for k, v in LLAMA_CONFIG.items() if k != "rope_theta"}
    file.update(num_hidden_layers=3, num_key_value_heads=1,
                rope_parameters={"rope_type": "linear", "rope_theta": 5e5, "factor": 2.0})
    message = _refusal(tmp_path / "other", llama_tensors(layers=3, kv_heads=1), m, settings=file)
    assert message.endswith("the model must match it: set model.n_layer=3 model.n_kv_head=1 model.rope_theta=500000.0 "
                            "model.rope_scaling=linear model.rope_scaling_factor=2.0")


def test_rope_parameters_give_the_theta_and_scaling(tmp_path):
    """transformers 5 writes rope_theta inside rope_parameters only; before, such a file read as theta 10000."""
    file = {k: v for k, v in LLAMA_CONFIG.items() if k != "rope_theta"}
    folder = _llama_folder(tmp_path / "v5")
    (folder / "config.json").write_text(json.dumps({**file, "rope_parameters": {"rope_type": "default",
                                                                                 "rope_theta": 5e5}}))
    wanted = model_settings(folder)
    assert (wanted["model.rope_theta"], wanted["model.rope_scaling"]) == (5e5, "none")
    (folder / "config.json").write_text(json.dumps({**file, "rope_scaling": {"type": "linear", "factor": 4.0}}))
    wanted = model_settings(folder)  # no theta anywhere: Hugging Face's default
    assert (wanted["model.rope_theta"], wanted["model.rope_scaling"], wanted["model.rope_scaling_factor"]) == (
        10000.0, "linear", 4.0)
