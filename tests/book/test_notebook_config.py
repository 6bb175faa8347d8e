"""A `config` notebook parameter every notebook starts from (preset/steps/corpus as shortcuts on top),
parameters addressed per notebook, and the generated reference page of every notebook parameter."""
from __future__ import annotations

import shutil
from pathlib import Path

import nbformat
import pytest
import yaml

from helpers.book.notebooks import (NOTEBOOKS_DIR, WorkbookError, discover, notebook_parameters, notebook_params,
                                    preflight, split_params)
from helpers.config import ConfigError, with_changes
from helpers.tune.study import base_config, data_parallel_applies, export_applies, round_applies
from tests.conftest import REPO, run_cli

NOTEBOOKS = discover(NOTEBOOKS_DIR)
DEFAULTS = {p.stem: notebook_parameters(p) for p in NOTEBOOKS}
RECIPE = REPO / "configs" / "examples" / "qwen2_5_0_5b_mcore.yaml"


def _import_nano(out: Path) -> Path:
    proc = run_cli("import-config", str(RECIPE), "--target", "cpu", "--scale", "nano", "--out", str(out), timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out


def test_parameters_for_one_notebook_go_to_it_alone():
    shared, own = split_params({"steps": 50, "14_time_to_quality": {"steps": 400}}, DEFAULTS)
    assert shared == {"steps": 50} and own == {"14_time_to_quality": {"steps": 400}}
    assert notebook_params("14_time_to_quality", DEFAULTS["14_time_to_quality"], shared, own)["steps"] == 400
    for stem in ("01_baseline", "05_batch_size", "13_convergence"):
        assert notebook_params(stem, DEFAULTS[stem], shared, own)["steps"] == 50
    assert "steps" not in notebook_params("00_environment", DEFAULTS["00_environment"], shared, own)
    with pytest.raises(WorkbookError, match=r"notebook '14_time_to_qualty', which is not one; did you mean "
                                            r"'14_time_to_quality'"):
        split_params({"14_time_to_qualty": {"steps": 4}}, DEFAULTS)
    with pytest.raises(WorkbookError, match="must be a mapping of name: value"):
        split_params({"14_time_to_quality": 4}, DEFAULTS)
    with pytest.raises(WorkbookError, match=r"steps='x' must be a whole number \(default in 14_time_to_quality"):
        split_params({"14_time_to_quality": {"steps": "x"}}, DEFAULTS)
    with pytest.raises(WorkbookError, match="unknown notebook parameter 'lever'"):  # 14's own, not 01's
        split_params({"01_baseline": {"lever": "x"}}, DEFAULTS)


def test_base_config_starts_from_a_config_file_with_the_shortcuts_given_on_top(tmp_path):
    plain = base_config()
    assert (plain.model.preset, plain.steps, plain.data.corpus, plain.warmup, plain.eval_every) == \
        ("nano", 50, ["tinyshakespeare"], 10, 10)
    assert base_config(defaults={"preset": "tiny", "steps": 400}).steps == 400

    mine = _import_nano(tmp_path / "qwen_nano.yaml")
    as_written = base_config(config=mine)  # no shortcut given: the file as it is
    assert (as_written.steps, as_written.model.n_layer, as_written.model.d_model, as_written.model.mlp) == \
        (5000, 4, 128, "swiglu")
    small = base_config("debug", 12, str(tmp_path / "c.txt"), {"seed": 7}, config=mine)
    assert (small.model.preset, small.model.n_layer, small.model.d_model, small.model.seq_len) == ("debug", 1, 64, 32)
    assert (small.model.mlp, small.model.norm, small.model.positions, small.model.n_kv_head, small.model.qkv_bias) == \
        ("swiglu", "rmsnorm", "rope", 1, True)  # the recipe's layout stays
    assert (small.steps, small.eval_every, small.warmup_ratio, small.batch_size, small.seed) == (12, 2, 0.01, 32, 7)
    assert small.data.corpus == [str(tmp_path / "c.txt")]
    with pytest.raises(ConfigError, match="does not exist"):
        base_config(config=tmp_path / "missing.yaml")
    # relative to the notebooks' folder, where they run; a missing one fails before anything runs
    preflight({"config": "qwen_nano.yaml", "steps": 12}, DEFAULTS, notebooks_dir=tmp_path)
    with pytest.raises(WorkbookError, match="invalid config.*does not exist"):
        preflight({"config": "qwen_nano.yaml"}, DEFAULTS, notebooks_dir=tmp_path / "elsewhere")


def test_a_round_that_does_not_apply_says_why_in_one_line(tmp_path):
    cfg = base_config("debug", 12, config=_import_nano(tmp_path / "qwen_nano.yaml"))
    why = {name: round_applies(cfg, name, changes, objective) for name, changes, objective in [
        ("amp", {"amp_level": "O2", "loss_scale": "dynamic"}, "speed"),
        ("recompute", {"recompute": "blocks"}, "speed"),
        ("warmup_40", {"warmup": 40}, "convergence"),
        ("positions_rope", {"model.positions": "rope"}, "time_to_target"),
        ("grad_accumulation", {"batch_size": 16, "grad_accum_steps": 4}, "speed"),
        ("batch_size", {"batch_size": 24}, "time_to_target")]}
    assert why["amp"].startswith("round amp does not apply to this config: amp_dtype=bf16 does not run on CPU")
    assert why["recompute"] == ("round recompute does not apply to this config: recompute='blocks' equals the "
                                "current best; no change requested — pick a different value")
    assert "warmup_ratio=0.01, which replaces warmup" in why["warmup_40"]
    assert "model.positions='rope' equals the current best" in why["positions_rope"]
    assert why["grad_accumulation"] == why["batch_size"] == ""
    no_eval = with_changes(cfg, {"eval_every": 0})
    assert "eval_every=0 (no validation)" in round_applies(no_eval, "batch_size", {"batch_size": 24},
                                                          "time_to_target")
    assert "batch_size=2097152 cannot fit in memory" in round_applies(cfg, "batch_size", {"batch_size": 1 << 21},
                                                                      "time_to_target")
    # model.kernels=auto resolves to a formulation; asking for the one it runs is no round (native needs its library)
    from helpers.run.kernels import library_problem
    if not library_problem():
        assert round_applies(cfg, "kernels_native", {"model.kernels": "native"}) == (
            "round kernels_native does not apply to this config: model.kernels='auto' runs the native kernels here "
            "already")
        assert round_applies(with_changes(cfg, {"model.kernels": "mindspore"}), "kernels_native",
                             {"model.kernels": "native"}) == ""
    assert round_applies(cfg, "kernels_mindspore", {"model.kernels": "mindspore"}) == ""
    assert export_applies(base_config()) == ""
    assert export_applies(cfg).startswith("the from-weights study does not apply to this config: this run's model "
                                          "has no Hugging Face layout")  # q,k,v fused, not LLaMA's separate
    # data parallel: two copies must fit; one copy fitting is not enough
    assert data_parallel_applies(cfg) == ""
    from helpers.run.footprint import need_bytes
    one, two = need_bytes(cfg), need_bytes(with_changes(cfg, {"parallel.data_parallel": 2}))
    assert two > one
    assert data_parallel_applies(cfg, limit=(one + two) // 2).startswith(
        "data parallel (2 processes) does not apply to this config: ")


def test_the_reference_page_lists_every_parameter_of_every_notebook():
    from helpers.docs_pages import notebook_parameters_page
    page = notebook_parameters_page()
    assert page == (REPO / "docs" / "reference" / "notebook-parameters.md").read_text(encoding="utf-8"), \
        "run .venv/bin/python -m helpers.docs_pages --write"
    rows = {line.split("|")[1].strip().strip("`"): line for line in page.splitlines()
            if line.startswith("| `")}
    for stem, params in DEFAULTS.items():
        for name, default in params.items():
            assert name in rows, f"{stem}: {name} is not on the page"
            assert stem in rows[name], f"{name}: {stem} is not named among its notebooks"
    assert set(rows) == {k for p in DEFAULTS.values() for k in p}


def test_every_notebook_parameter_has_a_meaning_comment():
    from helpers.docs_pages import parameter_meanings
    for path in NOTEBOOKS:
        meanings = parameter_meanings(path)
        assert set(meanings) == set(DEFAULTS[path.stem]), path.name
        assert all(meanings.values()), f"{path.name}: a parameter line without a trailing # comment: " \
                                       f"{[k for k, v in meanings.items() if not v]}"


# What a recipe config makes of each notebook's round: the ones that do not apply say why in one line.
NOT_APPLYING = {
    "02_data_pipeline": ("round data_workers does not apply to this config: data.num_parallel_workers=2 equals",
                         "round parallel_workers does not apply to this config: data.num_parallel_workers=2 equals"),
    "04_graph_mode": "round graph_mode does not apply to this config: mode='graph' equals",
    "03_mixed_precision": "round amp does not apply to this config: amp_dtype=bf16 does not run on CPU",
    "07_recompute": "round recompute does not apply to this config: recompute='blocks' equals",
    "12_operator_fusion": "round kernels_native does not apply to this config: model.kernels='auto' runs the native "
                          "kernels here already",
    "13_convergence": "round warmup_40 does not apply to this config: it sets warmup_ratio=0.01",
    "14_time_to_quality": "round positions_rope does not apply to this config: model.positions='rope' equals",
    "15_bring_your_own": "the from-weights study does not apply to this config: this run's model has no Hugging "
                         "Face layout",
}


@pytest.mark.slow
def test_every_notebook_runs_on_an_imported_recipe_config(tmp_path):
    """Every notebook through papermill from (a copy of) notebooks/, as `python -m helpers workbook` runs them, on
    the mcore Qwen2.5 recipe imported for this CPU at --scale nano (`config:` relative to the notebooks' folder), at
    tiny sizes as `tests/conftest.py` runs them: the debug preset on top, 12 steps, two seeds, a short tuner budget;
    per-notebook entries for the tuner's steps. All complete; each round that does not apply prints its reason."""
    from helpers.book.notebooks import run_workbook
    books = tmp_path / "notebooks"
    shutil.copytree(NOTEBOOKS_DIR, books, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    _import_nano(books / "qwen_nano.yaml")
    params = tmp_path / "tiny.yaml"
    params.write_text(yaml.safe_dump({
        "config": "qwen_nano.yaml", "preset": "debug", "steps": 12, "seeds": 2, "autotune_budget_min": 0.15,
        "11_autotune": {"autotune_preset": "debug", "autotune_steps": 10},
        "14_time_to_quality": {"autotune_budget_min": 0.0}}))
    out = tmp_path / "report"
    results = run_workbook(params, out, books, log=print)

    assert {r.name: r.error for r in results if r.status != "ok"} == {}
    assert len(results) == len(NOTEBOOKS)
    texts = {}
    for path in NOTEBOOKS:
        executed = nbformat.read(str(out / path.name), as_version=4)
        if "config" in DEFAULTS[path.stem]:
            assert executed.metadata["papermill"]["parameters"]["config"] == "qwen_nano.yaml", path.name
        texts[path.stem] = "".join(o.get("text", "") for c in executed.cells for o in c.get("outputs", []))
    for stem, lines in NOT_APPLYING.items():
        for line in (lines,) if isinstance(lines, str) else lines:
            assert line in texts[stem], f"{stem} does not say why its round does not apply:\n{texts[stem][-3000:]}"
    from helpers.record import load_run
    baseline = [load_run(p.parent) for p in sorted((out / "workbook" / "baseline").rglob("summary.json"))]
    assert baseline and {(r.config.model.mlp, r.config.model.norm, r.config.model.n_kv_head, r.config.steps)
                         for r in baseline} == {("swiglu", "rmsnorm", 1, 12)}


def test_workbook_config_flag_is_checked_before_anything_runs(tmp_path):
    out = tmp_path / "report"
    proc = run_cli("workbook", "--config", str(tmp_path / "mine.yaml"), "--out", str(out), timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"error: config file {str(tmp_path / 'mine.yaml')!r} does not exist; pass an existing YAML file to --config"]
    (tmp_path / "mine.yaml").write_text("model: {preset: nano, n_head: 3}\n")
    proc = run_cli("workbook", "--config", str(tmp_path / "mine.yaml"), "--out", str(out), timeout=120)
    assert proc.returncode == 2 and "notebook parameters give an invalid config" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not out.exists()
