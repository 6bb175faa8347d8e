"""What one run trains with, built for its config once MindSpore is set up: the model, its loss, the optimizer and
step Cells (as the loop calls them), the hooks (they set each step's learning rate, run/schedule.py), the
device-memory reader, the validation batches, the test-only ballast and the AMP dtype audit. `bench/` builds the
same for its bare step loops."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from helpers.config import Config
from helpers.record import atomic_write_json
from helpers.run.hooks import RunHooks
from helpers.run.memory import DeviceMemory
from helpers.run.monitors import effective_max_grad_norm
from helpers.run.precision import apply_precision
from helpers.run.schedule import lr_at

if TYPE_CHECKING:
    from helpers.run.data import Prepared
    from helpers.run.step import Stepper


@dataclass
class Built:
    """A run's model and step, built. calls: the step Cells as the loop calls them (graph mode: their jit level set;
    PyNative: wrapped in ms.jit unless jit_level=none); [0] is the whole step, or with gradient accumulation the
    micro-step and [1] the update."""
    kernels: str                 # the resolved kernels choice ('native' or 'mindspore')
    vocab: int                   # tokens in the model's vocabulary
    n_params: int                # trainable parameters (elements)
    flops_per_token: float       # training FLOPs per token (model.flops_per_token)
    stepper: Stepper
    calls: list
    eval_net: object             # the loss Cell on the same backbone, for validation passes
    hooks: RunHooks
    device_memory: DeviceMemory | None  # None on CPU, where MindSpore's allocator counters are always 0
    val: list                    # the fixed validation batches, as (x, y) Tensors
    ballast: object | None       # the test-only intermittent cost (model.ballast_every), or None
    amp_audit: dict | None       # the AMP dtype audit's summary for summary.json (amp_level != O0), or None
    init: dict | None = None     # what init_from loaded (hf_weights.Loaded as a dict), or None

    def evaluate(self) -> float:
        """Mean validation loss over the fixed validation batches (nats/token); the step Cells train again after."""
        self.eval_net.set_train(False)
        losses = [float(self.eval_net(x, y).asnumpy()) for x, y in self.val]
        for cell in self.stepper.cells:
            cell.set_train(True)
        return float(np.mean(losses))

    def device_memory_bytes(self) -> int | None:
        """This step's device-allocator peak (bytes), or None on CPU (see helpers/run/memory.py)."""
        return self.device_memory.step_peak() if self.device_memory is not None else None


def model_vocab(cfg: Config, prep: Prepared) -> int:
    """The model's vocabulary: model.vocab_size, or the tokenizer's when it is 0 (`data.prepare` refused a
    model.vocab_size below the tokenizer's)."""
    return cfg.model.vocab_size or prep.tokenizer.vocab_size


def build(cfg: Config, prep: Prepared, run_dir: Path, kernels: str) -> Built:
    """Build `cfg`'s model and step into MindSpore (already configured, `train.configure_mindspore`), with the
    resolved `kernels`; the hooks set the LR of each step (run/schedule.py). Under AMP also writes
    run_dir/dtype_audit.json."""
    import mindspore as ms
    from helpers.run.data import val_batches
    from helpers.run.model import LossNet, build_model, count_params, flops_per_token
    from helpers.run.step import Stepper, make_muon, make_optimizer
    vocab = model_vocab(cfg, prep)
    backbone = build_model(cfg, vocab, kernels)
    init = _load_init(cfg, backbone)
    n_params = count_params(backbone)
    if cfg.recompute == "blocks":
        for block in getattr(backbone, "blocks", []):  # a user's model.build may have no blocks
            block.recompute()
    backbone = apply_precision(backbone, cfg, run_dir)
    loss_net, eval_net = LossNet(backbone, vocab), LossNet(backbone, vocab)
    if cfg.optimizer == "muon":
        optimizer = make_muon(backbone, lr_at(cfg, 1), lr_at(cfg, 1, cfg.muon_lr), cfg.weight_decay, cfg.betas,
                              cfg.eps, cfg.muon_momentum, cfg.muon_ns_steps)
    else:
        optimizer = make_optimizer(backbone, lr_at(cfg, 1), cfg.weight_decay, cfg.betas, cfg.eps)
    stepper = Stepper(loss_net, optimizer, effective_max_grad_norm(cfg), cfg.loss_scale, cfg.loss_scale_value,
                      cfg.loss_scale_window, cfg.grad_accum_steps, cfg.grad_norm)
    hooks = RunHooks(cfg, run_dir, optimizer)
    # On a device the per-step figure is MindSpore's allocator peak; on CPU its counters are always 0.
    device_memory = DeviceMemory(cfg.device_target) if cfg.device_target != "CPU" else None
    calls = _compiled_calls(cfg, stepper.cells)
    ballast = None
    if cfg.model.ballast_every and cfg.model.ballast:  # test-only intermittent cost (model.ballast_every)
        from helpers.run.model import Ballast
        ballast = Ballast(cfg.tokens_per_step, cfg.model.d_model, cfg.model.ballast)
        ballast().asnumpy()  # compiled now, not inside the first step that runs it
    # after the real model is built, so its init (RNG draws) matches O0 runs
    amp_audit = _audit_amp(cfg, vocab, kernels, run_dir) if cfg.amp_level != "O0" else None
    val = [(ms.Tensor(x), ms.Tensor(y)) for x, y in val_batches(cfg, prep)]
    return Built(kernels, vocab, n_params, flops_per_token(n_params, cfg.model), stepper, calls, eval_net, hooks,
                 device_memory, val, ballast, amp_audit, init)


def _load_init(cfg: Config, backbone) -> dict | None:
    """init_from's weights into the freshly built backbone (before AMP casts it), or None without init_from."""
    if not cfg.init_from:
        return None
    from dataclasses import asdict
    from helpers.run.hf_weights import load_into
    return {"path": cfg.init_from, **asdict(load_into(backbone, cfg.model, cfg.init_from))}


def _compiled_calls(cfg: Config, cells: list) -> list:
    """Graph mode: jit_level per Cell. PyNative: wrap the step Cells in ms.jit unless jit_level=none."""
    import mindspore as ms
    if cfg.mode == "graph":
        for cell in cells:
            cell.set_jit_config(ms.JitConfig(jit_level=cfg.jit_level if cfg.jit_level != "none" else "O0"))
        return cells
    if cfg.jit_level != "none":
        return [ms.jit(cell, jit_level=cfg.jit_level) for cell in cells]
    return cells


def _audit_amp(cfg: Config, vocab: int, kernels: str, run_dir: Path) -> dict:
    """Write run_dir/dtype_audit.json; return its summary for summary.json (`amp_audit`)."""
    from helpers.run.precision import audit_summary, dtype_audit, rows_as_dicts
    rows = dtype_audit(cfg, vocab, kernels, run_dir)
    atomic_write_json(Path(run_dir) / "dtype_audit.json", rows_as_dicts(rows))
    return audit_summary(rows)
