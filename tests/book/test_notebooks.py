"""The notebooks through papermill and the headless workbook runner (`python -m helpers workbook`)."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import nbformat
import pytest
import yaml
from nbformat.v4 import new_code_cell, new_notebook

from helpers.book.notebooks import (NOTEBOOKS_DIR, WorkbookError, check_params, discover, kernel_env,
                                  notebook_parameters, preflight, run_workbook)
from helpers.record import load_run
from helpers.spawn import zygote
from tests.conftest import run_cli, snapshot


def load_runs(folder: Path) -> list:
    return [load_run(p.parent) for p in sorted(folder.rglob("summary.json"))]

NOTEBOOKS = discover(NOTEBOOKS_DIR)
# The notebooks on the shared tuning workbook (others, e.g. 10_data_parallel, keep their own runs).
WORKBOOK_NOTEBOOKS = ["01_baseline", "02_data_pipeline", "03_mixed_precision", "04_graph_mode", "05_batch_size",
                      "06_grad_accumulation", "07_recompute", "08_compare", "09_evaluation"]


def test_notebooks_are_clean_and_parameterised(caplog):
    from papermill.translators import PythonTranslator
    shared = {"workbook_dir", "config", "preset", "steps", "repeats", "corpus"}
    types: dict[str, set] = {}
    for path in NOTEBOOKS:
        nb = nbformat.read(str(path), as_version=4)
        nbformat.validate(nb)
        assert all("id" in c for c in nb.cells), f"{path.name} has a cell without an id (nbformat warns on every read)"
        code = [c for c in nb.cells if c.cell_type == "code"]
        assert all(not c.outputs and c.execution_count is None for c in code), f"{path.name} has outputs"
        assert sum("parameters" in c.metadata.get("tags", []) for c in code) == 1, path.name
        caplog.clear()  # papermill reads every line of the parameters cell (a "=" in a comment defeats it)
        PythonTranslator.inspect(next(c for c in code if "parameters" in c.metadata.get("tags", [])))
        assert [r.getMessage() for r in caplog.records if "Unable to parse" in r.getMessage()] == [], path.name
        assert any(c.cell_type == "markdown" for c in nb.cells), f"{path.name} has no narration"
        params = notebook_parameters(path)
        if path.stem in WORKBOOK_NOTEBOOKS:
            assert shared <= set(params), f"{path.name} lacks {shared - set(params)}"
        for key, value in params.items():
            types.setdefault(key, set()).add(type(value))
    assert {k: v for k, v in types.items() if len(v) > 1} == {}, "a parameter has different types across notebooks"


def test_wrong_parameter_type_is_one_line_before_running(tmp_path):
    defaults = {p.stem: notebook_parameters(p) for p in NOTEBOOKS}
    with pytest.raises(WorkbookError) as err:
        check_params({"steps": "fifty"}, defaults)
    assert str(err.value) == ("notebook parameter steps='fifty' must be a whole number "
                              "(default in 01_baseline: steps = 0)")
    with pytest.raises(WorkbookError, match="did you mean 'steps'"):
        check_params({"stpes": 10}, defaults)
    with pytest.raises(WorkbookError, match="must be a list of whole numbers"):
        check_params({"batch_sweep": [4, "x"]}, defaults)
    check_params({"steps": 10, "slow_storage_ms": 3, "batch_sweep": []}, defaults)  # an int is a fine float
    with pytest.raises(WorkbookError, match=r"invalid config: model.preset='huge' is not allowed"):
        preflight({"preset": "huge"}, defaults)
    preflight({"preset": "debug", "steps": 10}, defaults)

    params = tmp_path / "p.yaml"
    params.write_text("steps: fifty\n")
    out = tmp_path / "report"
    proc = run_cli("workbook", "--params", str(params), "--out", str(out), timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: notebook parameter steps='fifty' must be a whole number (default in 01_baseline: steps = 0)"]
    assert not out.exists(), "nothing may run (or be created) before the parameters are checked"


def _notebook(path: Path, *sources: str, params: str = "") -> None:
    cells = []
    if params:
        cells.append(new_code_cell(params, metadata={"tags": ["parameters"]}))
    cells += [new_code_cell(s) for s in sources]
    nb = new_notebook(cells=cells, metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                            "language": "python"}})
    nbformat.write(nb, str(path))


def test_a_failing_notebook_keeps_its_copy_and_the_run_goes_on(tmp_path):
    books = tmp_path / "notebooks"
    books.mkdir()
    _notebook(books / "00_first.ipynb", "print('first ran', x)", params="x = 1")
    _notebook(books / "01_broken.ipynb", "raise ValueError('boom: this notebook fails on purpose')")
    _notebook(books / "02_after.ipynb", "print('failed so far:', failed_notebooks)", params="failed_notebooks = {}")
    params = tmp_path / "p.yaml"
    params.write_text("x: 7\n")
    out = tmp_path / "reports" / "run1"
    results = run_workbook(params, out, books, log=lambda _: None)

    assert [(r.name, r.status) for r in results] == [("00_first", "ok"), ("01_broken", "failed"), ("02_after", "ok")]
    assert results[1].error == "ValueError: boom: this notebook fails on purpose"
    broken = nbformat.read(str(out / "01_broken.ipynb"), as_version=4)
    outputs = [o for c in broken.cells for o in c.get("outputs", [])]
    assert any(o.output_type == "error" and o.ename == "ValueError" for o in outputs)
    assert "papermill-error-cell" in json.dumps(broken.cells[0].metadata) or any(
        "papermill" in json.dumps(c.metadata) for c in broken.cells)
    first = (out / "00_first.ipynb").read_text()
    assert "first ran 7" in first
    after = nbformat.read(str(out / "02_after.ipynb"), as_version=4)
    assert "01_broken" in after.cells[-1].outputs[0].text
    for name in ("00_first", "01_broken", "02_after"):
        assert (out / f"{name}.html").is_file()
    index = (out / "index.html").read_text()
    assert '<tr class="failed"><td>01_broken</td><td>failed</td>' in index
    assert "2 of 3 notebooks ran; 1 failed" in index
    assert "notebook failed: ValueError: boom" in index  # the comparison marks it failed too
    assert (out.parent / "latest").resolve() == out.resolve()


# A kernel started as `run_workbook` starts it (start_kernel), then one started by jupyter_client's defaults (TCP):
# each waits until the kernel answers, runs a cell, and shuts it down; the kernel's own log goes to this child's stderr.
_KERNEL_CHILD = """
import sys
from pathlib import Path
from jupyter_client import BlockingKernelClient, KernelManager
from helpers.book.notebooks import start_kernel, stop_kernel
km = start_kernel("python3", Path(".")) if sys.argv[1] == "workbook" else KernelManager(kernel_name="python3")
if sys.argv[1] != "workbook":
    km.start_kernel()
