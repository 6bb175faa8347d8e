"""Merge the per-rank figures of a data-parallel run into its one run record (after msrun returns), and the
ranks' block step times of a data-parallel paired round into its paired.json.

Per step: step time = the slowest rank's (the step ends when every rank has its reduced gradients);
loss = mean of the ranks' shard losses (equal shards, so it is the global batch's loss). The summary
gains comm_step_share (profiled collective time / merged step time over the same steps) and per-rank figures.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from helpers.run.metrics import Ema, summarize
from helpers.run.profile import window_steps
from helpers.record import (METRICS_FILE, MetricColumns, atomic_write_json, atomic_write_text, load_run, rows_to_csv,
                            steady_mask, write_summary)
from helpers.wire import PAIRED_FILE, RankFile, decode_rank_file, paired_rank_files, rank_files


def _merge_row(base: dict, per_rank: list[dict]) -> dict:
    step_ms = max(r["step_time_ms"] for r in per_rank)
    losses = [r["loss"] for r in per_rank]
    loss = float(np.mean(losses)) if all(math.isfinite(v) for v in losses) else float("nan")
    waits = [r.get("data_wait_ms") for r in per_rank]  # None: not measured (sink mode) on that rank
    return {**base, "step_time_ms": step_ms, "data_wait_ms": None if None in waits else max(waits),
            "loss": loss, "tokens_per_s": base["tokens"] / (step_ms / 1000.0)}


def _comm_summary(ranks: list[RankFile], rows: list[dict]) -> dict:
    """comm_ms_per_step (mean over ranks), comm_step_share: that ÷ the merged step time in the profiled window."""
    stats = [r.comm for r in ranks if r.comm]
    if not stats:
        return {"comm_step_share": None, "comm_ms_per_step": None, "allreduce_calls_per_step": None,
                "comm_source": "not measured (parallel.comm_profile_steps=0 or too few steps)"}
    first, n = stats[0]["first_step"], stats[0]["steps"]
    window = [r["step_time_ms"] for r in rows if first <= r["step"] < first + n]
    comm_ms = float(np.mean([s["comm_ms_per_step"] for s in stats]))
    return {"comm_step_share": comm_ms / float(np.mean(window)),
            "comm_ms_per_step": comm_ms,
            "allreduce_calls_per_step": float(np.mean([s["allreduce_calls_per_step"] for s in stats])),
            "comm_op_ms_per_step": float(np.mean([s["op_ms_per_step"] for s in stats])),
            "comm_window": [first, first + n - 1],
            "comm_source": f"MindSpore profiler, collective ops over steps {first}-{first + n - 1} on each of "
                           f"{len(stats)} ranks (mean); includes waiting for the slower rank"}


def merge_ranks(run_dir: str | Path) -> dict | None:
    """Rewrite run_dir's metrics.csv and summary.json from ranks/rank_*.json; returns the summary (None: no ranks)."""
    run_dir = Path(run_dir)
    ranks = [decode_rank_file(p.read_text(encoding="utf-8")) for p in rank_files(run_dir)]
    if not ranks:
        return None
    record = load_run(run_dir)
    cfg, summary = record.config, record.summary
    start = min(r.start_step for r in ranks)
    by_step: dict[int, list[dict]] = {}
    for rank in ranks:
        for row in rank.rows:
            by_step.setdefault(row["step"], []).append(row)
    rows = [r for r in record.metrics if r["step"] < start]
    rows += [_merge_row(r, by_step[r["step"]]) for r in record.metrics
             if r["step"] >= start and len(by_step.get(r["step"], [])) == len(ranks)]
    ema = Ema()
    for row in rows:
        row["loss_ema"] = ema.update(row["loss"])
    atomic_write_text(run_dir / METRICS_FILE, rows_to_csv(rows))
    profiled = window_steps(cfg)  # the ranks' profiler window (comm_profile_steps): not speed
    columns = MetricColumns.of_rows(rows)
    stats = summarize(columns, start, cfg.steady_after, summary.get("flops_per_token") or 0.0,
                      summary.get("peak_flops"), profiled, hardware_peak_flops=summary.get("peak_flops_hardware"))
    peaks = [r.peak_rss_bytes for r in ranks]
    steps = columns["step"]
    steady = set(steps[steady_mask(steps, start + cfg.steady_after, profiled)].astype(int).tolist())
    rank_ms = [float(np.median([row["step_time_ms"] for row in r.rows if row["step"] in steady] or [np.nan]))
               for r in ranks]
    merged = {**summary, **stats, **_comm_summary(ranks, rows),
              # the ranks' own RSS, not this merging process's (summarize's peak_rss_bytes)
              "peak_memory_bytes": max(peaks), "peak_rss_bytes": max(peaks),
              "peak_memory_bytes_all_ranks": int(sum(peaks)),
              "data_parallel": cfg.parallel.data_parallel, "ranks_merged": len(ranks),
              "rank_step_time_ms": rank_ms, "rank_status": [r.status for r in ranks],
              "step_time_source": "per step, the slowest rank's time (median over the steady window)"}
    write_summary(run_dir, merged)
    return merged


def merge_pairs(folder: str | Path) -> dict | None:
    """folder/paired.json from the ranks' paired_rank_K.json (`wire.paired_rank_file`): rank 0's record with each
    block step time the slowest rank's, over the pairs every rank completed (the worst status wins); None when no
    rank wrote one."""
    folder = Path(folder)
    ranks = [json.loads(p.read_text(encoding="utf-8")) for p in paired_rank_files(folder)]
    if not ranks:
        return None
    n = min(len(r["pairs"]) for r in ranks)
    pairs = [[[max(times) for times in zip(*(r["pairs"][i][arm] for r in ranks))] for arm in (0, 1)]
             for i in range(n)]
    merged = {**ranks[0], "pairs": pairs, **{k: ranks[0][k][:n] for k in ("first_in_pair", "waits", "foreign_cores")
                                             if k in ranks[0]},
              "ranks_merged": len(ranks), "block_time_source": "per step, the slowest rank's time",
              "waits_source": "rank 0's", "foreign_source": "rank 0's reading (every rank counts msrun's tree as own)"}
    for rank in ranks:
        if rank["status"] == "failed" or (rank["status"] == "ended" and merged["status"] == "ok"):
            merged["status"], merged["reason"] = rank["status"], rank["reason"]
    atomic_write_json(folder / PAIRED_FILE, merged)
    return merged
