"""Native kernels and formulation knobs against MindSpore's own ops, in graph mode, values and gradients.

Tolerances: native kernels match values to 1e-5 relative and gradients to 1e-4. The absolute floor on
GELU values (1e-6) is MindSpore's own rounding: its GeLU computes 1 + erf(x/√2) in fp32, which is a multiple of
6e-8 below x ≈ −5, so its tail values are quantised (0 or ±1.6e-7 at x = −5.5) while the kernel's erfc form is exact.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

from helpers.config import ConfigError, from_dict
from helpers.run import kernels
from tests.conftest import mindspore_on_cpu

_skip_unbuilt = pytest.mark.skipif("not built" in kernels.library_problem(),
                                   reason="native kernels not built (run `make kernels`; needs g++)")


def needs_library(test):
    """Skips without the built library (no g++); under CI (`make test` builds it) that skip fails the run."""
    return pytest.mark.ci_required(_skip_unbuilt(test))

RNG = np.random.default_rng(0)


@pytest.fixture(scope="module", autouse=True)
def graph_mode():
    mindspore_on_cpu()


def _values_and_grads(net, inputs, dout):
    """Forward output and the gradients of sum(out · dout) w.r.t. every input and every trainable parameter."""
    from mindspore import ParameterTuple, ops
    params = ParameterTuple(net.trainable_params())
    out = net(*inputs).asnumpy()
    grads = ops.GradOperation(get_all=True, get_by_list=bool(params), sens_param=True)
    got = grads(net, params)(*inputs, dout) if params else grads(net)(*inputs, dout)
    flat = [g.asnumpy() for part in (got if params else (got,)) for g in part]
    return out, flat


def _assert_close(a, b, rtol, atol=0.0, what=""):
    np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, err_msg=what)


def _tensor(*shape, scale=1.0, shift=0.0):
    import mindspore as ms
    return ms.Tensor((RNG.standard_normal(shape) * scale + shift).astype(np.float32))


def _ln(impl):
    from helpers.run.model import LayerNorm
    import mindspore as ms
    from mindspore import nn
    net = nn.LayerNorm((128,), epsilon=1e-5) if impl == "mindspore" else LayerNorm(128, 1e-5, impl)
    # non-trivial affine parameters, the same for every implementation
    net.gamma.set_data(ms.Tensor(np.linspace(0.5, 1.5, 128, dtype=np.float32)))
    net.beta.set_data(ms.Tensor(np.linspace(-0.2, 0.3, 128, dtype=np.float32)))
    return net


@needs_library
@pytest.mark.parametrize("impl, rtol, grad_tol", [("native", 1e-5, 1e-4), ("manual", 1e-6, 1e-4)])
def test_layernorm_matches_mindspore(impl, rtol, grad_tol):
    x, dout = _tensor(12, 64, 128, scale=3.0, shift=1.0), _tensor(12, 64, 128)
    ref_out, ref_grads = _values_and_grads(_ln("mindspore"), (x,), dout)
    out, grads = _values_and_grads(_ln(impl), (x,), dout)
    _assert_close(out, ref_out, rtol, 1e-6, f"{impl} LayerNorm values")
    assert len(grads) == len(ref_grads) == 3  # dx, dgamma, dbeta
    for name, g, r in zip(("dx", "dgamma", "dbeta"), grads, ref_grads):
        _assert_close(g, r, grad_tol, grad_tol * np.abs(r).max(), f"{impl} LayerNorm {name}")


def _gelu_net(kind):
    from mindspore import nn
    from helpers.run.model import make_gelu
    cfg = from_dict({"model": {"gelu": "erf_manual" if kind == "erf_manual" else "mindspore"}}).model

    class Act(nn.Cell):
        def __init__(self):
            super().__init__()
            self.act = make_gelu(cfg, "native" if kind == "native" else "mindspore")

        def construct(self, x):
            return self.act(x)
    return Act()


@needs_library
@pytest.mark.parametrize("kind", ["native", "erf_manual"])
def test_exact_gelu_matches_mindspore(kind):
    x, dout = _tensor(12, 64, 512, scale=3.0), _tensor(12, 64, 512)
    ref_out, (ref_dx,) = _values_and_grads(_gelu_net("mindspore"), (x,), dout)
    out, (dx,) = _values_and_grads(_gelu_net(kind), (x,), dout)
    _assert_close(out, ref_out, 1e-5, 1e-6, f"{kind} GELU values")
    _assert_close(dx, ref_dx, 1e-4, 1e-6, f"{kind} GELU gradient")


@needs_library
def test_causal_softmax_matches_mask_add_softmax():
    import mindspore as ms
    from mindspore import nn

    class Ref(nn.Cell):
        def __init__(self, t, scale):
            super().__init__()
            self.scale = scale
            self.mask = ms.Tensor(np.triu(np.full((t, t), -1e4, np.float32), k=1)[None, None])
            self.softmax = nn.Softmax(axis=-1)

        def construct(self, s):
            return self.softmax(s * self.scale + self.mask)

    class Native(nn.Cell):
        def __init__(self, scale):
            super().__init__()
            self.op = kernels.native_ops()["causal_softmax"]
            self.scale = ms.Tensor(np.array([scale], np.float32))

        def construct(self, s):
            return self.op(s, self.scale)

    s, dout = _tensor(12, 4, 64, 64, scale=4.0), _tensor(12, 4, 64, 64)
    ref_out, (ref_ds,) = _values_and_grads(Ref(64, 0.177), (s,), dout)
    out, (ds,) = _values_and_grads(Native(0.177), (s,), dout)
    assert np.all(np.triu(out[0, 0], k=1) == 0.0)  # the mask: nothing above the diagonal
    _assert_close(out, ref_out, 1e-5, 1e-7, "causal softmax values")
    _assert_close(ds, ref_ds, 1e-4, 1e-6, "causal softmax gradient")


@needs_library
@pytest.mark.parametrize("bias_op", ["bias_add", "bias_gelu"])
def test_native_bias_kernels_match_dense_bias_add(bias_op):
    import mindspore as ms
    from mindspore import nn
    from helpers.run.model import _dense

    class Net(nn.Cell):
        def __init__(self, kernels):
            super().__init__()
            self.dense = _dense(128, 512, True, 0.02, kernels == "native", bias_op)
            self.dense.weight.set_data(ms.Tensor(np.linspace(-0.1, 0.1, 512 * 128, dtype=np.float32).reshape(512, 128)))
            self.dense.bias.set_data(ms.Tensor(np.linspace(-1.0, 1.0, 512, dtype=np.float32)))
            # the fused kernel applies GELU itself; the reference applies MindSpore's after its BiasAdd
            self.act = nn.GELU(approximate=False) if bias_op == "bias_gelu" and kernels == "mindspore" else None

        def construct(self, x):
            y = self.dense(x)
            return self.act(y) if self.act is not None else y

    x, dout = _tensor(768, 128, scale=2.0), _tensor(768, 512)
    ref_out, ref_grads = _values_and_grads(Net("mindspore"), (x,), dout)
    out, grads = _values_and_grads(Net("native"), (x,), dout)
    _assert_close(out, ref_out, 1e-5, 1e-6, f"{bias_op} values")
    assert len(grads) == len(ref_grads) == 3
    for name, g, r in zip(("dx", "dweight", "dbias"), grads, ref_grads):
        _assert_close(g, r, 1e-4, 1e-4 * np.abs(r).max(), f"{bias_op} {name}")


def _loss_and_grads(overrides: dict):
    """One tiny GPT's loss and parameter gradients on fixed tokens, the model built from `overrides`."""
    import mindspore as ms
    from mindspore import ops
    from helpers.run.model import LossNet, build_model
    cfg = from_dict({"model": {"preset": "debug"}, **overrides})
    ms.set_seed(0)
    net = LossNet(build_model(cfg, 50, kernels.resolve_kernels(cfg)), 50)
    data = np.random.default_rng(1).integers(0, 50, (4, 33)).astype(np.int32)
    x, y = ms.Tensor(data[:, :-1]), ms.Tensor(data[:, 1:])
    params = net.trainable_params()
    grads = ops.GradOperation(get_by_list=True)(net, params)(x, y)
    return float(net(x, y).asnumpy()), {p.name: g.asnumpy() for p, g in zip(params, grads)}


