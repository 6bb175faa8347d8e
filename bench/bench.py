"""`make bench`: ratios measured side by side in one run (interleaved A B A B, medians, spread).

Items: monitoring overhead (the full trainer vs a bare step loop), MFU of the presets against the
measured matmul peak, nanoGPT-config parity (val loss at 2000 iterations), headless workbook wall time,
A/A checks and recorded-vs-outside step time (noise honesty, bench/noise_items.py), the nano config's speed per
formulation (bench/speed_item.py).
Results go to bench/results/<item>.json and bench/results/README.md.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from helpers.config import dump, load_config, with_changes  # noqa: E402
from helpers.record import atomic_write_json, load_run  # noqa: E402
from helpers.spawn.runner import child_env  # noqa: E402
from noise_items import item_aa, item_clock, noise_rows  # noqa: E402  (bench/ is sys.path[0])
from ttq_item import NANOGPT_RECIPE, item_ttq, ttq_rows  # noqa: E402
from speed_item import arm_steps, item_speed, speed_rows  # noqa: E402
from power_item import LoadSampler, item_power, power_rows  # noqa: E402

RESULTS = REPO / "bench" / "results"
# "must" limits: `make bench` exits 1 when an item measured in that invocation misses one. Goals are only reported.
OVERHEAD_GOAL, OVERHEAD_LIMIT = 1.02, 1.05  # monitored ÷ bare ms/step
NANOGPT_VAL_LOSS, PARITY_LIMIT = 1.88, 1.95  # val loss at 2000 iterations (nanoGPT's README: 1.88 on CPU)
WORKBOOK_LIMIT_S = 360  # `make workbook` wall seconds (issue 12: ≤ 6 min)
NANO = REPO / "configs" / "nano.yaml"


def _python(*args: str, timeout: float = 1800) -> str:
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=REPO, env=child_env(),
                          timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args[:3])} failed: {proc.stderr[-1500:]}")
    return proc.stdout


def _must(ok: bool, what: str) -> dict:
    """A result's "must" entry: whether the item met its hard limit, and the one line that says so."""
    return {"ok": bool(ok), "text": what}


def must_misses(results: dict, items: list[str]) -> list[str]:
    """One line per item measured now whose "must" limit was missed (goals are reported, not enforced)."""
    return [f"{item}: {results[item]['must']['text']}" for item in items
            if not results.get(item, {}).get("must", {"ok": True})["ok"]]


def _spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


# The monitored arm has every monitor on: grad-norm alarm (limit 1.0 = the clip norm, so it fires on early steps),
# loss spikes, RSS growth, overfit (fed by the final eval, outside the timed window), loss drop per 1k tokens, plus
# the per-step row, RSS sample and record write.
MONITORS_ON = {"monitor.grad_norm_limit": 1.0, "monitor.grad_norm_action": "log", "monitor.spike_ratio": 0.25,
               "monitor.memory_slope_limit": 262144.0, "monitor.memory_window": 50, "monitor.overfit_evals": 2}


def bare_loop(config_yaml: str, steps: int, skip: int) -> float:
    """Child side of the overhead item: the trainer's own step Cell on the same batches, nothing else.

    Same device work as the trainer (its step Cell, clipping and loss-scale logic included); no metrics row,
    monitors, RSS sampling, record writes or per-step host reads. ms/step over steps skip+1 .. steps-1, each
    end synchronised by reading the loss.
    """
    import mindspore as ms
    from helpers.run.train import Trainer, configure_mindspore
    cfg = load_config(config_yaml)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(cfg, tmp)
        configure_mindspore(cfg)
        trainer._build()
        batches = iter(trainer._train_dataset(0).create_tuple_iterator(num_epochs=1, output_numpy=True))
        step = trainer.calls[0]
        for i in range(1, steps):
            x, y = next(batches)
            out = step(ms.Tensor(x), ms.Tensor(y))
            if i == skip:
                out[0].asnumpy()
                t0 = time.perf_counter()
        out[0].asnumpy()
        return (time.perf_counter() - t0) * 1000.0 / (steps - 1 - skip)


