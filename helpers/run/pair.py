"""A paired round's training process: the reference and the candidate built in ONE process, each with its own
model, optimizer, data pipeline and compiled step Cell, then trained in alternating blocks of K steps (ABBA:
R C, C R, R C, …) so that whatever else the machine does hits both arms alike.

Each arm still writes a normal run record (its `cfg.steps` steps, evals, checkpoint) into its own folder; blocks
that go on past an arm's last recorded step are measurement-only (`train.Turns.extra_steps`). The block step times
go to `paired.json` in the round folder, with each step's data wait and the CPU other processes used during each
pair; the estimator that reads them is helpers/paired.py (the `stop` callable passed in decides after each pair
whether to go on). Each arm's input pipeline works only while that arm steps (data.DataGate), as in a run of its
own: the waiting arm cannot read ahead during the other's steps.

Memory: `rss_bytes` and ru_maxrss are the process's, which here holds both arms. The candidate is built, warmed
up and evaluated once *before the reference exists*, so the process high-water at that point is the candidate's
own peak (build, compile, steady steps, the eval graph): that is what the memory gate judges. The reference's
peak is estimated as the RSS before any model was built plus the high-water it added on top of the candidate;
it only enters the printed memory ratio. See docs/explanation/speed-rule.md ("Memory in a round").
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable

from helpers.config import Config, with_changes
from helpers.paired import (Measurement, add_pair, live_tokens_per_s, measurement_record, pair_order,
                            woven)
from helpers.record import atomic_write_json, update_summary
from helpers.run.data import DataGate
from helpers.run.foreign import ForeignLoad
from helpers.run.metrics import peak_rss_bytes, rss_bytes
from helpers.run.profile import warmup_steps, with_profiler
from helpers.run.train import Phase, Trainer, Turns, configure_mindspore
from helpers.wire import PAIRED_FILE, PairDone, PairStart, encode

MEMORY_SCOPE = ("paired process: peak_memory_bytes is this arm's own ({how}); rows' rss_bytes and "
                "process_peak_rss_bytes are the whole process (both arms)")

StopRule = Callable[[Measurement], bool]
MakeTrainer = Callable[[Config, Path, Turns], Trainer]  # (arm config, arm record folder, how it takes turns)


def _emit(message: PairStart | PairDone) -> None:
    """One progress line for the parent (`wire.encode`; in msrun's log, which `spawn/paired.py` follows)."""
    print(encode(message), flush=True)


def _warm(trainer: Trainer, steps: int) -> list[float]:
    """The arm's first `steps` steps (compile, warm-up) and one validation pass (compiles the eval graph), so
    the blocks time steady steps and the arm's memory high-water includes everything a run of it allocates."""
    times = trainer.step_block(steps)
    if trainer.outcome is None or trainer.outcome.status == "ok":
        trainer.evaluate()
    return times


def _first_graph() -> None:
    """Compile and run a throwaway one-layer Cell before either arm exists. Measured here (tiny preset, three
    identical Trainers in one process, ABBA-rotated blocks): the first graph a process compiles ran 3–14% faster
    per step than the later ones in every try (so an A/A said "keep" for the arm built first); with a throwaway
    graph compiled first, the arms differed by −2.7% to +1.9% (see docs/explanation/speed-rule.md)."""
    import mindspore as ms
    import numpy as np
    from mindspore import nn
    cell = nn.Dense(4, 4)
    for _ in range(3):
        cell(ms.Tensor(np.ones((2, 4), np.float32))).asnumpy()


class _Arms:
    """The two Trainers of the process and which records are written."""

    def __init__(self, reference: Config, candidate: Config, folder: Path, extra_steps: int,
                 make_trainer: MakeTrainer):
        self.trainers = {name: make_trainer(cfg, folder / name, Turns(DataGate(), extra_steps, shares_process=True))
                         for name, cfg in (("candidate", candidate), ("reference", reference))}

    def block(self, name: str, k: int) -> tuple[list[float], list[float | None]]:
        """K step times of one arm and their data waits (ms), see `Trainer.measure_block`."""
        return self.trainers[name].measure_block(k)

    def row(self, name: str, times_ms: list[float], step: int) -> dict:
        """What the parent's live view draws for one arm after a block: its step count, its record's latest
        loss (None before the first row) and tokens/s at the block's median step time."""
        return {"step": step, "loss": self.trainers[name].last_loss,
                "tokens_per_s": live_tokens_per_s(self.tokens_per_step(name), times_ms)}

    def tokens_per_step(self, name: str) -> int:
        return self.trainers[name].cfg.tokens_per_step

    def broken(self) -> list[str]:
        """Arms whose record ended other than 'ok' (NaN, a monitor's stop)."""
        return [n for n, t in self.trainers.items() if t.outcome is not None and t.outcome.status != "ok"]

    def complete(self, out: dict) -> None:
        """Train each record to its last step and write its summary; once one arm failed or ended early, the
        other stops where it is (status 'stopped', naming why)."""
        for name, trainer in self.trainers.items():
            if trainer.phase is Phase.FINISHED:  # written already (a failed start too: its record says why)
                trainer.finish()  # releases its pipeline: its threads wait on the gate and the exit joins them
            if trainer.phase in (Phase.BUILT, Phase.FINISHED):
                continue
            other = next(n for n in self.trainers if n != name)
            try:
                while trainer.outcome is None and not self.broken() and out["status"] != "failed":
                    trainer.step_block(trainer.cfg.steps)
                trainer.finish(f"the {other} arm of this paired round ended first ({out['reason']})")
            except Exception:  # its record says failed; the other arm is still completed
                out["status"] = "failed"


def run_pair(reference: Config, candidate: Config, folder: Path, block_steps: int, max_pairs: int,
             stop: StopRule, make_trainer: MakeTrainer, setup: Callable[[], None] | None = None,
             paired_file: str = PAIRED_FILE,
             interleave: str = "blocks", profile_steps: int = 0,
             own_pids: Callable[[], list[int]] | None = None) -> dict:
    """Train both arms in this process and measure them in ABBA blocks; returns (and writes) the raw record.

    block_steps: K steps per block; interleave: "blocks" (one arm's K steps, then the other's) or "steps" (the
    two arms' K steps alternate one by one, ABBA, so both blocks of a pair span the same wall-clock window);
    max_pairs: the budget in block pairs; stop(pairs) → True ends the
    measurement early (pairs = [(reference ms list, candidate ms list), …]). Both records are completed to
    their `steps` whatever the measurement needed. A failure or NaN in one arm ends the other as 'stopped'.
    make_trainer(cfg, run_dir, turns) makes each arm's Trainer: a data-parallel rank (helpers/spawn/dp_worker.py)
    makes its rank's, and passes a `setup` run once after MindSpore is configured (joining the process group) and
    its own `paired_file` name.
    profile_steps: each arm gets a profiler window of that many steps right after its own steady_after (an arm
    whose config has a window keeps it); the warm-up of both arms runs to the later window's end, so every
    profiled step is taken while the other arm is not stepping (the candidate's before the reference exists):
    one arm's ops per op table, and no profiled step inside a block. own_pids: the processes whose CPU is the
    round's own while it measures (default: this one and its children; see run/foreign.py).
    """
    folder = Path(folder)
    t0 = time.perf_counter()
    # Process-wide settings are equal for both arms on the paired path. The compile cache stays off: MindSpore
    # keys it by source files, not by graph, so two arms' graphs in one process could load each other's.
    if profile_steps:
        reference, candidate = (c if c.monitor.profile_steps else with_profiler(c, profile_steps)
                                for c in (reference, candidate))
    configure_mindspore(with_changes(candidate, {"compile_cache": False}))
    if setup is not None:
        setup()
    _first_graph()
    rss_base = rss_bytes()  # MindSpore imported and set up, no model built yet
    warmup = max(warmup_steps(c) for c in (reference, candidate))
    arms = _Arms(reference, candidate, folder, warmup + block_steps * max_pairs, make_trainer)
    out = measurement_record("paired", block_steps, interleave, max_pairs, warmup,
                             {name: arms.tokens_per_step(name) for name in arms.trainers})
    memory = out["memory"]
    memory["rss_before_models_bytes"] = rss_base
    try:
        _warm_arms(arms, warmup, out)
        out["setup_s"] = time.perf_counter() - t0
        _measure_pairs(arms, out, stop, own_pids)
        out["status"] = "ok" if out["status"] == "running" else out["status"]
        out["measure_s"] = time.perf_counter() - t0 - out["setup_s"]
    except Exception as exc:  # the arm that raised has a failed record; the round reads it from there
        out["status"], out["reason"] = "failed", f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    arms.complete(out)
    _own_memory(arms.trainers, memory)
    out["wall_s"] = time.perf_counter() - t0
    atomic_write_json(folder / paired_file, out)
    return out


def _warm_arms(arms: _Arms, warmup: int, out: dict) -> None:
    """Start and warm up each arm, the candidate first: the process high-water after it is then the candidate's
    own peak (the memory gate's figure); the reference's is estimated on top of it (module docstring)."""
    memory = out["memory"]
    rss_base = memory["rss_before_models_bytes"]
    for name in ("candidate", "reference"):
        _emit(PairStart(name))
        before = rss_bytes()
        arms.trainers[name].start()
        out["warmup_ms"][name] = _warm(arms.trainers[name], warmup)
        # resident memory the arm added, after its warm-up: the same measure for both arms (the ratio)
        memory[f"{name}_resident_bytes"] = rss_base + rss_bytes() - before
        if name == "candidate":  # the high-water so far is the candidate's alone: the gate's figure
            memory["candidate_peak_bytes"] = peak_rss_bytes()
    memory["reference_peak_bytes"] = rss_base + max(0, peak_rss_bytes() - memory["candidate_resident_bytes"])


def _measure_pairs(arms: _Arms, out: dict, stop: StopRule, own_pids: Callable[[], list[int]] | None) -> None:
    """The ABBA pairs of `out`'s plan (block_steps, max_pairs, interleave) into `out`, each with its data waits and
    the outside load meanwhile, until `stop`, the budget, or an arm's record ends before a pair is complete."""
    k, max_pairs, warmup = out["block_steps"], out["max_pairs"], out["warmup_steps"]
    foreign = ForeignLoad(own_pids)
    for i in range(max_pairs):
        order = pair_order(i)
        foreign.start()
        got = _interleaved(arms, order, k) if out["interleave"] == "steps" else \
            {name: arms.block(name, k) for name in order}
        if arms.broken() or any(len(v[0]) < k for v in got.values()):
            out["status"] = "ended"
            out["reason"] = f"{', '.join(arms.broken()) or 'an arm'} ended before pair {i + 1} was complete"
            return
        measured = add_pair(out, order, {n: got[n][0] for n in order}, {n: got[n][1] for n in order}, foreign.read())
        _emit(PairDone(i + 1, max_pairs, {name: arms.row(name, got[name][0], warmup + (i + 1) * k) for name in order}))
        if stop(measured):
            return


def _interleaved(arms: _Arms, order: tuple[str, str], k: int) -> dict[str, tuple[list[float], list[float | None]]]:
    """One pair with its two blocks woven together: K single steps of each arm in ABBA order (first arm of the
    pair, then the other, then the other twice …), so a slow stretch of the machine that starts mid-pair lands on
    both arms' blocks alike instead of on one block. Per arm: (step ms, data wait ms)."""
    got = {name: ([], []) for name in order}
    for name in woven(order, k):
        times, waits = arms.block(name, 1)
        got[name][0].extend(times)
        got[name][1].extend(waits)
    return got


def _own_memory(trainers: dict[str, Trainer], memory: dict) -> None:
    """Put each arm's own peak into its summary (the process's peak stays as process_peak_rss_bytes)."""
    how = {"candidate": "the process high-water after its build, warm-up and an eval, before the reference existed",
           "reference": "the process high-water minus the candidate's resident memory (an estimate)"}
    for name, trainer in trainers.items():
        own = memory.get(f"{name}_peak_bytes")
        summary = trainer.run_dir / "summary.json"
        if own is None or not summary.is_file():
            continue
        process_peak = json.loads(summary.read_text(encoding="utf-8")).get("peak_rss_bytes")
        update_summary(trainer.run_dir, {"peak_memory_bytes": own, "peak_rss_bytes": own,
                                         "resident_memory_bytes": memory.get(f"{name}_resident_bytes"),
                                         "process_peak_rss_bytes": process_peak,
                                         "memory_scope": MEMORY_SCOPE.format(how=how[name]),
                                         "compile_cache_used": False})  # see run_pair