PLAIN = {"model": {"preset": "debug", "kernels": "mindspore", "norm_backward": "mindspore", "gelu": "mindspore"}}


@needs_library
@pytest.mark.parametrize("knob, value", [("norm_backward", "manual"), ("gelu", "erf_manual"), ("kernels", "native")])
def test_each_model_knob_trains_the_same_model(knob, value):
    ref_loss, ref_grads = _loss_and_grads(PLAIN)
    loss, grads = _loss_and_grads({"model": {**PLAIN["model"], knob: value}})
    assert loss == pytest.approx(ref_loss, rel=1e-5)
    assert grads.keys() == ref_grads.keys()  # same parameters, same names: checkpoints load across knobs
    for name, g in grads.items():
        _assert_close(g, ref_grads[name], 1e-4, 1e-4 * np.abs(ref_grads[name]).max() + 1e-9, f"{knob}: {name}")


def test_flat_grad_norm_equals_per_tensor_and_clips_the_same():
    import mindspore as ms
    from helpers.run.model import GPT, LossNet
    from helpers.run.step import TrainStep, _Update, make_optimizer
    data = np.random.default_rng(2).integers(0, 50, (4, 33)).astype(np.int32)
    x, y = ms.Tensor(data[:, :-1]), ms.Tensor(data[:, 1:])
    results = {}
    for how in ("per_tensor", "flat"):
        ms.set_seed(0)
        cfg = from_dict(PLAIN)
        net = GPT(cfg.model, 50, False)
        # max_grad_norm 0.1 is below the first step's norm, so the clip factor matters
        update = _Update(make_optimizer(net, [1e-2] * 2, 0.1, [0.9, 0.99], 1e-8), 0.1, "none", 1.0, 1000, how)
        step = TrainStep(LossNet(net, 50), update)
        norms = [float(step(x, y)[1].asnumpy()) for _ in range(2)]
        results[how] = norms, {p.name: p.asnumpy() for p in net.trainable_params()}
    (ref_norms, ref_params), (norms, params) = results["per_tensor"], results["flat"]
    assert ref_norms[0] > 0.1 and norms == pytest.approx(ref_norms, rel=1e-5)
    for name, p in params.items():
        _assert_close(p, ref_params[name], 1e-5, 1e-7, name)


