"""The speed-record levers against plain NumPy references on small inputs, and a short real run of each:
Newton–Schulz (Muon), rotary positions, QK-norm, ReLU², zero-initialised projections, the logit soft-cap and the
warm-up–stable–decay schedule."""
from __future__ import annotations

import math

import numpy as np
import pytest

from helpers.config import ConfigError, from_dict
from helpers.record import load_run
from helpers.run.schedule import lr_at
from helpers.tune.study import base_config
from tests.conftest import mindspore_on_cpu

RNG = np.random.default_rng(7)


@pytest.fixture(scope="module", autouse=True)
def graph_mode():
    mindspore_on_cpu()


def _t(a):
    import mindspore as ms
    return ms.Tensor(np.asarray(a, np.float32))


# ----------------------------------------------------------------------------------------- NumPy references

def ns_reference(g: np.ndarray, steps: int) -> np.ndarray:
    """Newton–Schulz as the Muon write-ups give it, in float64: normalise, iterate the quintic on the wide side."""
    a, b, c = 3.4445, -4.7750, 2.0315
    x = g.astype(np.float64)
    flip = x.shape[0] > x.shape[1]
    x = x.T if flip else x
    x = x / (np.linalg.norm(x) + 1e-7)
    for _ in range(steps):
        m = x @ x.T
        x = a * x + (b * m + c * m @ m) @ x
    return x.T if flip else x


def rope_reference(x: np.ndarray, theta: float) -> np.ndarray:
    """Rotary embedding as complex numbers: dimension i and i + d/2 of position p form one number, times
    exp(1j · p · theta^(-2i/d)). x: [..., T, d]."""
    d = x.shape[-1]
    z = x[..., : d // 2] + 1j * x[..., d // 2:]
    angle = np.arange(x.shape[-2])[:, None] * theta ** (-np.arange(0, d, 2) / d)[None, :]
    z = z * np.exp(1j * angle)
    return np.concatenate([z.real, z.imag], axis=-1)


# --------------------------------------------------------------------------------------------- math

@pytest.mark.parametrize("shape", [(16, 48), (48, 16)])
def test_newton_schulz_matches_the_reference_and_is_near_orthogonal(shape):
    from helpers.run.muon import newton_schulz
    g = RNG.standard_normal(shape)
    got = newton_schulz(_t(g), 5).asnumpy()
    np.testing.assert_allclose(got, ns_reference(g, 5), atol=2e-4)
    singular = np.linalg.svd(got, compute_uv=False)
    assert singular.min() > 0.5 and singular.max() < 1.3  # the quintic's band around 1, not exactly 1
    wide = got if shape[0] <= shape[1] else got.T
    assert np.abs(wide @ wide.T - np.eye(wide.shape[0])).max() < 0.8
    assert np.linalg.norm(g) > 10 and np.linalg.norm(got) < math.sqrt(min(shape)) * 1.3  # the scale is gone


def test_rotary_matches_complex_rotation_keeps_norms_and_depends_on_relative_position():
    from helpers.run.model import Rotary
    head, seq, theta = 8, 12, 10000.0
    x = RNG.standard_normal((2, 3, seq, head))
    got = Rotary(head, seq, theta)(_t(x)).asnumpy()
    np.testing.assert_allclose(got, rope_reference(x, theta), atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(got, axis=-1), np.linalg.norm(x, axis=-1), rtol=1e-5)
    q, k = RNG.standard_normal(head), RNG.standard_normal(head)
    rot = Rotary(head, seq, theta)
    qs = rot(_t(np.broadcast_to(q, (1, 1, seq, head)).copy())).asnumpy()[0, 0]
    ks = rot(_t(np.broadcast_to(k, (1, 1, seq, head)).copy())).asnumpy()[0, 0]
    # the score of positions (m, n) depends on m - n only
    np.testing.assert_allclose(qs[5] @ ks[2], qs[9] @ ks[6], rtol=1e-4)
    np.testing.assert_allclose(qs[3] @ ks[3], q @ k, rtol=1e-4)


def test_head_norm_gives_unit_rms_per_head():
    from helpers.run.model import HeadNorm
    x = RNG.standard_normal((2, 2, 5, 8)) * 7
    got = HeadNorm()(_t(x)).asnumpy()
    np.testing.assert_allclose(got, x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6), rtol=1e-5)


