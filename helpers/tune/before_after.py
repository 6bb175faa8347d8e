"""The workbook's final table: the pinned baseline against the current best, medians over each side's runs, and the
two measured side by side (`cumulative.py`), the one row with an interval."""
from __future__ import annotations

from helpers.config import Config
from helpers.record import RunRecord, median_summary, memory_label


SIDE_BY_SIDE = "throughput, side by side"  # the cumulative measurement's row


def before_after_rows(base_cfg: Config, base_runs: list[RunRecord], best_cfg: Config,
                      best_runs: list[RunRecord], cumulative=None) -> list[dict]:
    """Rows of metric, unit, baseline, best, ratio (best ÷ baseline; None where a side has no value); the comm
    share appears only if a run reports it. cumulative: the best's `cumulative.Cumulative`, if measured: a last
    row with its ratio, interval [low, high] and level (its baseline and best columns empty: the arms took turns)."""
    def pair(fn) -> tuple:
        return fn(base_cfg, base_runs), fn(best_cfg, best_runs)

    rows = [
        ("model params", "parameters", pair(lambda c, r: median_summary(r, "n_params"))),
        ("data parallel", "processes", pair(lambda c, r: c.parallel.data_parallel)),
        ("global batch", "sequences", pair(lambda c, r: c.global_batch)),
        ("micro-batch per device", "sequences", pair(lambda c, r: c.micro_batch_per_device)),
        ("gradient accumulation", "micro-batches", pair(lambda c, r: c.grad_accum_steps)),
        ("step time", "ms", pair(lambda c, r: median_summary(r, "step_time_ms"))),
        ("throughput", "tokens/s", pair(lambda c, r: median_summary(r, "tokens_per_s"))),
        ("MFU of the matmul peak", "fraction", pair(lambda c, r: median_summary(r, "mfu"))),
        ("MFU of the hardware peak", "fraction", pair(lambda c, r: median_summary(r, "mfu_hardware"))),
        (memory_label(base_runs[0].summary if base_runs else None), "bytes",
         pair(lambda c, r: median_summary(r, "peak_memory_bytes"))),
        ("comm share of step time", "fraction", pair(lambda c, r: median_summary(r, "comm_step_share"))),
        (f"loss after {base_cfg.steps} steps", "nats/token", pair(lambda c, r: median_summary(r, "loss_last"))),
        ("val loss", "nats/token", pair(lambda c, r: median_summary(r, "val_loss"))),
    ]
    out = [{"metric": metric, "unit": unit, "baseline": a, "best": b,
            "ratio": (b / a if a not in (None, 0) and b is not None else None)}
           for metric, unit, (a, b) in rows if not (metric.startswith("comm share") and a is None and b is None)]
    v = cumulative.verdict if cumulative is not None else None
    if v is not None and v.interval:
        out.append({"metric": SIDE_BY_SIDE, "unit": "tokens/s", "baseline": None, "best": None, "ratio": v.speedup,
                    "interval": list(v.interval), "level": v.level, "pairs": v.pairs})
    return out
