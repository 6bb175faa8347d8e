"""What is checked in a config before anything is written or MindSpore is imported (the CLI's fast path, and
`launch` before it starts a process): its device is on this machine (`devices`), the paths it reads exist, the
modules it names can be found, the native kernels it asks for are built, and its arrays can fit in memory
(`footprint`). Each failure is one ConfigError line.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

from helpers.config import Config, ConfigError
from helpers.run.devices import check_device
from helpers.run.footprint import check_fits
from helpers.run.kernels import resolve_kernels


def check_paths(cfg: Config) -> None:
    """A resume_from or init_from that does not exist is named as missing (corpus files are checked with the
    data)."""
    if cfg.resume_from and not Path(cfg.resume_from).exists():
        raise ConfigError(f"resume_from={cfg.resume_from!r} does not exist; pass a run folder or one of its "
                          f"checkpoints/step_N.ckpt files")
    if cfg.init_from and not Path(cfg.init_from).exists():
        raise ConfigError(f"init_from={cfg.init_from!r} does not exist; pass a Hugging Face checkpoint: a .safetensors "
                          f"file or a folder holding one (`python -m helpers export` writes one from a run)")


def check_modules(cfg: Config) -> None:
    """Every 'pkg.module:function' in model.build and monitor.callbacks names a module this process can find.

    importlib.util.find_spec imports at most the module's parent packages, not the module (which may import
    MindSpore), so a typo is the first and only line, before the ~2 s import.
    """
    named = [("model.build", cfg.model.build)] if cfg.model.build else []
    named += [("monitor.callbacks item", spec) for spec in cfg.monitor.callbacks]
    for what, spec in named:
        module, _, function = spec.partition(":")
        try:
            missing = "" if importlib.util.find_spec(module) is not None else f"no module named {module!r}"
        except Exception as exc:  # a parent package that is missing or fails to import
            missing = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if missing:
            raise ConfigError(f"{what} {spec!r} cannot be imported ({missing}); check the module is on PYTHONPATH "
                              f"(or in the working folder) and defines {function}")


def check_kernels(cfg: Config) -> None:
    """model.kernels=native needs the native library built from the current sources (`make kernels`): without it
    the run would fail in its process, after MindSpore's import and the model's build."""
    resolve_kernels(cfg)


def preflight(cfg: Config, modules: bool = True) -> None:
    """All of the above. modules=False where the process that trains has another Python path (`launch`'s child
    adds the caller's folder to PYTHONPATH and checks them itself). The device first: a config for another
    machine fails on nothing else here."""
    check_device(cfg)
    check_paths(cfg)
    if cfg.init_from:  # numpy comes with the weights' reader: not for a config that has none
        from helpers.run.hf_weights import check_init_from
        check_init_from(cfg)  # a config.json contradicting its weights, a model not matching them: no tensor read
    if modules:
        check_modules(cfg)
    check_kernels(cfg)
    check_fits(cfg)
