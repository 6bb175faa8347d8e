"""AMP dtype audit on a real O2 run: protected cells compute in fp32, matmuls in fp16."""
import json

import pytest

from helpers.record import load_run
from helpers.book.report import amp_audit_table, amp_audit_text
from tests.conftest import run_cli, tiny_args

pytestmark = pytest.mark.slow


def _rows(run):
    return json.loads((run / "dtype_audit.json").read_text())


def test_o2_with_fp32_layernorm_and_softmax(tmp_path, small_corpus):
    run = tmp_path / "o2"
    proc = run_cli("train", *tiny_args(small_corpus, 4, "amp_level=O2", "fp32_cells=[layernorm, softmax]"),
                   "--out", str(run), "--progress", "none")
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = _rows(run)
    kinds = {(r["kind"], r["compute_dtype"]) for r in rows}
    assert ("LayerNorm", "fp32") in kinds and ("Softmax", "fp32") in kinds
    assert ("Dense", "fp16") in kinds and ("MatMul", "fp16") in kinds
    assert ("LayerNorm", "fp16") not in kinds and ("Softmax", "fp16") not in kinds
    assert all(r["ok"] for r in rows)
    audit = load_run(run).summary["amp_audit"]
    assert "Softmax" in audit["fp32"] and "Dense" in audit["fp16"] and audit["unprotected"] == []
    table = amp_audit_table(load_run(run))  # what notebook 03 displays
    by_kind = table.groupby("kind")["compute dtype"].agg(set)
    assert by_kind["LayerNorm"] == by_kind["Softmax"] == {"fp32"} and by_kind["MatMul"] == {"fp16"}
    assert amp_audit_text(load_run(run)).endswith("unprotected (asked fp32, computing lower): none")


def test_o2_without_softmax_protection_computes_softmax_in_fp16(tmp_path, small_corpus):
    run = tmp_path / "o2bare"
    proc = run_cli("train", *tiny_args(small_corpus, 4, "amp_level=O2", "fp32_cells=[]"),
                   "--out", str(run), "--progress", "none")
    assert proc.returncode == 0, proc.stderr[-2000:]
    kinds = {(r["kind"], r["compute_dtype"]) for r in _rows(run)}
    assert ("Softmax", "fp16") in kinds
    assert ("LayerNorm", "fp32") in kinds  # MindSpore's own O2 black list keeps LayerNorm in fp32


def test_fp32_run_has_no_audit(tmp_path, small_corpus):
    run = tmp_path / "o0"
    assert run_cli("train", *tiny_args(small_corpus, 4), "--out", str(run), "--progress", "none").returncode == 0
    assert not (run / "dtype_audit.json").exists() and "amp_audit" not in load_run(run).summary
    assert amp_audit_table(load_run(run)).startswith("no dtype audit in o0: only runs with amp_level O1-O3")
