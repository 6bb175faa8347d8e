"""Train-step Cells: gradients, loss scaling, global-norm clipping, AdamW, gradient accumulation.

Written as Cells, not `@ms.jit` functions: a functional step measured slower in graph mode here, and with
the compile cache it trained silently wrong (its parameters never updated; `tests/run/test_startup.py` trains
the Cell step warm). HyperMap helpers are module-level functions because graph mode refuses lambdas there.
"""
from __future__ import annotations

import mindspore as ms
from mindspore import Parameter, Tensor, amp, nn, ops
from mindspore.ops import composite as C

from helpers.run.schedule import LR_PARAMETERS

_square_sum = ops.MultitypeFuncGraph("square_sum")
_flatten = ops.MultitypeFuncGraph("flatten")
_scale_grad = ops.MultitypeFuncGraph("scale_grad")
_accumulate = ops.MultitypeFuncGraph("accumulate")
_reset = ops.MultitypeFuncGraph("reset")


@_square_sum.register("Tensor")
def _square_sum_tensor(g):
    return ops.ReduceSum()(ops.Square()(g.astype(ms.float32)))


@_flatten.register("Tensor")
def _flatten_tensor(g):
    return ops.reshape(g.astype(ms.float32), (-1,))


@_scale_grad.register("Tensor", "Tensor")
def _scale_grad_tensor(factor, g):
    return g * factor.astype(g.dtype)


@_accumulate.register("Tensor", "Tensor")
def _accumulate_tensor(acc, g):
    return ops.assign_add(acc, g.astype(acc.dtype))


@_reset.register("Tensor")
def _reset_tensor(acc):
    return ops.assign(acc, ops.zeros_like(acc))


def _grad_reducer(parameters) -> nn.Cell:
    """All-reduce of the gradients in DATA_PARALLEL mode (as nn.TrainOneStepCell does), else identity."""
    from mindspore.parallel._utils import _get_device_num, _get_gradients_mean, _get_parallel_mode
    if _get_parallel_mode() != ms.ParallelMode.DATA_PARALLEL:
        return nn.Identity()
    return nn.DistributedGradReducer(parameters, _get_gradients_mean(), _get_device_num())


class _Update(nn.Cell):
    """Shared update: unscale → finite check → global norm → clip → AdamW (skipped on overflow)."""

    def __init__(self, optimizer: nn.Optimizer, max_grad_norm: float, loss_scale: str,
                 scale_value: float, scale_window: int, grad_norm: str = "per_tensor"):
        super().__init__(auto_prefix=False)
        # flat: one Concat + one square-sum over every gradient instead of a Square+ReduceSum per tensor and an
        # AddN (the same norm up to fp32 summation order; fewer small ops, each ~0.07-0.1 ms on CPU)
        self.flat_norm = grad_norm == "flat"
        self.concat = ops.Concat()
        self.optimizer = optimizer
        self.hyper_map = C.HyperMap()
        self.max_grad_norm = max_grad_norm
        self.check_finite = loss_scale != "none"
        self.dynamic = loss_scale == "dynamic"
        if self.dynamic:
            self.scaler = amp.DynamicLossScaler(scale_value, 2, scale_window)
        else:
            self.scaler = amp.StaticLossScaler(scale_value if loss_scale == "static" else 1.0)
        # amp's scalers are not Cells, so their Parameters (the scale, the finite-step counter) were invisible to
        # get_parameters() and so to checkpoints: a resumed run restarted its scale. As attributes they are state.
        self.scaler.scale_value.name = "loss_scale"
        self.loss_scale = self.scaler.scale_value
        if self.dynamic:
            self.scaler.counter.name = "loss_scale_counter"
            self.loss_scale_counter = self.scaler.counter
        self.addn = ops.AddN()
        self.sqrt = ops.Sqrt()
        self.reducer = _grad_reducer(optimizer.parameters)

    def scale_value(self):
        return self.scaler.scale_value

    def apply(self, grads):
        grads = self.reducer(grads)
        grads = self.scaler.unscale(grads)
        finite = amp.all_finite(grads) if self.check_finite else Tensor(True)
        if self.flat_norm:
            flat = self.concat(self.hyper_map(_flatten, grads))
            norm = self.sqrt(ops.ReduceSum()(flat * flat))
        else:
            norm = self.sqrt(self.addn(self.hyper_map(_square_sum, grads)))
        if self.max_grad_norm > 0:
            factor = ops.minimum(self.max_grad_norm / (norm + 1e-6), 1.0)
            grads = self.hyper_map(ops.partial(_scale_grad, factor), grads)
        if self.check_finite:
            if finite:
                self.optimizer(grads)
        else:
            self.optimizer(grads)
        if self.dynamic:
            self.scaler.adjust(finite)
        return norm, finite


