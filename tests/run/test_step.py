"""Train-step Cells in-process (graph mode): accumulation equivalence and the LR schedule."""
import numpy as np
import pytest

from helpers.config import from_dict
from helpers.run.build import lr_at


def test_lr_schedule_warmup_then_cosine_to_min():
    cfg = from_dict({"lr": 1e-3, "min_lr": 1e-4, "warmup": 10, "steps": 110})
    assert lr_at(cfg, 1) == pytest.approx(1e-4) and lr_at(cfg, 10) == pytest.approx(1e-3)
    assert lr_at(cfg, 60) == pytest.approx(5.5e-4) and lr_at(cfg, 110) == pytest.approx(1e-4)
    linear = from_dict({"schedule": "linear", "warmup": 0, "steps": 10, "lr": 1.0, "min_lr": 0.0})
    assert lr_at(linear, 5) == pytest.approx(0.5)


def test_gradient_accumulation_4x2_equals_one_batch_of_8():
    import mindspore as ms
    from mindspore import ops
    from helpers.run.model import GPT, LossNet
    from helpers.run.step import MicroStep, _Update, make_optimizer

    ms.set_device("CPU")
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_seed(0)
    cfg = from_dict({"model": {"preset": "tiny"}})
    net = GPT(cfg.model, 50, False)
    loss_net = LossNet(net, 50)
    data = np.random.default_rng(0).integers(0, 50, (8, 33)).astype(np.int32)
    x, y = ms.Tensor(data[:, :-1]), ms.Tensor(data[:, 1:])

    update = _Update(make_optimizer(net, [1e-3], 0.0, [0.9, 0.99], 1e-8), 0.0, "none", 1.0, 1000)
    full = ops.GradOperation(get_by_list=True)(loss_net, update.optimizer.parameters)(x, y)
    micro = MicroStep(loss_net, update, accum_steps=4)
    for i in range(4):
        micro(x[2 * i:2 * i + 2], y[2 * i:2 * i + 2])
    worst = max(float(np.abs(a.asnumpy() - g.asnumpy()).max()) for a, g in zip(micro.accum, full))
    assert worst < 1e-6
