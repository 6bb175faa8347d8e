"""`import-config --target cpu`: an Ascend or GPU recipe at its own size (dims kept) on this machine's CPU. What only
those devices run falls back, the precision becomes fp32, and data parallel shrinks to the processes that fit here
while each keeps the recipe's micro-batch and accumulation keeps its global batch; each change is a row of the
mapping table."""
from __future__ import annotations

import os
from dataclasses import dataclass, replace

from helpers.book.planner import GB, config_plan, estimate
from helpers.config import Config, from_dict
from helpers.mindformers.changes import Change, changed
from helpers.mindformers.importer import Imported
from helpers.run.memory import DEVICE_LIMIT_FRACTION, default_memory_limit

TARGETS = ("cpu",)
# What only Ascend (or GPU) runs, and what CPU runs instead; --scale takes these too.
DEVICE_ONLY: dict[str, Change] = {
    "device_target": ("CPU", "this machine's CPU"),
    "jit_level": (lambda v, cfg: "O1" if v == "O2" else v, "jit_level O2 is Ascend only"),
    "memory_optimize": ("O0", "an Ascend memory-pool level"),
    "model.attention": ("manual", "flash attention is Ascend only"),
}
# The precision CPU trains best in: bf16 does not run there and fp16 is slower than fp32 (a small model here: O0 72
# ms a step, O2 193 ms).
FP32: dict[str, Change] = {
    "amp_level": ("O0", "fp32: bf16 does not run on CPU and fp16 is slower there than fp32 (no fp16 matmul units)"),
    "loss_scale": ("none", "fp32 gradients do not underflow: no loss scale"),
}


@dataclass(frozen=True)
class Fit:
    """How many data-parallel processes of a recipe fit this machine: `processes`, from `cores`, the memory gate
    `limit` (bytes) and the planner's estimate of one process (`per_process`, bytes)."""
    processes: int
    cores: int
    limit: float
    per_process: float

    @property
    def copies(self) -> int:
        """Processes whose estimate fits the memory gate together."""
        return int(self.limit // self.per_process)


def fit(cfg: Config, cores: int | None = None, limit: float | None = None) -> Fit:
    """The data-parallel processes of a recipe's config that fit here in fp32: at most the cores, as many as the
    planner's per-process estimate fits in the memory gate (90% of RAM), a divisor of the recipe's data parallel
    so its global batch stays whole, and at least 1."""
    cores = cores or os.cpu_count() or 1
    limit = default_memory_limit("CPU") if limit is None else limit
    # every process holds a whole copy; an unnamed vocabulary (the tokenizer's) is not counted
    shape, strategy = config_plan(cfg, vocab=1)
    per_process = estimate(shape, replace(strategy, dp=1, dtype="fp32")).total
    dp = cfg.parallel.data_parallel
    most = min(cores, int(limit // per_process))
    return Fit(max(d for d in range(1, dp + 1) if dp % d == 0 and (d <= most or d == 1)), cores, limit, per_process)


def _parallel(cfg: Config) -> dict[str, Change]:
    """The data parallel that fits (`fit`), the recipe's micro-batch per process and its global batch kept."""
    f = fit(cfg)
    dp, micro, accum = cfg.parallel.data_parallel, cfg.micro_batch_per_device, cfg.grad_accum_steps
    copies = f"{f.copies} cop{'y' if f.copies == 1 else 'ies'}"
    return {
        "parallel.data_parallel": (f.processes, f"processes that fit here: at most the {f.cores} cores, {copies} of "
                                                f"the planner's {f.per_process / GB:.1f} GB per process (fp32, "
                                                f"micro-batch {micro}) in {f.limit / GB:.1f} GB "
                                                f"({DEVICE_LIMIT_FRACTION:.0%} of RAM), a divisor of {dp}"),
        "batch_size": (micro * f.processes, f"{micro} sequences per process, as on each of the recipe's {dp} "
                                            f"devices"),
        "grad_accum_steps": (accum * dp // f.processes, f"keeps the recipe's global batch of {cfg.global_batch} "
                                                        f"sequences"),
    }


def on_cpu(imported: Imported, parallel: bool = True) -> Imported:
    """The recipe on CPU at its own size: DEVICE_ONLY and FP32 changes, and with `parallel` the data parallel that
    fits here (`fit`); rows of '--target cpu'. Not validated (`changes.changed`): without `parallel` the recipe's
    data parallel stays for --scale to set."""
    changes = {**DEVICE_ONLY, **FP32, **(_parallel(from_dict(imported.config)) if parallel else {})}
    return changed(imported, "--target cpu", changes)
