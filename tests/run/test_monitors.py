"""Arithmetic of the monitors on synthetic rows (no training): spike periodicity, RSS slope, overfit rule."""
from __future__ import annotations

import pytest

from helpers.config import ConfigError, from_dict
from helpers.record import MetricColumns
from helpers.tune.diagnose import troubleshooting_rows
from helpers.run.monitors import (Monitors, effective_max_grad_norm, rising_while_falling, rss_slope, spike_period,
                              sustained_slope)


def test_spike_period_regular_irregular_and_too_few():
    assert spike_period([10, 60, 110, 160]) == 50
    assert spike_period([10, 61, 109, 160]) == pytest.approx(50, abs=1)
    assert spike_period([10, 30, 110, 115]) is None
    assert spike_period([10, 60]) is None


def test_rss_slope_bytes_per_step():
    steps = list(range(100, 150))
    assert rss_slope(steps, [5e8 + 2**20 * (s - 100) for s in steps]) == pytest.approx(2**20)
    assert rss_slope(steps, [5e8] * 50) == 0.0
    assert rss_slope([1], [5e8]) == 0.0
    jump = [5e8 if s < 125 else 5.5e8 for s in steps]  # the first eval's buffers: once, not a leak
    assert rss_slope(steps, jump) > 2**20 and sustained_slope(steps, jump) == 0.0
    assert sustained_slope(steps, [5e8 + 2**19 * (s - 100) for s in steps]) == pytest.approx(2**19)


def test_overfit_rule_needs_k_rises_and_falling_train_loss():
    rising = [(10, 5.0, 2.0), (20, 6.0, 1.8), (30, 7.0, 1.5), (40, 8.0, 1.2)]
    assert rising_while_falling(rising, 3)
    assert not rising_while_falling(rising[:3], 3)
    assert not rising_while_falling([(10, 5.0, 2.0), (20, 6.0, 1.8), (30, 5.5, 1.5), (40, 8.0, 1.2)], 3)
    assert not rising_while_falling([(10, 5.0, 1.0), (20, 6.0, 1.8), (30, 7.0, 1.5), (40, 8.0, 1.2)], 3)


def _row(step, loss, ema, rss=6e8, val_ppl=None, norm=1.0):
    return {"step": step, "loss": loss, "loss_ema": ema, "tokens": 256, "grad_norm": norm, "lr": 1e-3,
            "rss_bytes": rss, "val_ppl": val_ppl, "loss_scale": 1.0}


def test_monitors_flag_periodic_spikes_and_memory_growth(tmp_path):
    cfg = from_dict({}, ["steps=200", "monitor.memory_window=20"])
    mon = Monitors(cfg, tmp_path)
    rows = []
    for step in range(1, 201):
        spike = step % 40 == 0
        row = _row(step, 3.0 if spike else 2.0, 2.0, rss=6e8 + 2**20 * step)
        mon.on_row(row)
        rows.append(row)
    kinds = [a.kind for a in mon.alarms]
    assert kinds.count("loss_spike") == 5 and "every ~40 steps" in mon.alarms[-1].message
    assert "memory_growth" in kinds and rows[29]["alarms"] == "memory_growth"
    summary = mon.summary(MetricColumns.of_rows(rows))
    assert summary["spike_period"] == 40 and summary["alarm_counts"]["memory_growth"] == 1
    assert rows[-1]["loss_drop_per_ktok"] == 0.0


def test_grad_norm_stop_and_clip_settings(tmp_path):
    cfg = from_dict({}, ["monitor.grad_norm_limit=5", "monitor.grad_norm_action=stop"])
    mon = Monitors(cfg, tmp_path)
    assert mon.on_row(_row(1, 2.0, 2.0, norm=3.0)) is None
    assert "exceeded monitor.grad_norm_limit=5" in mon.on_row(_row(2, 2.0, 2.0, norm=7.0))
    assert effective_max_grad_norm(from_dict({}, ["monitor.grad_norm_limit=0.5",
                                                  "monitor.grad_norm_action=clip"])) == 0.5
    assert effective_max_grad_norm(from_dict({}, ["monitor.grad_norm_limit=0.5"])) == 1.0


def test_bad_callback_and_profile_window_are_one_line_errors(tmp_path):
    with pytest.raises(ConfigError, match="must look like 'package.module:factory'"):
        from_dict({}, ["monitor.callbacks=[nocolon]"])
    with pytest.raises(ConfigError, match="cannot be imported"):
        Monitors(from_dict({}, ["monitor.callbacks=[no_such_mod:f]"]), tmp_path)
    with pytest.raises(ConfigError, match="profile window"):
        from_dict({}, ["steps=30", "monitor.profile_steps=40"])


def test_troubleshooting_table_covers_every_finding():
    needed = ["data-bound", "compute-bound", "communication-bound", "memory-bound", "nan", "loss_spike",
              "grad_norm", "memory_growth", "overfit", "no_learning", "slow_compile"]
    for finding in needed:
        rows = troubleshooting_rows([finding])
        assert rows and all(r["causes"] and r["checks"] and r["fix"] for r in rows), finding
