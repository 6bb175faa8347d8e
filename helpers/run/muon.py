"""optimizer=muon: Muon for the hidden 2-D weights, AdamW for everything else.

Muon (from the small-GPT speed records): keep a momentum of each hidden weight's gradient, take its Nesterov step,
and replace that update by the nearest semi-orthogonal matrix (all singular values ≈ 1), found with a few
Newton–Schulz iterations of a quintic polynomial; then scale it by sqrt(max(1, rows/cols)) and step. Embeddings,
norms, biases and the (tied) head stay on AdamW, whose learning rate and betas are the run's own. The
iterations run in fp32 whatever precision the model computes in.
"""
from __future__ import annotations

from typing import Callable

import mindspore as ms
from mindspore import Parameter, ParameterTuple, Tensor, nn, ops
from mindspore.ops import composite as C

# The quintic's coefficients (a, b, c): X ← aX + b(XXᵀ)X + c(XXᵀ)²X. They push every singular value in (0, 1]
# towards 1 fast, without converging exactly (they land in about [0.7, 1.2]), which is what training needs.
NS_COEFFS = (3.4445, -4.7750, 2.0315)

_muon_step = ops.MultitypeFuncGraph("muon_step")


def newton_schulz(g, steps: int):
    """The semi-orthogonal matrix nearest to g (2-D, fp32 on return): g normalised by its Frobenius norm, then
    `steps` quintic Newton–Schulz iterations, on the wide orientation (rows ≤ cols)."""
    a, b, c = NS_COEFFS
    x = g.astype(ms.float32)
    tall = x.shape[0] > x.shape[1]
    if tall:
        x = x.T
    x = x / (ops.sqrt(ops.reduce_sum(x * x)) + 1e-7)
    for _ in range(steps):
        m = ops.matmul(x, x.T)
        x = a * x + ops.matmul(b * m + c * ops.matmul(m, m), x)
    return x.T if tall else x


@_muon_step.register("Number", "Tensor", "Tensor", "Tensor", "Tensor", "Tensor")
def _muon_step_tensor(steps, lr, momentum, weight, grad, buf):
    buf_new = momentum * buf + grad.astype(ms.float32)
    update = newton_schulz(grad.astype(ms.float32) + momentum * buf_new, steps)
    scale = max(1.0, weight.shape[0] / weight.shape[1]) ** 0.5
    ops.assign(buf, buf_new)
    return ops.assign_sub(weight, (lr * scale * update).astype(weight.dtype))


def hidden_weights(params: list[Parameter]) -> list[Parameter]:
    """The parameters Muon updates: the 2-D weights inside the transformer blocks (names 'blocks.…')."""
    return [p for p in params if p.ndim == 2 and (p.name.startswith("blocks.") or ".blocks." in p.name)]


class MuonAdamW(nn.Cell):
    """Called as an optimizer (`optimizer(grads)`, grads in the order of `parameters`): Muon on the hidden
    weights with a scalar LR Parameter (`muon_learning_rate`, set by the host before every step), MindSpore's
    AdamWeightDecay on the rest with its own."""

    def __init__(self, params: list[Parameter], adam: Callable[[list[Parameter]], nn.Optimizer],
                 muon_lr: float, momentum: float, ns_steps: int):
        super().__init__(auto_prefix=False)
        hidden = hidden_weights(params)
        if not hidden:
            raise ValueError("optimizer=muon found no 2-D weights inside transformer blocks to update; "
                             "use optimizer=adamw for this network")
        names = {p.name for p in hidden}
        rest = [p for p in params if p.name not in names]
        self.n_hidden = len(hidden)
        self.parameters = ParameterTuple(hidden + rest)
        self.adam = adam(rest)
        self.buffers = ParameterTuple(hidden).clone(prefix="muon_momentum", init="zeros")
        self.muon_learning_rate = Parameter(Tensor(muon_lr, ms.float32), name="muon_learning_rate",
                                            requires_grad=False)
        self.momentum = Tensor(momentum, ms.float32)
        self.ns_steps = ns_steps
        self.hyper_map = C.HyperMap()

    def construct(self, grads):
        done = self.hyper_map(ops.partial(_muon_step, self.ns_steps, self.muon_learning_rate, self.momentum),
                              self.parameters[:self.n_hidden], grads[:self.n_hidden], self.buffers)
        return ops.depend(self.adam(grads[self.n_hidden:]), done)
