"""`make bench` items for noise honesty (declared in ITEMS, run by bench.py).

aa:    the workbook's own A/A check (`Workbook.aa_check`: the best as candidate and reference, measured and judged
       like a round) repeated `trials` times. Goal: "no change" in ≥ 19 of 20. Must: every decision is what today's
       rule (helpers/paired.py `conclude`: keep / reject / no change against its floor, over the looks) gives
       on that trial's own pairs and plan (speed.json).
clock: the per-step times a run records (step_time_ms) against an outside wall clock: the parent stamps
       time.perf_counter() as each step's progress line arrives; over the steady steps, the sum of recorded
       step times ÷ the sum of the gaps between consecutive lines. Goal: within 5% of 1.

Both use the config `make workbook` trains (helpers.study.base_config: notebook 01's 50 steps, warm-up and
eval every 10 steps, first 5 steps outside the steady window, repeats 2) on tiny shakespeare, with the tiny
preset by default (nano: --preset).
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from helpers.config import dump
from helpers.record import load_run
from helpers.paired import Measurement, SpeedPlan, conclude
from helpers.tune.rounds import Workbook
from helpers.spawn.runner import child_env
from helpers.tune.study import base_config
from registry import GOAL, MET, MISSED, MUST, NOT_MEASURED, Check, Item, Judgement, at_least, positive

REPO = Path(__file__).resolve().parent.parent


def _load() -> float:
    """1-minute load average (runnable processes; this machine has os.cpu_count() cores)."""
    return os.getloadavg()[0]


def _rule_decision(speed_file: Path) -> str | None:
    """What today's rule concludes from the trial's own pairs and plan (None when it measured no look)."""
    speed = json.loads(speed_file.read_text(encoding="utf-8"))
    try:
        return conclude(Measurement.from_raw({"pairs": [], **speed}), SpeedPlan.from_dict(speed["plan"])).decision
    except ValueError:  # fewer pairs than the first look: the round failed before any look
        return None


def item_aa(trials: int = 20, preset: str = "tiny", steps: int = 50, budget_s: float = 600.0) -> dict:
    """`trials` A/A checks on one pinned baseline; stops starting new trials after `budget_s` seconds.

    Per trial: decision, speedup (candidate ÷ reference tokens/s), its interval and relative half-width, pairs,
    the rule's own decision on its pairs, the 1-minute load average when it ended.
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
            rule = _rule_decision(wb.path / "aa" / f"{i + 1:02d}" / "speed.json")
            done.append({"decision": v.decision, "rule_decision": rule, "speedup": v.speedup, "interval": v.interval,
                         "half_width": v.noise_band, "pairs": v.pairs, "path": v.path, "reason": v.reason,
                         "load_1min": _load()})
            print(f"  A/A {i + 1}/{trials}: {v.reason}", flush=True)
    widths = [t["half_width"] for t in done if t["half_width"] is not None]
    speedups = [t["speedup"] for t in done if t["speedup"]]
    return {"config": {"preset": preset, "steps": steps, "steady_after": cfg.steady_after,
                       "eval_every": cfg.eval_every, "repeats": 2},
            "trials": len(done), "trials_asked": trials, "no_change": sum(t["decision"] == "no change" for t in done),
            "half_width": {"median": statistics.median(widths), "min": min(widths), "max": max(widths)}
            if widths else None,
            "speedup": {"min": min(speedups), "max": max(speedups)} if speedups else None,
            "load_1min": {"min": min(t["load_1min"] for t in done), "max": max(t["load_1min"] for t in done)}
            if done else None,
            "cores": os.cpu_count(), "wall_s": time.perf_counter() - t0, "detail": done}


def _follows_rule(r: dict) -> Judgement:
    trials = r.get("detail") or []
    if not trials:
        return Judgement(NOT_MEASURED, "no A/A trial ran")
    off = [f"trial {i + 1}: {t['decision']} (the rule on its pairs: {t['rule_decision']})"
           for i, t in enumerate(trials) if t["decision"] != t["rule_decision"]]
    return Judgement(MISSED if off else MET, "; ".join(off) if off else
                     f"all {len(trials)} decisions are the rule's own on their pairs")


def _no_change_share(r: dict) -> Judgement:
    if not r.get("trials"):
        return Judgement(NOT_MEASURED, "no A/A trial ran")
    return at_least(r["no_change"] / r["trials"], 0.95, f"\"no change\" in {r['no_change']} of {r['trials']} "
                                                        f"({{sign}} 95%)")


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
            "ratio_max": max(ratios)}


def aa_rows(r: dict) -> list[tuple[str, str]]:
    c = r["config"]
    if not r["trials"]:
        return [(f"A/A check ({c['preset']})", "no trial ran")]
    return [(f"A/A check ({c['preset']}, {c['steps']} steps, repeats {c['repeats']})",
             f"\"no change\" in {r['no_change']} of {r['trials']} (median half-width ±{100 * r['half_width']['median']:.1f}%,"
             f" speed-ups ×{r['speedup']['min']:.3f}–×{r['speedup']['max']:.3f}; {r['wall_s'] / 60:.0f} min)")]


def clock_rows(r: dict) -> list[tuple[str, str]]:
    return [(f"recorded step time ÷ outside wall clock ({r['config']['preset']}, {len(r['runs'])} runs)",
             f"×{r['ratio_min']:.3f}–×{r['ratio_max']:.3f}")]


def _within_5pct(r: dict) -> Judgement:
    if not r.get("runs"):
        return Judgement(NOT_MEASURED, "no run")
    worst = max(abs(1 - x["ratio"]) for x in r["runs"])
    return Judgement(MET if worst <= 0.05 else MISSED, f"×{r['ratio_min']:.3f}–×{r['ratio_max']:.3f} "
                                                       f"({'within' if worst <= 0.05 else 'beyond'} 5% of 1)")


PRESET_OPTION = (("--preset",), {"default": "tiny", "help": "model preset of the aa and clock items"})
ITEMS = [
    Item("aa", "the workbook's A/A check repeated: how often it says no change, and whether it follows its rule",
         lambda a: item_aa(a.trials, a.preset), aa_rows,
         (Check(MUST, "every A/A decision is today's rule (paired.conclude) on that trial's own pairs", _follows_rule,
                miss={"detail": [{"decision": "no change", "rule_decision": "keep"}]}),
          Check(GOAL, "\"no change\" in ≥ 19 of 20 A/A checks", _no_change_share)),
         options=(PRESET_OPTION, (("--trials",), {"type": int, "default": 20,
                                                  "help": "trials (aa: A/A checks; power: per kind and condition)"})),
         check_args=lambda a: positive(a, "trials")),
    Item("clock", "recorded step time against an outside wall clock", lambda a: item_clock(a.clock_runs, a.preset),
         clock_rows, (Check(GOAL, "recorded ÷ outside seconds within 5% of 1 in every run", _within_5pct),),
         options=(PRESET_OPTION, (("--clock-runs",), {"type": int, "default": 3, "help": "clock: runs"})),
         check_args=lambda a: positive(a, "clock_runs")),
]
