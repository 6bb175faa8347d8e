"""One msrun worker (helpers/spawn/dp_worker.py): where each rank keeps its record, which Trainer a rank gets (it
joins the process group, or in a paired process sets its arm's fusion), and the rank file it leaves for the merge.
The worker's processes are msrun's: a whole 2-rank run is tests/spawn/test_parallel.py, a paired launch
tests/spawn/test_paired.py."""
from __future__ import annotations

from pathlib import Path

from helpers.run.data import DataGate
from helpers.run.train import Phase, Turns
from helpers.spawn.dp_worker import (join_process_group, profiled_comm, rank_dir, rank_trainer, set_fusion,
                                     write_rank_file)
from helpers.tune.study import base_config
from helpers.wire import RankFile, decode_rank_file, rank_file


def _dp(corpus):
    return base_config("debug", 8, str(corpus), {"batch_size": 8, "parallel.data_parallel": 2})


def test_rank_zero_writes_the_runs_folder_the_others_their_own(tmp_path):
    assert rank_dir(tmp_path, 0) == tmp_path
    assert rank_dir(tmp_path, 1) == tmp_path / "ranks" / "rank_1"


def test_a_rank_joins_the_group_alone_and_only_sets_its_fusion_in_a_shared_process(tmp_path, small_corpus):
    alone = rank_trainer(_dp(small_corpus), tmp_path / "run", 1)
    assert alone.run_dir == tmp_path / "run" / "ranks" / "rank_1" and alone.phase is Phase.BUILT
    assert (alone.rank.index, alone.rank.join) == (1, join_process_group)
    shared = rank_trainer(_dp(small_corpus), tmp_path / "arm", 0, turns=Turns(DataGate(), 6, shares_process=True))
    assert shared.run_dir == tmp_path / "arm" and shared.rank.join is set_fusion
    assert shared.turns.extra_steps == 6


def test_the_rank_file_is_what_the_merge_reads(tmp_path):
    rank = RankFile(1, 2, "ok", 1, 9.5, 2 ** 29, [RankFile.row({"step": 1, "step_time_ms": 80.0, "data_wait_ms": 0.5,
                                                                "loss": 4.0, "grad_norm": 1.5, "lr": 1e-3})], None)
    write_rank_file(tmp_path, rank)
    assert decode_rank_file(rank_file(tmp_path, 1).read_text()) == rank


def test_no_profiler_window_no_collective_time(tmp_path, small_corpus):
    cfg = _dp(small_corpus)
    assert cfg.monitor.profile_steps == 0 and profiled_comm(tmp_path, cfg) is None
    profiled = base_config("debug", 30, str(small_corpus), {"monitor.profile_steps": 4})
    assert profiled_comm(tmp_path, profiled) is None  # a window that never closed left no profile to read


# As msrun starts them: a scheduler and two workers (each a process whose command line names dp_worker.py), all
# children of one launcher; the launcher prints how the scheduler ended and when, after the last worker exited.
_LAUNCHER = """
import subprocess, sys, time
SCHED = ("import sys, time; from helpers.spawn.dp_worker import serve_cluster; "
         "sys.exit(serve_cluster(2, serve=lambda: {serve}))")
sched = subprocess.Popen([sys.executable, "-c", SCHED])
def forked():
    try:
        return open("/proc/%d/task/%d/children" % (sched.pid, sched.pid)).read().split()
    except OSError:  # it has ended
        return True
deadline = time.monotonic() + 60
while sched.poll() is None and not forked() and time.monotonic() < deadline:
    time.sleep(0.05)  # its imports (a loaded machine: seconds) done, it forked its server and watches
workers = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(2.0)", "dp_worker.py"]) for _ in range(2)]
codes = [w.wait() for w in workers]
gone = time.monotonic()
print(sched.wait(timeout=60), round(time.monotonic() - gone, 2), codes)
"""


def _launch(serve: str) -> tuple[int, float]:
    import subprocess
    import sys

    from tests.conftest import REPO
    out = subprocess.run([sys.executable, "-c", _LAUNCHER.replace("{serve}", serve)], capture_output=True, text=True,
                         timeout=90, cwd=REPO, check=True).stdout.split()
    return int(out[0]), float(out[1])


def test_the_scheduler_ends_as_soon_as_its_workers_have_exited():
    # MindSpore's scheduler waits up to 5 s more (here: for ever, a sleep of a minute)
    code, after_s = _launch("time.sleep(60)")
    assert code == 0 and after_s < 2.0, (code, after_s)


def test_a_scheduler_that_ends_first_passes_its_exit_code_on():
    code, after_s = _launch("sys.exit(3)")  # fails at once, before the workers end
    assert code == 1  # the serving child failed: msrun reads a failed scheduler
    code, _ = _launch("None")  # served and returned (MindSpore's init exits the process itself)
    assert code == 0


def test_the_cluster_server_dies_with_the_scheduler_msrun_kills():
    """msrun kills its scheduler on Ctrl+C; the child serving the cluster (and holding its port) goes with it."""
    import os
    import signal
    import subprocess
    import sys

    from tests.conftest import REPO, wait_for
    sched = subprocess.Popen([sys.executable, "-c", "import time; from helpers.spawn.dp_worker import serve_cluster; "
                                                    "serve_cluster(2, serve=lambda: time.sleep(60))"], cwd=REPO)
    children = Path(f"/proc/{sched.pid}/task/{sched.pid}/children")
    assert wait_for(lambda: children.read_text().split(), 30)
    server = int(children.read_text().split()[0])
    os.kill(sched.pid, signal.SIGKILL)
    sched.wait()
    assert wait_for(lambda: not Path(f"/proc/{server}").exists() or
                    Path(f"/proc/{server}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z", 5), \
        "the serving child outlived its scheduler"
