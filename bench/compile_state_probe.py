"""Evidence for `config.speed_measured`: A/A measurements (the same config in both arms, two arm processes taking
turns step by step, as a round measures) in three compile states: `cache on` (both arms share one warm folder, so
one arm loads the graph and the other, locked out of the folder, compiles it), `cache off` (both compile) and
`both loaded` (each arm loads its own copy of the warm folder: the rule a suite-wide cache would need). Per launch:
the candidate ÷ reference mean step time over all measured steps, and which arm loaded its graph.

    python bench/compile_state_probe.py [--trials 6] [--states "cache on,cache off"] [--out docs/data/<today>-compile-state-aa.json]

Needs a clean tree (the record names its commit); run it with nothing else running.
"""
from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import sys
import tempfile
from datetime import date
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH.parent), str(BENCH)]

from helpers.config import with_changes  # noqa: E402
from helpers.record import atomic_write_json  # noqa: E402
from helpers.spawn.runner import launch  # noqa: E402
from helpers.spawn.stepped import launch_stepped  # noqa: E402
from helpers.tune.study import base_config  # noqa: E402
from provenance import Provenance  # noqa: E402

CONFIGS = {  # name → (preset, steps, changes): the autotune notebook's naive start, and the workbook's default
    "tiny, batch 2, 1 op thread": ("tiny", 10, {"batch_size": 2, "threads": 1, "data.num_parallel_workers": 1,
                                                "eval_every": 0}),
    "nano (the workbook's default)": ("nano", 50, {}),
}
PLAN = {"block_steps": 8, "looks": [12]}


STATES = ("cache on", "cache off", "both loaded")


def _arms(state: str, base, cached, folder: Path) -> tuple:
    """(reference, candidate) configs of one launch in `state`; `both loaded` copies the warm folder once per arm."""
    if state == "cache on":
        return cached, cached
    if state == "cache off":
        off = with_changes(base, {"compile_cache": False})
        return off, off
    arms = []
    for arm in ("reference", "candidate"):
        copy = folder.parent / f"{folder.name}_cache_{arm}"
        shutil.copytree(cached.compile_cache_path, copy)
        arms.append(with_changes(cached, {"compile_cache_path": str(copy)}))
    return tuple(arms)


def _launch(ref, cand, folder: Path) -> dict:
    """One A/A launch; the ratio and each arm's compile state (loaded: cache on and not locked out of it)."""
    _, _, raw, error = launch_stepped(ref, cand, folder, PLAN, lambda m: False, progress=False)
    if error or raw is None or not raw["pairs"]:
        raise RuntimeError(f"A/A in {folder} failed: {error or (raw or {}).get('reason')}")
    logs = [math.log(statistics.fmean(c) / statistics.fmean(r)) for r, c in raw["pairs"]]
    arms = {}
    for arm in ("reference", "candidate"):
        summary = json.loads((folder / arm / "summary.json").read_text(encoding="utf-8"))
        loaded = ref.compile_cache and not summary.get("compile_cache_off")
        arms[arm] = {"compile_s": round(summary["compile_s"], 3), "graph": "loaded" if loaded else "compiled",
                     "step_time_ms": round(summary["step_time_ms"], 3)}
    return {"candidate_over_reference_step": round(math.exp(statistics.fmean(logs)), 4), "pairs": len(logs),
            "arms": arms}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trials", type=int, default=6)
    p.add_argument("--states", default="cache on,cache off", help=f"comma-separated, of: {', '.join(STATES)}")
    p.add_argument("--out", type=Path,  # dated: a rerun never overwrites committed evidence
                   default=BENCH.parent / "docs" / "data" / f"{date.today():%Y-%m-%d}-compile-state-aa.json")
    args = p.parse_args(argv)
    states = [x.strip() for x in args.states.split(",")]
    if not states or any(x not in STATES for x in states):
        p.error(f"--states {args.states!r}: choose from {', '.join(STATES)}")
    work = Path(tempfile.mkdtemp(prefix="compile_state_"))
    result = {}
    with Provenance(argv, script="bench/compile_state_probe.py") as prov:
        for name, (preset, steps, changes) in CONFIGS.items():
            base = base_config(preset, steps, changes=changes)
            cached = with_changes(base, {"compile_cache": True, "compile_cache_path": str(work / "cache" / preset)})
            launch(cached, work / f"warm_{preset}", progress=False)  # the folder warm, as a workbook's baseline leaves it
            rows = {state: [] for state in states}
            for k in range(args.trials):  # interleaved, so drift lands on every state
                for state in states:
                    folder = work / f"{preset}_{state.replace(' ', '_')}_{k}"
                    rows[state].append(_launch(*_arms(state, base, cached, folder), folder))
                    print(name, state, rows[state][-1]["candidate_over_reference_step"], flush=True)
            result[name] = {
                state: {"trials": got, "loaded_over_compiled_step": _loaded_ratio(got) if state == "cache on" else None,
                        "abs_log_ratio_median": round(statistics.median(
                            abs(math.log(t["candidate_over_reference_step"])) for t in got), 4),
                        "step_time_ms_median": round(statistics.median(
                            a["step_time_ms"] for t in got for a in t["arms"].values()), 3)}
                for state, got in rows.items()}
    shutil.rmtree(work, ignore_errors=True)
    atomic_write_json(args.out, {"what": __doc__.split("\n\n")[0], "plan": PLAN, "provenance": prov.to_dict(),
                                 "result": result})
    print(f"wrote {args.out}")
    return 0


def _loaded_ratio(trials: list[dict]) -> list[float]:
    """Per launch with one arm loaded and one compiled: the loaded arm's ÷ the compiled arm's step time."""
    out = []
    for t in trials:
        states = {a["graph"]: arm for arm, a in t["arms"].items()}
        if set(states) == {"loaded", "compiled"}:
            r = t["candidate_over_reference_step"]
            out.append(round(r if states["loaded"] == "candidate" else 1 / r, 4))
    return out


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
