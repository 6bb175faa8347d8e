"""Shared fixtures: small corpora made here (no corpus text is committed) and a CLI runner."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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
    """--set arguments for a seconds-long run of the tiny preset on `corpus`."""
    sets = [f"data.corpus={corpus}", "model.preset=tiny", "batch_size=8", f"steps={steps}",
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


@pytest.fixture(scope="session")
def notebooks_run(tmp_path_factory):
    """Every notebook executed once as a user opens them: a copy of notebooks/ as the working directory, every
    default as written (relative folders included), only the model preset and step count made small. Returns
    (root, failures): root/notebooks/out_<name>.ipynb are the executed copies, root/workbooks and root/runs what
    the defaults wrote; failures maps a notebook to its last error line. Shared by the tests that read its output."""
    import shutil

    import papermill as pm

    from helpers.book.notebooks import NOTEBOOKS_DIR, discover, notebook_parameters
    root = tmp_path_factory.mktemp("user")
    books = root / "notebooks"
    shutil.copytree(NOTEBOOKS_DIR, books, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    failures = {}
    for path in discover(books):
        declared = notebook_parameters(path)
        params = {k: v for k, v in {"preset": "tiny", "steps": 12}.items() if k in declared}
        try:
            pm.execute_notebook(str(path), str(books / f"out_{path.name}"), parameters=params, cwd=str(books),
                                progress_bar=False, kernel_name="python3")
        except Exception as exc:  # every notebook is tried; all failures are reported together
            failures[path.stem] = str(exc).strip().splitlines()[-1][:300]
    return root, failures


class FakeBar:
    """What the progress code drives of a tqdm bar: its position, postfix and refreshes."""

    def __init__(self):
        self.n, self.postfix, self.refreshed = 0, {}, 0

    def set_postfix(self, refresh=False, **values):
        self.postfix = values

    def refresh(self):
        self.refreshed += 1
