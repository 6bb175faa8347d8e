"""The last line of `import-config`: the command that trains the written config on this machine, or why it cannot
train here and the import that can (never a command that is refused seconds later)."""
from __future__ import annotations

import shlex
from pathlib import Path

from helpers import config as config_mod
from helpers.book.planner import GB
from helpers.config import ConfigError
from helpers.mindformers.target import fit
from helpers.run.devices import absent
from helpers.run.preflight import preflight


def _sibling(out: str, tag: str) -> str:
    """mine.yaml → mine_cpu.yaml: a new file beside the written one, so the suggested import needs no --replace."""
    path = Path(out)
    return str(path.with_name(f"{path.stem}_{tag}{path.suffix or '.yaml'}"))


def _import(source: str, out: str, flags: str) -> str:
    return f"python -m helpers import-config {shlex.quote(source)} {flags} --out {shlex.quote(out)}"


def next_step(out: str, source: str, preset: str = "") -> str:
    """The line for the config written to `out` from `source` (with `--scale preset`, '' when not given): a train
    command only where `train`'s own checks before it starts anything (`preflight`) pass."""
    cfg = config_mod.absolute_paths(config_mod.load_config(out))
    missing = absent(cfg.device_target)
    if missing:
        return (f"wrote {out} for device_target={cfg.device_target}, which is not on this machine ({missing}); to "
                f"train the recipe here on CPU: {_import(source, _sibling(out, 'cpu'), '--target cpu')}")
    try:
        preflight(cfg)
    except ConfigError as exc:
        flags = "--target cpu --scale nano"
        tryout = "" if preset else f"; a try-out at a preset's dims: {_import(source, _sibling(out, 'nano'), flags)}"
        return f"wrote {out}; as written it cannot train on this machine: {exc}{tryout}"
    line = f"wrote {out}; train it with: python -m helpers train --config {shlex.quote(out)} --out runs/<name>"
    if cfg.device_target != "CPU" or preset:
        return line
    f, dp = fit(cfg), cfg.parallel.data_parallel
    if f.copies >= dp:
        return line
    return line + (f" (the planner estimates {f.per_process / GB:.1f} GB per process × {dp}, above the "
                   f"{f.limit / GB:.1f} GB memory gate here: it may run out of memory; --scale PRESET tries the "
                   f"recipe at a preset's dims)")
