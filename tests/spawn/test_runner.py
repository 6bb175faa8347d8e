"""Starting a run in a process of its own (helpers/spawn/runner.py): the child's rows reach the bar and the live
listeners, its record comes back, a finished run of the same config is reused, a child's exit code and stderr pass
through, and a config that cannot run is refused before any process starts."""
from __future__ import annotations

import os
import sys

import pytest

from helpers.config import ConfigError, with_changes
from helpers.spawn import zygote
from helpers.spawn.live import listen
from helpers.spawn.runner import child_env, launch, launch_or_reuse, show_row, stream_child
from helpers.tune.study import base_config
from helpers.wire import StepRow, encode_row
from tests.conftest import REPO, FakeBar


def _tiny(corpus, steps: int = 6):
    return base_config("debug", steps, str(corpus), {"steady_after": 2, "eval_every": 0, "eval_batches": 2,
                                                    "threads": 1})


def test_a_step_row_moves_the_bar_and_reaches_the_listeners_other_lines_do_not():
    bar, heard = FakeBar(), []
    with listen(lambda label, row: heard.append((label, row))):
        show_row(bar, "run x", "a line of the child's own output")
        show_row(bar, "run x", encode_row(StepRow(4, 2.25, 1234.0, 9.5)))
    assert heard == [("run x", {"step": 4, "loss": 2.25, "tokens_per_s": 1234.0, "step_time_ms": 9.5})]
    assert (bar.n, bar.postfix, bar.refreshed) == (4, {"loss": "2.250", "tok_s": "1234"}, 1)


def test_a_child_gets_the_repository_first_and_the_callers_folder_last(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", "/somewhere/else")
    monkeypatch.delenv("GLOG_v", raising=False)
    env = child_env()
    assert env["PYTHONPATH"].split(os.pathsep) == [str(REPO), "/somewhere/else", os.getcwd()]
    assert env["GLOG_v"] == "3"


def test_a_plain_child_streams_its_stdout_and_logs_its_stderr(tmp_path):
    """A command other than `python -m helpers` runs as a plain process: each stdout line to the callback, stderr
    appended to the log, its exit code back."""
    lines = []
    code = stream_child([sys.executable, "-c", "import sys; print('one'); print('two'); "
                                               "sys.stderr.write('oops\\n'); sys.exit(4)"],
                        tmp_path / "train.log", lines.append)
    assert code == 4 and [line.strip() for line in lines] == ["one", "two"]
    assert (tmp_path / "train.log").read_text() == "oops\n"


def test_a_config_that_cannot_run_is_refused_before_any_process(tmp_path, small_corpus):
    cfg = with_changes(_tiny(small_corpus), {"resume_from": str(tmp_path / "gone")})
    with pytest.raises(ConfigError, match="resume_from=.*gone' does not exist"):
        launch(cfg, tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()  # refused before the run folder, let alone a process


@pytest.mark.slow
def test_launch_trains_in_a_child_and_its_rows_reach_the_listeners(tmp_path, small_corpus, monkeypatch):
    monkeypatch.setenv(zygote.SWITCH_ENV, "0")  # a fresh interpreter (the zygote's forks: test_zygote.py)
    heard = []
    with listen(lambda label, row: heard.append((label, row["step"]))):
        record = launch(_tiny(small_corpus), tmp_path / "run", progress=False, desc="round 1 x candidate 1/2")
    assert record.status == "ok" and record.path == tmp_path / "run"
    assert record.summary["process_start"] == "fresh"  # its own process, not this one
    assert heard == [("round 1 x candidate 1/2", step) for step in range(1, 7)]
    assert not list((tmp_path / "run").glob(".request.*"))  # the request file is removed
    assert (tmp_path / "run" / "train.log").is_file()


@pytest.mark.slow
def test_a_finished_run_of_the_same_config_is_reused_and_another_moved_aside(tmp_path, small_corpus, capsys,
                                                                             monkeypatch):
    monkeypatch.setenv(zygote.SWITCH_ENV, "0")
    cfg = _tiny(small_corpus, steps=4)
    first = launch_or_reuse(cfg, tmp_path / "run", progress=False)
    again = launch_or_reuse(cfg, tmp_path / "run", progress=False)
    assert "reused the finished run of this same config" in capsys.readouterr().out
    assert again.summary["finished_at"] == first.summary["finished_at"]  # nothing trained
    other = launch_or_reuse(with_changes(cfg, {"steps": 5, "warmup": 1}), tmp_path / "run", progress=False)
    assert "moved the earlier run" in capsys.readouterr().out and len(other.metrics) == 5
    (aside,) = tmp_path.glob("run.replaced-*")
    assert len(launch_or_reuse(cfg, aside, progress=False).metrics) == 4  # the earlier record, whole
