"""Convergence rounds: the rule's arithmetic on synthetic records, then real tiny rounds, a suggested round
and notebook 13."""
from __future__ import annotations

import math
import shutil
from pathlib import Path

import nbformat
import pytest

from helpers.config import from_dict
from helpers.tune.convergence import compare_tokens, seed_band, time_to_target, val_loss_at
from helpers.record import RunRecord, load_run
from helpers.book.report import convergence_table, rounds_table
from helpers.tune.rounds import RoundError, Workbook
from helpers.tune.suggest import suggest_for
from helpers.tune.rules import judge_convergence, t975
from helpers.book.widgets import suggestion_panel
from helpers.book.notebooks import NOTEBOOKS_DIR, execute, kernel_env

MIB = 2 ** 20


def synthetic(name: str, val: dict[int, float], tokens_per_step: int = 100, step_ms: float = 1000.0,
              seed: int = 1) -> RunRecord:
    """A record with one row per step up to the last eval step (arithmetic only; nothing trains)."""
    rows = [{"step": s, "tokens": tokens_per_step, "step_time_ms": step_ms, "val_loss": val.get(s)}
            for s in range(1, max(val) + 1)]
    summary = {"status": "ok", "peak_memory_bytes": 500 * MIB, "tokens_per_s": tokens_per_step / step_ms * 1e3}
    return RunRecord(Path(name), from_dict({"seed": seed}), rows, summary, {})


def test_val_loss_is_interpolated_on_cumulative_tokens_across_batch_sizes():
    small = synthetic("small", {10: 3.0, 20: 2.0}, tokens_per_step=100)  # evals at 1,000 and 2,000 tokens
    big = synthetic("big", {5: 2.5, 10: 1.5}, tokens_per_step=300)  # evals at 1,500 and 3,000 tokens
    assert compare_tokens([small, big]) == 2000.0  # the largest count both evaluated at
    assert val_loss_at(small, 1500) == pytest.approx(2.5)
    assert val_loss_at(big, 2000) == pytest.approx(2.5 - 1.0 * 500 / 1500)
    late = synthetic("late", {30: 1.0}, tokens_per_step=100)  # first eval at 3,000 tokens > small's last
    with pytest.raises(ValueError, match="cover no common token count"):
        compare_tokens([small, late])
    with pytest.raises(ValueError, match="has no validation loss"):
        compare_tokens([small, RunRecord(Path("none"), from_dict({}), [{"step": 1, "tokens": 1}], {}, {})])


def test_time_to_target_interpolates_between_bracketing_evals():
    run = synthetic("r", {10: 3.0, 20: 2.0, 30: 1.8}, step_ms=500.0)  # 5 s per 10 steps
    assert time_to_target(run, 2.5) == pytest.approx(7.5)  # half-way from 5 s (3.0) to 10 s (2.0)
    assert time_to_target(run, 3.5) == pytest.approx(5.0)  # already below at the first eval
    assert time_to_target(run, 1.0) is None


def test_seed_band_is_pooled_spread_times_student_t():
    band = seed_band([2.0, 2.2], [1.5, 1.7])  # each arm's variance 0.02, pooled over 2 dof
    assert band == pytest.approx(t975(2) * math.sqrt(0.02 * (1 / 2 + 1 / 2)))
    assert t975(2) == pytest.approx(4.302653, abs=1e-6)  # exact (scipy), no longer a 3-decimal table
    with pytest.raises(ValueError, match="seeds=2"):
        seed_band([2.0], [1.9])


@pytest.mark.parametrize("cand, decision", [((1.50, 1.52), "keep"), ((2.50, 2.52), "reject"),
                                            ((1.98, 2.03), "no change")])
def test_convergence_decision_against_the_band(cand, decision):
    ref = [synthetic(f"ref{i}", {10: 2.5, 20: v}, seed=i) for i, v in enumerate((2.00, 2.02))]
    cands = [synthetic(f"cand{i}", {10: 2.5, 20: v}, seed=i) for i, v in enumerate(cand)]
    verdict = judge_convergence(ref, cands, memory_limit_bytes=10 ** 12)
    assert verdict.decision == decision
    assert "val loss at 2,000 tokens 2.0100 →" in verdict.reason and "seed band ±" in verdict.reason
    assert "time to val loss 2.0200" in verdict.reason and verdict.reason.endswith(f"→ {decision}")
    assert verdict.noise_band == pytest.approx(seed_band([2.0, 2.02], list(cand)))
    over = judge_convergence(ref, cands, memory_limit_bytes=100 * MIB)
    assert over.decision == "reject" and "over the memory limit" in over.reason


