"""Evidence for the msrun scheduler's early exit (helpers/spawn/dp_worker.py `serve_cluster`): how long a 2-rank
data-parallel run goes on after its ranks have written their rank files (msrun waiting for its scheduler, then the
merge), with this checkout's scheduler and with an earlier commit's (MindSpore's own 5 s wait), launches taking
turns.

    python bench/msrun_tail_probe.py [--before 72f8fe4^] [--trials 3] [--out docs/data/<today>-msrun-tail.json]

The earlier commit is checked out into a temporary worktree. Both train with MindSpore's ops (model.kernels:
mindspore: a worktree has no native build). Needs a clean tree (the record names its commit); run it with nothing
else running.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from datetime import date
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path[:0] = [str(REPO), str(BENCH)]

from helpers.record import atomic_write_json  # noqa: E402
from provenance import Provenance  # noqa: E402

CHANGES = {"model.preset": "nano", "steps": 12, "batch_size": 12, "parallel.data_parallel": 2, "eval_every": 0,
           "model.kernels": "mindspore"}
# One launch in the checkout on sys.path[0]: seconds from the last rank file to train_data_parallel's return.
LAUNCH = """
import json, sys, time
from pathlib import Path
from helpers import config as C
from helpers.spawn.msrun import train_data_parallel
out = Path(sys.argv[2])
code = train_data_parallel(C.with_changes(C.load_config(), json.loads(sys.argv[1])), out)
done = time.time()
ranks = max(p.stat().st_mtime for p in (out / "ranks").glob("rank_*.json"))
print(json.dumps({"exit": code, "tail_s": round(done - ranks, 3)}))
"""


def _launch(checkout: Path, folder: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(checkout))
    proc = subprocess.run([sys.executable, "-c", LAUNCH, json.dumps(CHANGES), str(folder)], cwd=checkout, env=env,
                          capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"launch in {checkout} failed: {proc.stderr.strip().splitlines()[-1:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", default="72f8fe4^", help="the commit whose scheduler waits as MindSpore's does")
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--out", type=Path,  # dated: a rerun never overwrites committed evidence
                   default=REPO / "docs" / "data" / f"{date.today():%Y-%m-%d}-msrun-tail.json")
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="msrun_tail_"))
    before = work / "before"
    subprocess.run(["git", "worktree", "add", "--detach", str(before), args.before], cwd=REPO, check=True,
                   capture_output=True)
    tails: dict[str, list[dict]] = {"before": [], "after": []}
    try:
        with Provenance(argv, script="bench/msrun_tail_probe.py") as prov:
            for k in range(args.trials):  # taking turns, so drift lands on both
                for name in ("before", "after") if k % 2 == 0 else ("after", "before"):
                    tails[name].append(_launch(before if name == "before" else REPO, work / f"{name}_{k}"))
                    print(name, k, tails[name][-1], flush=True)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(before)], cwd=REPO, capture_output=True)
        shutil.rmtree(work, ignore_errors=True)
    before_commit = subprocess.run(["git", "rev-parse", args.before], cwd=REPO, capture_output=True,
                                   text=True).stdout.strip()
    atomic_write_json(args.out, {
        "what": __doc__.split("\n\n")[0], "changes": CHANGES, "before_commit": before_commit,
        "provenance": prov.to_dict(), "launches": tails,
        "tail_s_median": {n: statistics.median(t["tail_s"] for t in runs) for n, runs in tails.items()}})
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
