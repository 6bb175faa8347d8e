"""How this folder was written: with the workbook code as it was before the split (helpers/tune/rounds.py at commit
c638e94, the last one before Workbook was split by job), run from the repository root as
`PYTHONPATH=. .venv/bin/python tests/data/workbook_before_split/generate.py OUT` with a copy of
tests/data/record_7c15080 in /tmp/gen/record_7c15080. It uses
the old code's own create/baseline(adopt)/note/decide/rollback, and builds its run_round/aa_check ledger entries
exactly as those methods build them (their measuring part trains, so it is left out; the runs they name are absent,
which readers allow)."""
import importlib.util
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
src = subprocess.run(["git", "show", "c638e94:helpers/tune/rounds.py"], capture_output=True, text=True, cwd=REPO,
                     check=True).stdout
old = importlib.util.module_from_spec(importlib.util.spec_from_loader("old_rounds", loader=None))
sys.modules["old_rounds"] = old
exec(compile(src, "old_rounds.py", "exec"), old.__dict__)

from helpers.record import load_run  # noqa: E402
from helpers.tune.rules import Verdict  # noqa: E402

out = Path(sys.argv[1])
record = load_run("/tmp/gen/record_7c15080")  # a copy: the ledger names where it was adopted from
wb = old.Workbook.create(out, record.config, repeats=2, loss_gate=0.02, memory_limit_bytes=8 * 2 ** 30)
wb.baseline(progress=False, who="ana", adopt=[record])


def add_round(index, name, changes, decision, objective="speed", who="ana", why="", reasoning=None, **ttq):
    """The tail of the old run_round: fresh folder, rollback point, and its _append call, verbatim."""
    entries = wb.ledger()
    best_round = wb._best_round(entries)
    cand, moved = wb.candidate(name, changes, objective)
    folder = wb._fresh(wb.path / "rounds" / f"{index:02d}_{name}")
    seed_list = [1337, 1338] if objective != "speed" else None
    verdict = Verdict(decision, f"{decision}: written by hand for the replay test", 1.05, 0.01, 0.0, 1.0,
                      "the rule (hand)", [1.04, 1.06], 12, "processes" if objective == "speed" else None, 0.998,
                      objective=objective)
    rollback = wb._save_rollback(folder / "rollback", cand, [])
    target, target_from, time_cap_s = ttq.get("target"), ttq.get("target_from"), ttq.get("time_cap_s")
    wb._append({"event": "round", "round": index, "name": name, "objective": objective,
                **({"seeds": seed_list} if seed_list else {}),
                **({"target": target, "target_from": target_from, "time_cap_s": time_cap_s}
                   if objective == "time_to_target" else {}),
                "changes": {k: list(v) for k, v in moved.items()}, "reference_round": best_round,
                "reference_runs": [f"rounds/{index:02d}_{name}/reference"],
                "candidate_runs": [f"rounds/{index:02d}_{name}/candidate"],
                "verdict": verdict.to_dict(), "decision": verdict.decision, "rollback": wb._rel(rollback),
                "who": who or old._user(), "when": old._now(), **old._reasons(why, reasoning)},
               index if verdict.decision == "keep" else best_round, entries)


add_round(1, "batch", {"batch_size": 8}, "keep", why="the CPU is idle between steps")
add_round(2, "lr", {"lr": 0.002}, "reject", objective="convergence", reasoning={"bottleneck": "balanced"})
add_round(3, "recipe", {"lr": 0.003, "warmup": 4}, "no change", objective="time_to_target", target=2.5,
          target_from="given", time_cap_s=60.0)
wb.note("stop", "nothing left that fits the budget", decision="stop", who="autotune")
entries = wb.ledger()  # the old aa_check's _append, verbatim (its measurement cannot run here)
best_round = wb._best_round(entries)
aa = Verdict("no change", "no change: written by hand", 1.0, 0.01, 0.0, 1.0, "the rule (hand)", [0.99, 1.01], 12,
             "processes", 0.998)
wb._append({"event": "aa_check", "round": best_round, "name": "aa_01", "changes": {},
            "reference_runs": ["aa/01/reference"], "candidate_runs": ["aa/01/candidate"], "verdict": aa.to_dict(),
            "decision": aa.decision, "who": "ana", "when": old._now()}, best_round, entries)
wb.decide(2, "keep", who="ben", why="a lower loss at the end is what we want")
wb.rollback(1, who="cy")
print(open(out / "ledger.jsonl").read())
