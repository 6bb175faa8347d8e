"""`make bench` item `power`: can one default speed round see a 5% change, and what does
it cost?

The candidate carries a test-only `model.ballast`: a real MatMul whose output enters the loss multiplied by zero
(helpers/run/model.py), so it costs step time and changes nothing else. Its width is calibrated first to +5% and
+10% step time by one long paired measurement (a probe width, 24 block pairs, the cost taken as linear in width).
Then, per condition — `quiet` (nothing started by the bench; the 1-minute load average is sampled throughout and
recorded; above QUIET_MARGIN over the core count at any sample, the quiet musts are invalid) and `hog` (one busy-loop process the bench starts itself, alongside every round) — `trials` rounds of
each of A/A (`Workbook.aa_check`), +5% and +10% (`Workbook.run_round({"model.ballast": width})`), interleaved,
on the nano preset with the workbook's default config (helpers.tune.study.base_config: 50 steps).
Expected: A/A → "no change", ballast → "reject" (slower). A ballast round wrongly kept is rolled back, so the
best stays the baseline.

Also the wall time of one round at commit 7c15080 (four processes of 50 nano steps: its `aa_check`), run from a
git worktree of that commit in this same bench run, against the new rounds' wall times.
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

from helpers.config import speed_measured, with_changes
from helpers.spawn.stepped import launch_stepped
from helpers.spawn.runner import child_env
from helpers.paired import Measurement, SpeedPlan, interval_of
from helpers.tune.rounds import Workbook
from helpers.tune.study import base_config
from provenance import LoadSampler
from registry import INVALID, MET, MISSED, MUST, NOT_MEASURED, Check, Item, Judgement, known, positive

REPO = Path(__file__).resolve().parent.parent
OLD_COMMIT = "7c15080"
OLD_TREE = Path(tempfile.gettempdir()) / f"workbook_{OLD_COMMIT}"
FRACTIONS = {"+5%": 0.05, "+10%": 0.10}
EXPECTED = {"A/A": "no change", "+5%": "reject", "+10%": "reject"}
CONDITIONS = ("quiet", "hog")
# "quiet": the 1-minute load average stays ≤ cores + QUIET_MARGIN at every sample. A round's own MindSpore threads
# keep about one runnable thread per core (measured with nothing else running: 1.2–2.1 on 2 cores), so more
# than half a core above that is someone else's work, and the quiet condition was not met: its musts are invalid.
QUIET_MARGIN = 0.5
PROBE_WIDTH = 1024  # calibration probe: about +10% on the nano preset
CALIBRATION = SpeedPlan(block_steps=8, looks=(24,), alphas=(0.01,))
HALF_WIDTH_LIMIT = 0.025  # quiet A/A median relative half-width of the interval
ROUND_WALL_LIMIT = 0.5  # one default round's wall seconds ÷ a round's at commit 7c15080


def calibrate(cfg, probe: int = PROBE_WIDTH) -> dict:
    """Ballast widths for +5% and +10% step time: one paired process (ballast `probe` vs none, 24 pairs); the
    step-time factor per unit of width is taken as constant (a MatMul's cost grows linearly in its width)."""
    with tempfile.TemporaryDirectory() as tmp, LoadSampler() as load:
        # each arm compiles its own graph, as a round's arms do (config.speed_measured)
        cfg = speed_measured(cfg)
        heavy = with_changes(cfg, {"model.ballast": probe})
        _, _, raw, error = launch_stepped(cfg, heavy, Path(tmp), CALIBRATION.to_dict(), lambda m: False,
                                          progress=False)
    if error or not raw or len(raw["pairs"]) < CALIBRATION.max_pairs:
        raise RuntimeError(f"ballast calibration failed: {error or (raw or {}).get('reason')}")
    iv = interval_of(Measurement.from_raw(raw), CALIBRATION, 0.01)
    slowdown = math.exp(-iv.estimate) - 1  # step time factor − 1 at the probe width
    widths = {name: max(1, round(probe * f / slowdown)) for name, f in FRACTIONS.items()}
    return {"probe_width": probe, "probe_step_time_increase": slowdown,
            "probe_interval": [math.exp(-iv.high) - 1, math.exp(-iv.low) - 1], "pairs": iv.pairs,
            "widths": widths, "load_1min": load.summary()}


def _hog() -> subprocess.Popen:
    """One busy-loop process (one core's worth of interference)."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def _trial(wb: Workbook, kind: str, width: int | None, i: int, condition: str) -> dict:
    t0 = time.perf_counter()
    with LoadSampler() as load:
        if kind == "A/A":
            v = wb.aa_check(progress=False)
        else:
            r = wb.run_round(f"ballast{width}_{condition}_{i}", {"model.ballast": width}, progress=False)
            v = r.verdict
            if r.decision == "keep":  # a wrongly kept ballast must not become the reference of later trials
                wb.rollback(0)
    return {"kind": kind, "decision": v.decision, "expected": EXPECTED[kind], "speedup": v.speedup,
            "interval": v.interval, "half_width": v.noise_band, "pairs": v.pairs, "path": v.path,
            "wall_s": time.perf_counter() - t0, "load_1min": load.summary(), "reason": v.reason}


def old_round_wall(cfg, rounds: int) -> dict:
    """Wall seconds of `rounds` A/A rounds at commit 7c15080 (its 4-process `aa_check`), from a worktree."""
    if not (OLD_TREE / "helpers").is_dir():
        subprocess.run(["git", "worktree", "add", "--detach", str(OLD_TREE), OLD_COMMIT], cwd=REPO, check=True,
                       capture_output=True)
    code = ("import json, sys, time, tempfile\n"
            "from pathlib import Path\n"
            "from helpers.rounds import Workbook\n"
            "from helpers.study import base_config\n"
            f"cfg = base_config('nano', {cfg.steps}, {str(REPO / 'data' / 'cache' / 'tinyshakespeare.txt')!r})\n"
            "wb = Workbook.create(Path(tempfile.mkdtemp()) / 'wb', cfg, repeats=2)\n"
            "wb.baseline(progress=False)\n"
            "walls = []\n"
            f"for _ in range({rounds}):\n"
            "    t0 = time.perf_counter(); v = wb.aa_check(progress=False); walls.append(time.perf_counter() - t0)\n"
            "print(json.dumps(walls))\n")
    env = {**child_env(), "PYTHONPATH": str(OLD_TREE)}
    with LoadSampler() as load:
        proc = subprocess.run([sys.executable, "-c", code], cwd=OLD_TREE, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"old round at {OLD_COMMIT} failed: {proc.stderr[-1500:]}")
    walls = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"commit": OLD_COMMIT, "round": "aa_check (4 processes of 50 nano steps, repeats 2)", "wall_s": walls,
            "median_s": statistics.median(walls), "load_1min": load.summary()}


def _rates(done: list[dict]) -> dict:
    out = {}
    for kind in EXPECTED:
        rows = [t for t in done if t["kind"] == kind]
        if not rows:
            continue
        hw = [t["half_width"] for t in rows if t["half_width"] is not None]
        out[kind] = {"trials": len(rows), "as_expected": sum(t["decision"] == t["expected"] for t in rows),
                     "decisions": {d: sum(t["decision"] == d for t in rows) for d in
                                   ("keep", "reject", "no change", "failed")},
                     "half_width_median": statistics.median(hw) if hw else None,
                     "pairs_median": statistics.median([t["pairs"] or 0 for t in rows]),
                     "wall_s_median": statistics.median([t["wall_s"] for t in rows]),
                     "speedup_median": statistics.median([t["speedup"] for t in rows if t["speedup"]] or [math.nan])}
    return out


def item_power(trials: int = 20, conditions: tuple[str, ...] = CONDITIONS, old_rounds: int = 2) -> dict:
    """The power benchmark (see the module docstring): calibration, the old round's wall time, and every trial of
    every condition with its verdict, interval, pairs, wall seconds and load."""
    cfg = base_config("nano", 50)
    t_start = time.perf_counter()
    out = {"config": {"preset": "nano", "steps": cfg.steps, "trials": trials}, "cores": os.cpu_count(),
           "calibration": calibrate(cfg)}
    widths = out["calibration"]["widths"]
    print(f"  ballast widths {widths} (probe {PROBE_WIDTH}: "
          f"+{100 * out['calibration']['probe_step_time_increase']:.1f}% step time)", flush=True)
    out["old_round"] = old_round_wall(cfg, old_rounds)
    print(f"  round at {OLD_COMMIT}: {out['old_round']['wall_s']} s", flush=True)
    for condition in conditions:
        hog = _hog() if condition == "hog" else None
        try:
            with tempfile.TemporaryDirectory() as tmp:
                wb = Workbook.create(Path(tmp) / "wb", cfg, repeats=2)
                wb.baseline(progress=False)
                done = []
                for i in range(trials):
                    for kind in EXPECTED:
                        done.append(_trial(wb, kind, widths.get(kind), i, condition))
                        t = done[-1]
                        print(f"  {condition} {kind} {i + 1}/{trials}: {t['decision']} ({t['wall_s']:.1f} s, load "
                              f"{t['load_1min']['max']:.1f}) {t['reason'][:150]}", flush=True)
        finally:
            if hog is not None:
                hog.kill()
                hog.wait()
        loads = [t["load_1min"] for t in done]
        out[condition] = {"rates": _rates(done), "trials": done,
                          "load_1min": {"min": min(x["min"] for x in loads), "max": max(x["max"] for x in loads)},
                          "load_limit": (os.cpu_count() or 1) + QUIET_MARGIN if condition == "quiet" else None}
    new = out.get("quiet", out.get("hog", {})).get("rates", {}).get("A/A", {}).get("wall_s_median")
    out["round_wall"] = {"new_aa_median_s": new, "old_median_s": out["old_round"]["median_s"],
                         "ratio": new / out["old_round"]["median_s"] if new else None}
    out["wall_s"] = time.perf_counter() - t_start
    return out


def _in_condition(c: dict, line: str, status: str) -> Judgement:
    """`status` when the condition held; invalid when a quiet condition's load went above its limit."""
    limit = c.get("load_limit")
    if limit is not None and c["load_1min"]["max"] > limit:
        return Judgement(INVALID, f"{line}; but the 1-min load reached {c['load_1min']['max']:.1f} > {limit:.1f} "
                                  f"(cores + {QUIET_MARGIN}), so the condition was not quiet")
    return Judgement(status, line)


def _share(condition: str, kind: str, share: float) -> Check:
    def judge(r: dict) -> Judgement:
        c = r.get(condition) or {}
        rate = (c.get("rates") or {}).get(kind)
        if not rate:
            return Judgement(NOT_MEASURED, f"{condition} {kind}: no trial")
        hit = rate["as_expected"] >= math.ceil(share * rate["trials"])
        return _in_condition(c, f"{condition} {kind}: {rate['as_expected']}/{rate['trials']} "
                                f"\"{EXPECTED[kind]}\" ({'≥' if hit else '<'} {share:.0%})", MET if hit else MISSED)
    quiet = f" (quiet: 1-min load ≤ cores + {QUIET_MARGIN} throughout, else invalid)" if condition == "quiet" else ""
    return Check(MUST, f"{condition} {kind}: \"{EXPECTED[kind]}\" in ≥ {share:.0%} of the trials{quiet}", judge,
                 miss={condition: {"rates": {kind: {"as_expected": 0, "trials": 20}}, "load_1min": {"max": 0.0},
                                   "load_limit": None}})


def _half_width(r: dict) -> Judgement:
    c = r.get("quiet") or {}
    aa = (c.get("rates") or {}).get("A/A")
    if not aa or aa["half_width_median"] is None:
        return Judgement(NOT_MEASURED, "quiet A/A: no trial")
    hit = aa["half_width_median"] <= HALF_WIDTH_LIMIT
    return _in_condition(c, f"quiet A/A median half-width ±{100 * aa['half_width_median']:.2f}% "
                            f"({'≤' if hit else '>'} ±{100 * HALF_WIDTH_LIMIT:.1f}%)", MET if hit else MISSED)


def _round_wall(r: dict) -> Judgement:
    ratio = (r.get("round_wall") or {}).get("ratio")
    if not ratio:
        return Judgement(NOT_MEASURED, "no A/A round timed")
    hit = ratio <= ROUND_WALL_LIMIT
    return Judgement(MET if hit else MISSED, f"round wall ×{ratio:.2f} of the {OLD_COMMIT} round "
                                             f"({'≤' if hit else '>'} ×{ROUND_WALL_LIMIT})")


CHECKS = (_share("quiet", "A/A", 0.95), _share("hog", "A/A", 0.90), _share("quiet", "+5%", 0.95),
          _share("hog", "+10%", 0.90),
          Check(MUST, f"quiet A/A median half-width ≤ ±{100 * HALF_WIDTH_LIMIT:.1f}% (quiet as above, else invalid)",
                _half_width, miss={"quiet": {"rates": {"A/A": {"half_width_median": 0.05}}, "load_1min": {"max": 0.0},
                                             "load_limit": None}}),
          Check(MUST, f"one default round's wall seconds ≤ ×{ROUND_WALL_LIMIT} of a round at commit {OLD_COMMIT}",
                _round_wall, miss={"round_wall": {"ratio": 0.8}}))


def rows(r: dict) -> list[tuple[str, str]]:
    out = []
    for condition in CONDITIONS:
        if condition not in r:
            continue
        c = r[condition]
        parts = [f"{kind} {v['as_expected']}/{v['trials']} \"{EXPECTED[kind]}\" (±{100 * (v['half_width_median'] or 0):.1f}% "
                 f"median half-width, {v['pairs_median']:.0f} pairs, {v['wall_s_median']:.1f} s)"
                 for kind, v in c["rates"].items()]
        out.append((f"power, nano, {condition} (load {c['load_1min']['min']:.1f}–{c['load_1min']['max']:.1f})",
                    "; ".join(parts)))
    w = r["round_wall"]
    if w["ratio"]:
        out.append((f"one default round vs a round at commit {OLD_COMMIT}",
                    f"{w['new_aa_median_s']:.1f} s vs {w['old_median_s']:.1f} s (×{w['ratio']:.2f})"))
    return out


ITEMS = [Item("power", "how often one default speed round sees +5%/+10% and says no change on A/A, quiet and hogged",
              lambda a: item_power(a.trials, tuple(a.conditions.split(","))), rows, CHECKS,
              options=((("--trials",), {"type": int, "default": 20,
                                        "help": "trials (aa: A/A checks; power: per kind and condition)"}),
                       (("--conditions",), {"default": ",".join(CONDITIONS),
                                            "help": "power: quiet, hog or both (comma-separated)"})),
              check_args=lambda a: positive(a, "trials") or known("condition", a.conditions.split(","),
                                                                  list(CONDITIONS)))]
