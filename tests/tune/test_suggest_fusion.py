"""Evaluation → decision rules on real runs that show each symptom, and the operator-fusion notebook's op-table
shift on real profiled runs (fused_slice → fused: StridedSlice vanishes)."""
from __future__ import annotations

import random
from pathlib import Path

import nbformat
import pytest
from matplotlib.figure import Figure

from helpers.spawn.runner import profile_run
from helpers.tune.fusion import best_profile, fusion_base, op_table_shift, profile_arms, round_op_shift, shift_summary
from helpers.book.plots import op_shift_plot
from helpers.record import load_run
from helpers.tune.rounds import Workbook
from helpers.tune.study import study_dir
from helpers.tune.suggest import suggest, suggestions_table
from tests.conftest import run_cli, tiny_args

pytestmark = pytest.mark.slow


def _train(out, corpus, steps, *extra):
    proc = run_cli("train", *tiny_args(corpus, steps, "threads=1", *extra), "--out", str(out), "--progress", "none")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return load_run(out)


def test_random_text_overfits_and_trips_grad_norm_alarms_into_warmup_and_regularisation_rounds(tmp_path):
    corpus = tmp_path / "random.txt"  # nothing to generalise: train loss falls while validation PPL rises
    rng = random.Random(0)
    corpus.write_text("".join(rng.choice("abcdefghijklmnopqrst") for _ in range(3000)))
    record = _train(tmp_path / "run", corpus, 120, "batch_size=16", "lr=3e-3", "min_lr=3e-4", "warmup=10",
                    "eval_every=20", "eval_batches=4", "data.val_fraction=0.5", "weight_decay=0",
                    "monitor.grad_norm_limit=0.01")
    found = {s.name: s for s in suggest(record)}
    assert set(found) == {"warmup_20", "weight_decay_0.1", "dropout_0.1"}, suggestions_table(list(found.values()))
    assert found["warmup_20"].changes == {"warmup": 20} and "on 120 of 120 steps" in found["warmup_20"].evidence
    assert found["dropout_0.1"].changes == {"model.dropout": 0.1}
    decay = found["weight_decay_0.1"]
    assert "val PPL" in decay.evidence and "overfit alarm fired" in decay.evidence
    assert all(s.objective == "convergence" for s in found.values())


def test_memorised_text_flattens_effective_throughput_into_a_batch_round(tmp_path):
    corpus = tmp_path / "abc.txt"  # learnt in ~20 steps; afterwards the loss drop per 1k tokens is ~0
    corpus.write_text("abcdefgh\n" * 1500)
    record = _train(tmp_path / "run", corpus, 60, "lr=3e-3", "eval_every=20")
    (batch,) = suggest(record)
    assert batch.changes == {"batch_size": 16} and batch.objective == "convergence"
    assert "flat for 20 steps" in batch.rule and "60-step run" in batch.rule
    assert "≤ 10% of the run's best" in batch.evidence


def test_op_table_shift_shows_strided_slices_vanish(tmp_path, small_corpus):
    """fused_slice → fused on two real profiled runs: the op-table shift the fusion notebook shows per round."""
    runs = {qkv: profile_run(fusion_base("debug", 14, str(small_corpus), qkv), tmp_path / qkv, window=6,
                             progress=False) for qkv in ("fused_slice", "fused")}
    shift = op_table_shift([runs["fused_slice"]], [runs["fused"]]).set_index("op")
    assert shift.loc["StridedSlice", "flag"] == "vanished" and shift.loc["StridedSlice", "ms/step after"] == 0
    assert shift.loc["StridedSlice", "calls/step before"] > 0 and shift.loc["Split", "flag"] == "new"
    assert "vanished: " in shift_summary(shift.reset_index()) and "StridedSlice" in shift_summary(shift.reset_index())
    assert isinstance(op_shift_plot(shift.reset_index()), Figure)


def test_fusion_notebook_shows_the_op_shift_next_to_tokens_per_s(notebooks_run):
    """Notebook 12 as a user runs it (the shared run of every notebook with its defaults: the native-kernels
    round, its two arm processes taking turns, each arm profiled in its own warm-up): the round's verdict in
    tokens/s, its op-table shift and its plot in the outputs; profile_arms returns the round's records and trains
    nothing."""
    root, failures = notebooks_run
    assert "12_operator_fusion" not in failures, failures
    (result,) = Workbook.open(study_dir(root / "workbooks" / "default", "fusion")).rounds()
    assert result.changes == {"model.kernels": ("mindspore", "native")} and "tokens/s" in result.verdict.reason
    assert result.verdict.path == "processes"
    flags = set(round_op_shift(result)["flag"])
    assert {"vanished", "new"} <= flags  # MindSpore's LayerNorm/GeLU ops leave, the custom kernels arrive
    ref, cand = profile_arms(result, progress=False)  # the round's own records, profiled in its warm-ups
    assert not (result.rollback.parent / "profiled").exists()  # no arm trained a second time
    assert [ref.path, cand.path] == [Path(result.reference_runs[0]), Path(result.candidate_runs[0])]
    assert cand.config.model.kernels == "native" and ref.config.model.kernels == "mindspore"
    assert ref.config.monitor.profile_steps > 0 and cand.config.monitor.profile_steps > 0
    assert best_profile([result], [(ref, cand)]).path == (cand.path if result.decision == "keep" else ref.path)
    text = "".join(str(o) for c in nbformat.read(str(root / "notebooks" / "out_12_operator_fusion.ipynb"),
                                                  as_version=4).cells for o in c.get("outputs", []))
    assert "vanished" in text and "image/png" in text and "tokens/s" in text