"""Runs forked from the zygote: one zygote serves many runs, is replaced when the environment or the code changes,
passes exit codes and stderr through, and a zygote that cannot start leaves runs to fresh processes."""
from __future__ import annotations

import os
import shutil
import socket
import sys
import time
from pathlib import Path

import pytest

from helpers.spawn import zygote
from helpers.spawn.runner import child_env, launch, stream_child
from helpers.tune.study import base_config

pytestmark = pytest.mark.slow


def _cfg(corpus):
    return base_config("debug", 6, str(corpus), {"steady_after": 2})


def _zygote_pid() -> int:
    return zygote._current.proc.pid


def test_runs_fork_from_one_zygote_until_environment_or_code_changes(tmp_path, small_corpus, monkeypatch):
    monkeypatch.delenv(zygote.SWITCH_ENV, raising=False)
    first = launch(_cfg(small_corpus), tmp_path / "a", progress=False)
    pid = _zygote_pid()
    second = launch(_cfg(small_corpus), tmp_path / "b", progress=False)
    assert first.status == second.status == "ok"
    assert first.summary["process_start"] == second.summary["process_start"] == "forked"
    assert _zygote_pid() == pid, "the second run must come from the same zygote"
    assert second.summary["fixed_cost_s"]["import"] < 0.2  # MindSpore was imported before the fork

    monkeypatch.setenv("WORKBOOK_TEST_MARK", "1")  # a child must see the caller's environment of now
    launch(_cfg(small_corpus), tmp_path / "c", progress=False)
    assert _zygote_pid() != pid
    pid = _zygote_pid()
    monkeypatch.setattr(zygote, "newest_source_mtime", lambda: time.time() + 60)  # code edited after its start
    launch(_cfg(small_corpus), tmp_path / "d", progress=False)
    assert _zygote_pid() != pid


def test_exit_code_and_stderr_of_a_forked_child(tmp_path):
    lines = []
    code = stream_child([sys.executable, "-m", "helpers", "show", str(tmp_path / "missing")], tmp_path / "log",
                        lines.append)
    assert code == 2 and lines == []
    assert (tmp_path / "log").read_text().startswith("error: ")
    assert zygote._current is not None and zygote._current.proc.poll() is None


def test_off_or_failing_zygote_leaves_runs_to_fresh_processes(tmp_path, small_corpus, monkeypatch):
    monkeypatch.setenv(zygote.SWITCH_ENV, "0")
    assert launch(_cfg(small_corpus), tmp_path / "off", progress=False).summary["process_start"] == "fresh"

    monkeypatch.delenv(zygote.SWITCH_ENV)

    def broken(self, env):
        raise zygote.ZygoteError("it could not start")
    monkeypatch.setattr(zygote, "_current", None)
    monkeypatch.setattr(zygote.Zygote, "__init__", broken)
    record = launch(_cfg(small_corpus), tmp_path / "broken", progress=False)
    assert record.status == "ok" and record.summary["process_start"] == "fresh"
    assert "note: started as a fresh process: it could not start" in (tmp_path / "broken" / "train.log").read_text()


def test_a_shared_zygote_serves_every_caller_until_an_import_variable_differs(tmp_path, small_corpus, monkeypatch):
    """`zygote.shared` (make workbook): each kernel connects to the one zygote instead of importing MindSpore into
    its own; a child still gets its caller's PYTHONPATH (a model.build module beside the notebook) and folder; a
    caller whose import-time variables differ gets a zygote of its own."""
    monkeypatch.delenv(zygote.SWITCH_ENV, raising=False)
    monkeypatch.setattr(zygote, "_current", None)
    with zygote.shared(child_env()):
        path = Path(os.environ[zygote.SOCKET_ENV])
        assert path.exists()
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as gone:  # a kernel that connects, then dies
            gone.connect(str(path))                                        # before the zygote is ready
        assert launch(_cfg(small_corpus), tmp_path / "a", progress=False).summary["process_start"] == "forked"
        first = zygote._current
        assert first.proc is None  # connected, not started here
        zygote._current = None  # the next kernel: a process of its own, connecting anew
        first.close()
        shutil.copy(Path(__file__).parent.parent / "user_net.py", tmp_path / "user_net_shared.py")
        monkeypatch.chdir(tmp_path)  # the caller's folder: on its PYTHONPATH, not on the zygote's
        cfg = base_config("debug", 6, str(small_corpus), {"steady_after": 2, "model.build": "user_net_shared:build"})
        record = launch(cfg, tmp_path / "b", progress=False)
        assert record.status == "ok" and record.summary["process_start"] == "forked"
        assert zygote._current.proc is None and zygote._current.pid == first.pid
        monkeypatch.setenv("MS_TEST_MARK", "1")  # read at import: the shared zygote does not fit any more
        launch(_cfg(small_corpus), tmp_path / "c", progress=False)
        assert zygote._current.proc is not None and zygote._current.pid != first.pid
        zygote._current.close()
        zygote._current = None
    assert zygote.SOCKET_ENV not in os.environ and not path.exists()


def test_a_forked_session_child_reports_its_exit_and_dies_with_its_caller(tmp_path, small_corpus, monkeypatch):
    """`start_forked` (a round's arm): started at once, in a session of its own, its exit code over its own
    connection; frozen and left by the process that asked for it, it is killed, not left waiting forever."""
    import signal

    from helpers import config
    from helpers.wire import ArmReady, decode
    monkeypatch.delenv(zygote.SWITCH_ENV, raising=False)
    assert zygote.start_forked(["show", "x"], child_env(), tmp_path / "none.log") is None  # no shared zygote
    with zygote.shared(child_env()):
        shown = zygote.start_forked(["show", str(tmp_path / "missing")], child_env(), tmp_path / "show.log")
        assert shown.wait(timeout=60) == 2 and shown.poll() == 2
        assert (tmp_path / "show.log").read_text().startswith("error: ")
        request = tmp_path / "arm.yaml"
        request.write_text(config.dump(config.absolute_paths(_cfg(small_corpus))))
        (tmp_path / "arm").mkdir()
        with socket.create_server(("127.0.0.1", 0)) as server:
            host, port = server.getsockname()[:2]
            arm = zygote.start_forked(["arm", "--config", str(request), "--out", str(tmp_path / "arm"), "--arm",
                                       "reference", "--connect", f"{host}:{port}", "--extra-steps", "0"],
                                      child_env(), tmp_path / "arm.log")
            server.settimeout(120)
            conn, _ = server.accept()
            with conn, conn.makefile("r", encoding="utf-8") as chan:
                assert isinstance(decode(chan.readline()), ArmReady)
                assert os.getpgid(arm.pid) == arm.pid and arm.poll() is None
                os.killpg(arm.pid, signal.SIGSTOP)  # frozen, as between its steps
                arm.conn.close()  # the process that asked for it went away
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:
                    try:
                        os.kill(arm.pid, 0)
                    except ProcessLookupError:
                        break
                    time.sleep(0.1)
                else:
                    pytest.fail("the frozen arm outlived its caller")
