"""MindSpore LLM-training tuning workbook.

The floors, each importing only from its own floor or below (tests/test_layers.py checks it):
    config, record, paths   the contract: typed config, the run record, where things live
    run/                    one training process: data, model, step Cells, train loop, metrics, monitors
    spawn/                  starting runs: one process (runner) or msrun's data-parallel ranks
    tune/                   deciding: rounds + ledger, the keep/reject rules, diagnosis, suggestions, autotune
    book/                   showing: tables, plots, widgets, studies, planner, the notebook runner
    cli                     every `python -m helpers` subcommand

Notebooks import everything from here (`from helpers import Workbook, loss_plot`). Names load lazily, so
importing this package does not import MindSpore, pandas or matplotlib; a training process imports only its floor.
"""
from __future__ import annotations

import importlib

_HOMES = {
    "helpers.config": ("Config", "ConfigError", "load_config", "from_dict", "with_changes"),
    "helpers.record": ("RunRecord", "RecordError", "load_run", "median_summary", "memory_label", "memory_source"),
    "helpers.run.env": ("environment",),
    "helpers.run.peaks": ("hardware_peak", "matmul_shapes", "peak_flops", "peak_flops_info"),
    "helpers.run.profile": ("load_profile", "with_profiler"),
    "helpers.run.device_profile": ("read_op_table",),
    "helpers.spawn.runner": ("launch", "profile_run"),
    "helpers.tune.rounds": ("Workbook", "RoundError", "load_runs"),
    "helpers.tune.rules": ("Verdict",),
    "helpers.tune.convergence": ("compare_tokens", "eval_curve", "time_to_target"),
    "helpers.tune.diagnose": ("diagnose", "write_bottleneck"),
    "helpers.tune.suggest": ("suggest", "suggest_for", "suggestions_table"),
    "helpers.tune.autotune": ("autotune",),
    "helpers.tune.ttq_search": ("autotune_time_to_target", "recipe_changes"),
    "helpers.tune.ttq_levers": ("lever_changes",),
    "helpers.tune.fusion": ("best_profile", "fusion_base", "op_table_shift", "profile_arms", "round_op_shift",
                            "runnable_rounds", "shift_summary"),
    "helpers.tune.study": ("accumulation_changes", "accumulation_sweep", "base_config", "compile_cache_runs",
                           "run_rounds", "run_variants", "study_dir", "sweep", "try_config", "workbook_config"),
    "helpers.book.report": ("alarms_table", "amp_audit_table", "amp_audit_text", "before_after_table",
                            "break_even_table", "convergence_table", "environment_table", "eval_table",
                            "groups_table", "ledger_table", "overfit_check", "results_groups", "rollback_table",
                            "round_groups", "round_points", "round_table", "rounds_groups", "rounds_table",
                            "runs_table", "speed_reading", "sweep_groups", "time_to_target_before_after",
                            "time_to_target_table", "verdict_lines", "verdict_text", "waterfall_steps"),
    "helpers.book.plots": ("data_wait_plot", "evaluation_plot", "loss_plot", "memory_plot", "op_shift_plot",
                           "step_parts_plot", "step_time_plot", "sweep_plot", "val_loss_time_plot",
                           "val_loss_tokens_plot", "waterfall"),
    "helpers.book.widgets": ("round_panel", "suggestion_panel"),
    "helpers.book.live": ("live_curves",),
    "helpers.book.planner": ("msrun_commands",),
    "helpers.book.tensorboard": ("export_tensorboard",),
    "helpers.book.bring_your_own": ("export_weights", "from_weights", "load_recipe", "recipe_plan", "recipe_table",
                                     "tryout_config"),
    "helpers.mindformers": ("import_mindformers", "read_yaml", "scaled"),
    "helpers.book.dp_study": ("comm_table", "dp_configs", "fusion_records", "fusion_study", "hand_arithmetic_7b",
                              "loss_diff_plot", "loss_equivalence", "memory_check", "run_all", "strategy_table"),
}
_WHERE = {name: module for module, names in _HOMES.items() for name in names}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'helpers' has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
