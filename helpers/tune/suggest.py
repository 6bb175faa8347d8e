"""From evaluation to decision: rules that read a run record and suggest the next round, with evidence.

Each rule is a symptom seen in the metrics and the round that addresses it; each suggestion is a
convergence round (it changes what the model learns, so validation loss at equal tokens judges it):
  * effective throughput (loss drop per 1k tokens) flat for a long window → double the global batch;
  * grad-norm alarms keep firing → double the warm-up;
  * train loss falls while validation perplexity rises → more regularisation (weight decay ×2, dropout).
Convergence rules of thumb speak of windows of ~500 steps on long runs; here runs are tens to hundreds of steps, so the
flat window is a third of the run (at least `monitor.throughput_window`, at most 500 steps) and "keeps
firing" / "rises" count alarms and evaluation passes rather than steps.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from helpers.config import Config
from helpers.run.monitors import rising_while_falling
from helpers.record import RunRecord, memory_fraction
from helpers.tune.study import slug

FLAT_FRACTION = 0.1  # "flat": the window's median loss drop per 1k tokens is ≤ 10% of the run's best
MAX_FLAT_WINDOW = 500  # the seed rule's window on long runs, in steps
ALARM_ONSETS = 3  # grad-norm alarms "keep firing": at least this many separate crossings of the limit
OVER_LIMIT_SHARE = 0.25  # ... or the grad norm above the limit on at least this share of steps
RISING_EVALS = 2  # val PPL rising at each of the last 2 evaluation passes while train loss fell
SMALL_MEMORY = 0.5  # below this share of its memory (`record.memory_fraction`) a doubled micro-batch is affordable


@dataclass
class Suggestion:
    """A round to try next: its name, {key: new value} changes, objective, the evidence and the rule."""
    name: str
    changes: dict[str, Any]
    objective: str
    evidence: str
    rule: str

    def text(self) -> str:
        """One line: what to change, why (with numbers), and how it will be judged."""
        change = ", ".join(f"{k}={v!r}" for k, v in self.changes.items())
        return f"{self.name}: {change} ({self.objective} round) — {self.rule}: {self.evidence}"


def flat_window(cfg: Config) -> int:
    """Steps of the 'flat effective throughput' window: a third of the run, within [throughput_window, 500]."""
    return min(MAX_FLAT_WINDOW, max(cfg.monitor.throughput_window, cfg.steps // 3))


def _flat_throughput(record: RunRecord, base: Config) -> Suggestion | None:
    window = flat_window(record.config)
    cols = record.columns("step", "loss_drop_per_ktok")
    has = cols.filled["loss_drop_per_ktok"]
    rates, at = cols["loss_drop_per_ktok"][has], cols["step"][has]
    last = rates[at > record.summary.get("steps", len(cols)) - window]
    if len(last) < window // 2 or not rates.size:
        return None
    best, now = float(rates.max()), float(np.median(last))
    if best <= 0 or now > FLAT_FRACTION * best:
        return None
    memory = memory_fraction(record.summary, record.env)  # RSS ÷ RAM on CPU, device peak ÷ device memory off it
    roomy = memory.fraction is not None and memory.fraction < SMALL_MEMORY
    # A doubled micro-batch also runs faster per token on CPU; accumulation doubles the batch at the same memory.
    changes = ({"batch_size": 2 * base.batch_size} if roomy else {"grad_accum_steps": 2 * base.grad_accum_steps})
    key, value = next(iter(changes.items()))
    where = (f"{memory.text()}, so a bigger micro-batch fits" if roomy
             else f"memory is not known to be roomy ({memory.text()}), so accumulate")
    return Suggestion(slug(key, value), changes, "convergence",
                      f"loss drop per 1k tokens over the last {window} steps is {now:.4f} nats (median), "
                      f"≤ {FLAT_FRACTION:.0%} of the run's best {best:.4f}; {where}",
                      f"effective throughput flat for {window} steps (the 500-step rule scaled to a "
                      f"{record.summary.get('steps')}-step run) → double the global batch")


def _grad_norm_alarms(record: RunRecord, base: Config) -> Suggestion | None:
    limit = record.config.monitor.grad_norm_limit
    if not limit:
        return None
    cols = record.columns("grad_norm")
    norms = cols["grad_norm"][cols.filled["grad_norm"]]
    over = int((norms > limit).sum())
    onsets = (record.summary.get("alarm_counts") or {}).get("grad_norm", 0)
    share = over / len(norms) if len(norms) else 0.0
    if onsets < ALARM_ONSETS and share < OVER_LIMIT_SHARE:
        return None
    now = base.warmup_steps
    warmup = now * 2 if now else max(1, base.steps // 10)
    change = {"warmup": warmup, **({"warmup_ratio": 0.0} if base.warmup_ratio else {})}  # steps replace the share
    return Suggestion(slug("warmup", warmup), change, "convergence",
                      f"grad norm above monitor.grad_norm_limit={limit:g} on {over} of {len(norms)} steps "
                      f"({share:.0%}), alarm fired {onsets} time(s), max {norms.max():.3g}; warm-up now "
                      f"{now} steps",
                      f"grad-norm alarms keep firing (≥ {ALARM_ONSETS} crossings or ≥ {OVER_LIMIT_SHARE:.0%} of "
                      f"steps) → double the warm-up")


def _overfitting(record: RunRecord, base: Config) -> list[Suggestion]:
    cols = record.columns("step", "val_ppl", "loss_ema")
    has = cols.filled["val_ppl"]
    evals = [(int(step), ppl, ema) for step, ppl, ema in zip(cols["step"][has].tolist(), cols["val_ppl"][has].tolist(),
                                                             cols["loss_ema"][has].tolist())]
    fired = any(a["kind"] == "overfit" for a in record.summary.get("alarms") or [])
    if not (fired or rising_while_falling(evals, RISING_EVALS)):
        return []
    first, last = evals[-(RISING_EVALS + 1)], evals[-1]
    evidence = (f"val PPL {first[1]:.2f} → {last[1]:.2f} over evals at steps {first[0]}-{last[0]} while train "
                f"loss EMA {first[2]:.3f} → {last[2]:.3f}" + ("; overfit alarm fired" if fired else ""))
    rule = "train loss falls while validation PPL rises → more regularisation or data diversity"
    decay = round(base.weight_decay * 2, 6) if base.weight_decay else 0.1
    out = [Suggestion(slug("weight_decay", decay), {"weight_decay": decay}, "convergence",
                      f"{evidence}; weight_decay now {base.weight_decay:g}", rule)]
    if base.model.dropout == 0.0:
        out.append(Suggestion(slug("dropout", 0.1), {"model.dropout": 0.1}, "convergence",
                              f"{evidence}; no dropout now", rule))
    return out


def suggest(record: RunRecord, base: Config | None = None) -> list[Suggestion]:
    """Every rule that fires on `record`, as rounds relative to `base` (default: the record's own config)."""
    base = base or record.config
    found = [_flat_throughput(record, base), _grad_norm_alarms(record, base), *_overfitting(record, base)]
    return [s for s in found if s is not None]


def suggest_for(workbook) -> list[Suggestion]:
    """Suggestions from the current best's runs, relative to the best config; one per name (first evidence)."""
    base, seen = workbook.best_config(), {}
    for record in workbook.best_runs():
        for s in suggest(record, base):
            seen.setdefault(s.name, s)
    return list(seen.values())


def suggestions_table(suggestions: list[Suggestion]):
    """The suggestions as a DataFrame: name, change, objective, rule, evidence."""
    import pandas as pd
    return pd.DataFrame([{"name": s.name, "change": ", ".join(f"{k}={v!r}" for k, v in s.changes.items()),
                          "objective": s.objective, "rule": s.rule, "evidence": s.evidence} for s in suggestions],
                        columns=["name", "change", "objective", "rule", "evidence"])