client = BlockingKernelClient()
client.load_connection_info(km.get_connection_info())
client.start_channels()
client.wait_for_ready(timeout=60)
client.execute_interactive("print('cell ran')", timeout=60)
client.stop_channels()
stop_kernel(km) if sys.argv[1] == "workbook" else km.shutdown_kernel(now=True)
print("transport", km.transport)
"""


def test_workbook_kernels_use_ipc_so_no_tcp_warning_is_printed():
    """`make workbook` printed ipykernel's "Kernel is running over TCP without encryption" once per notebook; its
    kernels now talk over IPC (Unix sockets in a private folder)."""
    import subprocess
    import sys
    from tests.conftest import REPO
    warning = "Kernel is running over TCP without encryption"
    out = {}
    for how in ("workbook", "default"):
        proc = subprocess.run([sys.executable, "-c", _KERNEL_CHILD, how], cwd=REPO, capture_output=True, text=True,
                              timeout=180, env={**os.environ, "PYTHONPATH": str(REPO)})
        assert proc.returncode == 0, proc.stderr[-2000:]
        out[how] = proc.stdout + proc.stderr
    assert "cell ran" in out["workbook"] and "transport ipc" in out["workbook"]
    assert out["workbook"].count(warning) == 0
    assert out["default"].count(warning) == 1 and "transport tcp" in out["default"]  # the check sees the warning


def test_the_next_kernel_gets_its_imports_without_a_thread_in_the_caller(tmp_path):
    """`start_kernel` sends the notebooks' common imports to the kernel that will run the next notebook: a client
    that only sends (a heartbeat thread of it raised "ZMQError: Too many open files" when it was closed at once),
    whose imports have arrived when the notebook runs."""
    import threading
    import time
    from helpers.book.notebooks import close_warm, execute, start_kernel, stop_kernel
    wait = ("import sys, time\nfor _ in range(100):\n    if 'helpers.book.report' in sys.modules: break\n"
            "    time.sleep(0.1)\nprint('warm' if 'helpers.book.report' in sys.modules else 'cold')")
    _notebook(tmp_path / "probe.ipynb", wait)
    before = threading.active_count()
    with kernel_env():
        km = start_kernel("python3", tmp_path)
    try:
        assert km is not None and km.warm_client is not None
        assert threading.active_count() == before
        time.sleep(2)  # the notebook before runs meanwhile
        close_warm(km)
        with kernel_env():
            status, error = execute(tmp_path / "probe.ipynb", tmp_path / "out.ipynb", {}, km=km)
    finally:
        stop_kernel(km)
    assert (status, error) == ("ok", "")
    outputs = [o.get("text", "") for c in nbformat.read(str(tmp_path / "out.ipynb"), as_version=4).cells
               for o in c.get("outputs", [])]
    assert outputs == ["warm\n"]


def test_a_hung_notebook_is_stopped_at_its_timeout_and_the_run_goes_on(tmp_path):
    import time

    import psutil
    books = tmp_path / "notebooks"
    books.mkdir()
    # a cell waiting on a child that never returns, as a hung msrun would
    _notebook(books / "00_hang.ipynb", "print('started')", "import subprocess\nsubprocess.run(['sleep', '613.25'])")
    _notebook(books / "01_after.ipynb", "print('after ran')")
    t0 = time.monotonic()
    results = run_workbook(None, tmp_path / "report", books, log=lambda _: None, timeout_s=8)
    assert time.monotonic() - t0 < 120  # stopped, not waited out (the sleep is 613 s)

    assert [(r.name, r.status) for r in results] == [("00_hang", "failed"), ("01_after", "ok")]
    assert results[0].error == ("NotebookTimeout: the notebook ran past its 8 s limit (--notebook-timeout) while "
                                "running cell 2 (it was stopped and its kernel shut down); the executed copy shows "
                                "the cell")
    hung = nbformat.read(str(tmp_path / "report" / "00_hang.ipynb"), as_version=4)
    assert [o.evalue for o in hung.cells[1].outputs if o.output_type == "error"][-1] == results[0].error
    index = (tmp_path / "report" / "index.html").read_text()
    assert '<tr class="failed"><td>00_hang</td><td>failed</td>' in index and "NotebookTimeout: " in index
    left = [p for p in psutil.process_iter(["cmdline"]) if (p.info["cmdline"] or [])[-1:] == ["613.25"]]
    assert left == [], "the hung cell's child outlived its kernel"
    with pytest.raises(WorkbookError, match="must be a positive number of seconds"):
        run_workbook(None, tmp_path / "r2", books, timeout_s=0)


@pytest.mark.slow
def test_workbook_run_writes_a_report(tmp_path, small_corpus):
    """`python -m helpers workbook`'s machinery (injected workbook folder, HTML, widget state, index) on the
    notebooks that pin and compare; every notebook's own run is in the test below."""
    books = tmp_path / "notebooks"
    books.mkdir()
    mine = [p for p in NOTEBOOKS if p.stem in ("00_environment", "01_baseline", "08_compare")]
    for path in mine:
        shutil.copy(path, books / path.name)
    params = tmp_path / "tiny.yaml"
    params.write_text(yaml.safe_dump({"preset": "debug", "steps": 10, "repeats": 2, "corpus": str(small_corpus),
                                      "aa_check": False}))
    out = tmp_path / "reports" / "stamp"
    results = run_workbook(params, out, books, log=lambda _: None)

    assert {r.name: r.error for r in results if r.status != "ok"} == {}
    assert [r.name for r in results] == [p.stem for p in mine]
    # training children came from the workbook's one zygote, which is gone with the run
    assert {r.summary["process_start"] for r in load_runs(out / "workbook" / "baseline")} == {"forked"}
    assert zygote.SOCKET_ENV not in os.environ
    for path in mine:
        executed = nbformat.read(str(out / path.name), as_version=4)
        errors = [o for c in executed.cells for o in c.get("outputs", []) if o.output_type == "error"]
        assert errors == [], path.name
        # the kernel's warm-up imports were silent: the notebook's own cells are counted from 1
        assert [c.execution_count for c in executed.cells if c.cell_type == "code"][0] == 1, path.name
        if path.stem in WORKBOOK_NOTEBOOKS:
            assert executed.metadata["papermill"]["parameters"]["workbook_dir"] == str(out.resolve() / "workbook")
        assert (out / f"{path.stem}.html").stat().st_size > 10_000
    # Matplotlib figures are in the reports; widget state was kept for the HTML.
    assert "image/png" in (out / "01_baseline.ipynb").read_text()
    assert "widget-state" in json.dumps(nbformat.read(str(out / "01_baseline.ipynb"), as_version=4).metadata)
    index = (out / "index.html").read_text()
    assert "3 of 3 notebooks ran; 0 failed" in index
    assert "throughput" in index and "Rounds" in index
    assert (out.parent / "latest").resolve() == out.resolve()


