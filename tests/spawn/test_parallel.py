"""Data parallel through msrun: config checks, the planner's arithmetic, and real 2-rank runs (msrun's own pieces:
test_msrun.py; the merge of the ranks: test_rankmerge.py)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from helpers.config import ConfigError, from_dict, with_changes
from helpers.book.planner import GB, MODELS, Strategy, eight_by_40gb, estimate, recommend
from helpers.record import load_run
from helpers.paired import DP_PAIRED_PLAN
from helpers.spawn.runner import reuse


# ------------------------------------------------------------------------------------------ no training

@pytest.mark.parametrize("overrides, message", [
    (["parallel.data_parallel=2", "batch_size=7"], "does not split evenly"),
    (["parallel.data_parallel=64", "batch_size=64"], "cores"),
    (["parallel.data_parallel=2", "batch_size=8", "parallel.comm_fusion=index"], "fusion_indices"),
    (["parallel.data_parallel=2", "batch_size=8", "parallel.comm_fusion=index", "parallel.fusion_indices=[5,3]"],
     "increasing"),
    (["parallel.comm_fusion=ring"], "choose one of none, size, index"),
])
def test_bad_parallel_config_is_one_line(overrides, message):
    with pytest.raises(ConfigError, match=message) as err:
        from_dict({}, overrides)
    assert "\n" not in str(err.value)


def test_planner_reproduces_7b_hand_arithmetic():
    e = estimate(MODELS["7B"], Strategy(dtype="fp16"))
    assert e.params == 14 * GB and e.grads == 14 * GB  # 7e9 x 2 bytes
    assert e.optimizer == 84 * GB  # fp32 master + m + v = 12 B/param
    assert e.model_state == 112 * GB  # 16 B/param
    assert estimate(MODELS["7B"], Strategy(dtype="fp32")).model_state == 7e9 * 16  # 4 + 4 + 8
    tp2 = estimate(MODELS["7B"], Strategy(tp=2))
    assert tp2.params == 7 * GB and tp2.optimizer == 42 * GB
    assert estimate(MODELS["7B"], Strategy(dp=8, optimizer_shard=True)).optimizer == 10.5 * GB
    # activations, 16-bit, no TP: s*b*h*(34 + 5*a*s/h) per layer x 32 layers + fp32 logits
    sbh = 4096 * 1 * 4096
    assert e.activations == pytest.approx(sbh * (34 + 5 * 32) * 32 + 4 * 4096 * 32000)
    recompute = estimate(MODELS["7B"], Strategy(recompute=True)).activations
    assert recompute == pytest.approx(2 * sbh * 32 + sbh * 194 + 4 * 4096 * 32000)


def test_eight_by_40gb_example_and_recommendations():
    rows = {(r["dp"], r["tp"], r["pp"], r["recompute"], r["optimizer_shard"]): r for r in eight_by_40gb()}
    assert not rows[(8, 1, 1, False, False)]["fits"]  # 112 GB of state on every device
    assert not rows[(8, 1, 1, True, True)]["fits"]  # 14 + 14 + 10.5 + activations > 40
    assert rows[(4, 2, 1, True, True)]["fits"]
    assert all(r["devices"] == 8 for r in rows.values())
    assert recommend(7e9).startswith("DP + recompute")
    assert recommend(13e9).startswith("DP + TP 2-4") and recommend(30e9).startswith("DP + TP 2-4")
    assert recommend(70e9).startswith("DP + TP") and "PP" in recommend(70e9)


# -------------------------------------------------------------------------------------- real training

@pytest.mark.slow
def test_two_rank_msrun_run_matches_one_process_with_same_global_batch(data_parallel_notebook):
    """Notebook 10's first section (the shared notebook run, tiny preset, 12 steps): its 2-rank msrun run and its
    one-process run of the same global batch train the same losses; the ranks' records merge into one."""
    root, failures = data_parallel_notebook
    assert "10_data_parallel" not in failures, failures
    single, dp = (root / "runs" / "10_data_parallel" / name for name in ("single_process", "dp2_unfused"))
    a, b = load_run(single), load_run(dp)
    assert a.config.global_batch == b.config.global_batch and b.config.parallel.data_parallel == 2
    la, lb = np.array([r["loss"] for r in a.metrics]), np.array([r["loss"] for r in b.metrics])
    assert len(la) == len(lb) == 12
    assert np.max(np.abs(la - lb) / la) < 1e-5  # measured ~6e-7: float32 summation order only
    s = b.summary
    assert s["status"] == "ok" and s["data_parallel"] == 2 and s["ranks_merged"] == 2
    assert s["comm_step_share"] > 0 and s["comm_ms_per_step"] > 0
    # the ranks profile steps after steady_after up to half the steady steps for the all-reduce time; speed is
    # the steps after that window only
    first, last = s["profiled_steps"]
    assert first == b.config.steady_after + 1 and last == 7 and s["steady_window"] == [8, 12]
    speed = [r for r in b.metrics if r["step"] >= 8]
    assert s["speed_steps"] == 5 and s["tokens_per_s"] == pytest.approx(
        1000 * sum(r["tokens"] for r in speed) / sum(r["step_time_ms"] for r in speed))
    assert len(s["rank_step_time_ms"]) == 2
    for rank in (0, 1):
        rows = load_json_rows(dp / "ranks" / f"rank_{rank}.json")
        assert [r["step"] for r in rows] == list(range(1, 13))
    merged = {r["step"]: r["step_time_ms"] for r in b.metrics}
    slowest = {row["step"]: max(row["step_time_ms"], other["step_time_ms"]) for row, other in
               zip(load_json_rows(dp / "ranks" / "rank_0.json"), load_json_rows(dp / "ranks" / "rank_1.json"))}
    assert merged == pytest.approx(slowest)
    assert a.summary["comm_step_share"] == 0.0
    assert b.checkpoints() and not list((dp / "ranks" / "rank_1" / "checkpoints").glob("*.ckpt"))
    # the record keeps the config its ranks trained (the profiler window set); the notebook's own request, without
    # the window, is still this run: a second execution reuses it instead of training it again
    assert reuse(with_changes(b.config, {"monitor.profile_steps": 0}), dp) is not None


