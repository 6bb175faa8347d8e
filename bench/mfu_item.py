"""`make bench` item `mfu`: achieved MFU of the presets in graph mode against both peaks each run names (the
hardware peak's arithmetic and the achievable matmul peak measured on the run's own shapes, helpers/run/peaks.py).
FLOPs/token = 6·N + 12·L·d·T (N = parameters without position embeddings, L layers, d width, T context); recompute
not counted; MFU = tokens/s × FLOPs/token ÷ peak."""
from __future__ import annotations

import tempfile
from pathlib import Path

from child import python
from helpers.record import load_run
from registry import MET, MISSED, MUST, NOT_MEASURED, Check, Item, Judgement, known, positive

NANO = Path(__file__).resolve().parent.parent / "configs" / "nano.yaml"
PRESETS = {"tiny": 16, "nano": 12, "small": 4}  # preset → batch size
KEYS = ("n_params", "flops_per_token", "tokens_per_s", "step_time_ms", "mfu", "mfu_hardware", "mfu_error",
        "peak_flops", "peak_flops_name", "peak_flops_shapes", "peak_flops_source", "peak_flops_load_avg",
        "peak_flops_hardware", "peak_flops_hardware_arithmetic")


def item_mfu(presets: list[str], steps: int) -> dict:
    """One graph-mode run per preset: its MFU against both of its peaks, what they were, and every step's ms."""
    out = {"presets": {}, "steps": steps}
    with tempfile.TemporaryDirectory() as tmp:
        for preset in presets:
            run = Path(tmp) / preset
            python("-m", "helpers", "train", "--config", str(NANO), "--set", f"model.preset={preset}",
                   "--set", f"batch_size={PRESETS[preset]}", "--set", f"steps={steps}", "--set", "eval_every=0",
                   "--set", "eval_batches=1", "--set", "steady_after=5", "--set", "mode=graph",
                   "--out", str(run), "--progress", "none")
            record = load_run(run)
            s = record.summary
            out["presets"][preset] = {"batch_size": PRESETS[preset], **{k: s.get(k) for k in KEYS},
                                      "step_times_ms": [r["step_time_ms"] for r in record.metrics]}
            print(f"  MFU {preset}: {100 * s['mfu']:.1f}% of the matmul peak, {100 * s['mfu_hardware']:.1f}% of the "
                  f"hardware peak, at {s['tokens_per_s']:,.0f} tokens/s", flush=True)
    return out


def rows(r: dict) -> list[tuple[str, str]]:
    return [(f"MFU {preset} ({p['n_params']:,} params, batch {p['batch_size']})",
             f"{100 * p['mfu']:.1f}% of the matmul peak ({p['peak_flops'] / 1e9:.1f} GFLOP/s, "
             f"{p['peak_flops_name']}; {p['peak_flops_source']}), {100 * p['mfu_hardware']:.1f}% of the hardware peak "
             f"({p['peak_flops_hardware_arithmetic']}), at {p['tokens_per_s']:,.0f} tokens/s")
            for preset, p in r["presets"].items()]


def _below_both(r: dict) -> Judgement:
    presets = r.get("presets") or {}
    if not presets:
        return Judgement(NOT_MEASURED, "no preset was run")
    over = [f"{preset}: {p['mfu_error'] or 'no MFU'}" for preset, p in presets.items()
            if p.get("mfu_error") or p.get("mfu") is None or p.get("mfu_hardware") is None]
    if over:
        return Judgement(MISSED, "; ".join(over))
    return Judgement(MET, "; ".join(f"{preset} {100 * p['mfu']:.1f}% and {100 * p['mfu_hardware']:.1f}%"
                                    for preset, p in presets.items()) + " of the matmul and hardware peaks")


ITEMS = [Item("mfu", "MFU of the presets against the hardware and the achievable matmul peak",
              lambda a: item_mfu(a.presets.split(","), a.mfu_steps), rows,
              (Check(MUST, "every preset's MFU is at most 100% of both peaks (above is impossible: a peak was "
                           "measured low or its arithmetic is wrong)", _below_both,
                     miss={"presets": {"tiny": {"mfu": 1.2, "mfu_hardware": 0.5,
                                                "mfu_error": "MFU above 100% (120.0% of the achievable matmul "
                                                             "peak)"}}}),),
              options=((("--presets",), {"default": ",".join(PRESETS), "help": "mfu: comma-separated presets"}),
                       (("--mfu-steps",), {"type": int, "default": 40, "help": "mfu: steps per run"})),
              check_args=lambda a: positive(a, "mfu_steps") or known("preset", a.presets.split(","), list(PRESETS)))]
