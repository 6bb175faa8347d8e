"""`make bench` item `overhead`: the full trainer with every monitor on against a bare loop over the trainer's own
step Cell on the same batches (same device work), each in its own process, pairs in alternating order; wall ms/step
over the same steady window. Run as a script, this module is the child side (`bare` / `monitored`)."""
from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

from child import python
from helpers.config import dump, load_config, with_changes
from registry import GOAL, MUST, Check, Item, at_most, positive

NANO = Path(__file__).resolve().parent.parent / "configs" / "nano.yaml"
OVERHEAD_GOAL, OVERHEAD_LIMIT = 1.02, 1.05  # monitored ÷ bare ms/step, median of the pairs
# The monitored arm has every monitor on: grad-norm alarm (limit 1.0 = the clip norm, so it fires on early steps),
# loss spikes, RSS growth, overfit (fed by the final eval, outside the timed window), loss drop per 1k tokens, plus
# the per-step row, RSS sample and record write.
MONITORS_ON = {"monitor.grad_norm_limit": 1.0, "monitor.grad_norm_action": "log", "monitor.spike_ratio": 0.25,
               "monitor.memory_slope_limit": 262144.0, "monitor.memory_window": 50, "monitor.overfit_evals": 2}


def bare_loop(config_yaml: str, steps: int, skip: int) -> float:
    """Child side: the trainer's own step Cell on the same batches, nothing else (no metrics row, monitors, RSS
    sampling, record writes or per-step host reads). ms/step over steps skip+1 .. steps-1, each end synchronised by
    reading the loss."""
    import mindspore as ms
    from helpers.run.build import build
    from helpers.run.data import prepare, train_dataset
    from helpers.run.kernels import resolve_kernels
    from helpers.run.train import configure_mindspore
    cfg = load_config(config_yaml)
    with tempfile.TemporaryDirectory() as tmp:
        prep = prepare(cfg, Path(tmp))
        configure_mindspore(cfg)
        step = build(cfg, prep, Path(tmp), resolve_kernels(cfg)).calls[0]
        batches = iter(train_dataset(cfg, prep).create_tuple_iterator(num_epochs=1, output_numpy=True))
        for i in range(1, steps):
            x, y = next(batches)
            out = step(ms.Tensor(x), ms.Tensor(y))
            if i == skip:
                out[0].asnumpy()
                t0 = time.perf_counter()
        out[0].asnumpy()
        return (time.perf_counter() - t0) * 1000.0 / (steps - 1 - skip)


def monitored_loop(config_yaml: str, steps: int, skip: int) -> float:
    """Child side: the full trainer, wall ms/step over the same window as `bare_loop`, stamped after each step's row
    is written (the final eval and checkpoint excluded)."""
    from helpers.run.train import Trainer
    cfg = load_config(config_yaml)
    stamps: dict[int, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        Trainer(cfg, tmp, lambda row, total: stamps.__setitem__(row["step"], time.perf_counter())).run()
    return (stamps[steps - 1] - stamps[skip]) * 1000.0 / (steps - 1 - skip)


def _spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def item_overhead(rounds: int, steps: int, skip: int = 10) -> dict:
    """Monitored and bare ms per step of each pair (order alternating A B, B A, ...) and their ratios."""
    cfg = with_changes(load_config(NANO), {"steps": steps, "eval_every": 0, "eval_batches": 1,
                                           "steady_after": skip, **MONITORS_ON})
    bare, full = [], []
    with tempfile.TemporaryDirectory() as tmp:
        request = Path(tmp) / "request.yaml"
        request.write_text(dump(cfg))
        arms = {"bare": bare, "monitored": full}
        for i in range(rounds):
            for arm in (("bare", "monitored") if i % 2 == 0 else ("monitored", "bare")):
                arms[arm].append(float(python(__file__, arm, str(request), str(steps), str(skip))
                                       .strip().splitlines()[-1]))
            print(f"  overhead pair {i + 1}: bare {bare[-1]:.1f} ms, monitored {full[-1]:.1f} ms "
                  f"(×{full[-1] / bare[-1]:.3f})", flush=True)
    ratios = [f / b for f, b in zip(full, bare)]
    return {"bare_ms_each": bare, "monitored_ms_each": full, "ratios": ratios, "bare_ms": _spread(bare),
            "monitored_ms": _spread(full), "ratio": _spread(ratios), "steps": steps, "window": [skip + 1, steps - 1],
            "monitors": MONITORS_ON}


def _ratio(result: dict) -> float | None:
    return result["ratio"]["median"] if result.get("ratios") else None


def rows(r: dict) -> list[tuple[str, str]]:
    return [("monitoring overhead (monitored ÷ bare ms/step)",
             f"×{r['ratio']['median']:.3f} median (range {r['ratio']['min']:.3f}–{r['ratio']['max']:.3f}, "
             f"{r['ratio']['n']} interleaved pairs; bare {r['bare_ms']['median']:.1f} ms, monitored "
             f"{r['monitored_ms']['median']:.1f} ms)")]


def _limit(kind: str, limit: float) -> Check:
    return Check(kind, f"monitored ÷ bare ms/step, median of the pairs ≤ ×{limit}",
                 lambda r: at_most(_ratio(r), limit, f"overhead ×{_ratio(r) or 0:.3f} {{sign}} ×{limit}"),
                 miss={"ratios": [limit + 0.1], "ratio": {"median": limit + 0.1}} if kind == MUST else None)


ITEMS = [Item("overhead", "monitoring overhead: the full trainer vs a bare step loop, interleaved pairs",
              lambda a: item_overhead(a.rounds, a.steps), rows, (_limit(MUST, OVERHEAD_LIMIT),
                                                                 _limit(GOAL, OVERHEAD_GOAL)),
              options=((("--rounds",), {"type": int, "default": 5, "help": "pairs (overhead), rounds (speed)"}),
                       (("--steps",), {"type": int, "default": 120, "help": "steps per run (overhead)"})),
              check_args=lambda a: positive(a, "rounds", "steps"))]

if __name__ == "__main__":  # child side: python bench/overhead_item.py bare|monitored CONFIG STEPS SKIP
    print((bare_loop if sys.argv[1] == "bare" else monitored_loop)(sys.argv[2], int(sys.argv[3]), int(sys.argv[4])))
