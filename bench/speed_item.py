"""`make bench` item `speed`: the nano config's step time per formulation (run as a script: one arm's turn).

Arms: `plain` (the formulation of commit 7c15080: MindSpore's LayerNorm/GELU/softmax kernels, per-tensor
gradient norm), each knob alone on top of plain, and the new default (the config's defaults). Each turn of an arm
is its own process running the trainer's own step Cell on the run's first batches (`warmup` steps untimed, then
`steps` timed, each synchronised by reading its loss); the arms take turns for `rounds` rounds in rotating order,
so load that drifts over minutes hits every arm alike. Not one process for all arms: there, the step time of a
graph depended on how many graphs were built after it (the same plain config measured 64 ms/step built first and
40 ms/step built last, interleaved). Reported per arm: p10 and median ms/step and tokens/s over every timed step;
the speed-up is plain ÷ default on p10 and median, and per round (a pair = one plain and one default turn of the
same round).
"""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from helpers.config import dump, load_config, with_changes
from helpers.run.kernels import resolve_kernels
from helpers.spawn.runner import child_env
from helpers.tune.fusion import PLAIN_FORMULATION
from registry import GOAL, MUST, Check, Item, at_least, positive

REPO = Path(__file__).resolve().parent.parent
NANO = REPO / "configs" / "nano.yaml"
SPEEDUP_GOAL, SPEEDUP_LIMIT = 1.6, 1.4  # today's ms/step ÷ the new default's

PLAIN = PLAIN_FORMULATION  # today's formulation (commit 7c15080): every formulation knob at MindSpore's own ops
# Each knob alone, switched to its fast value on top of plain.
KNOBS = {"norm_backward=manual": {"model.norm_backward": "manual"}, "gelu=erf_manual": {"model.gelu": "erf_manual"},
         "grad_norm=flat": {"grad_norm": "flat"}, "kernels=native": {"model.kernels": "native"}}


def arm_configs() -> dict[str, dict]:
    """Arm name → config changes on top of configs/nano.yaml ('default' = no changes: the new defaults)."""
    return {"plain": dict(PLAIN), **{k: {**PLAIN, **v} for k, v in KNOBS.items()}, "default": {}}


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1) + 0.5))]


def arm_steps(config_yaml: str, steps: int, warmup: int) -> list[float]:
    """Child side: ms of each of `steps` timed steps of the config's step Cell, after `warmup` untimed ones."""
    import mindspore as ms
    from helpers.run.build import build
    from helpers.run.data import prepare, train_dataset
    from helpers.run.train import configure_mindspore
    cfg = load_config(config_yaml)
    with tempfile.TemporaryDirectory() as tmp:
        prep = prepare(cfg, Path(tmp))
        configure_mindspore(cfg)
        step, times = build(cfg, prep, Path(tmp), resolve_kernels(cfg)).calls[0], []
        it = train_dataset(cfg, prep).create_tuple_iterator(num_epochs=1, output_numpy=True)
        batches = [(ms.Tensor(x), ms.Tensor(y)) for (x, y), _ in zip(it, range(8))]
        for i in range(warmup + steps):
            t0 = time.perf_counter()
            step(*batches[i % len(batches)])[0].asnumpy()
            if i >= warmup:
                times.append((time.perf_counter() - t0) * 1000.0)
    return times


