"""The learning rate of each optimizer step, and setting it into the optimizer before the step runs.

The optimizer holds one scalar LR Parameter (AdamW's `learning_rate`; Muon's `muon_learning_rate` too), which the
host sets before every step. So the compiled step graph holds neither the schedule nor `steps` (a per-step LR list
put its length into the graph): one compiled graph serves any schedule and step count, and the compile cache
(keyed by what is in the graph, helpers/run/startup.py) is warm for a config that differs only in them.
"""
from __future__ import annotations

import math

from helpers.config import Config

# The optimizer's LR Parameters, by name: None = the run's lr schedule, else the config key of its own peak.
LR_PARAMETERS = {"learning_rate": None, "muon_learning_rate": "muon_lr"}


def lr_at(cfg: Config, step: int, peak: float | None = None) -> float:
    """Learning rate for 1-based optimizer step `step`: linear warm-up, then cosine/linear/constant decay, or wsd
    (stable at the peak, then a linear decay over the last cooldown_frac of the steps); past `steps` it stays at
    the last step's. peak: the peak instead of cfg.lr (Muon's muon_lr), its floor scaled as min_lr is to lr."""
    top = cfg.lr if peak is None else peak
    floor = cfg.min_lr if peak is None else cfg.min_lr * peak / cfg.lr
    warmup = cfg.warmup_steps
    if warmup and step <= warmup:
        return top * step / warmup
    if cfg.schedule == "constant" or cfg.steps <= warmup:
        return top
    if cfg.schedule == "wsd":
        start = max(warmup, cfg.steps - round(cfg.cooldown_frac * cfg.steps))
        if step <= start:
            return top
        progress = min(1.0, (step - start) / max(1, cfg.steps - start))
        return floor + (1 - progress) * (top - floor)
    progress = min(1.0, (step - warmup) / max(1, cfg.steps - warmup))
    shape = 0.5 * (1 + math.cos(math.pi * progress)) if cfg.schedule == "cosine" else 1 - progress
    return floor + shape * (top - floor)


class LearningRates:
    """The optimizer's scalar LR Parameters, set to lr_at(step) × scale before each step (the scale falls when
    monitor.grad_norm_action=lower_lr fires); a value is written only when it changes."""

    def __init__(self, cfg: Config, optimizer):
        self.cfg = cfg
        self.params = [(p, getattr(cfg, LR_PARAMETERS[p.name]) if LR_PARAMETERS[p.name] else None)
                       for p in optimizer.get_parameters() if p.name in LR_PARAMETERS]
        # the value each holds, by position: Parameter.name costs a lookup in MindSpore, which at every step was
        # ~0.5 ms of a 10 ms tiny step
        self.held: list[float | None] = [None] * len(self.params)

    def set(self, step: int, scale: float = 1.0) -> None:
        """Each LR Parameter to its value at 1-based `step`, times `scale`."""
        from mindspore import Tensor, float32
        for i, (param, peak) in enumerate(self.params):
            value = lr_at(self.cfg, step, peak) * scale
            if self.held[i] != value:
                # in place: set_data rebinds the Parameter, and a PyNative jit graph (AdamWeightDecay's construct)
                # then goes on reading the old memory (measured: its LR never changed)
                param.copy_(Tensor(value, float32))
                self.held[i] = value
