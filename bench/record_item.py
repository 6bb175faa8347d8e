"""`make bench` item `record_scale`: the run record at a million steps. A RecordWriter takes 1,000,000 rows shaped as
the train loop makes them (every metrics column, a validation pass every 1,000 steps, no alarms), called as the loop
calls it, in a child process: µs per step, the growth of that process's RSS, the size of metrics.csv. That file then
replaces the metrics.csv of a real 3-step nano run (its summary says 1,000,000 steps), and `python -m helpers show`,
`diagnose` and `tensorboard` each run on it as a user runs them. For contrast, the writer before it: one whole
rewrite of the same rows (`rows_to_csv` + an atomic write), which it did every 5 s.

Run as a script, this module is the child side (`write`, `rewrite`).
"""
from __future__ import annotations

import json
import math
import sys
import tempfile
import time
from pathlib import Path

from child import python
from registry import MUST, Check, Item, at_most, positive

REPO = Path(__file__).resolve().parent.parent
NANO = REPO / "configs" / "nano.yaml"
ROWS = 1_000_000
EVAL_EVERY = 1000
STEP_US_LIMIT, RSS_LIMIT_MB = 20.0, 20.0
COMMAND_LIMITS_S = {"show": 10.0, "diagnose": 10.0, "tensorboard": 60.0}


# ------------------------------------------------------------------------------------------------ child side

def loop_row(step: int, steps: int, state: dict) -> dict:
    """Step `step`'s row as loop.StepLoop._record and the monitors fill it for the nano preset (768 tokens a step,
    ~70 ms), with a slowly falling loss and its EMA; `state` carries the EMA and the elapsed seconds."""
    step_ms = 70.0 + 5.0 * math.sin(step * 0.37) + (900.0 if step == 1 else 0.0)
    loss = 1.5 + 3.0 * math.exp(-step / 20000.0) + 0.05 * math.sin(step * 1.3)
    state["ema"] = loss if step == 1 else 0.9 * state["ema"] + 0.1 * loss
    state["elapsed"] += step_ms / 1000.0
    val = loss + 0.08 if step % EVAL_EVERY == 0 or step == steps else None
    return {"step": step, "step_time_ms": step_ms, "data_wait_ms": 0.4 + 0.1 * math.cos(step), "tokens": 768,
            "tokens_per_s": 768 / (step_ms / 1000.0), "loss": loss, "loss_ema": state["ema"],
            "grad_norm": 0.8 + 0.2 * math.sin(step * 0.11), "loss_scale": 1.0, "overflow": 0,
            "lr": 1e-4 + 0.9e-3 * 0.5 * (1 + math.cos(math.pi * step / steps)), "rss_bytes": 620_000_000 + step % 4096,
            "device_memory_bytes": None, "val_loss": val, "val_ppl": math.exp(val) if val is not None else None,
            "loss_drop_per_ktok": 3.0 / 20000.0 * math.exp(-step / 20000.0) / 768 * 1000.0 if step > 50 else None,
            "elapsed_s": state["elapsed"], "alarms": None}


def child_write(run_dir: str, steps: int) -> dict:
    """Child side: `steps` rows into a RecordWriter of `run_dir` through its step-sink call, as the loop hands them
    over. Only the call is timed (building the row is the loop's cost); RSS sampled every 10,000 rows."""
    import psutil
    from helpers.record import METRICS_FILE, RecordWriter
    proc = psutil.Process()
    writer = RecordWriter(run_dir)
    state = {"ema": 0.0, "elapsed": 3.0}
    rss0 = peak = proc.memory_info().rss
    spent = 0.0
    for step in range(1, steps + 1):
        row = loop_row(step, steps, state)
        t0 = time.perf_counter()
        writer(row, steps)
        spent += time.perf_counter() - t0
        if step % 10000 == 0:
            peak = max(peak, proc.memory_info().rss)
    t0 = time.perf_counter()
    writer.flush()
    spent += time.perf_counter() - t0
    peak = max(peak, proc.memory_info().rss)
    return {"rows": steps, "writer_s": spent, "us_per_step": spent / steps * 1e6, "rss_before_bytes": rss0,
            "rss_peak_bytes": peak, "rss_growth_bytes": peak - rss0,
            "metrics_bytes": (Path(run_dir) / METRICS_FILE).stat().st_size}


def child_rewrite(metrics: str) -> dict:
    """Child side: the writer before this one, once: every row held as a dict, the whole file rewritten atomically
    (`rows_to_csv` + `atomic_write_text`)."""
    import psutil
    from helpers.record import atomic_write_text, read_metric_rows, rows_to_csv
    rss0 = psutil.Process().memory_info().rss
    t0 = time.perf_counter()
    rows = read_metric_rows(Path(metrics))
    read_s = time.perf_counter() - t0
    held = psutil.Process().memory_info().rss - rss0
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        atomic_write_text(Path(tmp) / "metrics.csv", rows_to_csv(rows))
        rewrite_s = time.perf_counter() - t0
    return {"rows": len(rows), "read_dicts_s": read_s, "rows_held_bytes": held, "rewrite_s": rewrite_s}


# ----------------------------------------------------------------------------------------------- parent side

