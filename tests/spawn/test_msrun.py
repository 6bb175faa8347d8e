"""msrun's launch (helpers/spawn/msrun.py): the port, the exact command, its environment, and following rank 0's log
while a real process writes it. A whole data-parallel run is tests/spawn/test_parallel.py."""
from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest

from helpers.config import ConfigError
from helpers.spawn.msrun import (LOCAL_RETRY_S, LOG_DIR, _LogFollower, _msrun_env, _relay, check_port, follow_msrun,
                                 free_port, msrun_command)
from helpers.wire import StepRow, encode_row
from tests.conftest import run_cli, tiny_args


def test_port_in_use_is_refused_and_free_port_is_bindable():
    with socket.socket() as busy:
        busy.bind(("", 0))
        busy.listen()
        with pytest.raises(ConfigError, match="already in use"):
            check_port(busy.getsockname()[1])
    with pytest.raises(ConfigError, match="1024-65535"):
        check_port(80)
    check_port(free_port())


def test_pinned_busy_port_fails_before_launching(tmp_path, small_corpus):
    with socket.socket() as busy:
        busy.bind(("", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = run_cli("train", *tiny_args(small_corpus, 10, "parallel.data_parallel=2",
                                           f"parallel.master_port={port}"), "--out", str(tmp_path / "r"))
    assert proc.returncode == 2
    assert f"parallel.master_port={port} is already in use" in proc.stderr
    assert not (tmp_path / "r" / "msrun_logs").exists()


def test_msrun_command_for_two_nodes():
    cmd = msrun_command("c.yaml", "runs/x", 8, 8118, nodes=2, node_rank=1, master_addr="10.0.0.1")
    assert cmd[:7] == ["msrun", "--worker_num=16", "--local_worker_num=8", "--master_addr=10.0.0.1",
                       "--master_port=8118", "--node_rank=1", "--log_dir=runs/x/msrun_logs"]
    assert cmd[7:] == ["--join=True", "helpers/spawn/dp_worker.py", "--config", "c.yaml", "--out", "runs/x"]
    paired = msrun_command(None, "r", 2, 9000, worker_args=["--pair", "r/.pair_request.json"])
    assert paired[-3:] == ["helpers/spawn/dp_worker.py", "--pair", "r/.pair_request.json"]


def test_local_msrun_gets_short_cluster_retries_unless_the_caller_set_them(monkeypatch):
    for key in LOCAL_RETRY_S:
        monkeypatch.delenv(key, raising=False)
    env = _msrun_env()
    assert {k: env[k] for k in LOCAL_RETRY_S} == {"MS_RETRY_INTERVAL_LOWER": "0", "MS_RETRY_INTERVAL_UPPER": "1"}
    assert env["PATH"].split(":")[0] == str(Path(sys.executable).parent)  # the `python` msrun starts
    monkeypatch.setenv("MS_RETRY_INTERVAL_UPPER", "5")
    assert _msrun_env()["MS_RETRY_INTERVAL_UPPER"] == "5"


def test_the_log_follower_hands_over_whole_lines_only(tmp_path):
    log = tmp_path / "worker_0.log"
    follow = _LogFollower(log)
    assert follow.lines() == []  # no log yet
    log.write_text("first\nsec")
    assert follow.lines() == ["first"]
    with open(log, "a") as fh:
        fh.write("ond\nthird\n")
    assert follow.lines() == ["second", "third"] and follow.lines() == []


def test_rank_zeros_step_rows_reach_the_progress_sink_as_rows():
    got = []
    _relay(["[WARNING] a MindSpore log line", encode_row(StepRow(3, 2.5, 900.0, 11.0)), "{not json"],
           lambda row, total: got.append((row, total)), 12)
    assert got == [({"step": 3, "loss": 2.5, "tokens_per_s": 900.0, "step_time_ms": 11.0}, 12)]
    _relay([encode_row(StepRow(4, 2.4, 910.0, 10.0))], None, 12)  # no sink: nothing to do, nothing raised


def test_following_a_real_process_that_writes_rank_zeros_log(tmp_path):
    """follow_msrun runs its command in a process of its own and hands over the log's lines as they are written,
    the last ones after the process exits; its exit code comes back."""
    script = ("import pathlib, sys, time\n"
              f"log = pathlib.Path({str(tmp_path / LOG_DIR / 'worker_0.log')!r})\n"
              "log.parent.mkdir(parents=True)\n"
              "with open(log, 'w') as fh:\n"
              "    fh.write('step one\\n'); fh.flush(); time.sleep(1.2)\n"
              "    fh.write('step two\\nunfinished')\n"
              "print('to msrun.log'); sys.exit(3)\n")
    batches = []
    code = follow_msrun([sys.executable, "-c", script], tmp_path, lambda lines: batches.append(list(lines)))
    assert code == 3
    assert [line for batch in batches for line in batch] == ["step one", "step two"]
    assert ["step one"] in batches  # handed over while the process still ran (before "step two" was written)
    assert "to msrun.log" in (tmp_path / "msrun.log").read_text()
