"""`make bench` item `workbook`: `make workbook` with default parameters (the main job): wall seconds, exit status,
each notebook's seconds (from its log line), the 1-minute load average before and throughout (the workbook's own
training included), how often a kernel warned that it runs over TCP without encryption, and what the report's
workbook decided: every round of its ledger, the baseline against the best side by side (its cumulative
interval), notebook 05's batch round, and notebook 02's slow-storage demo round (a workbook of its own)."""
from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

from provenance import LoadSampler
from registry import MET, MISSED, MUST, NOT_MEASURED, Check, Item, Judgement, at_most

from helpers.book.notebooks import NOTEBOOKS_DIR, notebook_parameters
from helpers.record import data_wait_text
from helpers.tune.rounds import Workbook

REPO = Path(__file__).resolve().parent.parent
WORKBOOK_LIMIT_S = 360  # `make workbook` wall seconds (≤ 6 min)
TCP_WARNING = "Kernel is running over TCP without encryption"  # ipykernel's warning when a kernel's transport is tcp


def item_workbook() -> dict:
    """Run `make workbook` once and keep what it printed about each notebook, and which of notebook 10's runs were
    there before it (a fresh clone has none; with them notebook 10 trains only what changed)."""
    nb10 = NOTEBOOKS_DIR / "10_data_parallel.ipynb"  # its runs_dir: a fixed folder a later job reuses runs from
    runs = (nb10.parent / notebook_parameters(nb10)["runs_dir"]).resolve()
    reused = sorted(str(p.parent.relative_to(runs)) for p in runs.glob("*/summary.json"))
    load_before = os.getloadavg()[0]
    t0 = time.perf_counter()
    with LoadSampler() as load:
        proc = subprocess.run(["make", "workbook"], cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    notebooks = {}
    for line in proc.stdout.splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[0][:2].isdigit() and parts[3] == "s":
            notebooks[parts[0]] = {"status": parts[1], "seconds": float(parts[2])}
    return {"wall_s": wall, "returncode": proc.returncode, "notebooks": notebooks, "nb10_runs_before": reused,
            "load_1min": {**load.summary(), "before": load_before, "values": load.values},
            "tcp_warnings": (proc.stdout + proc.stderr).count(TCP_WARNING), "stderr_tail": proc.stderr[-2000:],
            "rounds": _rounds(REPO / "reports" / "latest" / "workbook"),
            "mfu": _mfu(REPO / "reports" / "latest" / "workbook"),
            "machine_speed": _machine_speed(REPO / "reports" / "latest" / "workbook")}


def _machine_speed(book: Path) -> dict:
    """How fast this machine ran while the workbook did: notebook 01's baseline runs (the same config every time),
    their step time (ms, median over runs) and matmul peak (GFLOP/s). Wall times of two records compare only with
    these: the same code took 341 s beside a 45 ms baseline step and 396 s beside a 70 ms one on one day."""
    runs = [json.loads(p.read_text(encoding="utf-8")) for p in sorted((book / "baseline").glob("run_*/summary.json"))]
    steps = sorted(s["step_time_ms"] for s in runs if s.get("step_time_ms"))
    if not steps:
        return {}
    return {"baseline_step_ms": steps[len(steps) // 2], "baseline_runs": len(steps),
            "matmul_peak_gflops": max(s.get("peak_flops") or 0.0 for s in runs) / 1e9}


def _mfu(book: Path) -> dict:
    """The highest MFU of any run the workbook holds, against each peak, and which run it was."""
    out = {"runs": 0}
    for path in book.rglob("summary.json"):
        s = json.loads(path.read_text(encoding="utf-8"))
        out["runs"] += 1
        for key in ("mfu", "mfu_hardware"):
            if s.get(key) is not None and s[key] > out.get(key, (0.0, ""))[0]:
                out[key] = (s[key], str(path.parent.relative_to(book)))
    return out


def _round_row(r) -> dict:
    return {"index": r.index, "name": r.name, "decision": r.decision, "objective": r.objective,
            "reason": r.verdict.reason, "gate": r.verdict.gate, "speedup": r.verdict.speedup,
            "interval": r.verdict.interval, "changes": {k: list(v) for k, v in r.changes.items()},
            "parts": r.verdict.parts}


def _rounds(book: Path) -> dict:
    """Every round of the report's one ledger, the cumulative measurement of its best (baseline against best, side by
    side), and the rounds of notebook 02's slow-storage demo (a workbook of its own, apart from the ledger)."""
    out: dict = {}
    try:
        wb = Workbook.open(book)
        out["ledger"] = [_round_row(r) for r in wb.rounds()]
        out["cumulative"] = next(({"changes": e["changes"], "best_round": e["round"], **{
            k: e["verdict"].get(k) for k in ("speedup", "interval", "level", "pairs", "path", "reason")}}
            for e in reversed(wb.ledger()) if e["event"] == "cumulative"), None)
        out["batch"] = next((row for row in out["ledger"] if row["name"] == "batch_size"),
                            {"error": f"no batch_size round in {book}"})
    except Exception as exc:  # a workbook the run did not leave: the checks say so
        out["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
    try:
        demo = Workbook.open(book / "studies" / "data_pipeline").rounds()
        out["data"] = _round_row(demo[0]) if demo else {"error": "no round in the data demo"}
    except Exception as exc:
        out["data"] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0]}"}
    return out


def rows(r: dict) -> list[tuple[str, str]]:
    slowest = sorted(r["notebooks"].items(), key=lambda kv: -kv[1]["seconds"])[:3]
    speed = r.get("machine_speed") or {}
    return [("`make workbook`, default parameters",
             f"{r['wall_s']:.0f} s, exit {r['returncode']}, {sum(n['status'] == 'ok' for n in r['notebooks'].values())}"
             f" of {len(r['notebooks'])} notebooks ok; slowest: "
             + ", ".join(f"{name} {n['seconds']:.0f} s" for name, n in slowest)
             + (f"; machine speed: notebook 01's baseline step {speed['baseline_step_ms']:.1f} ms"
                if speed.get("baseline_step_ms") else "")
             + ("; notebook 10 found " + ", ".join(r["nb10_runs_before"]) + " from an earlier job"
                if r.get("nb10_runs_before") else ""))] + _ledger_rows(r.get("rounds") or {})


def _ledger_rows(got: dict) -> list[tuple[str, str]]:
    """One row per round of the ledger (decision, gate, ratio and interval), then the cumulative one."""
    out = []
    for x in got.get("ledger", []):
        figure = (f"×{x['speedup']:.3f} [{x['interval'][0]:.3f}, {x['interval'][1]:.3f}]" if x.get("interval")
                  else "no interval")
        out.append((f"round {x['index']} {x['name']} ({', '.join(x['changes'])})",
                    f"{x['decision']} by {x.get('gate') or 'n/a'}: {x['objective']} {figure}"))
    c = got.get("cumulative")
    if c and c.get("interval"):
        out.append((f"cumulative: baseline → best of round {c['best_round']} ({', '.join(c['changes'])})",
                    f"tokens/s ×{c['speedup']:.3f}, {c['level']:.1%} interval ×{c['interval'][0]:.3f}–"
                    f"×{c['interval'][1]:.3f} ({c['pairs']} pairs, {c['path']}, side by side)"))
    return out


def _within_limit(r: dict) -> Judgement:
    if "returncode" not in r:
        return Judgement(NOT_MEASURED, "make workbook did not run")
    j = at_most(r["wall_s"], WORKBOOK_LIMIT_S, f"make workbook exited {r['returncode']} after {r['wall_s']:.0f} s "
                                               f"({{sign}} {WORKBOOK_LIMIT_S} s)")
    return j if r["returncode"] == 0 else Judgement(MISSED, j.line)


def _story(r: dict) -> Judgement:
    """A kept round in the ledger whose interval lies above ×1, and the cumulative interval above ×1."""
    got = r.get("rounds") or {}
    if "error" in got or "ledger" not in got:
        return Judgement(NOT_MEASURED, got.get("error", "no ledger read"))
    kept = [x for x in got["ledger"] if x["decision"] == "keep" and x.get("interval") and x["interval"][0] > 1.0]
    c = got.get("cumulative")
    line = ("kept above ×1: " + (", ".join(f"{x['name']} ×{x['speedup']:.2f} [{x['interval'][0]:.2f}, "
                                            f"{x['interval'][1]:.2f}]" for x in kept) or "none")
            + "; cumulative: " + (f"×{c['speedup']:.2f} [{c['interval'][0]:.2f}, {c['interval'][1]:.2f}]"
                                  if c and c.get("interval") else "not measured"))
    hit = bool(kept) and bool(c and c.get("interval") and c["interval"][0] > 1.0)
    return Judgement(MET if hit else MISSED, line)


def _data_round(r: dict) -> Judgement:
    got = (r.get("rounds") or {}).get("data")
    if not got or "error" in got:
        return Judgement(NOT_MEASURED, (got or {}).get("error", "no data round read"))
    parts = got.get("parts") or {}
    line = (f"{got['name']}: {got['decision']}; parts " + ("shown: data wait " + " → ".join(
        data_wait_text(parts[a]["data_wait_share"]) for a in ("reference", "candidate")) if parts else "missing"))
    return Judgement(MET if got["decision"] == "keep" and parts else MISSED, line)


def _batch_round(r: dict) -> Judgement:
    got = (r.get("rounds") or {}).get("batch")
    if not got or "error" in got:
        return Judgement(NOT_MEASURED, (got or {}).get("error", "no batch round read"))
    hit = got["objective"] == "time_to_target" and "lr" in got["changes"] and " rule" in got["reason"]
    return Judgement(MET if hit else MISSED, f"{got['name']}: {got['decision']} by {got['objective']}; changes "
                                             f"{sorted(got['changes'])}; {got['reason'][:160]}")


def _mfu_below_peaks(r: dict) -> Judgement:
    got = r.get("mfu")
    if not got or not got.get("runs"):
        return Judgement(NOT_MEASURED, "no run summary read")
    over = [f"{k} {got[k][0]:.1%} ({got[k][1]})" for k in ("mfu", "mfu_hardware") if k in got and got[k][0] > 1.0]
    line = (f"{got['runs']} runs; highest MFU: " + ", ".join(f"{k} {got[k][0]:.1%} ({got[k][1]})"
                                                          for k in ("mfu", "mfu_hardware") if k in got))
    return Judgement(MISSED if over else MET, line)


ITEMS = [Item("workbook", "`make workbook` wall time, per notebook, with the load average", lambda a: item_workbook(),
              rows,
              (Check(MUST, f"`make workbook` exits 0 within {WORKBOOK_LIMIT_S} s", _within_limit,
                     miss={"returncode": 0, "wall_s": WORKBOOK_LIMIT_S + 60.0}),
               Check(MUST, "no kernel warns that it runs over TCP without encryption",
                     lambda r: at_most(r.get("tcp_warnings"), 0, f"{r.get('tcp_warnings')} '{TCP_WARNING}' lines "
                                                                 f"({{sign}} 0)"),
                     miss={"tcp_warnings": 15}),
               Check(MUST, "no run shows an MFU above 100% of either peak (matmul, hardware)", _mfu_below_peaks,
                     miss={"mfu": {"runs": 3, "mfu": (1.44, "studies/data_pipeline/baseline/run_2")}}),
               Check(MUST, "the report tells the tuning story: a kept round of the ledger and the baseline against the "
                           "best side by side, both intervals above ×1", _story,
                     miss={"rounds": {"ledger": [{"name": "amp", "decision": "reject", "interval": [0.8, 0.9],
                                                  "speedup": 0.85}], "cumulative": None}}),
               Check(MUST, "notebook 02's slow-storage demo round is kept, with its parts (data wait, compute, stalls)",
                     _data_round,
                     miss={"rounds": {"data": {"name": "d", "decision": "no change", "parts": {}}}}),
               Check(MUST, "notebook 05's batch round is judged by time to target, its lr scaled by a named rule",
                     _batch_round, miss={"rounds": {"batch": {"name": "b", "decision": "reject", "objective": "speed",
                                                              "changes": {"batch_size": [12, 24]}, "reason": ""}}})))]
