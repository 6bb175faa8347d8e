"""Shared fixtures: small corpora made here (no corpus text is committed) and a CLI runner."""
from __future__ import annotations

import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

REPO = Path(__file__).resolve().parent.parent
WORDS = ("the king shall speak and all the lords of england hear him now while "
         "fair lady anne walks in the garden where roses bloom by the river").split()


def make_text(n_words: int, seed: int = 0) -> str:
    """Deterministic pseudo-English text with line breaks (learnable, not random)."""
    import random
    rng = random.Random(seed)
    lines, line = [], []
    for i in range(n_words):
        line.append(WORDS[(i * 7 + rng.randrange(3)) % len(WORDS)])
        if len(line) == 9:
            lines.append(" ".join(line).capitalize() + ".")
            line = []
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="session")
def small_corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "small.txt"
    path.write_text(make_text(20000), encoding="utf-8")
    return path


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under `folder`, by path relative to it → its bytes (to show a record was not touched)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def wait_for(predicate, timeout_s: float, poll_s: float = 0.1) -> bool:
    """Poll `predicate` until it is truthy or `timeout_s` seconds pass; returns whether it became true."""
    import time
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(poll_s)
    return False


def run_cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """`python -m helpers ARGS` in a fresh process (MindSpore's context is per process)."""
    env = dict(os.environ, GLOG_v="3",
               PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p))
    return subprocess.run([sys.executable, "-m", "helpers", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, env=env)


def tiny_args(corpus: Path, steps: int = 30, *extra: str) -> list[str]:
    """--set arguments for a seconds-long run of the debug preset (tiny with one block) on `corpus`."""
    sets = [f"data.corpus={corpus}", "model.preset=debug", "batch_size=8", f"steps={steps}",
            "warmup=5", "eval_every=0", "eval_batches=2", "steady_after=3", *extra]
    return [a for s in sets for a in ("--set", s)]


# ------------------------------------------------------------------------------------ CI: skips that must fail

CI_REQUIRED = "ci_required"


def _ci() -> bool:
    """Whether this run is CI's (`.ci/run` exports CI=true, as CI services do)."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def pytest_configure(config):
    config.addinivalue_line("markers", f"{CI_REQUIRED}: must run in CI; a skip there (no chromium, no root, no npm) "
                                       f"fails the run instead of passing green")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Under CI, a skip of a test marked ci_required becomes a failure that says why it skipped."""
    outcome = yield
    report = outcome.get_result()
    if report.skipped and _ci() and item.get_closest_marker(CI_REQUIRED) is not None:
        reason = report.longrepr[-1] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        reason = reason.removeprefix("Skipped: ")
        report.outcome = "failed"
        report.longrepr = f"skipped in CI, where it must run ({CI_REQUIRED}): {reason}"


def mindspore_on_cpu(mode: str = "graph") -> None:
    """MindSpore in this test process on the CPU, in graph mode or "pynative" (another in-process test in this
    worker may have set it up already: `use_device`)."""
    import mindspore as ms
    from helpers.run.train import use_device
    use_device("CPU")
    ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE)


