"""`make bench`: ratios measured side by side in one run (interleaved A B A B, medians, spread).

Items: monitoring overhead (the full trainer vs a bare step loop), MFU of the presets against the
measured matmul peak, nanoGPT-config parity (val loss at 2000 iterations), headless workbook wall time.
Results go to bench/results/<item>.json and bench/results/README.md.
"""
from __future__ import annotations

import argparse
import json
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
from helpers.runner import child_env  # noqa: E402

RESULTS = REPO / "bench" / "results"
NANO = REPO / "configs" / "nano.yaml"


def _python(*args: str, timeout: float = 1800) -> str:
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=REPO, env=child_env(),
                          timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args[:3])} failed: {proc.stderr[-1500:]}")
    return proc.stdout


def _spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def bare_loop(config_yaml: str, steps: int, skip: int) -> float:
    """Child side of the overhead item: the same Cells and data, a loop with nothing else (ms/step)."""
    import mindspore as ms
    from helpers.train import Trainer, configure_mindspore
    cfg = load_config(config_yaml)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(cfg, tmp)
        configure_mindspore(cfg)
        trainer._build()
        batches = iter(trainer._train_dataset(0).create_tuple_iterator(num_epochs=1, output_numpy=True))
        step = trainer.calls[0]
        for i in range(steps):
            if i == skip:
                t0 = time.perf_counter()
            x, y = next(batches)
            out = step(ms.Tensor(x), ms.Tensor(y))
        out[0].asnumpy()
        return (time.perf_counter() - t0) * 1000.0 / (steps - skip)


def monitored_loop(cfg, run_dir: Path) -> float:
    """The full trainer (every metric, alarm, record write) in its own process: mean steady ms/step."""
    _python("-m", "helpers", "train", "--config", str(run_dir / "request.yaml"), "--out", str(run_dir),
            "--progress", "none")
    rows = load_run(run_dir).metrics[cfg.steady_after:]
    return statistics.fmean(r["step_time_ms"] for r in rows)


def item_overhead(rounds: int, steps: int) -> dict:
    """Monitored / bare ms per step, interleaved A B A B; goal ≤ 1.02."""
    cfg = with_changes(load_config(NANO), {"steps": steps, "eval_every": 0, "eval_batches": 1,
                                           "steady_after": 10})
    bare, full = [], []
    with tempfile.TemporaryDirectory() as tmp:
        request = Path(tmp) / "request.yaml"
        request.write_text(dump(cfg))
        for i in range(rounds):
            bare.append(float(_python(str(Path(__file__)), "bare", str(request), str(steps), "10").strip()))
            run = Path(tmp) / f"run{i}"
            run.mkdir()
            (run / "request.yaml").write_text(dump(cfg))
            full.append(monitored_loop(cfg, run))
            print(f"  overhead round {i + 1}: bare {bare[-1]:.1f} ms, monitored {full[-1]:.1f} ms", flush=True)
    ratios = [f / b for f, b in zip(full, bare)]
    return {"bare_ms": _spread(bare), "monitored_ms": _spread(full), "ratio": _spread(ratios),
            "ratio_of_medians": statistics.median(full) / statistics.median(bare), "goal": 1.02, "limit": 1.05}


def item_mfu(steps: int) -> dict:
    """Achieved MFU of the presets in graph mode against the measured fp32 matmul peak."""
    out = {"formula": "flops/token = 6·N + 12·L·d·T (N without position embeddings); recompute not counted"}
    with tempfile.TemporaryDirectory() as tmp:
        for preset, batch in (("tiny", 16), ("nano", 12), ("small", 4)):
            run = Path(tmp) / preset
            _python("-m", "helpers", "train", "--config", str(NANO), "--set", f"model.preset={preset}",
                    "--set", f"batch_size={batch}", "--set", f"steps={steps}", "--set", "eval_every=0",
                    "--set", "eval_batches=1", "--set", "steady_after=5", "--out", str(run), "--progress", "none")
            s = load_run(run).summary
            out[preset] = {k: s[k] for k in ("n_params", "flops_per_token", "tokens_per_s", "step_time_ms",
                                             "mfu", "peak_flops")}
            print(f"  MFU {preset}: {100 * s['mfu']:.1f}% at {s['tokens_per_s']:,.0f} tokens/s", flush=True)
    return out


