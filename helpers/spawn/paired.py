"""A paired round on a data-parallel best: both arms in every rank of one msrun launch (helpers/spawn/dp_worker.py
--pair, helpers/run/pair.py), for what can only differ per compiled graph there (the all-reduce fusion; two msrun
launches cannot take turns step by step). Afterwards each arm's ranks are merged into its record and the ranks'
block times into paired.json (per step, the slowest rank's time, as in a data-parallel run's record). Every other
speed round measures its arms as two processes taking turns (helpers/spawn/stepped.py)."""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

from helpers import config as config_mod
from helpers.config import Config
from helpers.paths import absolute
from helpers.record import RecordError, load_run
from helpers.spawn.live import publish
from helpers.spawn.msrun import LOG_DIR, follow_msrun, msrun_command, msrun_executable, pick_port
from helpers.spawn.rankmerge import merge_pairs, merge_ranks
from helpers.wire import (PAIR_REQUEST_FILE, PAIRED_FILE, PairDone, PairRequest, PairStart, decode,
                          encode_pair_request)


def launch_pair(reference: Config, candidate: Config, folder, plan: dict, progress: bool = True,
                desc: str | None = None, profile_steps: int = 0):
    """Run both data-parallel arms in one msrun launch writing `folder`/reference, `folder`/candidate and
    `folder`/paired.json.

    plan: a `paired.SpeedPlan` as a dict (block_steps, looks, alphas, …); profile_steps: a profiler window per
    arm, in its warm-up (data-parallel arms are profiled whenever their comm_profile_steps is set, as a
    data-parallel run of their own is). Returns (reference record or None, candidate record or None, the
    paired.json dict or None, error text ("" when the launch left them)).
    """
    folder = absolute(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, cfg in (("reference", reference), ("candidate", candidate)):
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False, dir=folder, prefix=f".{name}.") as fh:
            fh.write(config_mod.dump(config_mod.absolute_paths(cfg)))
            paths[name] = fh.name
    request = folder / PAIR_REQUEST_FILE
    request.write_text(encode_pair_request(PairRequest(paths["reference"], paths["candidate"], str(folder), plan,
                                                       profile_steps)), encoding="utf-8")
    bar, label = None, desc or folder.name
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=plan["looks"][-1], desc=label, unit="pair", leave=True)
    log = folder / LOG_DIR / "worker_0.log"
    try:
        code = _run_ranks(reference, folder, request, lambda line: show_progress(bar, label, line))
    finally:
        for p in [*paths.values(), request]:
            Path(p).unlink(missing_ok=True)
        if bar is not None:
            bar.close()
    records = {}
    for name in ("reference", "candidate"):
        try:
            records[name] = load_run(folder / name)
        except RecordError:
            records[name] = None
    raw = json.loads((folder / PAIRED_FILE).read_text(encoding="utf-8")) if (folder / PAIRED_FILE).is_file() else None
    error = ""
    if raw is None or None in records.values():
        text = log.read_text(errors="replace") if log.is_file() else ""
        tail = text.strip().splitlines()[-1:] or ["(empty log)"]
        missing = [n for n, r in records.items() if r is None] + ([PAIRED_FILE] if raw is None else [])
        error = f"the msrun launch exited {code} without {', '.join(missing)} ({tail[0][:300]})"
    return records["reference"], records["candidate"], raw, error


def _run_ranks(cfg: Config, folder: Path, request: Path, on_line) -> int:
    """Both arms on every rank of one msrun launch; then each arm's record and paired.json merged over the ranks.
    Returns msrun's exit code."""
    cmd = msrun_command(None, folder, cfg.parallel.data_parallel, pick_port(cfg), msrun=msrun_executable(),
                        worker_args=["--pair", str(request)])

    def relay(lines: list[str]) -> None:
        for line in lines:
            on_line(line)
    code = follow_msrun(cmd, folder, relay)
    for arm in ("reference", "candidate"):
        try:
            merge_ranks(folder / arm)
        except RecordError:
            pass  # the arm left no record: launch_pair reports it
    merge_pairs(folder)
    return code


def show_progress(bar, label: str, line: str) -> None:
    """A paired process's progress (`wire.PairStart`, `wire.PairDone`) from one line of rank 0's log: each pair's
    arm rows to the live listeners (labelled "`label` reference|candidate"); the bar counts pairs."""
    message = decode(line)
    if isinstance(message, PairDone):
        for arm, row in message.arms.items():
            publish(f"{label} {arm}", row)
        if bar is not None:
            bar.n = message.pair
            bar.refresh()
    elif isinstance(message, PairStart) and bar is not None:
        bar.set_postfix(building=message.arm, refresh=True)
