"""What notebook 10 (data parallel) calls: its configs, its runs, the gradient-fusion rounds, its tables and its
loss-equivalence check.

Every figure comes from the run records (real runs) or from `planner` (arithmetic, labelled as an estimate); every
fusion verdict comes from `Workbook.run_round` (a paired round: both fusion settings in each rank of one msrun
launch, ABBA blocks, the workbook's keep/reject rule).
"""
from __future__ import annotations

import os

import numpy as np
import pandas as pd

from helpers import config as config_mod
from helpers.config import Config, ConfigError, from_dict, speed_measured, with_changes
from helpers.paths import absolute
from helpers.book.planner import GB, MODELS, Strategy, eight_by_40gb, estimate, plan_rows, recommend, shape_of
from helpers.record import RunRecord
from helpers.spawn.runner import launch_or_reuse
from helpers.tune.rounds import Workbook
from helpers.tune.study import SHORTCUT_DEFAULTS, base_config, config_path, data_parallel_applies, run_rounds
from helpers.units import MIB


def dp_configs(preset: str, steps: int, corpus: str, batch_size: int, device_target: str = "CPU",
               fusion_mb: int = 32, fusion_indices: list[int] | None = None) -> dict[str, Config]:
    """The single process and the unfused DP=2 config (the fusion rounds' baseline), same global batch. The DP
    config carries the fusion knobs' settings (bucket MB, split indices) so that a round changes comm_fusion
    only; every DP run, and each arm of a fusion round, profiles its all-reduces (parallel.comm_profile_steps).
    Their speeds are compared, so each compiles its own graph (`config.speed_measured`)."""
    base = speed_measured(from_dict({
        "model": {"preset": preset}, "data": {"corpus": [corpus]}, "steps": steps, "batch_size": batch_size,
        "warmup": max(1, steps // 10), "eval_every": 0, "eval_batches": 4, "steady_after": max(2, min(5, steps // 5)),
        "device_target": device_target,
        "parallel": {"fusion_size_mb": fusion_mb, "fusion_indices": fusion_indices or [5, 10]}}))
    return {"single process": base, "dp2 unfused": with_changes(base, {"parallel.data_parallel": 2})}


def fusion_study(dp_unfused: RunRecord, workbook_dir: str | os.PathLike, rounds: dict[str, dict],
                 progress: bool = True) -> tuple[Workbook, list]:
    """The gradient-fusion rounds as real rounds: a workbook whose baseline is the unfused DP run already
    trained (pinned as it is, not trained again: its config is the workbook's), then `rounds` ({name: changes},
    in order, each against the then-best) through `Workbook.run_round`: a fusion change is measured paired (both
    arms in each rank of one msrun launch, ABBA blocks) and judged by the workbook's rule."""
    # the record's config carries the profiler window that measured its all-reduces; the best's config does not
    # (each arm of a round is profiled in its warm-up, outside the blocks: dp_worker.pair_main)
    cfg = with_changes(dp_unfused.config, {"monitor.profile_steps": 0, "monitor.profile_start": 0})
    wb = Workbook.create(workbook_dir, cfg)
    wb.baseline(progress=progress, adopt=[dp_unfused])  # one run: the loss gate stays at its default width
    return wb, run_rounds(wb, rounds, progress=progress)


def fusion_records(wb: Workbook, results: list) -> dict[str, RunRecord]:
    """Every run of a fusion study by label (baseline runs, then each round's reference and candidate runs; the
    arms' records carry their all-reduce profile, taken in the round's own msrun launch)."""
    out = {f"baseline {k}": r for k, r in enumerate(wb.baseline_runs(), 1)}
    for result in results:
        for role, runs in (("reference", result.reference_runs), ("candidate", result.candidate_runs)):
            out.update({f"{result.name} {role} {k}": r for k, r in enumerate(wb.load_runs(runs), 1)})
    return out


def run_all(configs: dict[str, Config], runs_dir: str | os.PathLike) -> dict[str, RunRecord]:
    """Train every config in its own folder under runs_dir (relative: to the working directory) via `runner.launch`;
    a finished run of the same config already there is reused, another record moved aside (`launch_or_reuse`)."""
    root = absolute(runs_dir)
    return {label: launch_or_reuse(cfg, root / label.replace(" ", "_"), desc=label) for label, cfg in configs.items()}


def comm_table(records: dict[str, RunRecord]) -> pd.DataFrame:
    """Speed and communication of each run: merged step time, tokens/s, all-reduce calls, comm ms and share."""
    rows = []
    for label, rec in records.items():
        s, p = rec.summary, rec.config.parallel
        rows.append({"run": label, "status": s.get("status"), "processes": p.data_parallel,
                     "fusion": p.comm_fusion if p.data_parallel > 1 else "-",
                     "step (ms, slowest rank)": s.get("step_time_ms"), "tokens/s": s.get("tokens_per_s"),
                     "all-reduce calls/step": s.get("allreduce_calls_per_step"),
                     "all-reduce ms/step": s.get("comm_ms_per_step"),
                     "comm (% of step)": None if s.get("comm_step_share") is None else 100 * s["comm_step_share"],
                     "per-rank step (ms)": s.get("rank_step_time_ms"),
                     "peak RSS per rank (MiB)": (s.get("peak_memory_bytes") or 0) / MIB,
                     "loss last": s.get("loss_last"), "val loss": s.get("val_loss")})
    return pd.DataFrame(rows).set_index("run").round(3)


def loss_equivalence(single: RunRecord, parallel: RunRecord) -> dict:
    """Max absolute and relative per-step loss difference between two runs over their common steps."""
    a = {r["step"]: r["loss"] for r in single.metrics}
    b = {r["step"]: r["loss"] for r in parallel.metrics}
    steps = sorted(set(a) & set(b))
    x, y = np.array([a[s] for s in steps]), np.array([b[s] for s in steps])
    return {"steps compared": len(steps), "max abs diff": float(np.abs(x - y).max()),
            "max rel diff": float((np.abs(x - y) / np.abs(x)).max())}


def loss_diff_plot(single: RunRecord, parallel: RunRecord):
    """Two panels: both loss curves, and their per-step absolute difference (log scale)."""
    import matplotlib.pyplot as plt
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.6))
    for rec, label, style in ((single, "single process", "-"), (parallel, "DP=2 (merged)", "--")):
        ax1.plot([r["step"] for r in rec.metrics], [r["loss"] for r in rec.metrics], style, label=label)
    ax1.set(xlabel="step", ylabel="training loss (nats/token)", title="Same global batch, same loss curve")
    ax1.legend()
    diff = np.abs(np.array([r["loss"] for r in single.metrics]) - np.array([r["loss"] for r in parallel.metrics]))
    ax2.semilogy([r["step"] for r in single.metrics], np.maximum(diff, 1e-12))
    ax2.set(xlabel="step", ylabel="|loss difference|", title="Per-step difference (float32 reduction order)")
    fig.tight_layout()
    return fig


