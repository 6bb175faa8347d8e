"""`make bench` items for noise honesty (imported by bench.py).

aa:    the workbook's own A/A check (`Workbook.aa_check`: the baseline as candidate and reference, ABBA
       interleaved, judged by the same rule as a round) repeated `trials` times; goal: "no change" in
       ≥ 19 of 20, and every decision is the one the printed noise band implies.
clock: the per-step times a run records (step_time_ms) against an outside wall clock: the parent stamps
       time.perf_counter() as each step's progress line arrives; over the steady steps, the sum of recorded
       step times ÷ the sum of the gaps between consecutive lines; goal within 5% of 1.

Both use the config `make workbook` trains (helpers.study.base_config: notebook 01's 50 steps, warm-up and
eval every 10 steps, first 5 steps outside the steady window, repeats 2) on tiny shakespeare, with the tiny
preset by default so 20 A/A trials (82 runs) fit in about 10 minutes on a quiet 2-core machine (nano: --preset).
"""
from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from helpers.config import dump
from helpers.record import load_run
from helpers.tune.rounds import Workbook
from helpers.spawn.runner import child_env
from helpers.tune.study import base_config

REPO = Path(__file__).resolve().parent.parent


def _load() -> float:
    """1-minute load average (runnable processes; this machine has os.cpu_count() cores)."""
    return os.getloadavg()[0]


def item_aa(trials: int = 20, preset: str = "tiny", steps: int = 50, budget_s: float = 600.0) -> dict:
    """`trials` A/A checks on one pinned baseline; stops starting new trials after `budget_s` seconds.

    Per trial: decision, speedup (candidate ÷ reference median tokens/s), noise_band (relative half-width),
    whether the band alone explains the decision, the 1-minute load average when it ended.
    """
    cfg = base_config(preset, steps)
    t0 = time.perf_counter()
    done = []
    with tempfile.TemporaryDirectory() as tmp:
        wb = Workbook.create(Path(tmp) / "wb", cfg, repeats=2)
        wb.baseline(progress=False)
        for i in range(trials):
            if time.perf_counter() - t0 > budget_s:
                print(f"  A/A: time budget {budget_s:.0f} s spent after {i} trials", flush=True)
                break
            v = wb.aa_check(progress=False)
            within = v.speedup is not None and abs(math.log(v.speedup)) <= math.log1p(v.noise_band)
            done.append({"decision": v.decision, "speedup": v.speedup, "noise_band": v.noise_band,
                         "band_decides": v.decision == ("no change" if within else
                                                        "keep" if v.speedup and v.speedup > 1 else "reject"),
                         "reason": v.reason, "load_1min": _load()})
            print(f"  A/A {i + 1}/{trials}: {v.reason}", flush=True)
    bands = [t["noise_band"] for t in done]
    speedups = [t["speedup"] for t in done if t["speedup"]]
    return {"config": {"preset": preset, "steps": steps, "steady_after": cfg.steady_after,
                       "eval_every": cfg.eval_every, "repeats": 2},
            "trials": len(done), "trials_asked": trials, "no_change": sum(t["decision"] == "no change" for t in done),
            "band_decides_all": all(t["band_decides"] for t in done),
            "noise_band": {"median": statistics.median(bands), "min": min(bands), "max": max(bands)} if bands else None,
            "speedup": {"min": min(speedups), "max": max(speedups)} if speedups else None,
            "load_1min": {"min": min(t["load_1min"] for t in done), "max": max(t["load_1min"] for t in done)}
            if done else None,
            "cores": os.cpu_count(), "wall_s": time.perf_counter() - t0, "goal": "no change in >= 19 of 20",
            "detail": done}


def _clock_run(cfg, run_dir: Path) -> dict:
    """One training process; the parent stamps each progress line. Returns recorded vs outside seconds."""
    run_dir.mkdir(parents=True)
    request = run_dir / "request.yaml"
    request.write_text(dump(cfg))
    stamps: dict[int, float] = {}
    proc = subprocess.Popen([sys.executable, "-m", "helpers", "train", "--config", str(request), "--out",
                             str(run_dir), "--progress", "json"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True, cwd=REPO, env=child_env())
    for line in proc.stdout:
        stamp = time.perf_counter()
        try:
            stamps[json.loads(line)["step"]] = stamp
        except (ValueError, KeyError):
            continue
    if proc.wait() != 0:
        raise RuntimeError(f"training run {run_dir} exited {proc.returncode}")
    rows = {r["step"]: r for r in load_run(run_dir).metrics}
    # Steady steps whose gap holds nothing but the step and its bookkeeping: an eval step's validation pass
    # runs before its progress line, so it is left out; so is the last step (it also evaluates).
    steps = [s for s in range(cfg.steady_after + 1, cfg.steps)
             if s - 1 in stamps and s in stamps and rows[s]["val_loss"] is None]
    recorded = sum(rows[s]["step_time_ms"] for s in steps) / 1000.0
    outside = sum(stamps[s] - stamps[s - 1] for s in steps)
    return {"steps": len(steps), "recorded_s": recorded, "outside_s": outside, "ratio": recorded / outside,
            "load_1min": _load()}


def item_clock(runs: int = 3, preset: str = "tiny", steps: int = 50) -> dict:
    """`runs` runs of the workbook's config: recorded step time ÷ outside wall clock over the same steps."""
    cfg = base_config(preset, steps)
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(runs):
            out.append(_clock_run(cfg, Path(tmp) / f"run{i}"))
            r = out[-1]
            print(f"  clock run {i + 1}: recorded {r['recorded_s']:.3f} s, outside {r['outside_s']:.3f} s over "
                  f"{r['steps']} steps → ×{r['ratio']:.3f}", flush=True)
    ratios = [r["ratio"] for r in out]
    return {"config": {"preset": preset, "steps": steps}, "runs": out, "ratio_min": min(ratios),
            "ratio_max": max(ratios), "within_5pct": all(abs(1 - x) <= 0.05 for x in ratios), "goal": "0.95-1.05"}


def noise_rows(results: dict) -> list[str]:
    """Rows of bench.py's markdown table for these items."""
    lines = []
    if "aa" in results and results["aa"]["trials"]:
        r = results["aa"]
        c = r["config"]
        lines.append(f"| A/A check ({c['preset']}, {c['steps']} steps, repeats {c['repeats']}) | \"no change\" in "
                     f"{r['no_change']} of {r['trials']} (band median ±{100 * r['noise_band']['median']:.1f}%, "
                     f"speedups {r['speedup']['min']:.3f}–{r['speedup']['max']:.3f}; decisions follow the printed "
                     f"band: {'yes' if r['band_decides_all'] else 'NO'}; load {r['load_1min']['min']:.1f}–"
                     f"{r['load_1min']['max']:.1f} on {r['cores']} cores, {r['wall_s'] / 60:.0f} min) | ≥ 19 of 20 |")
    if "clock" in results:
        r = results["clock"]
        lines.append(f"| recorded step time ÷ outside wall clock ({r['config']['preset']}, {len(r['runs'])} runs) | "
                     f"×{r['ratio_min']:.3f}–×{r['ratio_max']:.3f} | within 5% |")
    return lines
