"""Evidence for `model.lazy_inline` (on by default): per preset, what reusing one block's graph does to compile
seconds (solo runs, each in a fresh process, off and on in turn) and to the step (paired launches: the two settings
in two processes taking turns step by step, as a round measures, the arm order swapped every trial), and whether
the losses stay the same.

    python bench/lazy_inline_probe.py [--trials 3] [--presets tiny,nano,small] [--out docs/data/<today>-lazy-inline.json]

Needs a clean tree (the record names its commit); run it with nothing else running.
"""
from __future__ import annotations

import argparse
import math
import shutil
import statistics
import sys
import tempfile
from datetime import date
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH.parent), str(BENCH)]

from helpers.record import atomic_write_json  # noqa: E402
from helpers.spawn.runner import launch  # noqa: E402
from helpers.spawn.stepped import launch_stepped  # noqa: E402
from helpers.tune.study import base_config  # noqa: E402
from provenance import Provenance  # noqa: E402

# preset → (steps of a solo run, paired plan): small's steps take ~0.5 s, so its launches pair fewer blocks
PRESETS = {"tiny": (20, {"block_steps": 8, "looks": [12]}), "nano": (20, {"block_steps": 8, "looks": [12]}),
           "small": (12, {"block_steps": 4, "looks": [6]})}
CHANGES = {"compile_cache": False}  # every run compiles its graph
SMALL = {"batch_size": 4}  # small at the workbook's batch of 12 takes seconds a step here


def _config(preset: str, steps: int, on: bool):
    return base_config(preset, steps, changes={**CHANGES, **(SMALL if preset == "small" else {}),
                                               "model.lazy_inline": on})


def _solo(preset: str, steps: int, on: bool, folder: Path) -> dict:
    """One run in a fresh process: its compile seconds, losses and peak RSS."""
    s = launch(_config(preset, steps, on), folder, progress=False).summary
    if s.get("status") != "ok":
        raise RuntimeError(f"{folder}: {s.get('status')} {s.get('status_reason')}")
    return {"compile_s": round(s["fixed_cost_s"]["compile"], 3), "loss_last": s["loss_last"],
            "val_loss": s["val_loss"], "peak_rss_mib": round(s["peak_rss_bytes"] / 2 ** 20)}


def _paired(preset: str, steps: int, plan: dict, on_first: bool, folder: Path) -> float:
    """One paired launch; the on arm's ÷ the off arm's mean step time (geometric mean over pairs)."""
    off, on = _config(preset, steps, False), _config(preset, steps, True)
    ref, cand = (on, off) if on_first else (off, on)
    _, _, raw, error = launch_stepped(ref, cand, folder, plan, lambda m: False, progress=False)
    if error or raw is None or not raw["pairs"]:
        raise RuntimeError(f"paired launch in {folder} failed: {error or (raw or {}).get('reason')}")
    cand_over_ref = math.exp(statistics.fmean(math.log(statistics.fmean(c) / statistics.fmean(r))
                                              for r, c in raw["pairs"]))
    return round(1 / cand_over_ref if on_first else cand_over_ref, 4)


def _spread(runs: list[dict]) -> float:
    """The largest relative difference of the last training loss or the val loss between any two of `runs` (the
    same seed: 0 would be bit-identical; run to run, MindSpore's CPU kernels leave ~1e-7)."""
    return max(abs(a[k] - b[k]) / abs(b[k]) for k in ("loss_last", "val_loss") for a in runs for b in runs)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--presets", default=",".join(PRESETS))
    p.add_argument("--out", type=Path,  # dated: a rerun never overwrites committed evidence
                   default=BENCH.parent / "docs" / "data" / f"{date.today():%Y-%m-%d}-lazy-inline.json")
    args = p.parse_args(argv)
    presets = [x.strip() for x in args.presets.split(",")]
    if not presets or any(x not in PRESETS for x in presets):
        p.error(f"--presets {args.presets!r}: choose from {', '.join(PRESETS)}")
    work = Path(tempfile.mkdtemp(prefix="lazy_inline_"))
    result = {}
    with Provenance(argv, script="bench/lazy_inline_probe.py") as prov:
        for preset in presets:
            steps, plan = PRESETS[preset]
            solo, ratios = {"off": [], "on": []}, []
            for k in range(args.trials):  # interleaved, so drift lands on both settings
                for name in ("off", "on") if k % 2 == 0 else ("on", "off"):
                    solo[name].append(_solo(preset, steps, name == "on", work / f"{preset}_{name}_{k}"))
                ratios.append(_paired(preset, steps, plan, k % 2 == 1, work / f"{preset}_paired_{k}"))
                print(preset, k, solo["off"][-1]["compile_s"], solo["on"][-1]["compile_s"], ratios[-1], flush=True)
            compile_med = {n: statistics.median(r["compile_s"] for r in rows) for n, rows in solo.items()}
            result[preset] = {
                "solo_runs": solo, "plan": plan, "on_over_off_step": ratios,
                "on_over_off_step_geomean": round(math.exp(statistics.fmean(math.log(r) for r in ratios)), 4),
                "compile_s_median": compile_med,
                "compile_on_over_off": round(compile_med["on"] / compile_med["off"], 3),
                "loss_max_rel_diff_on_vs_off": _spread(solo["off"] + solo["on"]),
                "loss_max_rel_diff_off_runs": _spread(solo["off"])}
    shutil.rmtree(work, ignore_errors=True)
    atomic_write_json(args.out, {"what": __doc__.split("\n\n")[0], "changes": CHANGES, "small_changes": SMALL,
                                 "provenance": prov.to_dict(), "result": result})
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
