"""`make bench` item `ttq`: wall time to a target validation loss, nanoGPT's recipe against
the recipe the auto-tuner finds.

1. The target and the reference: nanoGPT's own recipe (configs/nano.yaml + NANOGPT_RECIPE, `iters` iterations)
   trained by this project once per seed; the target is the worse seed's final validation loss (nats/token), and
   these runs' own seconds to it are the reference time (the worse seed's is its whole run). They are not rerun
   later: a rerun of the seed that set the target lands a hair above or below it by run-to-run nondeterminism (in
   the first try of this item, 150 iterations, both tuner baseline reruns of the seed that set the target ended
   2.4e-8 nats/token above it), so a rerun could "not reach"
   its own target.
2. The tuner: `autotune_time_to_target` from nanoGPT's recipe with that target and `budget_min` minutes
   (helpers/tune/ttq_search.py), the runs of step 1 pinned as its baseline (not trained again out of its
   budget); its ledger's entries are kept in the result (`tuner.ledger`).
3. The tuned recipe (the tuner's best config), once per seed, each ending at the target. When the tuner kept no
   change, the tuned recipe is nanoGPT's and its time is step 1's (ratio 1). Not interleaved with the
   reference: the target must exist before the tuner runs and the tuned recipe only after it; load averages of each
   phase are recorded instead.
Time to target = wall seconds since the run's process started (start-up, compile, every step and validation pass:
everything the user pays), interpolated between the validation passes around the crossing; every run compiles cold
(no compile cache), as the tuner's rounds do. ratio = mean tuned seconds ÷ mean reference seconds, with a
95% interval (`ratio_interval`: delta method on the log of the ratio of two independent means, Welch's degrees of
freedom); a seed that does not reach the target leaves its arm without a time (the ratio is then missing and the
musts fail).
Musts: ratio ≤ RATIO_LIMIT, the interval's upper end ≤ UPPER_LIMIT, every tuned seed reaches the target, the
target ≤ TARGET_LIMIT.
"""
from __future__ import annotations

import json
import math
import os
import tempfile
import time
from pathlib import Path

from helpers import config as config_mod
from helpers.config import load_config, with_changes
from helpers.paired import t_quantile
from helpers.spawn.runner import launch
from helpers.tune.ttq_search import autotune_time_to_target
from helpers.tune.convergence import eval_curve, seed_times_text, time_to_target
from helpers.tune.rounds import Workbook
from registry import MET, MISSED, MUST, NOT_MEASURED, Check, Item, Judgement, at_most, positive

REPO = Path(__file__).resolve().parent.parent
NANO = REPO / "configs" / "nano.yaml"
# tuned ÷ nanoGPT recipe seconds to target, the upper end of its 95% interval; the target's val loss
RATIO_LIMIT, UPPER_LIMIT, TARGET_LIMIT = 0.40, 0.5, 1.91
MIN_SEEDS = 4  # seeds per arm a record needs
# nanoGPT's shakespeare_char CPU recipe (its README's command line), on top of configs/nano.yaml.
NANOGPT_RECIPE = {"eval_batches": 20, "warmup": 100, "lr": 1e-3, "min_lr": 1e-4, "betas": [0.9, 0.99],
                  "weight_decay": 0.1, "max_grad_norm": 1.0, "batch_size": 12}
EVALS = 20  # validation passes over nanoGPT's schedule: the resolution of time to target (nanoGPT itself: 8)


