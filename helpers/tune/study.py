"""Measurements the notebooks need beside rounds: the notebooks' base config, one-run-per-value sweeps,
cold vs warm compile cache, the graph-mode break-even step count, and configs the device refuses.

Their runs go into fixed folders, so a notebook run twice finds its earlier runs there: a finished run of the same
config is reused, any other record moved aside, and a printed line says which (`runner.launch_or_reuse`)."""
from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path
from typing import Any

from helpers import config as config_mod
from helpers.config import Config, ConfigError, from_dict, with_changes
from helpers.record import CONFIG_FILE, RunRecord
from helpers.run.outdir import finished_same
from helpers.spawn.runner import launch, launch_or_reuse, reuse
from helpers.tune.lr_rule import DEFAULT_LR_RULE


# What an empty shortcut means without a config file: the workbook's own short nano run on tiny shakespeare.
SHORTCUT_DEFAULTS = {"preset": "nano", "steps": 50, "corpus": "tinyshakespeare"}


def config_path(config: str | os.PathLike, base: str | os.PathLike | None = None) -> Path | None:
    """The config file a `config` notebook parameter names: None for "", else the path made absolute against
    `base` (default: the working directory, which is the notebook's folder in a notebook)."""
    if not config:
        return None
    p = Path(config).expanduser()
    return p if p.is_absolute() else Path(base or os.getcwd()) / p