def test_bad_objective_or_seeds_refused_and_speed_round_on_lr_warns(tmp_path):
    wb = Workbook.create(tmp_path / "wb", from_dict({"model": {"preset": "debug"}, "steps": 10}), repeats=2)
    with pytest.raises(RoundError, match="objective='quality' is not allowed; choose one of speed, convergence"):
        wb.run_round("lr", {"lr": 1e-4}, objective="quality")
    with pytest.raises(RoundError, match="seeds=1 cannot measure seed-to-seed spread"):
        wb.run_round("lr", {"lr": 1e-4}, objective="convergence", seeds=1)
    with pytest.warns(UserWarning, match="judge it with objective='convergence'"):
        with pytest.raises(RoundError, match="no baseline pinned"):
            wb.run_round("lr", {"lr": 1e-4})
    with pytest.raises(RoundError, match="changes seed; steps, seed, steady_after, resume_from stay fixed"):
        wb.candidate("seed", {"seed": 7})  # convergence arms vary the seed themselves; a round may not


# ----------------------------------------------------------------------------------------- real runs

def tiny_config(corpus: Path):
    # grad_norm_limit far below tiny's grad norms, so every run keeps raising the alarm (the warm-up rule);
    # min_lr 0 so an lr round may go below it; eval every 4 steps gives 4 validation points per run;
    # threads=1 for stability under load.
    return from_dict({"model": {"preset": "debug"}, "data": {"corpus": [str(corpus)]}, "batch_size": 8,
                      "steps": 16, "warmup": 4, "min_lr": 0.0, "eval_every": 4, "eval_batches": 2,
                      "steady_after": 3, "threads": 1, "monitor": {"grad_norm_limit": 0.01}})


@pytest.fixture(scope="module")
def conv_book(tmp_path_factory, small_corpus):
    """A pinned tiny baseline and one convergence round with a clearly harmful change (lr 1e-3 → 1e-5)."""
    wb = Workbook.create(tmp_path_factory.mktemp("conv") / "book", tiny_config(small_corpus), repeats=2)
    wb.baseline(progress=False)
    wb.run_round("lr_1e-5", {"lr": 1e-5}, objective="convergence", progress=False)
    return wb


slow = pytest.mark.slow


@slow
def test_harmful_lr_is_rejected_by_validation_loss_with_two_seeds(conv_book):
    (r,) = conv_book.rounds()
    assert r.objective == "convergence" and r.decision == "reject", r.verdict.reason
    assert r.verdict.loss_drift > 0 and r.verdict.noise_band > 0
    tokens = 16 * 8 * 32  # steps × batch × seq_len: the last eval of every run
    assert f"val loss at {tokens:,} tokens" in r.verdict.reason and "2+2 seeds" in r.verdict.reason
    assert "time to val loss" in r.verdict.reason and r.verdict.reason.endswith("→ reject")
    cand, ref = [load_run(p) for p in r.candidate_runs], [load_run(p) for p in r.reference_runs]
    assert [x.config.seed for x in cand] == [x.config.seed for x in ref] == [1337, 1338]  # paired seeds
    assert {x.config.lr for x in cand} == {1e-5} and {x.config.lr for x in ref} == {1e-3}
    entry = [e for e in conv_book.ledger() if e["event"] == "round"][0]
    assert entry["objective"] == "convergence" and entry["seeds"] == [1337, 1338]
    assert conv_book.best_config().lr == 1e-3 and conv_book.best_config().seed == 1337
    table = convergence_table(r)
    assert list(table["arm"]) == ["reference", "reference", "candidate", "candidate"]
    col = f"val loss @ {tokens:,} tokens"
    assert table.loc[table.arm == "candidate", col].min() > table.loc[table.arm == "reference", col].max()
    assert rounds_table(conv_book.rounds())["objective"].tolist() == ["convergence"]


@slow
def test_warmup_suggestion_runs_from_the_panel_as_a_convergence_round(conv_book, tmp_path):
    wb = Workbook.open(shutil.copytree(conv_book.path, tmp_path / "book"))
    suggestions = suggest_for(wb)
    (warm,) = [s for s in suggestions if "warmup" in s.changes]
    assert warm.changes == {"warmup": 8} and warm.objective == "convergence"
    assert "grad norm above monitor.grad_norm_limit=0.01 on 16 of 16 steps" in warm.evidence
    panel = suggestion_panel(wb, suggestions)
    result = panel.run(suggestions.index(warm))
    assert result.objective == "convergence" and result.changes == {"warmup": (4, 8)}
    assert result.decision in ("keep", "reject", "no change") and "seed band" in result.verdict.reason
    assert panel.status.value.startswith(f"Round 2 '{warm.name}'")


@slow
def test_convergence_notebook_runs_a_warmup_round_and_shows_suggestions(conv_book, tmp_path):
    wb_dir = shutil.copytree(conv_book.path, tmp_path / "book")
    out = tmp_path / "13.ipynb"
    with kernel_env():
        status, error = execute(NOTEBOOKS_DIR / "13_convergence.ipynb", out,
                                {"workbook_dir": str(wb_dir), "warmup_candidate": 12})
    assert status == "ok", error
    text = "".join(str(o) for c in nbformat.read(str(out), as_version=4).cells for o in c.get("outputs", []))
    assert "warmup 4 → 12" in text and "seed band" in text and "image/png" in text
    assert "grad-norm alarms keep firing" in text and "Run warmup_" in text  # table (truncated) and panel
    assert "not run: set run_suggestion=True" in text
    assert [r.objective for r in Workbook.open(wb_dir).rounds()] == ["convergence", "convergence"]