@pytest.mark.slow
def test_every_notebook_runs_from_its_folder_with_its_own_defaults(notebooks_run):
    """As a user opens them: cwd = the notebooks' folder, every default as written (relative folders included);
    only the model preset, step count and seeds are made small."""
    root, failures = notebooks_run
    assert failures == {}
    # The default folders are relative to the notebooks: the workbook and the DP runs sit next to them.
    assert (root / "workbooks" / "default" / "workbook.json").is_file()
    assert (root / "runs" / "10_data_parallel").is_dir()

    from helpers.tune.rounds import Workbook, load_runs
    from helpers.tune.study import compile_cache_reused
    book = root / "workbooks" / "default"
    wb = Workbook.open(book)
    rounds = wb.rounds()
    # 01 pins MindSpore's defaults (PyNative with no ms.jit, MindSpore's operators, one data worker): 02, 04 and 12
    # put their rounds on that config into the one ledger, beside 03, 05, 06 and 07's
    assert wb.baseline_runs()[0].config.mode == "pynative"
    names = [r.name for r in rounds]
    assert names[:7] == ["data_workers", "amp", "graph_mode", "batch_size", "grad_accumulation", "recompute",
                         "kernels_native"], names
    for r in rounds[:7]:
        assert r.candidate_runs and r.reference_runs, r.name
        if r.objective == "time_to_target":  # a global-batch round: seconds to a loss both arms' seeds reached
            assert r.target is not None and "sqrt rule" in r.verdict.reason, r.name
            continue
        # speed rounds: an interval from pairs, measured paired or in processes
        assert r.verdict.interval and r.verdict.pairs >= 1 and r.verdict.path in ("paired", "processes"), r.name
    assert rounds[3].objective == "time_to_target", "notebook 05 judges the batch round by time to target"
    # 08 measured the baseline against the best side by side whenever a round was kept before it
    compare = (root / "notebooks" / "out_08_compare.ipynb").read_text()
    kept_before = [r for r in rounds[:6] if r.decision == "keep"]
    assert ("cumulative: baseline → best" in compare) == bool(kept_before), compare[-2000:]
    cold, warm = (load_runs([book / "studies" / "compile_cache" / k])[0] for k in ("cold", "warm"))
    assert cold.status == warm.status == "ok"
    assert compile_cache_reused(book / "studies" / "compile_cache", warm), "the warm run compiled again"
    assert warm.summary["loss_last"] < warm.summary["loss_first"], "a warm-cache run must still train"
    profiled = load_runs([book / "studies" / "profiled_baseline"])[0]
    assert (profiled.path / "profile" / "op_table.csv").is_file()
    assert profiled.summary["bottleneck"] in {"data-bound", "compute-bound", "communication-bound", "memory-bound",
                                              "balanced"}
    evaluation = (root / "notebooks" / "out_09_evaluation.ipynb").read_text()
    assert "bottleneck: " in evaluation and "alarm" in evaluation
    demo = Workbook.open(book / "studies" / "data_pipeline")
    # the measured steps' parts (at these sizes the records' own steps all lie in the arms' warm-up)
    parts = demo.rounds()[0].verdict.parts
    assert parts["reference"]["data_wait_share"] > 0.05, f"the slow-storage demo baseline is not data-bound: {parts}"
    assert parts["candidate"]["data_wait_share"] < parts["reference"]["data_wait_share"], parts
    import base64
    from helpers.book.live import LiveCurves, png
    titles = {"03_mixed_precision": "amp", "05_batch_size": "batch size", "06_grad_accumulation":
              "gradient accumulation", "07_recompute": "recompute"}
    for name, title in titles.items():
        # the round's live curves leave their last frame in the executed copy (and so in the HTML report)
        cell = next(c for c in nbformat.read(str(root / "notebooks" / f"out_{name}.ipynb"), as_version=4).cells
                    if "live_curves(" in c.source)
        frames = [base64.b64decode(o["data"]["image/png"]) for o in cell.outputs if "image/png" in o.get("data", {})]
        empty = png(LiveCurves(lambda _: None, f"round: {title}").figure())
        assert len(frames) == 1 and frames[0] != empty, f"{name}: no curves in the round's live plot"