def base_config(preset: str = "", steps: int = 0, corpus: str | list[str] = "",
                changes: dict[str, Any] | None = None, config: str | os.PathLike = "",
                defaults: dict[str, Any] | None = None) -> Config:
    """The config a notebook starts from, with preset/steps/corpus as shortcuts on top and `changes` last.

    config: a YAML config file (relative: to the working directory), read with `config.load_config` (the bounded
    YAML loader); "" = none. Without one, an empty shortcut takes `defaults` (default SHORTCUT_DEFAULTS: nano, 50
    steps, tiny shakespeare), as every shortcut did before; with one, only the shortcuts given apply:
    preset sets model.preset and drops the dims the preset sets (n_layer, n_head, d_model, seq_len), so its dims
    replace the file's; corpus sets data.corpus; steps sets steps with the short-run spacing: eval_every = steps/5
    with 5 validation batches, the first min(5, steps/3) steps left out of speed, and a warm-up of steps/5 unless
    the file gives warmup_ratio (a share of steps, kept)."""
    path = config_path(config)
    if path is None:
        given = {**SHORTCUT_DEFAULTS, **(defaults or {})}
        preset, steps, corpus = preset or given["preset"], steps or given["steps"], corpus or given["corpus"]
        data: dict[str, Any] = {}
    else:
        data = config_mod.to_dict(config_mod.load_config(path))
    if preset:
        data["model"] = {k: v for k, v in (data.get("model") or {}).items()
                         if k not in config_mod.PRESETS.get(preset, {})}
        data["model"]["preset"] = preset
    if corpus:
        data.setdefault("data", {})["corpus"] = [corpus] if isinstance(corpus, str) else list(corpus)
    short: dict[str, Any] = {}
    if steps:
        short = {"steps": steps, "eval_every": max(1, steps // 5), "eval_batches": 5,
                 "steady_after": max(1, min(5, steps // 3))}
        if not data.get("warmup_ratio"):
            short["warmup"] = max(1, steps // 5)
    return from_dict(data, {**short, **(changes or {})})


# Where the shared workbook starts without a config file: MindSpore as a newcomer meets it (PyNative, its default
# mode, with the train step in ms.jit as its tutorials write it; its own operators; one data worker), so the rounds
# show what each setting pays here; or eager PyNative (no ms.jit: ~14× slower a nano step here, 940 against 68 ms,
# so every round before 04's takes minutes); or the workbook's own nano defaults (graph mode, native kernels on CPU).
START_FROM = {"mindspore_defaults": {"mode": "pynative", "jit_level": "O0", "model.kernels": "mindspore",
                                     "data.num_parallel_workers": 1},
              "eager": {"mode": "pynative", "jit_level": "none", "model.kernels": "mindspore",
                        "data.num_parallel_workers": 1},
              "tuned": {}}


def workbook_config(preset: str = "", steps: int = 0, corpus: str | list[str] = "",
                    config: str | os.PathLike = "", start_from: str = "mindspore_defaults") -> Config:
    """The shared workbook's baseline config (01 pins it, 15 reopens it): `base_config`, and without a config file
    the START_FROM settings named by `start_from` on top (a config file is the user's own start: it is taken as
    it is). ConfigError (one line) for an unknown start_from."""
    if start_from not in START_FROM:
        raise ConfigError(f"start_from={start_from!r} is not one of {', '.join(map(repr, START_FROM))}")
    return base_config(preset, steps, corpus, changes=None if config else START_FROM[start_from], config=config)


def round_applies(cfg: Config, name: str, changes: dict[str, Any], objective: str = "speed", seeds: int = 2,
                  lr_rule: str = DEFAULT_LR_RULE) -> str:
    """'' when the round of `changes` on `cfg` (a workbook's best) can run and judge here, else one line saying
    why it does not apply to this config: a change the config has already (or refuses; `model.kernels=auto`
    already running the kernels asked for), a warm-up the config's warmup_ratio overrides, a convergence or
    time-to-target round on a config with no validation (eval_every=0), or a candidate that cannot fit in memory
    (`footprint.check_fits`)."""
    from helpers.run.footprint import check_fits
    from helpers.tune.ledger import RoundError
    from helpers.tune.round_spec import plan_round
    if set(changes) == {"warmup"} and cfg.warmup_ratio:
        return (f"round {name} does not apply to this config: it sets warmup_ratio={cfg.warmup_ratio:g}, which "
                f"replaces warmup (set warmup_ratio=0 in the config to run it)")
    if objective != "speed" and not cfg.eval_every:
        return (f"round {name} does not apply to this config: a {objective} round reads validation loss, and "
                f"the config has eval_every=0 (no validation); give steps= or set eval_every")
    try:
        if set(changes) == {"model.kernels"}:  # `auto` resolves to a formulation: the same one is no round
            from helpers.run.kernels import resolve_kernels
            now = resolve_kernels(cfg)
            if resolve_kernels(with_changes(cfg, changes)) == now and cfg.model.kernels != changes["model.kernels"]:
                return (f"round {name} does not apply to this config: model.kernels={cfg.model.kernels!r} runs the "
                        f"{now} kernels here already")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            spec = plan_round(cfg, name, changes, objective, seeds, None, None, lr_rule)
        for arm in spec.arms:
            check_fits(arm)
    except (ConfigError, RoundError) as exc:
        text = str(exc).removeprefix(f"round {name!r}: ")
        return f"round {name} does not apply to this config: {text}"
    return ""


def run_round_if_applies(wb, name: str, changes: dict[str, Any], **kwargs):
    """`wb.run_round(name, changes, **kwargs)` when `round_applies` to the workbook's best config; otherwise print
    its one line and return None (nothing trains, the notebook goes on). A round recorded already comes back."""
    done = wb._state().recorded(name, changes, kwargs.get("objective", "speed"))  # a notebook run again
    why = "" if done is not None else round_applies(
        wb.best_config(), name, changes, kwargs.get("objective", "speed"), kwargs.get("seeds", 2),
        kwargs.get("lr_rule", DEFAULT_LR_RULE))
    if why:
        print(why)
        return None
    return wb.run_round(name, changes, **kwargs)


def data_parallel_applies(cfg: Config, processes: int = 2, limit: int | None = None) -> str:
    """'' when `processes` data-parallel copies of cfg can train on this machine, else one line why not: the
    config refuses it (cores, a batch the processes do not divide) or the copies together cannot fit in memory
    (`footprint.check_fits` of the data-parallel config against `limit` bytes, default the memory gate's)."""
    from helpers.run.footprint import check_fits
    try:
        check_fits(with_changes(cfg, {"parallel.data_parallel": processes}), limit)
    except ConfigError as exc:
        return f"data parallel ({processes} processes) does not apply to this config: {exc}"
    return ""


def export_applies(cfg: Config) -> str:
    """'' when a run of cfg can be exported as Hugging Face weights (`hf_weights.layout_for` finds its layout), else
    one line why the from-weights study does not apply to this config."""
    from helpers.run.hf_weights import WeightsError, layout_for
    try:
        layout_for(cfg.model)
    except WeightsError as exc:
        return f"the from-weights study does not apply to this config: {exc}"
    return ""


def shortcuts_of(cfg: Config) -> tuple[str, str]:
    """(preset, corpus) of a built config, as a preset-and-corpus helper takes them (`tryout_config`): its model
    preset ('nano' for custom dims) and its first corpus."""
    preset = cfg.model.preset if cfg.model.preset in config_mod.PRESETS else SHORTCUT_DEFAULTS["preset"]
    return preset, cfg.data.corpus[0]


def slug(key: str, value: Any) -> str:
    """A folder / round name for key=value: 'data.order', 'map_first' → 'order_map_first' (≤ 48 characters;
    no '=' or ',', which the profiler refuses in paths)."""
    text = f"{key.split('.')[-1]}_{value}"
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in text)[:48]


def study_dir(workbook_dir: str | os.PathLike, name: str) -> Path:
    """Where a notebook keeps runs that are not rounds: <workbook>/studies/<name>."""
    return Path(workbook_dir) / "studies" / name


def run_variants(cfg: Config, variants: dict[Any, dict[str, Any]], out_dir: str | os.PathLike,
                 label_key: str, progress: bool = True) -> list[tuple[Any, RunRecord]]:
    """One run of `cfg` + changes per {label: changes} variant, in <out_dir>/<label_key>_<label>/;
    returns (label, record) pairs. All configs are validated before the first run starts; a finished run of the
    same config already in a variant's folder is reused (`launch_or_reuse`)."""
    out = Path(out_dir)
    configs = [(label, config_mod.speed_measured(with_changes(cfg, changes), changes))
               for label, changes in variants.items()]
    return [(label, launch_or_reuse(c, out / slug(label_key, label), progress=progress, desc=f"{label_key}={label}"))
            for label, c in configs]


def sweep(cfg: Config, key: str, values: list, out_dir: str | os.PathLike, progress: bool = True,
          fixed: dict[str, Any] | None = None) -> list[tuple[Any, RunRecord]]:
    """One run of `cfg` (plus `fixed` changes) per value of `key`; returns (value, record) pairs."""
    return run_variants(cfg, {v: {**(fixed or {}), key: v} for v in values}, out_dir, key, progress)


def accumulation_sweep(cfg: Config, factors: list[int], out_dir: str | os.PathLike,
                       progress: bool = True) -> list[tuple[int, RunRecord]]:
    """One run per accumulation factor at cfg's global batch; returns (micro-batch size, record) pairs."""
    variants = {cfg.batch_size // f: accumulation_changes(cfg, f) for f in factors}
    return run_variants(cfg, variants, out_dir, "micro_batch", progress)


def run_rounds(wb, rounds: dict[str, dict[str, Any]], progress: bool = True, profile_steps: int = 0) -> list:
    """wb.run_round for each {name: changes} in order (each against the then-current best); profile_steps: a
    profiler window per arm in each paired round (`Workbook.run_round`)."""
    return [wb.run_round(name, changes, progress=progress, profile_steps=profile_steps)
            for name, changes in rounds.items()]


def compile_cache_runs(cfg: Config, out_dir: str | os.PathLike, progress: bool = True,
                       steps: int | None = None) -> dict[str, list[RunRecord]]:
    """Two runs in separate processes with the compile cache on, the first into an empty cache folder:
    {'cold cache': [record], 'warm cache': [record]}; their summaries' compile_s is the first step (s).
    steps: steps per run instead of cfg's (the first step is the compile; the rest give the steady step time).
    When both runs of the same config are already in out_dir, finished, they are reused (the cache is left as they
    left it); otherwise the cache is emptied and both are trained again, earlier records moved aside."""
    out = Path(out_dir)
    cache = out / "compile_cache"
    cached = with_changes(cfg, {"compile_cache": True, "compile_cache_path": str(cache),
                                **({"steps": steps} if steps is not None else {})})
    kinds = ("cold", "warm")
    if all(finished_same(out / kind, config_mod.absolute_paths(cached)) for kind in kinds):
        return {f"{kind} cache": [reuse(cached, out / kind)] for kind in kinds}
    shutil.rmtree(cache, ignore_errors=True)
    return {f"{kind} cache": [launch(cached, out / kind, progress=progress, desc=f"compile cache {kind}",
                                     replace=True)] for kind in kinds}


def compile_cache_reused(out_dir: str | os.PathLike, warm: RunRecord) -> bool:
    """Whether the warm run of `compile_cache_runs(cfg, out_dir)` loaded the cold run's compiled graphs instead of
    compiling: the cache holds graphs (*.mindir) and none was written after the warm run started (on a miss MindSpore
    writes them again). Unlike the two runs' compile_s, this does not flip when other load slows one of them.
    The warm run's start is its config file's time (written before its first compile): `started_at` has whole
    seconds, and a cold run's last graph can land in the second the warm run starts."""
    graphs = list((Path(out_dir) / "compile_cache").rglob("*.mindir"))
    started = (Path(warm.path) / CONFIG_FILE).stat().st_mtime
    return bool(graphs) and all(p.stat().st_mtime < started for p in graphs)


def break_even_steps(compile_s: float, step_ms: float, other_compile_s: float, other_step_ms: float) -> float | None:
    """Steps after which a compiled run (first step `compile_s` s, then `step_ms` ms/step) has spent less
    time in all than the other run; 0 when it is ahead from the start, None when its step is not faster."""
    saving_s = (other_step_ms - step_ms) / 1000.0
    if saving_s <= 0:
        return None
    return max(0.0, (compile_s - other_compile_s) / saving_s)


def try_config(cfg: Config, changes: dict[str, Any]) -> str:
    """'accepted', or the one-line error this device gives for `changes` (e.g. bf16 on CPU)."""
    try:
        with_changes(cfg, changes)
    except ConfigError as exc:
        return f"refused: {exc}"
    return "accepted"


def accumulation_changes(cfg: Config, factor: int) -> dict[str, int]:
    """The declared group batch_size ÷ factor, grad_accum_steps × factor: same global batch, smaller micro-batch."""
    if factor < 1 or cfg.batch_size % factor:
        raise ConfigError(f"factor={factor} does not divide batch_size={cfg.batch_size}; "
                          f"pick a divisor of the batch size")
    return {"batch_size": cfg.batch_size // factor, "grad_accum_steps": factor * cfg.grad_accum_steps}