def shared_dir(tmp_path_factory) -> Path:
    """A folder every pytest-xdist worker of this session sees (the base temp folder without xdist)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


# The notebooks in two parts that share no folder, so two pytest-xdist workers can run them at once: 10 keeps its
# own runs (../runs/10_data_parallel); every other notebook works on the default workbook, in order.
NOTEBOOK_PARTS = {"workbook": lambda stem: stem != "10_data_parallel",
                  "data_parallel": lambda stem: stem == "10_data_parallel"}


@pytest.fixture(scope="session")
def notebooks_run(tmp_path_factory):
    """Every notebook executed once as a user opens them: a copy of notebooks/ as the working directory, every
    default as written (relative folders included), only the model preset, step count and seeds made small. Returns
    (root, failures): root/notebooks/out_<name>.ipynb are the executed copies, root/workbooks and root/runs what
    the defaults wrote; failures maps a notebook to its last error line. Shared by the tests that read its output,
    across pytest-xdist workers too (`_notebooks_part`)."""
    root, failures = None, {}
    for part in NOTEBOOK_PARTS:
        root, failed = _notebooks_part(tmp_path_factory, part)
        failures.update(failed)
    return root, failures


@pytest.fixture(scope="session")
def data_parallel_notebook(tmp_path_factory):
    """(root, failures) as `notebooks_run`, of notebook 10 alone."""
    return _notebooks_part(tmp_path_factory, "data_parallel")


def _notebooks_part(tmp_path_factory, part: str) -> tuple[Path, dict[str, str]]:
    """Run the notebooks of NOTEBOOK_PARTS[part] once per test session: the first worker to ask runs them
    (minutes), another that asks meanwhile waits on the lock, then reads what it wrote."""
    import json
    import shutil

    from helpers.book.notebooks import NOTEBOOKS_DIR
    shared = shared_dir(tmp_path_factory)
    root, done = shared / "notebooks_run", shared / f"notebooks_{part}.json"
    with _locked(shared / f"notebooks_{part}.lock"):
        if not done.is_file():
            with _locked(shared / "notebooks_copy.lock"):
                if not (root / "notebooks").is_dir():
                    shutil.copytree(NOTEBOOKS_DIR, root / "notebooks",
                                    ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
            done.write_text(json.dumps(_run_notebooks(root / "notebooks", NOTEBOOK_PARTS[part])))
    return root, json.loads(done.read_text())


@contextmanager
def small_tmpfs(folder: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` (mount's notation: 1m, 1500k) mounted at `folder` (made here) for the with-block, then
    unmounted; a skip where mount is refused (it needs root: CI runs as root, and its tests are ci_required)."""
    folder.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True,
                          text=True)
    if proc.returncode:
        pytest.skip(f"cannot mount a small tmpfs to fill ({proc.stderr.strip() or 'mount failed'}); needs root")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def stderr_lines(stderr: str) -> list[str]:
    """A command's stderr without blank lines and MindSpore's [WARNING] lines: what a user reads."""
    return [line for line in stderr.splitlines() if line.strip() and not line.lstrip().startswith("[WARNING]")]


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on `path` (created) against the other pytest-xdist workers."""
    import fcntl
    with open(path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _run_notebooks(books: Path, wanted) -> dict[str, str]:
    """Execute the notebooks in `books` whose stem `wanted` accepts, in order, as `run_workbook` does (one shared
    zygote, the next kernel started while a notebook runs); {stem: error line}."""
    from helpers.book.notebooks import (close_warm, discover, execute, kernel_env, notebook_parameters,
                                        start_kernel, stop_kernel)
    from helpers.spawn import zygote
    from helpers.spawn.runner import child_env
    paths = [p for p in discover(books) if wanted(p.stem)]
    failures, ready = {}, None
    with zygote.shared(child_env()):
        try:
            ready = start_kernel("python3", books) if paths else None
            for i, path in enumerate(paths):
                declared = notebook_parameters(path)
                # tiny sizes: the one-block preset, seeds too (notebook 14 trains 3 a round by default, ~20 s more
                # here for no new check), and a tuner's budget (notebook 11 spends all of its 24 s default; its
                # rounds are tests/tune/test_autotune.py's; 14's default 0 runs no tuner and stays 0)
                small = {"preset": "debug", "autotune_preset": "debug", "steps": 12, "seeds": 2,
                         "autotune_budget_min": min(0.15, declared.get("autotune_budget_min", 0.0))}
                params = {k: v for k, v in small.items() if k in declared}
                km, ready = ready, (start_kernel("python3", books) if i + 1 < len(paths) else None)
                close_warm(km)
                with kernel_env():
                    status, error = execute(path, books / f"out_{path.name}", params, km=km)
                if status != "ok":  # every notebook is tried; all failures are reported together
                    failures[path.stem] = error[:300]
        finally:
            stop_kernel(ready)
    return failures


class FakeBar:
    """What the progress code drives of a tqdm bar: its position, postfix and refreshes."""

    def __init__(self):
        self.n, self.postfix, self.refreshed = 0, {}, 0

    def set_postfix(self, refresh=False, **values):
        self.postfix = values

    def refresh(self):
        self.refreshed += 1