def item_speed(rounds: int = 5, steps: int = 40, warmup: int = 5, batch_size: int | None = None) -> dict:
    """ms/step and tokens/s of each arm on the nano config; speed-up of the new default over plain (goal ≥ 1.4)."""
    base = load_config(NANO)
    if batch_size:
        base = with_changes(base, {"batch_size": batch_size})
    tokens = base.tokens_per_micro_batch  # the arms time one micro-batch per call
    with tempfile.TemporaryDirectory() as tmp:
        arms = {}
        for name, changes in arm_configs().items():
            path = Path(tmp) / f"{name.replace('=', '_')}.yaml"
            path.write_text(dump(with_changes(base, changes)))
            arms[name] = str(path)
        names, times = list(arms), {name: [] for name in arms}
        for r in range(rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:  # rotate: no arm always first or last
                proc = subprocess.run([sys.executable, __file__, "arm", arms[name], str(steps), str(warmup)],
                                      capture_output=True, text=True, cwd=REPO, env=child_env())
                if proc.returncode != 0:
                    raise RuntimeError(f"speed arm {name} failed: {proc.stderr[-1500:]}")
                times[name].append(json.loads(proc.stdout.strip().splitlines()[-1]))
            print(f"  speed round {r + 1}/{rounds}: " + ", ".join(f"{n} {statistics.median(times[n][-1]):.1f}"
                                                                  for n in names) + " ms", flush=True)
        child = {"times": times, "kernels": {n: resolve_kernels(load_config(arms[n])) for n in names}}
    out = {"config": "configs/nano.yaml", "batch_size": base.batch_size, "tokens_per_step": tokens,
           "rounds": rounds, "steps_per_turn": steps, "warmup_steps": warmup, "arm_changes": arm_configs(),
           "kernels": child["kernels"], "times_ms": child["times"], "arms": {}}
    for name, per_round in child["times"].items():
        flat = [t for row in per_round for t in row]
        p10, med = _quantile(flat, 0.10), statistics.median(flat)
        out["arms"][name] = {"p10_ms": p10, "median_ms": med, "tokens_per_s_p10": tokens / (p10 / 1000.0),
                             "tokens_per_s_median": tokens / (med / 1000.0),
                             "round_medians_ms": [statistics.median(r) for r in per_round]}
    plain, new = out["arms"]["plain"], out["arms"]["default"]
    pairs = [p / d for p, d in zip(plain["round_medians_ms"], new["round_medians_ms"])]
    out["speedup"] = {"p10": plain["p10_ms"] / new["p10_ms"], "median": plain["median_ms"] / new["median_ms"],
                      "per_pair": pairs, "pairs": len(pairs)}
    for name, arm in out["arms"].items():
        print(f"  {name:22s} p10 {arm['p10_ms']:6.1f} ms  median {arm['median_ms']:6.1f} ms  "
              f"(×{plain['median_ms'] / arm['median_ms']:.2f} vs plain)", flush=True)
    return out


def rows(r: dict) -> list[tuple[str, str]]:
    s, plain, new = r["speedup"], r["arms"]["plain"], r["arms"]["default"]
    knobs = ", ".join(f"{k} ×{plain['median_ms'] / r['arms'][k]['median_ms']:.2f}" for k in KNOBS if k in r["arms"])
    return [("speed, nano config: plain (7c15080's formulation) ÷ new default ms/step",
             f"×{s['median']:.2f} median, ×{s['p10']:.2f} p10 ({new['median_ms']:.1f} vs {plain['median_ms']:.1f} "
             f"ms/step, {new['tokens_per_s_median']:,.0f} tokens/s; {s['pairs']} interleaved rounds; each knob alone: "
             f"{knobs})")]


def _speedup(kind: str, limit: float) -> Check:
    def judge(r: dict):
        median = (r.get("speedup") or {}).get("median")
        return at_least(median, limit, f"new default ×{median or 0:.2f} per step of the plain formulation's (median) "
                                       f"{{sign}} ×{limit}")
    return Check(kind, f"plain ÷ new default ms/step (median) ≥ ×{limit}", judge,
                 miss={"speedup": {"median": limit - 0.2}} if kind == MUST else None)


ITEMS = [Item("speed", "the nano config's ms/step per formulation, arms in turns of their own processes",
              lambda a: item_speed(max(a.rounds, 5), a.speed_steps), rows,
              (_speedup(MUST, SPEEDUP_LIMIT), _speedup(GOAL, SPEEDUP_GOAL)),
              options=((("--rounds",), {"type": int, "default": 5, "help": "pairs (overhead), rounds (speed)"}),
                       (("--speed-steps",), {"type": int, "default": 40,
                                             "help": "speed: timed steps per arm per round"})),
              check_args=lambda a: positive(a, "rounds", "speed_steps"))]

if __name__ == "__main__":  # one arm's turn: python bench/speed_item.py arm CONFIG STEPS WARMUP
    print(json.dumps(arm_steps(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))))
