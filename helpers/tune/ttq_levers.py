"""The time-to-target tuner's lever arms: the changes that won the public small-GPT speed records (the
modded-nanogpt line), each one arm of one declared group, tried against the best like any other arm.

Ordered by the size of the gain those records report for them (largest first), which is what is known before this
model and corpus are measured; the tuner's race and rounds then judge each here, on seconds to the target.
"""
from __future__ import annotations

from helpers import config as config_mod
from helpers.config import Config
from helpers.tune.autotune import Candidate

# (name, family, changes, why): the family names the group a round changes
LEVERS = (
    ("optimizer_muon", "optimizer", {"optimizer": "muon"},
     "Muon: momentum, then each hidden weight's update orthogonalised by Newton–Schulz (AdamW keeps the "
     "embeddings, norms and head); the records' largest optimizer gain"),
    ("positions_rope", "architecture", {"model.positions": "rope"},
     "rotary position embeddings instead of a learned table (LLaMA's positions)"),
    ("mlp_relu2", "architecture", {"model.mlp": "relu2"}, "ReLU² feed-forward instead of GELU"),
    ("qk_norm", "architecture", {"model.qk_norm": True}, "RMS-normalised q and k per head (QK-norm)"),
    ("zero_init_proj", "architecture", {"model.zero_init_proj": True},
     "output projections initialised to zero: every block starts as the identity"),
    ("schedule_wsd", "recipe", {"schedule": "wsd", "cooldown_frac": 0.4},
     "warm-up, stable, then a linear decay over the last 40% of the steps (trapezoid schedule)"),
    ("logit_softcap_30", "architecture", {"model.logit_softcap": 30.0}, "output logits soft-capped at ±30"),
)


def lever_arms(cfg: Config) -> list[Candidate]:
    """The LEVERS that would change `cfg` (one already in it is not an arm), as tuner candidates judged by time to
    target."""
    current = config_mod.flatten(cfg)
    return [Candidate(name, family, dict(changes), why, objective="time_to_target")
            for name, family, changes, why in LEVERS
            if any(current.get(k) != v for k, v in changes.items())]


def lever_changes(name: str) -> tuple[dict, str]:
    """(changes, why) of the lever called `name` (a LEVERS name, e.g. "optimizer_muon"); ValueError in one line
    naming the choices for any other name."""
    for lever, _, changes, why in LEVERS:
        if lever == name:
            return dict(changes), why
    raise ValueError(f"lever={name!r} is not a speed-record lever; choose one of "
                     f"{', '.join(n for n, *_ in LEVERS)}")
