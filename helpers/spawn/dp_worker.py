"""One msrun worker of a data-parallel run: joins the process group, sets DATA_PARALLEL and the all-reduce
fusion knobs, then runs the same Trainer on its shard of every global batch.

Started by `helpers.spawn.msrun` as `msrun ... helpers/spawn/dp_worker.py --config C --out RUN`. Rank 0 writes the run
record and prints progress JSON lines (into its msrun log); rank K > 0 keeps its own record in
RUN/ranks/rank_K/ without checkpoints. Every rank writes RUN/ranks/rank_K.json (its step times, losses,
peak RSS, profiled collective time) for `rankmerge` to merge after msrun returns.

With `--pair REQUEST` (a paired round on a data-parallel best, `helpers.spawn.paired`) every rank runs both arms
in ABBA blocks (helpers/run/pair.py), each arm a rank's Trainer whose step graph is compiled under its own all-reduce
fusion setting; the ranks write FOLDER/paired_rank_K.json and each arm's FOLDER/<arm>/ranks/rank_K.json. Each
arm's all-reduces are profiled (parallel.comm_profile_steps) in its own warm-up, while the other arm waits.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path
from typing import Callable

from helpers.config import Config, comm_profiled, load_config
from helpers.run.lifeline import die_with_parent
from helpers.run.metrics import peak_rss_bytes
from helpers.run.profile import comm_per_step, load_profile
from helpers.record import RecordError, atomic_write_text
from helpers.run.rows import fan_out, progress_sink
from helpers.run.train import Rank, Trainer, Turns
from helpers.wire import RANKS_DIR, RankFile, decode_pair_request, encode_rank_file, paired_rank_file, rank_file


def join_process_group(cfg: Config) -> None:
    """init() the collective backend (after the device is set), then DATA_PARALLEL with the configured fusion."""
    from mindspore.communication import init
    init()
    set_fusion(cfg)


def set_fusion(cfg: Config) -> None:
    """DATA_PARALLEL with `cfg`'s all-reduce fusion. MindSpore reads it when a step graph is built and compiled
    (the split indices when its gradient reducer is made, the bucket size in the graph's fusion pass), so two
    arms of one process each get their own when this runs before each one's build."""
    import mindspore as ms
    from mindspore.communication import get_group_size
    p = cfg.parallel
    ms.reset_auto_parallel_context()  # an earlier arm's fusion must not carry over to this one
    knobs = {"parallel_mode": ms.ParallelMode.DATA_PARALLEL, "gradients_mean": p.gradients_mean,
             "device_num": get_group_size()}
    if p.comm_fusion == "size":
        knobs["comm_fusion"] = {"allreduce": {"mode": "size", "config": p.fusion_size_mb}}
    elif p.comm_fusion == "index":
        knobs["all_reduce_fusion_config"] = list(p.fusion_indices)
    ms.set_auto_parallel_context(**knobs)


def rank_dir(run_dir: Path, rank: int) -> Path:
    """Where rank `rank` keeps its record: the run's own folder for rank 0, RUN/ranks/rank_K for the others."""
    return run_dir if rank == 0 else run_dir / RANKS_DIR / f"rank_{rank}"


def rank_trainer(cfg: Config, run_dir: Path, rank: int, progress=None, turns: Turns | None = None) -> Trainer:
    """The Trainer of rank `rank`: it reads its shard of every global batch, only rank 0 writes the record's folder
    and checkpoints. It joins the process group after MindSpore is set up; in a paired process (turns shares the
    process, whose group `pair_main` joined) it sets its arm's fusion instead, before its build."""
    shared = turns is not None and turns.shares_process
    return Trainer(cfg, rank_dir(run_dir, rank), progress, turns,
                   Rank(rank, set_fusion if shared else join_process_group))


def write_rank_file(run_dir: Path, rank: RankFile) -> None:
    """RUN/ranks/rank_K.json (`wire.RankFile`): what `rankmerge` merges."""
    path = rank_file(run_dir, rank.rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, encode_rank_file(rank))


def profiled_comm(run_dir: Path, cfg: Config) -> dict | None:
    """The collective ops' ms and calls per step from this rank's profile (`profile.comm_per_step`); None when
    the config has no profiler window or the run stopped before it closed."""
    if not cfg.monitor.profile_steps:
        return None
    try:
        return comm_per_step(load_profile(run_dir))
    except RecordError:
        return None


def pair_main(request: Path, rank: int, size: int) -> int:
    """Both arms of a paired round on this rank. Every rank runs the plan's last look of pairs: a stop decided
    from one rank's times could differ on the other, which would then wait for an all-reduce that never comes.
    The parent replays the looks over the merged pairs (the first look that decides ends the round)."""
    from helpers.record import load_run
    from helpers.run.pair import run_pair
    req = decode_pair_request(request.read_text(encoding="utf-8"))
    ref, cand = load_config(req.reference), load_config(req.candidate)
    folder, plan = Path(req.folder), req.plan
    t0 = time.time()
    out = run_pair(ref, cand, folder, plan["block_steps"], plan["looks"][-1], lambda m: False,
                   interleave=plan.get("interleave", "blocks"),
                   profile_steps=req.profile_steps or cand.parallel.comm_profile_steps,
                   make_trainer=lambda cfg, run_dir, turns: rank_trainer(cfg, run_dir, rank, turns=turns),
                   setup=lambda: join_process_group(cand), paired_file=paired_rank_file(rank),
                   own_pids=lambda: [os.getppid()])  # msrun and every rank it started are the round's own
    for arm in ("reference", "candidate"):
        arm_dir = folder / arm
        own = rank_dir(arm_dir, rank)
        try:
            record = load_run(own)
        except RecordError:
            continue  # this arm never started here: no rank file, the merge reads the rank-0 record's failure
        write_rank_file(arm_dir, RankFile(rank, size, record.status, 1, time.time() - t0,
                                          out["memory"].get(f"{arm}_peak_bytes") or peak_rss_bytes(),
                                          [RankFile.row(r) for r in record.metrics], profiled_comm(own, record.config)))
    return 0 if out["status"] != "failed" else 1


def serve_cluster(workers: int, serve: Callable[[], None] | None = None, poll_s: float = 0.1) -> int:
    """msrun's scheduler: serve the cluster until its `workers` finish; the exit code msrun reads.

    MindSpore's scheduler looks for its nodes' exit every 5 s (ClusterContext::Finalize sleeps 5 s between tries)
    and holds the GIL meanwhile, which kept msrun waiting up to 5 s after the last worker had exited. So a child
    process serves the cluster, and this one ends it as soon as `workers` workers of this host were seen and none
    is left running (each unregisters from the scheduler before it exits: nothing is left to serve). On more than
    one host some workers run elsewhere, never seen here, and MindSpore's own wait ends the child. serve: what the
    child runs (MindSpore's init(), which serves the cluster and exits the process when it ends)."""
    if serve is None:
        from mindspore.communication import init as serve
    parent = os.getpid()
    child = os.fork()
    if child == 0:
        try:
            die_with_parent(parent)  # msrun kills the process it started (Ctrl+C): the cluster's server must go too
            serve()
        except BaseException:
            os._exit(1)
        os._exit(0)
    seen: set[int] = set()
    while True:
        done, status = os.waitpid(child, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        running = _sibling_workers()
        seen |= running
        if len(seen) >= workers > 0 and not running:
            os.kill(child, signal.SIGKILL)
            os.waitpid(child, 0)
            return 0
        time.sleep(poll_s)


def _sibling_workers() -> set[int]:
    """PIDs of the live processes of this script that the same msrun started (its workers), zombies left out."""
    parent, found = os.getppid(), set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue  # gone meanwhile
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]
        if int(ppid) == parent and state != "Z" and Path(__file__).name.encode() in cmdline:
            found.add(int(entry))
    return found


def main(argv: list[str] | None = None) -> int:
    """Train one rank (or, with --pair, both arms of a paired round); exit 0 ok, 3 stopped (nan), 1 failed."""
    args = argparse.ArgumentParser()
    args.add_argument("--config")
    args.add_argument("--out")
    args.add_argument("--pair", help="a paired round's request (JSON: reference, candidate, folder, plan)")
    ns = args.parse_args(argv)
    if os.environ.get("MS_ROLE") == "MS_SCHED":  # msrun runs this script as its scheduler too
        return serve_cluster(int(os.environ.get("MS_WORKER_NUM", "0")))
    rank, size = int(os.environ["RANK_ID"]), int(os.environ["RANK_SIZE"])  # set by msrun
    if ns.pair:
        return pair_main(Path(ns.pair), rank, size)
    cfg = comm_profiled(load_config(ns.config))
    run_dir = Path(ns.out)
    rows: list[dict] = []

    def keep(row: dict, total: int) -> None:
        rows.append(RankFile.row(row))

    progress = fan_out(keep, progress_sink("json") if rank == 0 else None)  # rank 0's lines reach msrun's log

    t0 = time.time()
    trainer = rank_trainer(cfg, run_dir, rank, progress)
    outcome = trainer.run()
    write_rank_file(run_dir, RankFile(rank, size, outcome.status, outcome.start_step, time.time() - t0,
                                      peak_rss_bytes(), rows, profiled_comm(trainer.run_dir, cfg)))
    return 0 if outcome.status == "ok" else 3


if __name__ == "__main__":
    sys.exit(main())
