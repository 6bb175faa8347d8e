"""Tables, plots, study helpers and the round panel, on hand-made run records (no training here)."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from helpers.book import plots, report
from helpers.config import ConfigError, from_dict
from helpers.record import RunRecord
from helpers.tune.study import accumulation_changes, base_config, break_even_steps, slug, try_config
from helpers.book.widgets import RoundPanel, parse_values


def record(name="run_1", steps=10, loss=lambda s: 4.0 - 0.1 * s, val=None, tokens_per_s=1000.0,
           peak=500 * 2**20, step_ms=20.0, compile_s=2.0, **cfg) -> RunRecord:
    """A run record made by hand: `loss(step)` per step, `val(step)` on even steps when given."""
    rows = []
    for s in range(1, steps + 1):
        v = val(s) if val and s % 2 == 0 else None
        rows.append({"step": s, "step_time_ms": compile_s * 1000 if s == 1 else step_ms, "data_wait_ms": 0.5,
                     "tokens": 768, "tokens_per_s": tokens_per_s, "loss": loss(s), "loss_ema": loss(s) + 0.05,
                     "grad_norm": 1.5, "loss_scale": 1.0, "overflow": 0, "lr": 1e-3, "rss_bytes": peak - 2**20,
                     "device_memory_bytes": None, "val_loss": v, "val_ppl": None if v is None else 2.718 ** v})
    summary = {"status": "ok", "steps": steps, "n_params": 106304, "step_time_ms": step_ms,
               "tokens_per_s": tokens_per_s, "mfu": 0.05, "peak_memory_bytes": peak, "data_wait_share": 0.02,
               "compile_s": compile_s, "loss_last": loss(steps), "val_loss": None}
    return RunRecord(Path("/x") / name, from_dict({"model": {"preset": "tiny"}}, cfg), rows, summary, {})


def test_runs_table_has_units_and_a_median_row():
    table = report.runs_table([record("a", tokens_per_s=1000.0), record("b", tokens_per_s=3000.0)])
    assert list(table.index) == ["a", "b", "median"]
    assert table.loc["median", "tokens/s"] == 2000.0
    assert table.loc["a", "peak RSS (MiB)"] == 500
    assert table.loc["a", "comm (% of step)"] == "n/a (single process)"
    assert table.loc["a", "MFU (% of matmul peak)"] == 5.0


def test_groups_table_one_median_row_per_group():
    table = report.groups_table({"ref": [record(step_ms=20.0), record(step_ms=30.0)], "cand": [record(step_ms=10.0)]})
    assert table.loc["ref", "step (ms)"] == 25.0 and table.loc["ref", "runs"] == 2
    assert table.loc["cand", "step (ms)"] == 10.0


def test_overfit_check_reads_the_trend():
    rising = record(steps=20, loss=lambda s: 4.0 - 0.1 * s, val=lambda s: 2.0 + 0.05 * s)
    assert "overfitting: validation loss rose 2.900 → 3.000 while training loss fell" in report.overfit_check(rising)
    following = record(steps=20, loss=lambda s: 4.0 - 0.1 * s, val=lambda s: 4.2 - 0.1 * s)
    line = report.overfit_check(following)
    assert "no overfitting: validation loss still falls" in line
    assert line.startswith("step 2: train 3.850, val 4.000 (gap +0.150)")  # train = mean of steps 1-2
    bump = record(steps=20, loss=lambda s: 3.0, val=lambda s: 3.0 - 0.1 * s if s < 16 else 1.8)
    assert "past the sweet spot: validation loss is above its best (1.600 at step 14)" in report.overfit_check(bump)
    assert "only 0 validation" in report.overfit_check(record())


def test_eval_table_lists_validation_steps():
    table = report.eval_table(record(steps=6, val=lambda s: 3.0))
    assert list(table.index) == [2, 4, 6]
    assert table.loc[4, "val PPL"] == pytest.approx(2.718 ** 3, abs=0.01)


def test_break_even_steps():
    # 2 s more compile, 0.4 s saved per step → 5 steps; not faster → None; cheaper compile → 0.
    assert break_even_steps(3.0, 100.0, 1.0, 500.0) == pytest.approx(5.0)
    assert break_even_steps(3.0, 500.0, 1.0, 100.0) is None
    assert break_even_steps(0.5, 100.0, 1.0, 500.0) == 0.0


def test_break_even_table_uses_medians():
    compiled = {"graph": [record(compile_s=3.0, step_ms=100.0)]}
    others = {"eager": [record(compile_s=1.0, step_ms=500.0)], "slow": [record(compile_s=1.0, step_ms=50.0)]}
    table = report.break_even_table(compiled, others)
    assert list(table["break-even (steps)"]) == [5, "never (not faster)"]


def test_waterfall_moves_only_on_kept_rounds():
    fig = plots.waterfall(1000.0, [("01 a", 1.5, "keep"), ("02 b", 0.5, "reject"), ("03 c", None, "failed")])
    bars = fig.axes[0].patches
    assert bars[-1].get_height() == pytest.approx(1500.0)  # 'best' = baseline × kept speed-up only
    assert bars[1].get_height() == pytest.approx(500.0) and bars[2].get_y() == pytest.approx(1500.0)


def test_plots_draw_one_line_per_run():
    groups = {"ref": [record(), record("run_2")], "cand": [record("run_3")]}
    for fn in (plots.loss_plot, plots.step_time_plot, plots.memory_plot, plots.data_wait_plot):
        assert len(fn(groups).axes[0].lines) == 3
    fig = plots.evaluation_plot(record(val=lambda s: 3.0))
    assert len(fig.axes) == 3
    assert len(plots.sweep_plot([(4, record()), (8, record())], "batch").axes[0].patches) == 2


def test_rounds_table_adds_failed_notebooks():
    verdict = SimpleNamespace(speedup=1.1, noise_band=0.05, loss_drift=0.001, memory_ratio=1.0, reason="r",
                              decision="keep", interval=[1.05, 1.16], level=0.999, pairs=8, path="paired")
    rnd = SimpleNamespace(index=1, name="batch_size", changes={"batch_size": (12, 24)}, verdict=verdict,
                          decision="keep", rollback=Path("/w/rounds/01/rollback"), override=None)
    table = report.rounds_table([rnd], {"05_batch_size": "ValueError: boom"})
    assert list(table["decision"]) == ["keep", "failed"]
    assert table.iloc[0]["interval"] == "tokens/s ×1.100, 99.9% interval ×1.050–×1.160 (8 pairs, paired)"
    assert table.iloc[1]["reason"] == "notebook failed: ValueError: boom"
    assert report.verdict_text(rnd).startswith("Round 1 'batch_size': batch_size 12 → 24 → KEEP — r")
    assert table.iloc[0][report.ROLLBACK] == "rounds/01/rollback"  # in the workbook folder: no machine path


def test_the_index_rounds_table_is_one_decision_line_with_the_reason_a_click_away_and_relative_paths(tmp_path):
    verdict = SimpleNamespace(speedup=1.1, noise_band=0.05, loss_drift=0.001, memory_ratio=1.0,
                              reason=f"the whole reason; resume with: python -m helpers resume {tmp_path}/workbook/x",
                              decision="keep", interval=[1.05, 1.16], level=0.999, pairs=8, path="paired")
    rnd = SimpleNamespace(index=1, name="batch_size", changes={"batch_size": (12, 24)}, verdict=verdict,
                          decision="keep", rollback=tmp_path / "workbook" / "rounds" / "01" / "rollback", override=None)
    page = report.rounds_html([rnd], {"05_batch_size": f"ValueError: no {tmp_path}/workbook/y"}, tmp_path)
    assert ("<b>KEEP</b> tokens/s ×1.100, 99.9% interval ×1.050–×1.160 (8 pairs, paired); loss drift +0.10%; "
            "memory ×1.00<details><summary>why</summary>the whole reason; resume with: python -m helpers resume "
            "workbook/x</details>") in page
    assert '<a href="workbook/rounds/01/rollback/">' in page and "notebook failed: ValueError: no workbook/y" in page
    assert str(tmp_path) not in page


def test_base_config_scales_with_steps():
    cfg = base_config("tiny", 50, "tinyshakespeare", {"batch_size": 8})
    assert (cfg.steps, cfg.warmup, cfg.eval_every, cfg.steady_after, cfg.batch_size) == (50, 10, 10, 5, 8)
    assert base_config("tiny", 10).steady_after == 3


def test_study_helpers_refuse_in_one_line():
    cfg = base_config("tiny", 10)
    assert try_config(cfg, {"amp_level": "O2", "amp_dtype": "bf16"}).startswith("refused: amp_dtype=bf16")
    assert try_config(cfg, {"amp_level": "O2"}) == "accepted"
    assert accumulation_changes(cfg, 3) == {"batch_size": 4, "grad_accum_steps": 3}
    with pytest.raises(ConfigError, match="does not divide batch_size=12"):
        accumulation_changes(cfg, 5)
    assert slug("data.order", "map_first") == "order_map_first"
    assert slug("mode", "pynative+jit") == "mode_pynative_jit"


class FakeWorkbook:
    """Records what the panel asks of a Workbook."""

    def __init__(self):
        self.calls = []
        self.cfg = base_config("tiny", 10)

    def best_config(self):
        return self.cfg

    def run_round(self, name, changes, progress=True):
        self.calls.append(("run_round", name, changes))
        verdict = SimpleNamespace(reason="tokens/s ×1.004 …", decision="no change", speedup=1.004,
                                  interval=[0.99, 1.02], level=0.993, pairs=16, path="paired", noise_band=0.015,
                                  rule="speed (paired: …)")
        return SimpleNamespace(index=len(self.calls), name=name, changes={k: (12, v) for k, v in changes.items()},
                               verdict=verdict, decision="no change", override=None, reference_runs=[],
                               candidate_runs=[])

    def decide(self, index, decision, who, why):
        self.calls.append(("decide", index, decision, who, why))

    def rollback(self, index):
        self.calls.append(("rollback", index))
        return self.cfg


def test_round_panel_calls_the_workbook():
    wb = FakeWorkbook()
    panel = RoundPanel(wb, "batch_size", "16, 24")
    results = panel.run()
    assert [c[1:] for c in wb.calls] == [("batch_size_16", {"batch_size": 16}), ("batch_size_24", {"batch_size": 24})]
    assert len(results) == 2 and "NO CHANGE" in panel.status.value
    assert "99.3% interval ×0.990–×1.020 (16 pairs, paired)" in panel.status.value  # the interval, not a band
    assert "rule: speed (paired" in panel.status.value
    panel.why.value = "more memory headroom"
    panel.decide("reject")
    assert wb.calls[-1] == ("decide", 2, "reject", "widget", "more memory headroom")
    panel.roll_back()
    assert wb.calls[-1] == ("rollback", 2) and "batch_size=12" in panel.status.value


def test_round_panel_refuses_bad_values_before_running():
    wb = FakeWorkbook()
    panel = RoundPanel(wb, "batch_size", "16, zero")
    assert panel.run() == [] and wb.calls == []
    assert "must be a whole number" in panel.status.value
    panel.decide("keep")
    assert "run a round first" in panel.status.value and wb.calls == []
    assert parse_values("O2, true, 0.001") == ["O2", True, 0.001]


def test_before_after_table_shows_mib_and_percent():
    rows = [{"metric": "peak memory", "unit": "bytes", "baseline": 800 * 2**20, "best": 600 * 2**20, "ratio": 0.75},
            {"metric": "MFU", "unit": "fraction", "baseline": 0.1234, "best": 0.2, "ratio": 1.62},
            {"metric": "comm share", "unit": "fraction", "baseline": None, "best": None, "ratio": None}]
    table = report.before_after_table(rows)
    assert table.loc["peak memory"].tolist() == ["MiB", 800, 600, 0.75]
    assert table.loc["MFU", "baseline"] == 12.34 and table.loc["MFU", "unit"] == "%"
    assert pd.isna(table.loc["comm share", "baseline"])
    assert "interval" not in table  # only the side-by-side row has one
    side = report.before_after_table(rows + [{"metric": "throughput, side by side", "unit": "tokens/s",
                                              "baseline": None, "best": None, "ratio": 1.4, "interval": [1.2, 1.6],
                                              "level": 0.998, "pairs": 6}])
    assert side.loc["throughput, side by side", "interval"] == "99.8%: ×1.200–×1.600, 6 pairs"
    assert side.loc["MFU", "interval"] == ""
    assert "809856" in report.before_after_table([{"metric": "model params", "unit": "parameters", "baseline": 809856,
                                                    "best": 809856, "ratio": 1.0}]).to_html()
    assert "809856.0" not in report.before_after_table([{"metric": "p", "unit": "parameters", "baseline": 809856,
                                                        "best": 809856, "ratio": 1.0}]).to_html()


def test_a_change_prints_floats_to_four_digits_unless_that_hides_the_change():
    text = report.changes_text({"batch_size": (12, 24), "lr": (0.001, 0.0014142135623730952),
                                "min_lr": (0.0001, 0.0001414213562373095), "eps": (1.00001e-8, 1e-8)})
    assert text == "batch_size 12 → 24, lr 0.001 → 0.001414, min_lr 0.0001 → 0.0001414, eps 1.00001e-08 → 1e-08"