def _gpt(**model):
    from helpers.run.model import GPT
    cfg = from_dict({"model": {"preset": "debug", **model}}).model
    return GPT(cfg, 40, native=False), cfg


def test_relu2_mlp_is_the_square_of_relu():
    from helpers.run.model import MLP
    cfg = from_dict({"model": {"preset": "debug", "mlp": "relu2"}}).model
    mlp = MLP(cfg, 0.02, native=False)
    x = RNG.standard_normal((3, cfg.d_model))
    up_w, up_b = mlp.up.weight.asnumpy(), mlp.up.bias.asnumpy()
    down_w, down_b = mlp.down.weight.asnumpy(), mlp.down.bias.asnumpy()
    want = np.maximum(x @ up_w.T + up_b, 0) ** 2 @ down_w.T + down_b
    np.testing.assert_allclose(mlp(_t(x)).asnumpy(), want, rtol=1e-4, atol=1e-6)


def test_zero_initialised_projections_make_every_block_the_identity():
    net, cfg = _gpt(zero_init_proj=True)
    x = RNG.standard_normal((2, cfg.seq_len, cfg.d_model))
    for block in net.blocks:
        assert not block.attn.proj.weight.asnumpy().any() and not block.mlp.down.weight.asnumpy().any()
        np.testing.assert_allclose(block(_t(x)).asnumpy(), x, atol=1e-6)
    plain, _ = _gpt()
    assert plain.blocks[0].attn.proj.weight.asnumpy().std() > 1e-3


def test_logit_softcap_is_cap_tanh_of_the_plain_logits_and_rope_drops_the_position_table():
    import mindspore as ms
    capped, cfg = _gpt(logit_softcap=2.0, positions="rope")
    plain, _ = _gpt(positions="rope")
    assert capped.pos is None
    ms.load_param_into_net(plain, {p.name: p for p in capped.get_parameters()})
    idx = ms.Tensor(RNG.integers(0, 40, (2, cfg.seq_len)).astype(np.int32))
    plain.tok.embedding_table.set_data(plain.tok.embedding_table * 40)  # scaled so that the cap matters
    capped.tok.embedding_table.set_data(capped.tok.embedding_table * 40)
    raw, got = plain(idx).asnumpy(), capped(idx).asnumpy()
    assert np.abs(raw).max() > 2.0 and np.abs(got).max() <= 2.0 + 1e-4  # fp32 tanh rounds to 1 up there
    np.testing.assert_allclose(got, 2.0 * np.tanh(raw / 2.0), rtol=1e-4, atol=1e-5)


def test_wsd_schedule_warms_up_holds_then_decays_linearly_over_the_cooldown():
    cfg = from_dict({"steps": 100, "warmup": 10, "schedule": "wsd", "cooldown_frac": 0.3, "lr": 1e-3,
                     "min_lr": 1e-4})
    lrs = np.array([lr_at(cfg, s) for s in range(1, 101)])
    want = np.concatenate([np.arange(1, 11) / 10 * 1e-3, np.full(60, 1e-3),
                           1e-4 + (1 - np.arange(1, 31) / 30) * 9e-4])
    np.testing.assert_allclose(lrs, want, rtol=1e-9)
    # Muon's list has the same shape at its own peak
    np.testing.assert_allclose([lr_at(cfg, s, 0.02) for s in (5, 50, 100)], [0.01, 0.02, 0.002], rtol=1e-9)