def test_native_is_refused_off_cpu_and_under_amp_in_one_line():
    with pytest.raises(ConfigError, match=r"model.kernels=native .*device_target=GPU; use model.kernels=mindspore"):
        from_dict({"model": {"kernels": "native"}, "device_target": "GPU"})
    with pytest.raises(ConfigError, match=r"fp32 only .*amp_level=O2"):
        from_dict({"model": {"kernels": "native"}, "amp_level": "O2"})
    # auto never picks native where it cannot run
    assert kernels.resolve_kernels(from_dict({"model": {"kernels": "auto"}, "device_target": "GPU"})) == "mindspore"
    assert kernels.resolve_kernels(from_dict({"model": {"kernels": "auto"}, "amp_level": "O2"})) == "mindspore"


def test_missing_or_stale_library_is_one_actionable_line(tmp_path, monkeypatch):
    src = tmp_path / "native"
    (src / "build").mkdir(parents=True)
    for cc in kernels.NATIVE_DIR.glob("*.cc"):
        (src / cc.name).write_bytes(cc.read_bytes())
    monkeypatch.setattr(kernels, "NATIVE_DIR", src)
    monkeypatch.setattr(kernels, "LIBRARY", src / "build" / "libwbkernels.so")
    monkeypatch.setattr(kernels, "SOURCES_HASH", src / "build" / "sources.sha256")
    monkeypatch.setattr(kernels, "REPO_ROOT", tmp_path)
    native, auto = from_dict({"model": {"kernels": "native"}}), from_dict({"model": {"kernels": "auto"}})
    with pytest.raises(ConfigError, match=r"native/build/libwbkernels.so is not built; run `make kernels` \(needs g\+\+\)"):
        kernels.resolve_kernels(native)
    assert kernels.resolve_kernels(auto) == "mindspore"
    # refused before a process starts (launch's preflight) and before a round's arms (its candidate)
    from helpers.run.preflight import preflight
    from helpers.tune.round_spec import candidate
    for refuse in (lambda: preflight(native), lambda: candidate(auto, "native", {"model.kernels": "native"})):
        with pytest.raises(ConfigError, match=r"^model.kernels=native: the native kernel library .* is not built"):
            refuse()
    kernels.LIBRARY.write_bytes(b"not loaded: resolve_kernels only checks presence and the recorded hash")
    kernels.SOURCES_HASH.write_text(kernels.sources_digest() + "  -\n")
    assert kernels.resolve_kernels(native) == "native" and kernels.resolve_kernels(auto) == "native"
    (src / "wb_kernels.cc").write_text((src / "wb_kernels.cc").read_text() + "\n// edited\n")
    with pytest.raises(ConfigError, match=r"is stale \(native/ sources changed since it was built\); run `make kernels`"):
        kernels.resolve_kernels(native)
    assert kernels.resolve_kernels(auto) == "mindspore"
    assert "\n" not in kernels.library_problem()


@needs_library
def test_the_built_library_is_current():
    """The repository's library matches its sources (make kernels ran after the last edit)."""
    assert kernels.library_problem() == ""


def test_amp_o1_takes_mindspores_layernorm_and_trains(tmp_path):
    """AMP O1 rewrites the model's source and refuses the hand-written-backward LayerNorm; build_model gives O1
    MindSpore's own (and the manual one everywhere else). The rewritten source goes to the folder given, not the
    working directory."""
    import mindspore as ms
    from mindspore import ops
    from helpers.run.model import LayerNorm, LossNet, build_model
    from helpers.run.precision import apply_precision
    o0 = from_dict({"model": {"preset": "debug", "kernels": "mindspore"}})
    assert any(isinstance(c, LayerNorm) and c.impl == "manual"
               for _, c in build_model(o0, 50, "mindspore").cells_and_names())
    cfg = from_dict({"model": {"preset": "debug"}, "amp_level": "O1"})
    ms.set_seed(0)
    cwd = os.getcwd()
    net = LossNet(apply_precision(build_model(cfg, 50, kernels.resolve_kernels(cfg)), cfg, tmp_path), 50)
    assert os.getcwd() == cwd and list((tmp_path / "rewritten_network").glob("*.py"))
    assert not any(isinstance(c, LayerNorm) for _, c in net.cells_and_names())
    data = np.random.default_rng(3).integers(0, 50, (4, 33)).astype(np.int32)
    x, y = ms.Tensor(data[:, :-1]), ms.Tensor(data[:, 1:])
    grads = ops.GradOperation(get_by_list=True)(net, net.trainable_params())(x, y)
    assert np.isfinite(float(net(x, y).asnumpy())) and all(np.isfinite(g.asnumpy()).all() for g in grads)