class TrainStep(nn.Cell):
    """One optimizer step on one batch: (x, y) → (loss, grad_norm, finite, loss_scale)."""

    def __init__(self, loss_net: nn.Cell, update: _Update):
        super().__init__(auto_prefix=False)
        self.loss_net = loss_net
        self.update = update
        self.weights = update.optimizer.parameters
        self.grad = ops.GradOperation(get_by_list=True, sens_param=True)

    def construct(self, x, y):
        loss = self.loss_net(x, y)
        scale = self.update.scale_value()
        sens = ops.fill(loss.dtype, loss.shape, 1.0) * scale.astype(loss.dtype)
        grads = self.grad(self.loss_net, self.weights)(x, y, sens)
        norm, finite = self.update.apply(grads)
        return loss, norm, finite, self.update.scale_value()


class MicroStep(nn.Cell):
    """Gradient accumulation, part 1: add one micro-batch's (scaled, averaged) gradients into buffers."""

    def __init__(self, loss_net: nn.Cell, update: _Update, accum_steps: int):
        super().__init__(auto_prefix=False)
        self.loss_net = loss_net
        self.update = update
        self.weights = update.optimizer.parameters
        self.accum = self.weights.clone(prefix="accum", init="zeros")
        self.grad = ops.GradOperation(get_by_list=True, sens_param=True)
        self.hyper_map = C.HyperMap()
        self.inv_steps = 1.0 / accum_steps

    def construct(self, x, y):
        loss = self.loss_net(x, y)
        scale = self.update.scale_value()
        sens = ops.fill(loss.dtype, loss.shape, self.inv_steps) * scale.astype(loss.dtype)
        grads = self.grad(self.loss_net, self.weights)(x, y, sens)
        return ops.depend(loss, self.hyper_map(_accumulate, self.accum, grads))


class ApplyStep(nn.Cell):
    """Gradient accumulation, part 2: update from the buffers, then zero them."""

    def __init__(self, micro: MicroStep):
        super().__init__(auto_prefix=False)
        self.micro = micro
        self.hyper_map = C.HyperMap()

    def construct(self):
        grads = self.hyper_map(ops.partial(_scale_grad, Tensor(1.0, ms.float32)), self.micro.accum)
        norm, finite = self.micro.update.apply(grads)
        norm = ops.depend(norm, self.hyper_map(_reset, self.micro.accum))
        return norm, finite, self.micro.update.scale_value()


def make_optimizer(net: nn.Cell, lr: float, weight_decay: float, betas, eps: float) -> nn.Optimizer:
    """AdamW (MindSpore's fused AdamWeightDecay; no bias correction) with a scalar LR Parameter, `lr` until the
    host sets it (run/schedule.py sets it before every step).

    Decay applies to matrices only (as nanoGPT): norms and biases are not decayed.
    """
    return adamw(net.trainable_params(), lr, weight_decay, betas, eps)


def make_muon(net: nn.Cell, lr: float, muon_lr: float, weight_decay: float, betas, eps: float,
              momentum: float, ns_steps: int) -> nn.Cell:
    """optimizer=muon (helpers/run/muon.py): Muon on the blocks' 2-D weights with the scalar LR `muon_lr`,
    AdamW (`make_optimizer`'s) on the rest with `lr` (both Parameters the host sets before every step)."""
    from helpers.run.muon import MuonAdamW
    return MuonAdamW(net.trainable_params(), lambda rest: adamw(rest, lr, weight_decay, betas, eps), muon_lr,
                     momentum, ns_steps)


def adamw(params: list[Parameter], lr: float, weight_decay: float, betas, eps: float) -> nn.Optimizer:
    """AdamWeightDecay over `params` with a scalar LR Parameter (`learning_rate`), decaying the matrices only."""
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    groups = [g for g in ({"params": decay, "weight_decay": weight_decay},
                          {"params": no_decay, "weight_decay": 0.0}) if g["params"]]
    return nn.AdamWeightDecay(groups, learning_rate=Tensor(lr, ms.float32), beta1=betas[0], beta2=betas[1], eps=eps)


class Stepper:
    """Runs one optimizer step over `accum` micro-batches, whichever Cells that takes."""

    def __init__(self, loss_net: nn.Cell, optimizer: nn.Optimizer, max_grad_norm: float, loss_scale: str,
                 scale_value: float, scale_window: int, accum_steps: int, grad_norm: str = "per_tensor"):
        update = _Update(optimizer, max_grad_norm, loss_scale, scale_value, scale_window, grad_norm)
        self.accum_steps = accum_steps
        if accum_steps == 1:
            self.train_step = TrainStep(loss_net, update)
            self.cells = [self.train_step]
        else:
            self.micro = MicroStep(loss_net, update, accum_steps)
            self.apply = ApplyStep(self.micro)
            self.cells = [self.micro, self.apply]
        for cell in self.cells:
            cell.set_train(True)

    def parameters_and_state(self) -> list[Parameter]:
        """Everything a checkpoint needs: weights, optimizer moments, step, loss scale, accum buffers.

        The LR Parameters are left out: the host sets them from the config before every step.
        """
        seen, out = set(LR_PARAMETERS), []
        for cell in self.cells:
            for p in cell.get_parameters():
                if p.name not in seen:
                    seen.add(p.name)
                    out.append(p)
        return out
