"""Where the project lives on disk (ground floor: imported by every layer, imports nothing of ours)."""
from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
DATA_CACHE = REPO_ROOT / "data" / "cache"
CACHE_ENV = "WORKBOOK_DATA_CACHE"
NOTEBOOKS_DIR = REPO_ROOT / "notebooks"
REPORTS_DIR = REPO_ROOT / "reports"


def absolute(path: str | os.PathLike, base: str | os.PathLike | None = None) -> Path:
    """`path` as the user meant it: relative paths are relative to `base` (default: this process's working
    directory, i.e. the notebook's or the shell's), never to the repository a training child runs in."""
    p = Path(path).expanduser()
    return p if p.is_absolute() else Path(base or os.getcwd()) / p


def cache_root() -> Path:
    """The folder of every cache (registry corpora, compiled graphs under compile/): $WORKBOOK_DATA_CACHE; else
    data/cache of this checkout when it is writable; else data/cache under the working directory (an install whose
    package folder is read-only)."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return absolute(env)
    return DATA_CACHE if os.access(DATA_CACHE.parent, os.W_OK) else Path(os.getcwd()) / "data" / "cache"