def nanogpt_config(iters: int):
    """nanoGPT's recipe for `iters` iterations, a validation pass every iters/EVALS steps, cold compiles."""
    return with_changes(load_config(NANO), {"steps": iters, "eval_every": max(1, iters // EVALS),
                                            "compile_cache": False, **NANOGPT_RECIPE})


def _run_row(run, target: float) -> dict:
    t = time_to_target(run, target)
    return {"seed": run.config.seed, "status": run.status, "ended": run.summary.get("status_reason") or "all steps",
            "steps": len(run.metrics), "final_val_loss": float(eval_curve(run)[1][-1]),
            "elapsed_s": run.metrics[-1].get("elapsed_s"), "time_to_target_s": t, "reached": t is not None,
            "tokens_per_s": run.summary.get("tokens_per_s")}


def _recipe(cfg) -> dict:
    return {k: config_mod.flatten(cfg)[k] for k in ("lr", "min_lr", "warmup", "steps", "schedule", "batch_size",
                                                    "grad_accum_steps")}


def ratio_interval(reference: list[float], tuned: list[float], level: float = 0.95) -> tuple[float, float]:
    """The `level` interval of mean(tuned) ÷ mean(reference) (seconds ÷ seconds) from two independent samples:
    log ratio ± t·se, se² = s_t²/(n_t·m_t²) + s_r²/(n_r·m_r²) (the delta method), Welch's degrees of freedom."""
    parts = []
    for xs in (tuned, reference):
        n, m = len(xs), sum(xs) / len(xs)
        var = sum((x - m) ** 2 for x in xs) / (n - 1)
        parts.append((var / (n * m * m), n))
    se2 = sum(v for v, _ in parts)
    dof = se2 ** 2 / sum(v * v / (n - 1) for v, n in parts) if se2 > 0 else 1e9
    half = t_quantile(0.5 + level / 2, max(1, math.floor(dof))) * math.sqrt(se2)
    ratio = (sum(tuned) / len(tuned)) / (sum(reference) / len(reference))
    return ratio * math.exp(-half), ratio * math.exp(half)


def item_ttq(iters: int, budget_min: float, seeds: int, tuner_seeds: int) -> dict:
    """Measure the three parts in the module docstring (`seeds` runs per arm; `tuner_seeds` per arm of the tuner's
    rounds); returns the result (every run's row, the tuner's ledger, the ratio and its 95% interval)."""
    load = {"start": os.getloadavg()}
    ref_cfg = nanogpt_config(iters)
    seed_list = [ref_cfg.seed + k for k in range(seeds)]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        t0 = time.perf_counter()
        first = [launch(with_changes(ref_cfg, {"seed": s}), tmp / f"target_{s}", progress=False,
                        desc=f"nanoGPT recipe seed {s}") for s in seed_list]
        bad = [r for r in first if r.status != "ok"]
        if bad:
            raise RuntimeError(f"nanoGPT's recipe ended '{bad[0].status}': {bad[0].summary.get('status_reason')}")
        target = max(float(eval_curve(r)[1][-1]) for r in first)
        print(f"  target: val loss {target:.4f} (the worse of {seeds} seeds after {iters} iterations, "
              f"{time.perf_counter() - t0:.0f} s)", flush=True)
        load["tuner_start"] = os.getloadavg()
        t1 = time.perf_counter()
        tuned = autotune_time_to_target(ref_cfg, tmp / "tuner", budget_min, target, seeds=tuner_seeds,
                                        log=lambda line: print(f"  tuner: {line}", flush=True), baseline_runs=first)
        tuner_s = time.perf_counter() - t1
        wb = Workbook.open(tmp / "tuner")
        best_cfg = wb.best_config()
        ledger = [json.loads(line) for line in (wb.path / "ledger.jsonl").read_text(encoding="utf-8").splitlines()]
        load["tuned_start"] = os.getloadavg()
        tuned_cfg = with_changes(best_cfg, {"target_val_loss": target, "compile_cache": False})
        runs = {"nanogpt": first, "tuned": []}
        kept = [r.path for r in wb.best_runs()] != [r.path for r in wb.baseline_runs()]
        if not kept:  # the tuned recipe is nanoGPT's: its time is the reference runs' own (ratio 1)
            runs["tuned"] = first
            print("  the tuner kept no change: the tuned recipe is nanoGPT's, timed by the reference runs",
                  flush=True)
        for seed in seed_list if kept else []:
            run = launch(with_changes(tuned_cfg, {"seed": seed}), tmp / f"tuned_{seed}", progress=False,
                         desc=f"tuned seed {seed}")
            runs["tuned"].append(run)
            print(f"  tuned seed {seed}: {seed_times_text([time_to_target(run, target)])} to {target:.4f}",
                  flush=True)
        load["end"] = os.getloadavg()
        rows = {arm: [_run_row(r, target) for r in group] for arm, group in runs.items()}
    means = {arm: (sum(r["time_to_target_s"] for r in group) / len(group)
                   if all(r["reached"] for r in group) else None) for arm, group in rows.items()}
    ratio = means["tuned"] / means["nanogpt"] if None not in means.values() else None
    interval = (list(ratio_interval([r["time_to_target_s"] for r in rows["nanogpt"]],
                                    [r["time_to_target_s"] for r in rows["tuned"]]))
                if ratio is not None and seeds > 1 else None)
    return {"iters": iters, "seeds": seed_list, "tuner_seeds": tuner_seeds, "budget_min": budget_min,
            "target_val_loss": target,
            "order": "nanoGPT recipe per seed (sets the target, the reference time) → tuner → tuned recipe per seed",
            "tuner": {"elapsed_s": tuner_s, "stop_reason": tuned.stop_reason, "kept_a_change": kept,
                      "rounds": tuned.rounds, "skipped": tuned.skipped, "ledger": ledger},
            "recipes": {"nanogpt": _recipe(ref_cfg), "tuned": _recipe(best_cfg)},
            "changes": {k: list(v) for k, v in config_mod.diff(ref_cfg, best_cfg).items()
                        if k not in ("target_val_loss",)},
            "comparison": rows, "mean_time_to_target_s": means, "ratio": ratio, "ratio_interval_95": interval,
            "tuned_final_val_loss": [r["final_val_loss"] for r in rows["tuned"]], "load_avg": load}


def ttq_rows(r: dict) -> list[tuple[str, str]]:
    means = r["mean_time_to_target_s"]
    times = " → ".join("did not reach" if means[a] is None else f"{means[a]:.0f} s" for a in ("nanogpt", "tuned"))
    ratio = "missing" if r["ratio"] is None else f"×{r['ratio']:.3f}"
    if r.get("ratio_interval_95"):
        ratio += " (95% ×{:.3f}–×{:.3f})".format(*r["ratio_interval_95"])
    changes = ", ".join(f"{k} {a}→{b}" for k, (a, b) in r.get("changes", {}).items()) or "none"
    return [(f"seconds to val loss {r['target_val_loss']:.4f}: nanoGPT recipe → tuned ({r['iters']} iterations, "
             f"{r['budget_min']:g} min tuner, {len(r['seeds'])} seeds)", f"{times} ({ratio}); tuned: {changes}")]


def _ratio(r: dict) -> Judgement:
    if "mean_time_to_target_s" not in r:
        return Judgement(NOT_MEASURED, "not run")
    if r["ratio"] is None:  # an arm that did not reach the target has no seconds to compare
        return Judgement(MISSED, f"tuned ÷ nanoGPT recipe seconds to val loss {r['target_val_loss']:.4f}: missing "
                                   f"(an arm did not reach the target)")
    return at_most(r["ratio"], RATIO_LIMIT, f"tuned ÷ nanoGPT recipe seconds to val loss {r['target_val_loss']:.4f}: "
                                            f"×{r['ratio']:.3f} {{sign}} ×{RATIO_LIMIT}")


def _upper(r: dict) -> Judgement:
    if "mean_time_to_target_s" not in r:
        return Judgement(NOT_MEASURED, "not run")
    if not r.get("ratio_interval_95"):
        return Judgement(MISSED, "no interval: an arm did not reach the target, or one seed per arm")
    return at_most(r["ratio_interval_95"][1], UPPER_LIMIT, f"upper end of the ratio's 95% interval "
                                                          f"×{r['ratio_interval_95'][1]:.3f} {{sign}} ×{UPPER_LIMIT}")


def _every_seed(r: dict) -> Judgement:
    if "comparison" not in r:
        return Judgement(NOT_MEASURED, "not run")
    tuned = r["comparison"]["tuned"]
    reached = sum(row["reached"] for row in tuned)
    return Judgement(MET if reached == len(tuned) and len(tuned) >= MIN_SEEDS else MISSED,
                     f"{reached} of {len(tuned)} tuned seeds reached val loss {r['target_val_loss']:.4f} "
                     f"(at least {MIN_SEEDS} seeds, all reaching it)")


ITEMS = [Item("ttq", "seconds to nanoGPT's validation loss: its recipe against the time-to-target tuner's",
              lambda a: item_ttq(a.iters, a.budget_min, a.seeds, a.tuner_seeds), ttq_rows,
              (Check(MUST, f"tuned ÷ nanoGPT recipe mean seconds to the target ≤ ×{RATIO_LIMIT}", _ratio,
                     miss={"mean_time_to_target_s": {}, "ratio": 0.9, "target_val_loss": 1.9}),
               Check(MUST, f"the upper end of that ratio's 95% interval ≤ ×{UPPER_LIMIT}", _upper,
                     miss={"mean_time_to_target_s": {}, "ratio": 0.45, "ratio_interval_95": [0.4, 0.51]}),
               Check(MUST, f"every seed of the tuned recipe (≥ {MIN_SEEDS}) reaches the target", _every_seed,
                     miss={"target_val_loss": 1.9, "comparison": {"tuned": [{"reached": True}, {"reached": False}]}}),
               Check(MUST, f"the target (the worse nanoGPT-recipe seed's final val loss) ≤ {TARGET_LIMIT}",
                     lambda r: at_most(r.get("target_val_loss"), TARGET_LIMIT,
                                       f"target {r.get('target_val_loss') or 0:.4f} {{sign}} {TARGET_LIMIT}"),
                     miss={"target_val_loss": 2.1})),
              options=((("--iters",), {"type": int, "default": 2000, "help": "iterations (parity, ttq)"}),
                       (("--budget-min",), {"type": float, "default": 30.0, "help": "ttq: the tuner's budget, minutes"}),
                       (("--seeds",), {"type": int, "default": MIN_SEEDS, "help": "ttq: seeds per arm"}),
                       (("--tuner-seeds",), {"type": int, "default": 2, "help": "ttq: seeds per arm of the tuner's "
                                                                             "rounds"})),
              check_args=lambda a: positive(a, "iters", "seeds", "tuner_seeds") or (
                  "" if a.budget_min > 0 else f"--budget-min {a.budget_min} measures nothing; give a positive "
                                              f"number of minutes"))]
