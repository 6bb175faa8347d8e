"""The processes MindSpore's profiler parses in: from a forkserver, never a fork of the training process."""
from __future__ import annotations

import json
import multiprocessing
import os
import sys
from multiprocessing import forkserver
from pathlib import Path

from helpers.run import parser_processes


def _post_hook(path: str) -> None:
    Path(path).write_text(json.dumps({"ppid": os.getppid()}))


def _flow(path: str) -> None:
    """Shaped like MindSpore's parse: a Process that starts one of its own (a parser's post-hook)."""
    hook = multiprocessing.Process(target=_post_hook, args=(path + ".hook",))
    hook.start()
    hook.join()
    seen = {"pid": os.getpid(), "ppid": os.getppid(), "own": multiprocessing.get_start_method(),
            "preloaded": "mindspore.profiler.analysis.task_manager" in sys.modules}
    Path(path).write_text(json.dumps(seen))


def test_parse_children_come_from_the_forkserver_and_fork_their_own(tmp_path):
    parser_processes.start()
    before = multiprocessing.get_start_method(allow_none=True)
    with parser_processes.unforked():
        flow = multiprocessing.Process(target=_flow, args=(str(tmp_path / "flow"),))
        flow.start()
        flow.join(60)
    assert flow.exitcode == 0 and multiprocessing.get_start_method(allow_none=True) == before
    seen = json.loads((tmp_path / "flow").read_text())
    assert seen["ppid"] == forkserver._forkserver._forkserver_pid != os.getpid()
    assert seen["own"] == "fork" and seen["preloaded"]
    assert json.loads((tmp_path / "flow.hook").read_text())["ppid"] == seen["pid"]