def load_json_rows(path):
    import json
    return json.loads(path.read_text())["rows"]


@pytest.mark.slow
def test_notebook_runs_and_fusion_is_a_real_round(data_parallel_notebook):
    """Notebook 10 as a user runs it (the shared run of every notebook with its defaults, debug preset)."""
    import json
    import nbformat
    from helpers.tune.rounds import Workbook
    root, failures = data_parallel_notebook
    assert "10_data_parallel" not in failures, failures
    runs = root / "runs" / "10_data_parallel"
    assert load_run(runs / "dp2_unfused").summary["allreduce_calls_per_step"] == 16.0  # one per gradient tensor:
    # 12 in the one block, 4 outside it
    (folder,) = runs.glob("fusion_*")
    wb = Workbook.open(folder)
    (result,) = wb.rounds()  # the default: one round, gradient fusion by size
    assert result.name == "comm_fusion_size" and wb.baseline_runs()[0].config.parallel.comm_fusion == "none"
    # the baseline is section 1's unfused run, pinned as it is (its record carries the profiler window)
    (adopted,) = wb.ledger()[0]["adopted_from"]
    assert Path(adopted).resolve() == (runs / "dp2_unfused").resolve() and len(wb.baseline_runs()) == 1
    # both arms in each rank of one msrun launch, judged by the workbook's rule
    assert len(result.candidate_runs) == len(result.reference_runs) == 1 and result.verdict.path == "paired"
    assert result.decision in {"keep", "reject", "no change"}, result.verdict.reason
    assert "interval" in result.verdict.reason and result.changes == {"parallel.comm_fusion": ("none", "size")}
    (cand,), (ref,) = wb.load_runs(result.candidate_runs), wb.load_runs(result.reference_runs)
    assert cand.config.parallel.comm_fusion == "size" and ref.config.parallel.comm_fusion == "none"
    assert cand.summary["ranks_merged"] == ref.summary["ranks_merged"] == 2
    paired = json.loads((cand.path.parent / "paired.json").read_text())
    assert paired["ranks_merged"] == 2 and len(paired["pairs"]) == DP_PAIRED_PLAN.max_pairs  # the last look
    # each arm profiled its all-reduces in its own warm-up, before the blocks
    assert cand.summary["allreduce_calls_per_step"] == 1.0  # one bucket
    assert ref.summary["allreduce_calls_per_step"] == 16.0
    assert paired["warmup_steps"] == cand.summary["profiled_steps"][1] == ref.summary["profiled_steps"][1]
    text = "".join(str(o) for c in nbformat.read(str(root / "notebooks" / "out_10_data_parallel.ipynb"),
                                                  as_version=4).cells for o in c.get("outputs", []))
    assert "Round 1 'comm_fusion_size'" in text
