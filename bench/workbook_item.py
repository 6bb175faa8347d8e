"""`make bench` item `workbook`: `make workbook` with default parameters (the main job): wall seconds, exit status,
each notebook's seconds (from its log line), the 1-minute load average before and throughout (the workbook's own
training included), and how often a kernel warned that it runs over TCP without encryption."""
from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from provenance import LoadSampler
from registry import MISSED, MUST, NOT_MEASURED, Check, Item, Judgement, at_most

REPO = Path(__file__).resolve().parent.parent
WORKBOOK_LIMIT_S = 360  # `make workbook` wall seconds (issue 12: ≤ 6 min)
TCP_WARNING = "Kernel is running over TCP without encryption"  # ipykernel's warning when a kernel's transport is tcp


def item_workbook() -> dict:
    """Run `make workbook` once and keep what it printed about each notebook."""
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
    return {"wall_s": wall, "returncode": proc.returncode, "notebooks": notebooks,
            "load_1min": {**load.summary(), "before": load_before, "values": load.values},
            "tcp_warnings": (proc.stdout + proc.stderr).count(TCP_WARNING), "stderr_tail": proc.stderr[-2000:]}


def rows(r: dict) -> list[tuple[str, str]]:
    slowest = sorted(r["notebooks"].items(), key=lambda kv: -kv[1]["seconds"])[:3]
    return [("`make workbook`, default parameters",
             f"{r['wall_s']:.0f} s, exit {r['returncode']}, {sum(n['status'] == 'ok' for n in r['notebooks'].values())}"
             f" of {len(r['notebooks'])} notebooks ok; slowest: "
             + ", ".join(f"{name} {n['seconds']:.0f} s" for name, n in slowest))]


def _within_limit(r: dict) -> Judgement:
    if "returncode" not in r:
        return Judgement(NOT_MEASURED, "make workbook did not run")
    j = at_most(r["wall_s"], WORKBOOK_LIMIT_S, f"make workbook exited {r['returncode']} after {r['wall_s']:.0f} s "
                                               f"({{sign}} {WORKBOOK_LIMIT_S} s)")
    return j if r["returncode"] == 0 else Judgement(MISSED, j.line)


ITEMS = [Item("workbook", "`make workbook` wall time, per notebook, with the load average", lambda a: item_workbook(),
              rows,
              (Check(MUST, f"`make workbook` exits 0 within {WORKBOOK_LIMIT_S} s", _within_limit,
                     miss={"returncode": 0, "wall_s": WORKBOOK_LIMIT_S + 60.0}),
               Check(MUST, "no kernel warns that it runs over TCP without encryption",
                     lambda r: at_most(r.get("tcp_warnings"), 0, f"{r.get('tcp_warnings')} '{TCP_WARNING}' lines "
                                                                 f"({{sign}} 0)"),
                     miss={"tcp_warnings": 15})))]