def hand_arithmetic_7b() -> pd.DataFrame:
    """7B in fp16 with AdamW, by hand (bytes/param x 7e9) next to the planner's estimate (GB = 1e9 bytes)."""
    e = estimate(MODELS["7B"], Strategy(dp=1, dtype="fp16"))
    hand = {"weights (fp16, 2 B/param)": 7e9 * 2, "gradients (fp16, 2 B/param)": 7e9 * 2,
            "AdamW: fp32 master + m + v (12 B/param)": 7e9 * 12}
    planner = [e.params, e.grads, e.optimizer]
    rows = [{"part": k, "hand (GB)": v / GB, "planner (GB)": p / GB} for (k, v), p in zip(hand.items(), planner)]
    rows.append({"part": "model state total (16 B/param)", "hand (GB)": sum(hand.values()) / GB,
                 "planner (GB)": e.model_state / GB})
    return pd.DataFrame(rows).set_index("part")


def strategy_table(device_gb: float = 40.0) -> pd.DataFrame:
    """The 8 x 40 GB example for 7B, then one fitting plan per larger size (estimates, micro-batch 1)."""
    rows = eight_by_40gb()
    for name, strategy in (("13B", Strategy(dp=2, tp=4, recompute=True, optimizer_shard=True)),
                           ("30B", Strategy(dp=2, tp=4, pp=2, recompute=True, optimizer_shard=True)),
                           ("70B", Strategy(dp=2, tp=8, pp=4, recompute=True, optimizer_shard=True))):
        rows += plan_rows(MODELS[name], [strategy], device_gb * GB)
    table = pd.DataFrame(rows)
    table["usual strategy for the size"] = [recommend(MODELS[m].n_params) for m in table["model"]]
    return table.round(2)


def memory_check(record: RunRecord) -> pd.DataFrame:
    """The planner's estimate for a run's own model (fp32, its batch) next to the run's measured peak RSS."""
    cfg, s = record.config, record.summary
    from helpers.run.data import Tokenizer
    vocab = cfg.model.vocab_size or Tokenizer.load(record.path / "tokenizer.json").vocab_size
    shape = shape_of(cfg, int(s["n_params"]), vocab)
    e = estimate(shape, Strategy(dp=cfg.parallel.data_parallel, micro_batch=cfg.micro_batch_per_device,
                                 dtype="fp32", recompute=cfg.recompute == "blocks"))
    return pd.DataFrame([{"run": record.path.name, "estimated model state (MiB)": e.model_state / MIB,
                          "estimated activations (MiB)": e.activations / MIB,
                          "estimated total (MiB)": e.total / MIB,
                          "measured peak RSS per process (MiB)": s["peak_memory_bytes"] / MIB}]).set_index("run")


def data_parallel_configs(preset: str, steps: int, corpus: str, batch_size: int, device_target: str = "CPU",
                          config: str | os.PathLike = "") -> tuple[dict[str, Config] | None, str]:
    """Notebook 10's single-process and unfused DP=2 configs (`dp_configs`) and '' — from `config` when one
    is given (its model and recipe, with the DP study's batch, schedule spacing and fusion knobs on top) — or
    (None, the line `data_parallel_applies` gives) when DP does not apply to it."""
    if not config_path(config):
        configs = dp_configs(preset or SHORTCUT_DEFAULTS["preset"], steps or 12, corpus or SHORTCUT_DEFAULTS["corpus"],
                             batch_size, device_target)
    else:
        base = base_config(preset, steps, corpus, config=config)
        plain = dp_configs(base.model.preset if base.model.preset in config_mod.PRESETS else "nano", base.steps,
                           base.data.corpus[0], batch_size, device_target)["single process"]
        keep = ("batch_size", "warmup", "eval_every", "eval_batches", "steady_after", "device_target")
        flat = config_mod.flatten(plain)
        dp = {k: flat[k] for k in keep}
        dp.update({k: v for k, v in flat.items() if k.startswith("parallel.fusion")})
        dp["warmup_ratio"] = 0.0
        try:
            single = config_mod.speed_measured(with_changes(base, dp))
        except ConfigError as exc:
            return None, f"data parallel does not apply to this config: {exc}"
        configs = {"single process": single}
    why = data_parallel_applies(configs["single process"])
    if why:
        return None, why
    configs.setdefault("dp2 unfused", with_changes(configs["single process"], {"parallel.data_parallel": 2}))
    return configs, ""