def item_parity(iters: int) -> dict:
    """nanoGPT's shakespeare_char CPU config: val loss at `iters` iterations and wall time."""
    changes = {"steps": iters, "eval_every": 250, "eval_batches": 20, "warmup": 100, "lr": 1e-3, "min_lr": 1e-4,
               "betas": [0.9, 0.99], "weight_decay": 0.1, "max_grad_norm": 1.0, "batch_size": 12}
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
    return {"iters": iters, "val_loss": s["val_loss"], "nanogpt_readme_val_loss": 1.88, "limit": 1.95,
            "wall_s": wall, "tokens_per_s": s["tokens_per_s"], "step_time_ms": s["step_time_ms"],
            "val_curve": [(r["step"], r["val_loss"]) for r in record.metrics if r["val_loss"] is not None]}


def item_workbook() -> dict:
    """Wall time of `make workbook` with default parameters (the main job)."""
    t0 = time.perf_counter()
    proc = subprocess.run(["make", "workbook"], cwd=REPO, capture_output=True, text=True)
    return {"wall_s": time.perf_counter() - t0, "returncode": proc.returncode, "limit_s": 600}


def table(results: dict) -> str:
    """The short markdown table of everything measured so far."""
    lines = ["| item | result | goal |", "|---|---|---|"]
    if "overhead" in results:
        r = results["overhead"]
        lines.append(f"| monitoring overhead | ×{r['ratio']['median']:.3f} (range {r['ratio']['min']:.3f}–"
                     f"{r['ratio']['max']:.3f}, {r['ratio']['n']} interleaved pairs; bare "
                     f"{r['bare_ms']['median']:.1f} ms, monitored {r['monitored_ms']['median']:.1f} ms) | ≤ 1.02 |")
    if "mfu" in results:
        for preset in ("tiny", "nano", "small"):
            r = results["mfu"][preset]
            lines.append(f"| MFU {preset} ({r['n_params']:,} params) | {100 * r['mfu']:.1f}% "
                         f"({r['tokens_per_s']:,.0f} tokens/s, peak {r['peak_flops'] / 1e9:.0f} GFLOP/s) | — |")
    if "parity" in results:
        r = results["parity"]
        lines.append(f"| nanoGPT-config parity | val loss {r['val_loss']:.4f} at {r['iters']} iters, "
                     f"{r['wall_s']:.0f} s, {r['tokens_per_s']:,.0f} tokens/s | ≤ 1.95 (nanoGPT 1.88) |")
    if "workbook" in results:
        r = results["workbook"]
        lines.append(f"| `make workbook` wall time | {r['wall_s']:.0f} s (exit {r['returncode']}) | ≤ 600 s |")
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("item", choices=["all", "overhead", "mfu", "parity", "workbook", "bare"])
    p.add_argument("args", nargs="*")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--iters", type=int, default=2000)
    a = p.parse_args()
    if a.item == "bare":
        print(bare_loop(a.args[0], int(a.args[1]), int(a.args[2])))
        return 0
    RESULTS.mkdir(parents=True, exist_ok=True)
    items = ["overhead", "mfu", "parity", "workbook"] if a.item == "all" else [a.item]
    runners = {"overhead": lambda: item_overhead(a.rounds, a.steps), "mfu": lambda: item_mfu(40),
               "parity": lambda: item_parity(a.iters), "workbook": item_workbook}
    results = {}
    for f in RESULTS.glob("*.json"):
        results[f.stem] = json.loads(f.read_text())
    for item in items:
        print(f"[bench] {item} …", flush=True)
        results[item] = runners[item]()
        atomic_write_json(RESULTS / f"{item}.json", results[item])
    text = table(results)
    (RESULTS / "README.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