def test_one_muon_step_updates_hidden_weights_by_the_orthogonalised_momentum_and_the_rest_by_adamw():
    import mindspore as ms
    from mindspore import ParameterTuple, ops
    from helpers.run.muon import hidden_weights
    from helpers.run.step import make_muon
    net, cfg = _gpt()
    opt = make_muon(net, 1e-3, 0.05, 0.0, [0.9, 0.99], 1e-8, 0.95, 5)
    params = list(opt.parameters)
    hidden = {p.name for p in hidden_weights(net.trainable_params())}
    assert {p.name for p in params[:len(hidden)]} == hidden and "tok.embedding_table" not in hidden
    assert all(p.ndim == 2 for p in params[:len(hidden)]) and len(params) == len(net.trainable_params())
    before = {p.name: p.asnumpy().copy() for p in params}
    grads = tuple(ms.Tensor(RNG.standard_normal(p.shape).astype(np.float32)) for p in params)

    class Apply(ms.nn.Cell):
        def __init__(self, o):
            super().__init__(auto_prefix=False)
            self.o = o

        def construct(self, g):
            return self.o(g)
    Apply(opt)(grads)
    for p, g in zip(params, grads):
        delta = p.asnumpy() - before[p.name]
        if p.name in hidden:  # buffer 0 → buf = g, Nesterov step g + 0.95 g
            scale = max(1.0, p.shape[0] / p.shape[1]) ** 0.5
            want = -0.05 * scale * ns_reference(g.asnumpy() * 1.95, 5)
            np.testing.assert_allclose(delta, want, atol=2e-5, err_msg=p.name)
        else:
            assert np.abs(delta).max() > 0, p.name  # AdamW moved it
    buf = {b.name: b.asnumpy() for b in opt.buffers}
    assert len(buf) == len(hidden) and all(np.abs(v).max() > 0 for v in buf.values())
    assert opt.muon_learning_rate.shape == () and float(opt.muon_learning_rate.asnumpy()) == pytest.approx(0.05)


def test_the_levers_are_checked_before_training():
    with pytest.raises(ConfigError, match="model.positions=rope turns pairs .* head size d_model/n_head = 3 is odd"):
        from_dict({"model": {"preset": "custom", "d_model": 6, "n_head": 2, "positions": "rope"}})
    with pytest.raises(ConfigError, match="model.build='m:f' is your own network: the workbook's model levers"):
        from_dict({"model": {"build": "m:f", "qk_norm": True}})
    with pytest.raises(ConfigError, match="optimizer"):
        from_dict({"optimizer": "sgd"})
    with pytest.raises(ConfigError, match="cooldown_frac"):
        from_dict({"cooldown_frac": 0.0})


# ------------------------------------------------------------------------------------------ real runs

# Each lever in a real run, grouped into two runs to keep the suite short (each run is seconds of compile): the
# recipe levers (optimizer, schedule) in one, the architecture levers in the other.
LEVERS = {"recipe": {"optimizer": "muon", "schedule": "wsd", "cooldown_frac": 0.4},
          "architecture": {"model.positions": "rope", "model.qk_norm": True, "model.mlp": "relu2",
                           "model.zero_init_proj": True, "model.logit_softcap": 15.0, "model.n_kv_head": 1,
                           "model.qkv_bias": True, "model.rope_scaling": "linear", "model.rope_scaling_factor": 2.0}}


@pytest.mark.slow
@pytest.mark.parametrize("lever", LEVERS)
def test_every_lever_trains(tmp_path, small_corpus, lever):
    from helpers.run.train import train
    cfg = base_config("debug", 20, str(small_corpus), {"warmup": 3, "eval_every": 0, "eval_batches": 2,
                                                      "steady_after": 2, "threads": 1, **LEVERS[lever]})
    train(cfg, tmp_path / lever)
    record = load_run(tmp_path / lever)
    losses = [r["loss"] for r in record.metrics]
    assert record.status == "ok" and all(np.isfinite(losses)), record.summary.get("status_reason")
    assert np.mean(losses[-4:]) < losses[0] - 0.4, losses
    for key, value in LEVERS[lever].items():
        section, _, name = key.rpartition(".")
        assert getattr(getattr(record.config, section) if section else record.config, name) == value