def monitored_loop(config_yaml: str, steps: int, skip: int) -> float:
    """Child side: the full trainer (metrics row, monitors, RSS, record writes), wall ms/step over the same
    window as `bare_loop`, stamped after each step's row is written (the final eval and checkpoint excluded)."""
    from helpers.run.train import Trainer
    cfg = load_config(config_yaml)
    stamps: dict[int, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        Trainer(cfg, tmp, lambda row, total: stamps.__setitem__(row["step"], time.perf_counter())).run()
    return (stamps[steps - 1] - stamps[skip]) * 1000.0 / (steps - 1 - skip)


def item_overhead(rounds: int, steps: int, skip: int = 10) -> dict:
    """Monitored / bare ms per step, each pair side by side, order alternating (A B, B A, ...); goal ≤ 1.02."""
    cfg = with_changes(load_config(NANO), {"steps": steps, "eval_every": 0, "eval_batches": 1,
                                           "steady_after": skip, **MONITORS_ON})
    bare, full = [], []
    with tempfile.TemporaryDirectory() as tmp:
        request = Path(tmp) / "request.yaml"
        request.write_text(dump(cfg))
        arms = {"bare": bare, "monitored": full}
        for i in range(rounds):
            for arm in (("bare", "monitored") if i % 2 == 0 else ("monitored", "bare")):
                arms[arm].append(float(_python(str(Path(__file__)), arm, str(request), str(steps), str(skip))
                                       .strip().splitlines()[-1]))
            print(f"  overhead pair {i + 1}: bare {bare[-1]:.1f} ms, monitored {full[-1]:.1f} ms "
                  f"(×{full[-1] / bare[-1]:.3f})", flush=True)
    ratios = [f / b for f, b in zip(full, bare)]
    ratio = statistics.median(ratios)
    return {"bare_ms": _spread(bare), "monitored_ms": _spread(full), "ratio": _spread(ratios),
            "ratio_of_medians": statistics.median(full) / statistics.median(bare), "goal": OVERHEAD_GOAL,
            "limit": OVERHEAD_LIMIT, "steps": steps, "window": [skip + 1, steps - 1], "monitors": MONITORS_ON,
            "load_avg": os.getloadavg(),
            "must": _must(ratio <= OVERHEAD_LIMIT, f"monitoring overhead ×{ratio:.3f} (median of {len(ratios)} "
                                                   f"pairs) {'≤' if ratio <= OVERHEAD_LIMIT else '>'} limit "
                                                   f"×{OVERHEAD_LIMIT}")}


def item_mfu(steps: int) -> dict:
    """Achieved MFU of the presets in graph mode against the fp32 matmul peak measured now (helpers.env)."""
    peak = float(_python("-c", "from helpers.run.env import peak_flops; print(peak_flops('CPU', 'fp32', 0, "
                               "refresh=True))").strip().splitlines()[-1])
    out = {"formula": "flops/token = 6·N + 12·L·d·T (N = parameters without position embeddings, L layers, "
                      "d width, T context); recompute not counted; MFU = tokens/s × flops/token ÷ peak",
           "peak_flops": peak, "load_avg": os.getloadavg()}
    print(f"  matmul peak (fp32, 1024³): {peak / 1e9:.1f} GFLOP/s", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for preset, batch in (("tiny", 16), ("nano", 12), ("small", 4)):
            run = Path(tmp) / preset
            _python("-m", "helpers", "train", "--config", str(NANO), "--set", f"model.preset={preset}",
                    "--set", f"batch_size={batch}", "--set", f"steps={steps}", "--set", "eval_every=0",
                    "--set", "eval_batches=1", "--set", "steady_after=5", "--set", "mode=graph",
                    "--out", str(run), "--progress", "none")
            s = load_run(run).summary
            out[preset] = {k: s[k] for k in ("n_params", "flops_per_token", "tokens_per_s", "step_time_ms",
                                             "mfu", "peak_flops")}
            out[preset]["batch_size"] = batch
            print(f"  MFU {preset}: {100 * s['mfu']:.1f}% at {s['tokens_per_s']:,.0f} tokens/s", flush=True)
    return out


def item_parity(iters: int) -> dict:
    """nanoGPT's shakespeare_char CPU config: val loss at `iters` iterations and wall time."""
    changes = {"steps": iters, "eval_every": 250, **NANOGPT_RECIPE}
    cfg = with_changes(load_config(NANO), changes)
    with tempfile.TemporaryDirectory() as tmp:
        request = Path(tmp) / "parity.yaml"
        request.write_text(dump(cfg))
        t0 = time.perf_counter()
        _python("-m", "helpers", "train", "--config", str(request), "--out", str(Path(tmp) / "run"),
                "--progress", "none", timeout=3600)
        wall = time.perf_counter() - t0
        record = load_run(Path(tmp) / "run")
    s = record.summary
    ok = s["val_loss"] is not None and s["val_loss"] <= PARITY_LIMIT
    return {"iters": iters, "val_loss": s["val_loss"], "nanogpt_readme_val_loss": NANOGPT_VAL_LOSS,
            "limit": PARITY_LIMIT,
            "must": _must(ok, f"val loss {s['val_loss']:.4f} at {iters} iterations {'≤' if ok else '>'} limit "
                              f"{PARITY_LIMIT} (nanoGPT {NANOGPT_VAL_LOSS})"),
            "wall_s": wall, "tokens_per_s": s["tokens_per_s"], "step_time_ms": s["step_time_ms"],
            "val_curve": [(r["step"], r["val_loss"]) for r in record.metrics if r["val_loss"] is not None]}


def item_workbook() -> dict:
    """Wall time of `make workbook` with default parameters (the main job), each notebook's seconds (from its
    log lines) and the 1-minute load average sampled throughout (the workbook's own training included)."""
    load_before = os.getloadavg()[0]
    t0 = time.perf_counter()
    with LoadSampler() as load:
        proc = subprocess.run(["make", "workbook"], cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    notebooks = {}
    for line in proc.stdout.splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[0][:2].isdigit() and parts[3] == "s":
            notebooks[parts[0]] = float(parts[2])
    ok = proc.returncode == 0 and wall <= WORKBOOK_LIMIT_S
    return {"wall_s": wall, "returncode": proc.returncode, "limit_s": WORKBOOK_LIMIT_S, "notebooks_s": notebooks,
            "load_1min": {**load.summary(), "before": load_before},
            "must": _must(ok, f"make workbook exited {proc.returncode} after {wall:.0f} s (limit: exit 0 within "
                              f"{WORKBOOK_LIMIT_S} s)")}


def table(results: dict) -> str:
    """The short markdown table of everything measured so far."""
    lines = ["| item | result | goal |", "|---|---|---|"]
    if "overhead" in results:
        r = results["overhead"]
        lines.append(f"| monitoring overhead | ×{r['ratio']['median']:.3f} (range {r['ratio']['min']:.3f}–"
                     f"{r['ratio']['max']:.3f}, {r['ratio']['n']} interleaved pairs; bare "
                     f"{r['bare_ms']['median']:.1f} ms, monitored {r['monitored_ms']['median']:.1f} ms) | "
                     f"≤ {OVERHEAD_GOAL} (must ≤ {OVERHEAD_LIMIT}) |")
    if "mfu" in results:
        if "peak_flops" in results["mfu"]:
            lines.append(f"| fp32 matmul peak (1024³, measured) | {results['mfu']['peak_flops'] / 1e9:.1f} GFLOP/s; "
                         f"{results['mfu']['formula']} | — |")
        for preset in ("tiny", "nano", "small"):
            r = results["mfu"][preset]
            lines.append(f"| MFU {preset} ({r['n_params']:,} params) | {100 * r['mfu']:.1f}% "
                         f"({r['tokens_per_s']:,.0f} tokens/s, peak {r['peak_flops'] / 1e9:.0f} GFLOP/s) | — |")
    if "parity" in results:
        r = results["parity"]
        lines.append(f"| nanoGPT-config parity | val loss {r['val_loss']:.4f} at {r['iters']} iters, "
                     f"{r['wall_s']:.0f} s, {r['tokens_per_s']:,.0f} tokens/s | ≤ {PARITY_LIMIT} (nanoGPT {NANOGPT_VAL_LOSS}) |")
    if "workbook" in results:
        r = results["workbook"]
        load = r.get("load_1min")
        load_text = f"; load {load['before']:.1f} before, {load['min']:.1f}–{load['max']:.1f} during" if load else ""
        lines.append(f"| `make workbook` wall time | {r['wall_s']:.0f} s (exit {r['returncode']}{load_text}) | "
                     f"exit 0, ≤ {WORKBOOK_LIMIT_S} s |")
    lines += noise_rows(results)
    lines += speed_rows(results)
    lines += ttq_rows(results)
    lines += power_rows(results)
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("item", choices=["all", "overhead", "mfu", "parity", "workbook", "aa", "clock", "bare",
                                    "monitored", "speed", "speedarm", "power", "ttq"])
    p.add_argument("args", nargs="*")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--iters", type=int, default=2000)
    p.add_argument("--trials", type=int, default=20, help="A/A checks (aa item); trials per kind and condition "
                                                       "(power item)")
    p.add_argument("--conditions", default="quiet,hog", help="power item: quiet, hog or both (comma-separated)")
    p.add_argument("--budget-min", type=float, default=20.0, help="ttq item: the auto-tuner's budget, minutes")
    p.add_argument("--seeds", type=int, default=2, help="ttq item: seeds per arm (target, tuner rounds, comparison)")
    p.add_argument("--results", type=Path, default=RESULTS, help="folder for <item>.json and README.md")
    p.add_argument("--preset", default="tiny", help="model preset of the aa and clock items")
    p.add_argument("--speed-steps", type=int, default=40, help="timed steps per arm per round (speed item)")
    a = p.parse_args()
    if a.item == "speedarm":
        print(json.dumps(arm_steps(a.args[0], int(a.args[1]), int(a.args[2]))))
        return 0
    if a.item in ("bare", "monitored"):
        print((bare_loop if a.item == "bare" else monitored_loop)(a.args[0], int(a.args[1]), int(a.args[2])))
        return 0
    a.results.mkdir(parents=True, exist_ok=True)
    items = ["overhead", "mfu", "parity", "workbook", "aa", "clock", "speed", "power", "ttq"] if a.item == "all" \
        else [a.item]
    runners = {"overhead": lambda: item_overhead(a.rounds, a.steps), "mfu": lambda: item_mfu(40),
               "parity": lambda: item_parity(a.iters), "workbook": item_workbook,
               "aa": lambda: item_aa(a.trials, a.preset), "clock": lambda: item_clock(3, a.preset),
               "speed": lambda: item_speed(max(a.rounds, 5), a.speed_steps),
               "power": lambda: item_power(a.trials, tuple(a.conditions.split(","))),
               "ttq": lambda: item_ttq(a.iters, a.budget_min, a.seeds, a.results)}
    results = {}
    for f in a.results.glob("*.json"):
        results[f.stem] = json.loads(f.read_text())
    for item in items:
        print(f"[bench] {item} …", flush=True)
        results[item] = runners[item]()
        atomic_write_json(a.results / f"{item}.json", results[item])
    text = table(results)
    (a.results / "README.md").write_text(text)
    print(text)
    missed = must_misses(results, items)
    for line in missed:
        print(f"bench: must limit missed: {line}", file=sys.stderr)
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