@pytest.mark.slow
def test_time_to_quality_runs_a_speed_record_lever_by_time_to_target_with_its_curve(notebooks_run):
    """14: the lever round (rotary positions by default) is judged by wall seconds to the target, each
    arm's seeds in it, and its validation-loss-against-wall-seconds curve is in the executed copy."""
    from helpers.tune.rounds import Workbook
    root, failures = notebooks_run
    assert "14_time_to_quality" not in failures
    wb = Workbook.open(root / "workbooks" / "default" / "studies" / "time_to_quality")
    lever = next(r for r in wb.rounds() if r.name == "positions_rope")
    assert lever.objective == "time_to_target" and lever.target is not None
    assert {k: list(v) for k, v in lever.changes.items()} == {"model.positions": ["learned", "rope"]}
    assert lever.reference_runs and lever.candidate_runs and lever.decision in ("keep", "reject", "no change")
    cells = nbformat.read(str(root / "notebooks" / "out_14_time_to_quality.ipynb"), as_version=4).cells
    plots = next(c for c in cells if "val_loss_time_plot(" in c.source and "wb.rounds()" in c.source)
    shown = "".join(o.get("text", "") for o in plots.outputs)
    assert "positions_rope" in shown
    assert sum("image/png" in o.get("data", {}) for o in plots.outputs) == \
        sum(r.objective == "time_to_target" for r in wb.rounds())


