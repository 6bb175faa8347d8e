"""Train-step Cells in-process (graph mode): accumulation equivalence, the LR schedule and its setting per step."""
import numpy as np
import pytest

from helpers.config import from_dict
from helpers.run.schedule import lr_at
from tests.conftest import mindspore_on_cpu


def test_lr_schedule_warmup_then_cosine_to_min():
    cfg = from_dict({"lr": 1e-3, "min_lr": 1e-4, "warmup": 10, "steps": 110})
    assert lr_at(cfg, 1) == pytest.approx(1e-4) and lr_at(cfg, 10) == pytest.approx(1e-3)
    assert lr_at(cfg, 60) == pytest.approx(5.5e-4) and lr_at(cfg, 110) == pytest.approx(1e-4)
    linear = from_dict({"schedule": "linear", "warmup": 0, "steps": 10, "lr": 1.0, "min_lr": 0.0})
    assert lr_at(linear, 5) == pytest.approx(0.5)


@pytest.mark.parametrize("mode", ["graph", "pynative"])
def test_the_host_sets_each_steps_lr_into_one_scalar_parameter_that_the_compiled_step_reads(mode):
    """The graph holds a scalar LR Parameter, not the schedule: a step after set(step) moves the weights by that
    step's LR (zero scale: not at all), and the graph compiled once serves every step. In PyNative too, where the
    optimizer's construct is a jit graph that did not see a Parameter rebound by set_data."""
    import mindspore as ms
    from helpers.run.model import GPT, LossNet
    from helpers.run.schedule import LearningRates
    from helpers.run.step import Stepper, make_optimizer

    mindspore_on_cpu(mode)
    ms.set_seed(0)
    cfg = from_dict({"model": {"preset": "debug"}, "lr": 1e-2, "min_lr": 1e-3, "warmup": 2, "steps": 6})
    net = GPT(cfg.model, 50, False)
    opt = make_optimizer(net, lr_at(cfg, 1), 0.0, [0.9, 0.99], 1e-8)
    step = Stepper(LossNet(net, 50), opt, 0.0, "none", 1.0, 1000, 1).train_step
    lrs = LearningRates(cfg, opt)
    (param, _), = lrs.params
    data = np.random.default_rng(0).integers(0, 50, (2, 33)).astype(np.int32)
    x, y = ms.Tensor(data[:, :-1]), ms.Tensor(data[:, 1:])
    weight = net.trainable_params()[0]
    moved = []
    for k, scale in ((1, 0.0), (2, 1.0), (6, 1.0)):
        lrs.set(k, scale)
        assert param.shape == () and float(param.asnumpy()) == pytest.approx(lr_at(cfg, k) * scale)
        before = weight.asnumpy().copy()
        step(x, y)
        moved.append(float(np.abs(weight.asnumpy() - before).max()))
    assert moved[0] == 0.0 and moved[1] > 0.0
    # AdamW moves a weight by about lr a step (the largest by up to ~2×): step 2 at the peak 1e-2, step 6 at the
    # floor 1e-3
    assert 0.5e-2 < moved[1] < 2e-2 and 0.5e-3 < moved[2] < 2e-3, moved
    mindspore_on_cpu()


def test_gradient_accumulation_4x2_equals_one_batch_of_8():
    import mindspore as ms
    from mindspore import ops
    from helpers.run.model import GPT, LossNet
    from helpers.run.step import MicroStep, _Update, make_optimizer

    mindspore_on_cpu()
    ms.set_seed(0)
    cfg = from_dict({"model": {"preset": "debug"}})
    net = GPT(cfg.model, 50, False)
    loss_net = LossNet(net, 50)
    data = np.random.default_rng(0).integers(0, 50, (8, 33)).astype(np.int32)
    x, y = ms.Tensor(data[:, :-1]), ms.Tensor(data[:, 1:])

    update = _Update(make_optimizer(net, 1e-3, 0.0, [0.9, 0.99], 1e-8), 0.0, "none", 1.0, 1000)
    full = ops.GradOperation(get_by_list=True)(loss_net, update.optimizer.parameters)(x, y)
    micro = MicroStep(loss_net, update, accum_steps=4)
    for i in range(4):
        micro(x[2 * i:2 * i + 2], y[2 * i:2 * i + 2])
    worst = max(float(np.abs(a.asnumpy() - g.asnumpy()).max()) for a, g in zip(micro.accum, full))
    assert worst < 1e-6


def test_a_reused_block_graph_trains_as_the_inlined_one():
    """model.lazy_inline (one block's graph built once, mindspore.lazy_inline "front"): three steps of a three-block
    model give the same losses and weights as with every block inlined; the blocks are the reused kind only when on."""
    import mindspore as ms
    from helpers.run.model import GPT, LossNet, ReusedBlock
    from helpers.run.step import Stepper, make_optimizer

    mindspore_on_cpu()
    data = np.random.default_rng(1).integers(0, 50, (2, 33)).astype(np.int32)
    x, y = ms.Tensor(data[:, :-1]), ms.Tensor(data[:, 1:])
    got = {}
    for on in (False, True):
        ms.set_seed(0)
        cfg = from_dict({"model": {"preset": "debug", "n_layer": 3, "lazy_inline": on}})
        net = GPT(cfg.model, 50, False)
        assert all(isinstance(b, ReusedBlock) == on for b in net.blocks)
        step = Stepper(LossNet(net, 50), make_optimizer(net, 1e-2, 0.0, [0.9, 0.99], 1e-8), 0.0, "none", 1.0,
                       1000, 1).train_step
        losses = [float(step(x, y)[0].asnumpy()) for _ in range(3)]
        got[on] = losses, [p.asnumpy().copy() for p in net.trainable_params()]
    assert got[True][0] == pytest.approx(got[False][0], rel=1e-6) and got[True][0][2] < got[True][0][0]
    for a, b in zip(got[True][1], got[False][1]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
