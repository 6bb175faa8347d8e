"""A child Python process for a bench item: the repository's interpreter, cwd and training environment."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from helpers.spawn.runner import child_env

REPO = Path(__file__).resolve().parent.parent


def python(*args: str, timeout: float = 1800, env: dict | None = None) -> str:
    """Run `python ARGS` from the repository (with `env` added to the training environment); its stdout, or
    RuntimeError with the tail of its stderr."""
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=REPO,
                          env={**child_env(), **(env or {})}, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args[:3])} failed: {proc.stderr[-1500:]}")
    return proc.stdout
