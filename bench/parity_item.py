"""`make bench` item `parity`: nanoGPT's shakespeare-char CPU config (its recipe, ttq_item.NANOGPT_RECIPE) trained by
this project: validation loss at `iters` iterations (nanoGPT's README: 1.88 on CPU), wall time, tokens/s."""
from __future__ import annotations

import tempfile
import time
from pathlib import Path

from child import python
from helpers.config import dump, load_config, with_changes
from helpers.record import load_run
from registry import MUST, Check, Item, at_most, positive
from ttq_item import NANOGPT_RECIPE

NANO = Path(__file__).resolve().parent.parent / "configs" / "nano.yaml"
NANOGPT_VAL_LOSS, PARITY_LIMIT = 1.88, 1.95  # val loss at 2000 iterations (nanoGPT's README: 1.88 on CPU)


def item_parity(iters: int) -> dict:
    """One run of nanoGPT's config for `iters` iterations: its validation curve, wall seconds and speed."""
    cfg = with_changes(load_config(NANO), {"steps": iters, "eval_every": 250, **NANOGPT_RECIPE})
    with tempfile.TemporaryDirectory() as tmp:
        request = Path(tmp) / "parity.yaml"
        request.write_text(dump(cfg))
        t0 = time.perf_counter()
        python("-m", "helpers", "train", "--config", str(request), "--out", str(Path(tmp) / "run"),
               "--progress", "none", timeout=3600)
        wall = time.perf_counter() - t0
        record = load_run(Path(tmp) / "run")
    s = record.summary
    return {"iters": iters, "val_loss": s["val_loss"], "nanogpt_readme_val_loss": NANOGPT_VAL_LOSS, "wall_s": wall,
            "tokens_per_s": s["tokens_per_s"], "step_time_ms": s["step_time_ms"],
            "val_curve": [(r["step"], r["val_loss"]) for r in record.metrics if r["val_loss"] is not None]}


def rows(r: dict) -> list[tuple[str, str]]:
    return [(f"nanoGPT-config parity ({r['iters']} iterations)",
             f"val loss {r['val_loss']:.4f} (nanoGPT's README: {r['nanogpt_readme_val_loss']}), {r['wall_s']:.0f} s "
             f"wall, {r['tokens_per_s']:,.0f} tokens/s")]


ITEMS = [Item("parity", "nanoGPT's CPU config: validation loss after its iterations",
              lambda a: item_parity(a.iters), rows,
              (Check(MUST, f"val loss at the iterations run ≤ {PARITY_LIMIT} (nanoGPT {NANOGPT_VAL_LOSS})",
                     lambda r: at_most(r.get("val_loss"), PARITY_LIMIT,
                                       f"val loss {r.get('val_loss') or 0:.4f} at {r.get('iters')} iterations {{sign}} "
                                       f"limit {PARITY_LIMIT} (nanoGPT {NANOGPT_VAL_LOSS})"),
                     miss={"val_loss": 2.5, "iters": 20}),),
              options=((("--iters",), {"type": int, "default": 2000, "help": "iterations (parity, ttq)"}),),
              check_args=lambda a: positive(a, "iters"))]
