"""Start a training run in its own process (as DeepSpeed's autotuner isolates experiments).

Peak memory is then per run, a crash or OOM cannot take the notebook kernel down, and cold/warm compile
is measurable. The child reports progress as JSON lines on stdout; its stderr goes to `train.log`.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

from helpers import config as config_mod
from helpers.config import Config
from helpers.paths import REPO_ROOT, absolute
from helpers.run.interrupt import stop_child
from helpers.run.outdir import claim, finished_same
from helpers.run.preflight import preflight
from helpers.spawn import zygote
from helpers.spawn.live import publish
from helpers.record import RecordError, RunRecord, load_run
from helpers.wire import decode_row


REFUSED = 2  # the CLI's exit status for a run refused before it wrote anything (helpers/cli.py, main)


def child_env() -> dict:
    """Environment for a training child: the repo importable, then the caller's working directory (so a
    `model.build` or `monitor.callbacks` module next to the user's notebook imports), MindSpore's C++ log at
    errors only."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(REPO_ROOT), env.get("PYTHONPATH", ""), os.getcwd()] if p)
    env.setdefault("GLOG_v", "3")
    return env


if "ipykernel" in sys.modules:  # a notebook kernel: its zygote warms up while the notebook's first cells run
    zygote.prestart(child_env())


def launch(cfg: Config, run_dir: str | os.PathLike, progress: bool = True, desc: str | None = None,
           timeout_s: float | None = None, replace: bool = False):
    """Train `cfg` in a child process writing `run_dir`; returns its RunRecord (failed runs included).

    progress: show a tqdm bar (a widget in Jupyter) fed by the child's per-step JSON lines. Every row also goes
    to the live listeners (`spawn/live.py`), labelled `desc`. Before a process starts, a config that cannot fit in
    memory or reads a missing path is refused (ConfigError), and so is a run_dir that holds a run record
    (RecordError), unless `replace`: then the old record is first moved aside whole (`outdir.claim`, which says
    where in a printed line).
    """
    run_dir = absolute(run_dir)  # the child runs in the repository: hand it paths that mean what the caller meant
    cfg = config_mod.absolute_paths(cfg)
    preflight(cfg, modules=False)
    moved = claim(run_dir, cfg, replace)
    if moved:
        print(moved)
    run_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False, dir=run_dir, prefix=".request.") as fh:
        fh.write(config_mod.dump(cfg))
        request = fh.name
    cmd = [sys.executable, "-m", "helpers", "train", "--config", request, "--out", str(run_dir),
           "--progress", "json"]
    bar, label = None, desc or run_dir.name
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=cfg.steps, desc=label, unit="step", leave=True)
    try:
        code = stream_child(cmd, run_dir / "train.log", lambda line: show_row(bar, label, line), timeout_s)
    finally:
        Path(request).unlink(missing_ok=True)
        if bar is not None:
            bar.close()
    if code == REFUSED:  # it wrote nothing; what the folder holds (if anything) is another run's
        lines = (run_dir / "train.log").read_text(errors="replace").strip().splitlines()
        why = next((line for line in reversed(lines) if line.startswith("error: ")), f"exit {code}")
        raise RuntimeError(f"the training process refused the run: {why.removeprefix('error: ')}")
    try:
        return load_run(run_dir)
    except RecordError:
        tail = (run_dir / "train.log").read_text(errors="replace")[-2000:]
        raise RuntimeError(f"training process exited {code} without a record; log tail:\n{tail}") from None


def launch_or_reuse(cfg: Config, run_dir: str | os.PathLike, progress: bool = True,
                    desc: str | None = None) -> RunRecord:
    """`launch` for a cell that trains into a fixed folder and may be run twice: a finished run of the same config
    already in run_dir is returned as it is (`reuse`); any other record there is moved aside first. Either is
    said in a printed line."""
    return reuse(cfg, run_dir) or launch(cfg, run_dir, progress, desc, replace=True)


def reuse(cfg: Config, run_dir: str | os.PathLike) -> RunRecord | None:
    """The finished run of `cfg` in run_dir (`outdir.finished_same`), said in a printed line; else None."""
    run_dir = absolute(run_dir)
    cfg = config_mod.absolute_paths(cfg)
    # a data-parallel record holds the config its ranks trained (the collectives' profiler window set)
    record = finished_same(run_dir, config_mod.comm_profiled(cfg) if cfg.parallel.data_parallel > 1 else cfg)
    if record is not None:
        print(f"reused the finished run of this same config in {run_dir} (nothing trained; a different config "
              f"would move it aside)")
    return record


def stream_child(cmd: list[str], log_path: Path, on_line, timeout_s: float | None = None) -> int:
    """Run a helpers child process in the repository: each stdout line to `on_line`, stderr appended to
    `log_path`; returns its exit code. `python -m helpers ...` is forked from the zygote (MindSpore preloaded,
    `zygote.py`) unless it is off or fails, then it is a fresh process."""
    if cmd[:3] == [sys.executable, "-m", "helpers"]:
        code = zygote.run_forked(cmd[3:], child_env(), on_line, log_path, timeout_s)
        if code is not None:
            return code
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, env=child_env(), cwd=REPO_ROOT, text=True)
        try:
            for line in proc.stdout:
                on_line(line)
        except KeyboardInterrupt:  # the caller's Ctrl-C: the child saves its step and ends (interrupt.py)
            stop_child(proc.pid, proc.stdout, on_line)
            proc.wait()
            raise
        return proc.wait(timeout=timeout_s)


def show_row(bar, label: str, line: str) -> None:
    """A child's step row (`wire.StepRow`) to the live listeners (labelled `label`) and the bar; other lines
    are ignored."""
    row = decode_row(line)
    if row is None:
        return
    publish(label, asdict(row))
    if bar is None:
        return
    bar.n = row.step
    bar.set_postfix(loss=f"{row.loss:.3f}", tok_s=f"{row.tokens_per_s:.0f}", refresh=False)
    bar.refresh()


def profile_run(cfg: Config, run_dir, window: int = 20, progress: bool = True):
    """Train `cfg` once more in its own process with a profiler window (`with_profiler`); returns the
    RunRecord, whose profile `load_profile(record.path)` reads. A finished profiled run of the same config already
    in run_dir is reused, any other record there moved aside (`launch_or_reuse`)."""
    from helpers.run.profile import with_profiler  # numpy: not on the CLI's fast path (a typo fails in ~0.1 s)
    return launch_or_reuse(with_profiler(cfg, window), run_dir, progress=progress,
                           desc=f"profiled {Path(run_dir).name}")
