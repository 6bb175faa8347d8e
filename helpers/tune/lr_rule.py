"""The learning rate of a round that changes the global batch, by a stated rule the user can override.

A bigger global batch (batch_size × grad_accum_steps; a data-parallel size at a fixed micro-batch changes
batch_size too) makes fewer optimizer updates per token, so at an unchanged learning rate its loss at equal
tokens is worse early in training, whatever its speed. Recipes scale the learning rate with the global batch:
the usual rule of thumb by ×1.2–1.5 per doubling; the square-root rule (×√2 ≈ 1.41 per doubling) sits inside that
range and is the default; "linear" (×2 per doubling) and "none" are the others. A round that sets `lr` itself
overrides the rule. Such a round asks "do I reach my loss sooner?", so it is judged by time to target
(`Workbook.run_round(objective="time_to_target")`), not by tokens/s with loss at equal tokens.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from helpers import config as config_mod
from helpers.config import Config

LR_RULES = {"sqrt": math.sqrt, "linear": lambda k: k, "none": lambda k: 1.0}
DEFAULT_LR_RULE = "sqrt"
SCALED = ("lr", "min_lr")  # the schedule's peak and floor move together


@dataclass(frozen=True)
class LrScaling:
    """How a round's learning rate followed its global batch: the rule, the batches, the factor, the values."""
    rule: str
    global_batch: tuple[int, int]
    factor: float
    lr: tuple[float, float]
    min_lr: tuple[float, float]
    overridden: bool = False  # the round set lr itself

    def text(self) -> str:
        """e.g. "lr 0.001 → 0.001414, min_lr 0.0001 → 0.0001414 by the sqrt rule (×1.414 for global batch 12 →
        24)"."""
        b0, b1 = self.global_batch
        if self.overridden:
            return f"lr {self.lr[0]:g} → {self.lr[1]:g} as the round set it (global batch {b0} → {b1}; rule not applied)"
        return (f"lr {self.lr[0]:g} → {self.lr[1]:.4g}, min_lr {self.min_lr[0]:g} → {self.min_lr[1]:.4g} by the "
                f"{self.rule} rule (×{self.factor:.3f} for global batch {b0} → {b1})")

    def to_dict(self) -> dict:
        return asdict(self)


def check_rule(rule: str) -> str:
    """`rule` if known, else a one-line ValueError naming the rules."""
    if rule not in LR_RULES:
        raise ValueError(f"lr_rule={rule!r} is not a rule; choose one of {', '.join(LR_RULES)}")
    return rule


def moves_global_batch(best: Config, cand: Config) -> bool:
    """Whether the candidate makes another number of sequences per optimizer step than the best."""
    return cand.global_batch != best.global_batch


def scale_lr(best: Config, cand: Config, changes: dict, rule: str) -> tuple[Config, LrScaling | None]:
    """The candidate with lr and min_lr scaled by `rule` for its global batch (unless `changes` sets lr), and how;
    (cand, None) when the global batch does not move."""
    if not moves_global_batch(best, cand):
        return cand, None
    batches = (best.global_batch, cand.global_batch)
    if "lr" in changes:
        return cand, LrScaling(rule, batches, cand.lr / best.lr, (best.lr, cand.lr), (best.min_lr, cand.min_lr), True)
    factor = LR_RULES[check_rule(rule)](batches[1] / batches[0])
    scaled = config_mod.with_changes(cand, {k: getattr(best, k) * factor for k in SCALED})
    return scaled, LrScaling(rule, batches, factor, (best.lr, scaled.lr), (best.min_lr, scaled.min_lr))
