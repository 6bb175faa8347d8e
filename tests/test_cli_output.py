"""The CLI's output edges: a reader that leaves early (`show run | head`) ends it quietly, and the line refusing an
export of a damaged checkpoint names the export of the newest intact one."""
from __future__ import annotations

import os
import subprocess
import sys

from helpers.run.checkpoints import damaged_line
from tests.conftest import REPO


def test_a_reader_that_leaves_early_ends_show_quietly_with_sigpipes_status():
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, "-m", "helpers", "show", str(REPO / "tests/data/record_7c15080")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO, env=env)
    proc.stdout.close()  # before the child has written a byte: its first flush meets a closed pipe
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141, err
    assert err == "", err


def _checkpoint(folder, step: int, size: int):
    path = folder / "checkpoints" / f"step_{step:06d}.ckpt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\0" * size)
    return path


def test_an_export_of_a_damaged_checkpoint_names_the_export_of_the_newest_intact_one(tmp_path, monkeypatch):
    older, newest = _checkpoint(tmp_path, 10, 8), _checkpoint(tmp_path, 20, 8)
    monkeypatch.setattr("helpers.run.checkpoints.damage", lambda p: "truncated" if p == newest else "")
    monkeypatch.setattr("helpers.run.checkpoints.identity_damage", lambda p, run_dir: "")  # bytes, not a real one
    line = damaged_line(newest, "truncated", tmp_path, export_to="hf/x")
    assert line.endswith(f"export it with: python -m helpers export {older} --out hf/x"), line
    assert "train again" not in line and "\n" not in line
    resume = damaged_line(newest, "truncated", tmp_path)
    assert f"resume {tmp_path} --checkpoint {older} (steps 11–20 train again)" in resume, resume