def _timed(*args: str) -> dict:
    """`python -m helpers ARGS` as a user runs it: wall seconds, and the tail of what it said."""
    t0 = time.perf_counter()
    out = python("-m", "helpers", *args)
    return {"seconds": time.perf_counter() - t0, "stdout_tail": out[-300:]}


def item_record(steps: int) -> dict:
    """A real 3-step nano run whose metrics.csv becomes `steps` writer rows; the writer's cost, then the three
    commands on that record, then the old whole rewrite of the same rows."""
    from helpers.record import update_summary
    with tempfile.TemporaryDirectory() as tmp:
        corpus, run = Path(tmp) / "corpus.txt", Path(tmp) / "run"
        corpus.write_text("\n".join(p.read_text(encoding="utf-8") for p in sorted((REPO / "docs").rglob("*.md"))),
                          encoding="utf-8")
        python("-m", "helpers", "train", "--config", str(NANO), "--set", f"data.corpus={corpus}", "--set", "steps=3",
               "--set", "eval_every=0", "--set", "eval_batches=1", "--set", "steady_after=1", "--out", str(run),
               "--progress", "none")
        print(f"  writing {steps:,} rows …", flush=True)
        writer = json.loads(python(__file__, "write", str(run), str(steps)).strip().splitlines()[-1])
        update_summary(run, {"steps": steps})
        commands = {}
        for name, args in (("show", ("show", str(run))), ("diagnose", ("diagnose", str(run))),
                           ("tensorboard", ("tensorboard", str(run), "--out", str(Path(tmp) / "tb")))):
            commands[name] = _timed(*args)
            print(f"  {name}: {commands[name]['seconds']:.1f} s", flush=True)
        old = json.loads(python(__file__, "rewrite", str(run / "metrics.csv")).strip().splitlines()[-1])
    return {"rows": steps, "writer": writer, "commands": commands, "old_writer": old}


def _seconds(name: str):
    return lambda r: ((r.get("commands") or {}).get(name) or {}).get("seconds")


def rows(r: dict) -> list[tuple[str, str]]:
    w, old, c = r["writer"], r["old_writer"], r["commands"]
    return [(f"writer, {r['rows']:,} loop-shaped rows", f"{w['us_per_step']:.1f} µs per step amortised; RSS "
             f"+{w['rss_growth_bytes'] / 1e6:.1f} MB; metrics.csv {w['metrics_bytes'] / 1e6:,.0f} MB"),
            (f"`show` / `diagnose` / `tensorboard` on {r['rows']:,} rows",
             f"{c['show']['seconds']:.1f} s / {c['diagnose']['seconds']:.1f} s / {c['tensorboard']['seconds']:.1f} s"),
            ("before: one whole rewrite of the same rows (each 5 s flush)",
             f"{old['rewrite_s']:.1f} s, with {old['rows_held_bytes'] / 1e6:,.0f} MB of rows held as dicts "
             f"({old['read_dicts_s']:.1f} s to read them back)")]


def _step_us(r: dict) -> float | None:
    return (r.get("writer") or {}).get("us_per_step")


def _growth_mb(r: dict) -> float | None:
    grew = (r.get("writer") or {}).get("rss_growth_bytes")
    return None if grew is None else grew / 1e6


CHECKS = (Check(MUST, f"writer ≤ {STEP_US_LIMIT:g} µs per step amortised over {ROWS:,} rows",
                lambda r: at_most(_step_us(r), STEP_US_LIMIT,
                                  f"{_step_us(r) or 0:.1f} µs/step {{sign}} {STEP_US_LIMIT:g}"),
                miss={"writer": {"us_per_step": 45.0}}),
          Check(MUST, f"writer process RSS growth ≤ {RSS_LIMIT_MB:g} MB over {ROWS:,} rows",
                lambda r: at_most(_growth_mb(r), RSS_LIMIT_MB,
                                  f"+{_growth_mb(r) or 0:.1f} MB {{sign}} {RSS_LIMIT_MB:g}"),
                miss={"writer": {"rss_growth_bytes": 600e6}}),
          *(Check(MUST, f"`python -m helpers {name}` on the {ROWS:,}-row record ≤ {limit:g} s",
                  lambda r, name=name, limit=limit: at_most(_seconds(name)(r), limit,
                                                            f"{name} {_seconds(name)(r) or 0:.1f} s {{sign}} "
                                                            f"{limit:g} s"),
                  miss={"commands": {name: {"seconds": limit * 3}}})
            for name, limit in COMMAND_LIMITS_S.items()))

ITEMS = [Item("record_scale", "the run record at a million steps: appending writer, readers and the three commands",
              lambda a: item_record(a.record_rows), rows, CHECKS,
              options=((("--record-rows",), {"type": int, "default": ROWS, "help": "record_scale: rows written"}),),
              check_args=lambda a: positive(a, "record_rows"))]

if __name__ == "__main__":  # child side: python bench/record_item.py write RUN_DIR ROWS | rewrite METRICS_CSV
    result = child_write(sys.argv[2], int(sys.argv[3])) if sys.argv[1] == "write" else child_rewrite(sys.argv[2])
    print(json.dumps(result))
