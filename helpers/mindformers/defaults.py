"""Where MindFormers' default differs from the workbook's: a recipe that leaves the key out trains with
MindFormers' value, so the import takes theirs and says so in a row (never a silent change of optimizer or
schedule)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class TheirDefault:
    """`source` absent (and none of `also`) while `section` is present → `ours` = `value(data)`, noted with `why`."""
    section: str
    source: str
    ours: str
    value: Callable[[dict], Any]
    why: str
    also: tuple[str, ...] = ()


def _eps(data: dict) -> float:
    kind = (data.get("optimizer") or {}).get("type", "AdamW")
    return 1e-8 if kind in ("AdamW", "PmaAdamW") else 1e-6


def _family_eps(data: dict) -> float | None:
    config = (data.get("model") or {}).get("model_config") or {}
    return 1e-5 if config.get("type") == "LlamaConfig" else None


def _family_dropout(data: dict) -> float | None:
    config = (data.get("model") or {}).get("model_config") or {}
    return 0.1 if config.get("type") == "GPT2Config" else None


THEIR_DEFAULTS: tuple[TheirDefault, ...] = (
    TheirDefault("optimizer", "optimizer.weight_decay", "weight_decay", lambda d: 0.0,
                 "MindFormers' AdamW default; the workbook's is 0.1"),
    TheirDefault("optimizer", "optimizer.betas", "betas", lambda d: [0.9, 0.999],
                 "MindFormers' AdamW default; the workbook's is [0.9, 0.99]", also=("optimizer.beta1",
                                                                                   "optimizer.beta2")),
    TheirDefault("optimizer", "optimizer.eps", "eps", _eps, "MindFormers' default for this optimizer type; the "
                                                            "workbook's is 1e-8"),
    TheirDefault("runner_wrapper", "runner_wrapper.use_clip_grad", "max_grad_norm", lambda d: 0.0,
                 "MFTrainOneStepCell clips only with use_clip_grad: true; the workbook clips at 1.0"),
    TheirDefault("lr_schedule", "lr_schedule.lr_end", "min_lr", lambda d: 0.0,
                 "MindFormers' schedules decay to 0; the workbook's min_lr is 1e-4",
                 also=("lr_schedule.min_lr", "lr_schedule.end_learning_rate")),
    TheirDefault("lr_schedule", "lr_schedule.warmup_steps", "warmup", lambda d: 0,
                 "no warm-up unless warmup_steps or warmup_ratio; the workbook's is 100 steps",
                 also=("lr_schedule.warmup_ratio",)),
    TheirDefault("parallel", "parallel.gradients_mean", "parallel.gradients_mean", lambda d: False,
                 "MindSpore's default (gradients summed); the workbook's is true (averaged)"),
    TheirDefault("", "context.device_target", "device_target", lambda d: "Ascend",
                 "MindFormers trains on Ascend; the workbook's default is CPU (on this CPU: --target cpu, or "
                 "--scale PRESET for a try-out)"),
    TheirDefault("", "seed", "seed", lambda d: 0, "MindFormers' default seed; the workbook's is 1337"),
    TheirDefault("", "do_eval", "eval_every", lambda d: 0,
                 "MindFormers evaluates only with do_eval: true; the workbook validates once, at the end"),
    TheirDefault("model", "model.model_config.rms_norm_eps", "model.rms_eps", _family_eps,
                 "MindFormers' LlamaConfig default; the workbook's is 1e-6"),
    TheirDefault("model", "model.model_config.hidden_dropout_rate", "model.dropout", _family_dropout,
                 "MindFormers' GPT2Config default; the workbook's is 0.0", also=("model.model_config.hidden_dropout_prob",
                                                                                "model.model_config.hidden_dropout")),
)


def missing_defaults(data: dict, present: set[str]) -> list[tuple[TheirDefault, Any]]:
    """The defaults this recipe relies on: (default, its value) for each key it leaves out where it matters."""
    out = []
    for d in THEIR_DEFAULTS:
        if d.section and d.section not in data:
            continue
        if {d.source, *d.also} & present:
            continue
        value = d.value(data)
        if value is not None:
            out.append((d, value))
    return out
