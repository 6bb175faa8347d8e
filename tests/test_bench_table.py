"""docs/benchmarks.md's bench tables are generated from the committed records; every record carries its provenance;
musts can fail, goals are called goals, a quiet condition under load is invalid, and a bench that would measure nothing
fails in one line."""
from __future__ import annotations

import json
import math
import re
import subprocess
import sys

import pytest

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "bench"))
import registry  # noqa: E402
import table  # noqa: E402
from provenance import RECORDS  # noqa: E402

ITEMS = registry.items()
PAGE = REPO / "docs" / "benchmarks.md"


def _bench(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "bench/bench.py", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


def test_readmes_bench_tables_are_the_ones_the_committed_records_generate():
    assert table.difference(PAGE.read_text(encoding="utf-8"), RECORDS, ITEMS) == ""


def test_a_figure_edited_by_hand_in_readme_fails_the_comparison():
    text = PAGE.read_text(encoding="utf-8")
    block = table.page_block(text)
    digit = re.search(r"\d", block.split("\n", 1)[1])  # the first figure after the marker line
    at = len(block.split("\n", 1)[0]) + 1 + digit.start()
    edited = block[:at] + str((int(block[at]) + 1) % 10) + block[at + 1:]
    why = table.difference(text.replace(block, edited), RECORDS, ITEMS)
    assert why.startswith("docs/benchmarks.md's bench tables differ from bench/records at line ") and why.endswith(
        "run `python bench/bench.py table --write`"), why


def test_every_must_can_fail_every_goal_is_a_goal_and_an_empty_result_measured_nothing():
    for item in ITEMS.values():
        for check in item.checks:
            assert check.kind in (registry.MUST, registry.GOAL)
            if check.kind == registry.MUST:
                assert check.judge(check.miss).status == registry.MISSED, (item.name, check.limit)
        judged = registry.judge(item, {})
        assert {j["status"] for j in judged} == {registry.NOT_MEASURED}, item.name
        assert registry.failures(item, judged)[0].startswith(f"{item.name}: measured nothing (")
    block = table.generated(RECORDS, ITEMS)
    for item in ITEMS.values():  # the checks table names each check's kind beside its limit
        for check in item.checks:
            assert f"| {item.name} | {check.kind} | {table._cell(check.limit)} |" in block


def _quiet(load_max: float) -> dict:
    """A power result fixture: 20 of 20 quiet A/A trials said "no change", at this peak 1-minute load."""
    return {"quiet": {"rates": {"A/A": {"as_expected": 20, "trials": 20, "half_width_median": 0.015}},
                      "load_1min": {"min": 1.2, "max": load_max}, "load_limit": 2.5}}


def test_a_quiet_condition_above_its_load_limit_is_invalid_not_passed():
    power = ITEMS["power"]
    quiet_aa = next(c for c in power.checks if c.limit.startswith("quiet A/A: "))
    assert quiet_aa.judge(_quiet(2.1)).status == registry.MET
    loaded = quiet_aa.judge(_quiet(3.4))
    assert loaded == registry.Judgement(registry.INVALID, 'quiet A/A: 20/20 "no change" (≥ 95%); but the 1-min load '
                                                          'reached 3.4 > 2.5 (cores + 0.5), so the condition was not '
                                                          'quiet')
    assert f"power: must invalid: {loaded.line}" in registry.failures(power, registry.judge(power, _quiet(3.4)))


def test_the_aa_must_is_todays_rule_on_each_trials_own_pairs():
    follows = next(c for c in ITEMS["aa"].checks if c.kind == registry.MUST)
    trials = [{"decision": "no change", "rule_decision": "no change"}, {"decision": "reject", "rule_decision": "reject"}]
    assert follows.judge({"detail": trials}).status == registry.MET
    # the old rule said "no change" whenever the interval held 1.0; today's rule may reject such an interval
    assert follows.judge({"detail": [{"decision": "no change", "rule_decision": "reject"}]}).line == (
        "trial 1: no change (the rule on its pairs: reject)")


@pytest.mark.parametrize("args, line", [
    (("power", "--trials", "0"), "bench: power: --trials 0 measures nothing; give --trials 1 or more"),
    (("power", "--conditions", "quiet,quite"),
     "bench: power: unknown condition 'quite'; choose from quiet, hog; did you mean 'quiet'?"),
    (("aa", "--trials", "0"), "bench: aa: --trials 0 measures nothing; give --trials 1 or more"),
])
def test_a_bench_that_would_measure_nothing_or_an_unknown_condition_exits_2_in_one_line(tmp_path, args, line):
    proc = _bench(*args, "--results", str(tmp_path))
    assert (proc.returncode, proc.stderr) == (2, line + "\n")
    assert list(tmp_path.iterdir()) == []  # nothing ran, nothing written


@pytest.mark.slow
def test_real_records_carry_provenance_and_the_tables_follow_the_files(tmp_path):
    records = tmp_path / "records"
    assert "No committed results yet" in table.generated(records, ITEMS)  # zero records
    for args in (("mfu", "--presets", "tiny", "--mfu-steps", "12"), ("clock", "--clock-runs", "1")):
        proc = _bench(*args, "--results", str(records))
        assert proc.returncode == 0, proc.stderr[-2000:]
    mfu = json.loads((records / "mfu.json").read_text())
    p = mfu["provenance"]
    assert re.fullmatch(r"[0-9a-f]{40}", p["commit"]) and isinstance(p["dirty"], bool)
    assert p["command"] == f"python bench/bench.py mfu --presets tiny --mfu-steps 12 --results {records}"
    assert p["machine"]["cores"] >= 1 and p["machine"]["ram_bytes"] > 0 and p["machine"]["cpu_model"]
    assert p["load_1min_before"] >= 0 and p["load_1min_during"]["values"] and re.match(r"\d{4}-\d\d-\d\dT", p["date"])
    tiny = mfu["result"]["presets"]["tiny"]  # the raw figures behind the row, both peaks named
    assert 0 < tiny["mfu"] <= 1 and 0 < tiny["mfu_hardware"] <= 1 and tiny["peak_flops_hardware_arithmetic"]
    assert mfu["checks"][0]["status"] == registry.MET
    many = table.generated(records, ITEMS)
    at = f"`{p['commit_short']}`{' (dirty tree)' if p['dirty'] else ''} {p['date'][:10]} {p['date'][11:16]}"
    assert f"| mfu | MFU tiny (" in many and at in many and "| clock | recorded step time ÷ outside wall clock" in many
    assert f"| mfu | must | {table._cell(ITEMS['mfu'].checks[0].limit)} | met: tiny " in many
    (records / "mfu.json").unlink()  # a record deleted: its rows and status go with it
    one = table.generated(records, ITEMS)
    assert "| mfu | MFU tiny (" not in one and "| clock | recorded step time" in one
    assert f"| mfu | must | {table._cell(ITEMS['mfu'].checks[0].limit)} | not measured (no committed record) |" in one


def test_validity_truth_is_the_geometric_mean_of_its_measurements_and_coverage_is_judged_against_it():
    import validity_item as v
    effect = {"truth": {"ratio": 1.015}, "truths": [{"ratio": 1.015}, {"ratio": 1.06}, {"ratio": 1.05}],
              "standalone": None, "changes": {"threads": 2}}
    assert v.truth_of(effect) == pytest.approx((1.015 * 1.06 * 1.05) ** (1 / 3))
    assert v.truth_of({"truth": {"ratio": 1.0}}) == 1.0  # an A/A, or a state from before repeated truths
    trial = {"effect": "threads 1→2", "trial": 0, "decision": "keep", "expected": "keep", "ratio": 1.05,
             "half_width": 0.03,
             "pairs": 20, "wall_s": 40.0, "load_1min": {"max": 2.0}, "foreign_cores_median": 0.01}
    trials = [{**trial, "interval": [1.02, 1.08], "covered": False},  # recorded against the first truth alone
              {**trial, "interval": [1.00, 1.03], "covered": True}, {**trial, "interval": None, "covered": False}]
    rate = v._rates(trials, {name: {"truth": {"ratio": 1.0}, "standalone": None} for name in v.EFFECTS}
                    | {"threads 1→2": effect})["threads 1→2"]
    assert rate["covered"] == 1 and rate["truths"] == [1.015, 1.06, 1.05]
    assert "over 3: ×1.015–×1.060" in v.rows({"rates": {"threads 1→2": rate}})[0][0]


def test_a_long_run_truth_is_taken_at_the_trial_s_hour():
    """Truths before trials 0, 5, 10 and after the last (10 trials): each trial between the two around its block."""
    import validity_item as v
    effect = {"truth": {"ratio": 4.0}, "truths": [{"ratio": 4.0}, {"ratio": 3.6, "before_trial": 5},
                                                  {"ratio": 3.6, "before_trial": 10}]}
    assert v.truth_at(effect, 0) == pytest.approx(math.exp(0.9 * math.log(4.0) + 0.1 * math.log(3.6)))
    assert v.truth_at(effect, 4) == pytest.approx(math.exp(0.1 * math.log(4.0) + 0.9 * math.log(3.6)))
    assert v.truth_at(effect, 7) == pytest.approx(3.6) and v.truth_at({"truth": {"ratio": 1.0}}, 3) == 1.0
    trial = {"effect": "slow storage removed", "decision": "keep", "expected": "keep", "ratio": 3.7,
             "half_width": 0.05, "pairs": 6, "wall_s": 30.0, "load_1min": {"max": 2.0}, "foreign_cores_median": 0.01}
    trials = [{**trial, "trial": 4, "interval": [3.5, 3.8]}, {**trial, "trial": 0, "interval": [3.5, 3.8]}]
    rate = v._rates(trials, {"slow storage removed": {**effect, "standalone": None}},
                    {"slow storage removed": None})["slow storage removed"]
    assert (rate["covered"], rate["covered_at_its_time"]) == (2, 1)  # mean ×3.73; trial 4 at ×3.64, trial 0 at ×3.96
    row = v.rows({"rates": {"slow storage removed": rate}})[0][1]
    assert row.startswith("interval holds it 2/2 (the truth of its hour: 1/2); keep 2")
    judged = v.STALL_CHECKS[0].judge({"rates": {"slow storage removed": rate}, "load_limit": 9.0})
    assert judged.status == "missed" and "1/2" in judged.line
