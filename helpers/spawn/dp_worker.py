"""One msrun worker of a data-parallel run: joins the process group, sets DATA_PARALLEL and the all-reduce
fusion knobs, then runs the same Trainer on its shard of every global batch.

Started by `helpers.spawn.msrun` as `msrun ... helpers/spawn/dp_worker.py --config C --out RUN`. Rank 0 writes the run
record and prints progress JSON lines (into its msrun log); rank K > 0 keeps its own record in
RUN/ranks/rank_K/ without checkpoints. Every rank writes RUN/ranks/rank_K.json (its step times, losses,
peak RSS, profiled collective time) for `rankmerge` to merge after msrun returns.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from helpers.config import Config, load_config, with_changes
from helpers.run.data import train_dataset
from helpers.run.metrics import peak_rss_bytes
from helpers.run.profile import comm_per_step, load_profile
from helpers.record import RecordError, atomic_write_json
from helpers.run.rows import fan_out, progress_sink
from helpers.run.train import Trainer


def rank_file(run_dir: str | Path, rank: int) -> Path:
    """Where rank `rank` writes its per-step figures."""
    return Path(run_dir) / "ranks" / f"rank_{rank}.json"


def join_process_group(cfg: Config) -> None:
    """init() the collective backend (after the device is set), then DATA_PARALLEL with the configured fusion."""
    import mindspore as ms
    from mindspore.communication import get_group_size, init
    init()
    p = cfg.parallel
    knobs = {"parallel_mode": ms.ParallelMode.DATA_PARALLEL, "gradients_mean": p.gradients_mean,
             "device_num": get_group_size()}
    if p.comm_fusion == "size":
        knobs["comm_fusion"] = {"allreduce": {"mode": "size", "config": p.fusion_size_mb}}
    elif p.comm_fusion == "index":
        knobs["all_reduce_fusion_config"] = list(p.fusion_indices)
    ms.set_auto_parallel_context(**knobs)


class RankTrainer(Trainer):
    """The Trainer on one rank: reads its shard; only rank 0 writes the record and checkpoints."""

    def __init__(self, cfg: Config, run_dir: Path, rank: int, size: int, progress):
        self.rank, self.size = rank, size
        super().__init__(cfg, run_dir if rank == 0 else run_dir / "ranks" / f"rank_{rank}", progress)

    def _configure(self) -> None:
        super()._configure()
        join_process_group(self.cfg)

    def _build(self):
        super()._build()
        self._train_dataset = lambda skip: train_dataset(self.cfg, self.prep, skip_batches=skip,
                                                         shard=(self.rank, self.size))

    def _save_checkpoint(self, step: int) -> None:
        if self.rank == 0:
            super()._save_checkpoint(step)


def main(argv: list[str] | None = None) -> int:
    """Train one rank; exit 0 ok, 3 stopped (nan), 1 failed."""
    args = argparse.ArgumentParser()
    args.add_argument("--config", required=True)
    args.add_argument("--out", required=True)
    ns = args.parse_args(argv)
    cfg = load_config(ns.config)
    run_dir = Path(ns.out)
    if os.environ.get("MS_ROLE") == "MS_SCHED":  # msrun runs this script as its scheduler too
        from mindspore.communication import init
        init()  # serves the cluster until the workers finish
        return 0
    rank, size = int(os.environ["RANK_ID"]), int(os.environ["RANK_SIZE"])  # set by msrun
    # at most half the steady steps: the profiled ones are left out of speed, so unprofiled ones must remain
    window = min(cfg.parallel.comm_profile_steps, max(0, cfg.steps - cfg.steady_after) // 2)
    if window and not cfg.monitor.profile_steps:  # the run's profiler window measures the collectives
        cfg = with_changes(cfg, {"monitor.profile_steps": window})
    rows: list[dict] = []

    def keep(row: dict, total: int) -> None:
        rows.append({k: row[k] for k in ("step", "step_time_ms", "data_wait_ms", "loss", "grad_norm")})

    progress = fan_out(keep, progress_sink("json") if rank == 0 else None)  # rank 0's lines reach msrun's log

    t0 = time.time()
    trainer = RankTrainer(cfg, run_dir, rank, size, progress)
    outcome = trainer.run()
    try:
        comm = comm_per_step(load_profile(trainer.run_dir)) if cfg.monitor.profile_steps else None
    except RecordError:  # the run stopped before its profiler window closed
        comm = None
    rank_file(run_dir, rank).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(rank_file(run_dir, rank), {
        "rank": rank, "size": size, "status": outcome.status, "start_step": outcome.start_step,
        "wall_s": time.time() - t0, "peak_rss_bytes": peak_rss_bytes(), "rows": rows, "comm": comm})
    return 0 if outcome.status == "ok" else 3


if __name__ == "__main__":
    sys.exit(main())
