"""Every path a user hands the API or the CLI means what it means in the user's working directory.

The training child runs with the repository as its working directory; before the fix a relative workbook
folder was resolved once by the caller and once by the child, so runs landed elsewhere and the baseline read
"run_1 left no record".
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from helpers.config import absolute_paths, from_dict
from helpers.paths import REPO_ROOT, absolute
from helpers.record import load_run
from tests.conftest import make_text


def test_relative_paths_are_made_absolute_against_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.txt").write_text("hello\n")
    assert absolute("wb") == tmp_path / "wb" and absolute("/x/y") == absolute("/x/y", "/elsewhere")
    cfg = absolute_paths(from_dict({"data": {"corpus": ["mine.txt", "tinyshakespeare"]},
                                    "compile_cache_path": "cache"}))
    assert cfg.data.corpus == [str(tmp_path / "mine.txt"), "tinyshakespeare"]  # a registry name stays a name
    assert cfg.compile_cache_path == str(tmp_path / "cache")


@pytest.mark.slow
def test_workbook_in_a_relative_folder_from_another_directory(tmp_path, monkeypatch):
    """The issue's own reproduction: Workbook.create('wb', base_config(preset, …)) then wb.baseline()."""
    from helpers import Workbook, base_config
    user = tmp_path / "user"
    user.mkdir()
    (user / "small.txt").write_text(make_text(20000), encoding="utf-8")
    monkeypatch.chdir(user)
    wb = Workbook.create("wb", base_config("debug", 12, corpus="small.txt"))
    records = wb.baseline(progress=False)
    assert [r.status for r in records] == ["ok", "ok"]
    assert all(r.path.parent == user / "wb" / "baseline" for r in records)
    assert not (REPO_ROOT / "wb").exists(), "runs must not land in the repository"
    assert records[0].config.data.corpus == [str(user / "small.txt")]
    monkeypatch.chdir(tmp_path)  # reopened from elsewhere by its absolute path, it reads the same runs
    assert [r.path for r in Workbook.open(user / "wb").baseline_runs()] == [r.path for r in records]


@pytest.mark.slow
def test_cli_train_with_relative_out_and_corpus(tmp_path):
    (tmp_path / "small.txt").write_text(make_text(20000), encoding="utf-8")
    env = dict(os.environ, GLOG_v="3", PYTHONPATH=str(REPO_ROOT))
    sets = ["data.corpus=small.txt", "model.preset=debug", "batch_size=4", "steps=8", "warmup=2", "eval_every=0",
            "eval_batches=2", "steady_after=3"]
    proc = subprocess.run([sys.executable, "-m", "helpers", "train", *[a for s in sets for a in ("--set", s)],
                           "--out", "runs/x", "--progress", "none"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    record = load_run(tmp_path / "runs" / "x")
    assert record.status == "ok" and record.config.data.corpus == [str(tmp_path / "small.txt")]


def test_the_corpus_and_compile_caches_follow_workbook_data_cache(tmp_path, monkeypatch):
    from helpers.run.corpus import default_cache_dir
    from helpers.run.startup import compile_cache_dir
    monkeypatch.setenv("WORKBOOK_DATA_CACHE", str(tmp_path / "cache"))
    assert default_cache_dir() == tmp_path / "cache"
    assert compile_cache_dir(from_dict({})).parent == tmp_path / "cache" / "compile"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WORKBOOK_DATA_CACHE", "rel")  # relative to the caller's folder, not the repository's
    assert compile_cache_dir(from_dict({})).parent == tmp_path / "rel" / "compile"