@pytest.mark.slow
def test_a_notebook_run_twice_into_one_workbook_reuses_its_fixed_folder_run(tmp_path, small_corpus):
    """01_baseline trains its profiled baseline into a fixed study folder. Executed again into the same
    workbook it runs to the end, trains nothing, says what it reused, and the first run's record is untouched.
    (05_batch_size's sweep goes through the same `launch_or_reuse`: tune/test_study.py runs a sweep twice.)"""
    import papermill as pm
    books = tmp_path / "notebooks"
    books.mkdir()
    shutil.copy(NOTEBOOKS_DIR / "01_baseline.ipynb", books)
    book = tmp_path / "workbook"
    params = {"workbook_dir": str(book), "preset": "debug", "steps": 8, "corpus": str(small_corpus)}
    profiled = book / "studies" / "profiled_baseline"

    def execute(k: int) -> str:
        out = books / f"run_{k}.ipynb"
        with kernel_env():  # the kernel imports this checkout's helpers, as `python -m helpers workbook` gives it
            pm.execute_notebook(str(books / "01_baseline.ipynb"), str(out), parameters=params, cwd=str(books),
                                progress_bar=False, kernel_name="python3")
        cells = nbformat.read(str(out), as_version=4).cells
        return "".join(o.get("text", "") for c in cells for o in c.get("outputs", []))

    assert "reused" not in execute(1)
    before = snapshot(book)
    assert f"reused the finished run of this same config in {profiled} (nothing trained" in execute(2)
    assert snapshot(book) == before and not list(book.rglob("*.replaced-*"))


@pytest.mark.slow
def test_bring_your_own_pins_baselines_from_a_recipe_and_from_weights(notebooks_run):
    """15: a baseline of the imported mcore MindFormers recipe at the preset's dims (its AMP O2, recompute, SwiGLU,
    shared k,v heads and q,k,v bias on CPU), and one from 01's baseline exported as Hugging Face GPT-2 weights, which
    starts where that run ended."""
    root, failures = notebooks_run
    assert "15_bring_your_own" not in failures
    book = root / "workbooks" / "default"
    pins = notebook_parameters(NOTEBOOKS_DIR / "15_bring_your_own.ipynb")["study_repeats"]  # one run pins each
    recipe = load_runs(book / "studies" / "imported_recipe" / "baseline")
    assert len(recipe) == pins == 1 and all(r.status == "ok" for r in recipe)
    assert {(r.config.amp_level, r.config.recompute, r.config.model.mlp, r.config.model.norm,
             r.config.model.positions, r.config.model.tie_head, r.config.model.n_kv_head, r.config.model.qkv_bias)
            for r in recipe} == {("O2", "blocks", "swiglu", "rmsnorm", "rope", True, 1, True)}
    source, weights = load_runs(book / "baseline"), load_runs(book / "studies" / "from_weights" / "baseline")
    assert len(weights) == pins and all(r.summary["init_from"]["layout"] == "GPT-2" for r in weights)
    assert (book / "studies" / "hf_weights" / "model.safetensors").is_file()
    assert max(r.summary["loss_first"] for r in weights) < min(r.summary["loss_first"] for r in source) - 0.3
