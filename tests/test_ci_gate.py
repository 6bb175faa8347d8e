"""CI cannot be green while the tests that need chromium, root or npm skip: under CI=true their skip fails the run."""
from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import CI_REQUIRED, REPO


def _pytest(args: list[str], ci: str | None, cwd) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PYTHONPATH"] = str(REPO)
    if ci is not None:
        env["CI"] = ci
    # outside the repository the suite's conftest comes in as a plugin; inside it pytest finds it itself
    plugin = ["-p", "tests.conftest"] if cwd != REPO else []
    return subprocess.run([sys.executable, "-m", "pytest", "-q", *plugin, "-p", "no:cacheprovider",
                           *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_a_required_skip_fails_under_ci_and_only_there(tmp_path):
    (tmp_path / "test_needs.py").write_text(
        "import pytest\n\n"
        f"@pytest.mark.{CI_REQUIRED}\n"
        "@pytest.mark.skipif(True, reason='no chromium here')\n"
        "def test_browser():\n    pass\n\n"
        f"@pytest.mark.{CI_REQUIRED}\n"
        "def test_root():\n    pytest.skip('cannot mount a tmpfs; needs root')\n\n"
        "def test_optional():\n    pytest.skip('an ordinary skip stays a skip')\n")
    local = _pytest(["test_needs.py"], None, tmp_path)
    assert local.returncode == 0 and "3 skipped" in local.stdout, local.stdout
    ci = _pytest(["test_needs.py"], "true", tmp_path)
    assert ci.returncode == 1, ci.stdout
    # a skip in setup (skipif) reports as an error, one in the test body as a failure: both fail the run
    assert "1 failed, 1 skipped, 1 error" in ci.stdout, ci.stdout
    assert f"skipped in CI, where it must run ({CI_REQUIRED}): no chromium here" in ci.stdout
    assert f"skipped in CI, where it must run ({CI_REQUIRED}): cannot mount a tmpfs; needs root" in ci.stdout


def test_the_browser_and_disk_fault_tests_are_required_in_ci():
    proc = _pytest(["--collect-only", "-m", CI_REQUIRED, "tests/book/test_browser.py", "tests/test_faults.py"],
                   None, REPO)
    ids = {line.split("[")[0] for line in proc.stdout.splitlines() if "::" in line}
    assert {"tests/test_faults.py::test_full_disk_is_one_line_and_keeps_the_record_whole",
            "tests/test_faults.py::test_read_only_output_folder_is_one_line_before_training"} <= ids, proc.stdout
    assert sum(i.startswith("tests/book/test_browser.py::") for i in ids) >= 2, proc.stdout


def test_ci_script_exports_ci():
    script = (REPO / ".ci" / "run").read_text()
    assert "export CI=true" in script and script.index("export CI=true") < script.index("make test")
