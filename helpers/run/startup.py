"""A run's fixed cost (what it pays before its first steady step) and the per-config compile-cache folder.

`fixed_cost_s` in summary.json, seconds: `start` (process creation → the run begins: interpreter start and our
imports; meaningful in a run's own process, as `launch` and the CLI start it; a child of the zygote is created by
its fork, after those imports: `process_start` in summary.json says which), `data` (corpus read/tokenized or
taken from the cache), `import` (importing MindSpore and setting its context), `peak` (the matmul peak FLOP/s,
measured only when the cached one is stale), `build` (datasets, model, step Cells), `compile` (first step minus the
median steady step: graph compile and first-call set-up).
"""
from __future__ import annotations

import hashlib
import os
import time
from contextlib import contextmanager
from pathlib import Path

from helpers import config as config_mod
from helpers.config import Config
from helpers.levers import keys_where
from helpers.paths import cache_root

# Keys that do not change the compiled graph (declared in helpers/levers.py): where the cache lives, where a resume
# starts from, when a run ends; the input pipeline and the corpus; what is measured or watched from Python, evaluation
# and checkpoint cadence; the learning-rate schedule and the step count (the host sets the optimizer's scalar LR
# Parameters before every step, run/schedule.py). The seed only matters to random ops in the graph (`_graph_keys`).
_NOT_IN_GRAPH = frozenset(keys_where(in_graph=False))


def _graph_keys(cfg: Config) -> dict:
    """The flattened config keys that can change a compiled graph (what the cache folder is named after)."""
    flat = {k: v for k, v in config_mod.flatten(cfg).items() if k not in _NOT_IN_GRAPH}
    if not cfg.model.dropout and not cfg.model.build:  # our model without dropout has no random op in its graph
        flat.pop("seed")  # (parameters are initialised eagerly, outside it); a user's model may have one
    return flat


# Set in a child forked from the zygote (helpers/spawn/zygote.py): the pid of the parent that had MindSpore imported.
FORKED_FROM: int | None = None


def process_start() -> str:
    """How this process began, for the record: 'forked' (from the zygote: interpreter, our imports and MindSpore's
    import were done before the fork, so `start` and `import` are small) or 'fresh' (its own interpreter)."""
    return "forked" if FORKED_FROM is not None else "fresh"


def process_age_s() -> float:
    """Seconds since this process was created (fork or exec), to the kernel's clock tick (10 ms).

    On Linux both ends are counted from boot (/proc/self/stat's start tick, CLOCK_BOOTTIME): psutil's
    create_time adds the boot time, which Linux gives in whole seconds, and read ~0.5 s too old here (a fresh
    interpreter's first line at "0.53 s")."""
    try:
        with open("/proc/self/stat", encoding="ascii") as fh:
            started_tick = int(fh.read().rsplit(")", 1)[1].split()[19])  # field 22, after the command name
        return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - started_tick / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError, AttributeError):
        import psutil
        return max(0.0, time.time() - psutil.Process().create_time())


def compile_cache_dir(cfg: Config, graph_key: str = "") -> Path:
    """The compile-cache folder of this config: `<compile_cache_path or paths.cache_root()/compile>/<config hash>`.

    MindSpore's cache is keyed only by the Python files it depends on, not by the graph: a warm cache filled by
    another config was measured to load the wrong graph (batch 8 after batch 12: "For 'Reshape', the size of
    'input_x': {1024} is not equal to ... {1536}"). One folder per config (every key except those that cannot
    change the graph, plus `graph_key`, e.g. the vocabulary size, and MindSpore's version) keeps them apart.
    """
    import mindspore as ms
    key = repr((sorted(_graph_keys(cfg).items()), graph_key, ms.__version__))
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return Path(cfg.compile_cache_path or cache_root() / "compile") / digest


# The hold this process has on a compile-cache folder's part ((folder, part), open lock file), for its life.
_held: tuple | None = None


def claim_cache_folder(folder: Path) -> str:
    """Take this process's exclusive hold on its part of a compile-cache folder (MindSpore writes each rank's
    graphs to rank_<RANK_ID>/ inside it; RANK_ID is msrun's, 0 alone), for as long as it lives ("" when it has it,
    else why it compiles without the cache). One process at a time: MindSpore writes a cold (or stale) folder's
    graph files in place, and a second process reading or writing them then would load a half-written graph.
    Two processes of one graph at once (a round's arms, two test workers) thus compile the second cold, as does a
    second graph in one process (measured: it loaded the first folder's graph, of other shapes)."""
    import fcntl
    global _held
    key = (Path(folder), f"rank_{os.environ.get('RANK_ID', '0')}")
    if _held is not None and _held[0] == key:
        return ""
    key[0].mkdir(parents=True, exist_ok=True)
    lock = open(key[0] / f".{key[1]}.in_use", "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        return (f"compile cache off: another process is compiling into or loading from {key[0] / key[1]}; "
                f"this run compiles without it")
    if _held is not None:  # a second graph in this process: MindSpore would keep using the first folder
        lock.close()
        return (f"compile cache off: this process already compiled with {_held[0][0]}, and MindSpore keeps one "
                f"cache folder per process; this run compiles without it")
    _held = (key, lock)
    return ""


class FixedCost:
    """Seconds per start-up phase, in the order they ran: `with cost.phase("data"): ...`."""

    def __init__(self):
        self.seconds: dict[str, float] = {"start": process_age_s()}

    @contextmanager
    def phase(self, name: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0

    def summary(self, first_ms: float | None, steady_ms: float | None) -> dict:
        """fixed_cost_s for summary.json: the phases plus `compile` (the first step's ms − the median steady step's)
        and `total`."""
        out = dict(self.seconds)
        if first_ms is not None and steady_ms is not None:
            out["compile"] = max(0.0, (first_ms - steady_ms) / 1000.0)
        out["total"] = sum(out.values())
        return {k: round(v, 3) for k, v in out.items()}
