"""Argument parsing and the one-line outputs of `python -m helpers`."""
from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

from helpers import config as config_mod
from helpers import folder_lock
from helpers.config import PRESETS, ConfigError, load_config
from helpers.folder_lock import FolderBusy, LockError
from helpers.record import SUMMARY_DETAIL_KEYS, SUMMARY_KEYS, RecordError, data_wait_text, load_run, memory_label
from helpers.units import mib_text
from helpers.run.rows import PROGRESS_KINDS, progress_sink

KNOWN_ERRORS = (ConfigError, RecordError, LockError)


def one_line(summary: dict, out: str) -> str:
    """The final one-line summary of a run."""
    def num(key, f):
        value = summary.get(key)
        return "n/a" if value is None else format(value, f)
    mfu = " · ".join(f"{100 * summary[k]:.2f}% of {name} peak" for k, name in (("mfu", "matmul"),
                                                                               ("mfu_hardware", "hardware"))
                     if summary.get(k) is not None) or "n/a"
    return (f"{summary.get('status')} · {summary.get('steps')} steps · loss {num('loss_first', '.3f')}→"
            f"{num('loss_last', '.3f')} · val {num('val_loss', '.3f')} (ppl {num('val_ppl', '.1f')}) · "
            f"{num('tokens_per_s', ',.0f')} tokens/s · {num('step_time_ms', '.1f')} ms/step · "
            f"MFU {mfu} · {memory_label(summary)} "
            f"{mib_text(summary.get('peak_memory_bytes'))} → {out}")


def show_table(record) -> str:
    """The summary as an aligned two-column table."""
    s = record.summary
    rows = [("run", str(record.path)), ("status", s.get("status")), ("reason", s.get("status_reason") or "")]
    rows += [(k, s.get(k)) for k in SUMMARY_KEYS + SUMMARY_DETAIL_KEYS
             if k not in ("record_version", "status", "status_reason")]
    width = max(len(k) for k, _ in rows)
    lines = []
    for key, value in rows:
        if isinstance(value, float):
            value = f"{value:,.4g}" if abs(value) < 1e4 else f"{value:,.0f}"
        lines.append(f"{key:<{width}}  {value if value is not None else 'n/a'}")
    return "\n".join(lines)


def cmd_train(args) -> int:
    cfg = config_mod.absolute_paths(load_config(args.config, args.set))  # the record rereads the same files
    _before_run(cfg, args.out, args.replace)
    return _run(cfg, args.out, args.progress)


def _before_run(cfg, out, replace: bool) -> None:
    """Before anything is written or MindSpore is imported: the config's paths, modules and memory (`preflight`),
    then --out: its writer lock, and no other run's record in it unless --replace moves it aside
    (`outdir.claim_locked`)."""
    from helpers.run.outdir import claim_locked
    from helpers.run.preflight import preflight
    if cfg.parallel.data_parallel <= 1:  # before preflight imports numpy: a thread made earlier (OpenBLAS's) would
        from helpers.run import interrupt  # take Ctrl-C into MindSpore's handler, which answers with SIGTERM
        interrupt.catch()
    preflight(cfg)
    moved = claim_locked(out, cfg, replace)
    if moved:
        print(moved, file=sys.stderr)


def cmd_resume(args) -> int:
    """Continue a run in its own folder: from its newest checkpoint (or --checkpoint), checked whole before anything
    is written; a run stopped before its first step starts again."""
    from helpers.config import with_changes
    from helpers.run.checkpoints import check_resumable, checkpoint_files
    from helpers.run.devices import check_device
    run_dir = Path(args.run_dir)
    load_run(run_dir)  # a folder that is no run record: one line before the lock makes anything
    folder_lock.hold(run_dir)
    record = load_run(run_dir)
    changes = {"steps": args.steps} if args.steps is not None else {}
    if args.checkpoint:
        changes["resume_from"] = str(_own_checkpoint(run_dir, args.checkpoint))
    elif checkpoint_files(run_dir):
        changes["resume_from"] = str(run_dir)
    elif record.metrics:
        raise RecordError(f"run {str(run_dir)!r} recorded {len(record.metrics)} steps and left no checkpoint to "
                          f"continue from (checkpoint_every=0 saves only at the end); train it again with --replace, "
                          f"and set checkpoint_every=N to make a run resumable")
    else:  # nothing was recorded: the same run from its first step, into its own folder
        changes["resume_from"] = ""
    cfg = with_changes(record.config, changes)
    check_device(cfg)  # a run folder copied from another machine: one line before MindSpore or msrun start
    check_resumable(cfg)  # a damaged checkpoint or a finished run: one line, exit 2, nothing rewritten
    return _run(cfg, args.run_dir, args.progress)


def _own_checkpoint(run_dir: Path, name: str) -> Path:
    """--checkpoint: one of the run's own checkpoints, by path or file name."""
    from helpers.run.checkpoints import checkpoint_files
    own = checkpoint_files(run_dir)
    wanted = Path(name)
    match = [p for p in own if p.name == wanted.name and (len(wanted.parts) == 1 or p.resolve() == wanted.resolve())]
    if not match:
        names = ", ".join(p.name for p in own) or "none"
        raise ConfigError(f"--checkpoint {name!r} is not one of the checkpoints of {str(run_dir)!r} (it has: "
                          f"{names}); pass one of them")
    return match[0]


def _run(cfg, out, progress) -> int:
    """Train `cfg` into `out` (whose writer lock the caller holds) in this process, or under msrun; the exit status:
    0 ok, 3 ended early (nan, stopped), 1 failed, 130 interrupted by Ctrl-C."""
    if cfg.parallel.data_parallel > 1:
        return _run_msrun(cfg, out, progress)
    from helpers.run import interrupt
    interrupt.catch()  # before MindSpore starts a thread: Ctrl-C saves and says so (interrupt.py)
    from helpers.run.train import Trainer
    trainer = Trainer(cfg, out, progress_sink(progress))  # an unusable --out fails here, before any record
    try:
        outcome = trainer.run()
    except KeyboardInterrupt:
        print(f"interrupted: {trainer.outcome.reason if trainer.outcome else 'by Ctrl-C'}", file=sys.stderr)
        return interrupt.EXIT_CODE
    except Exception as exc:
        print(f"error: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__} "
              f"({_left_behind(out, trainer)})", file=sys.stderr)
        return 1
    record = load_run(out)
    if outcome.status == "interrupted":
        print(f"interrupted: {record.summary.get('status_reason')}", file=sys.stderr)
        return interrupt.EXIT_CODE
    print(one_line(record.summary, out))
    return 0 if outcome.status == "ok" else 3


def _left_behind(out, trainer) -> str:
    """What a failed run left on disk, for its error line (a full disk may have refused the failed summary)."""
    try:
        status = load_run(out).status
    except RecordError:
        return f"no run record in {out}"
    if not trainer.writer.started:  # a resume that failed before its first new step
        return f"the record in {out} is unchanged (status {status}); the attempt is noted in {out}/history/"
    status = "interrupted" if status == "running" else status  # 'running' under our own, still live pid
    ckpts = sorted(Path(out, "checkpoints").glob("step_*.ckpt"))
    resume = f"; after fixing it: python -m helpers resume {out}" if ckpts else ""
    return f"run recorded as {status} in {out}{resume}"


def _run_msrun(cfg, out, progress) -> int:
    """Data parallel: msrun starts the ranks; the merged record is read back like a one-process run's."""
    from helpers.spawn.msrun import train_data_parallel
    code = train_data_parallel(cfg, out, progress_sink(progress))
    try:
        record = load_run(out)
    except RecordError:
        print(f"error: msrun exited {code} without a record; see {out}/msrun_logs/", file=sys.stderr)
        return 1
    if code != 0 or record.status not in ("ok", "nan"):
        print(f"error: msrun exited {code}, run status {record.status} ({record.summary.get('status_reason')}); "
              f"see {out}/msrun_logs/", file=sys.stderr)
        return 1
    print(one_line(record.summary, out))
    return 0 if record.status == "ok" else 3


def cmd_arm(args) -> int:
    """One arm of a speed round (started by helpers/spawn/stepped.py): steps when its parent asks."""
    from helpers.run.arm import serve
    host, port = args.connect.rsplit(":", 1)
    return serve(load_config(args.config), Path(args.out), args.arm, (host, int(port)), args.extra_steps)


def cmd_zygote(args) -> int:
    """The zygote of helpers/spawn/zygote.py: each child it forks runs `main(argv)`, as `python -m helpers` would."""
    from helpers.spawn.zygote import serve
    return serve(args.fd, main, args.listen_fd)


def cmd_show(args) -> int:
    print(show_table(load_run(args.run_dir)))
    return 0


def cmd_workbook(args) -> int:
    from helpers.book.notebooks import WorkbookError, run_workbook
    try:
        results = run_workbook(args.params, args.out, args.notebooks, timeout_s=args.notebook_timeout,
                               config=args.config)
    except WorkbookError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    failed = [r.name for r in results if r.status != "ok"]
    if failed:
        print(f"{len(failed)} notebook(s) failed: {', '.join(failed)} (their executed copies show the error)",
              file=sys.stderr)
    return 1 if failed else 0


def cmd_profile(args) -> int:
    from helpers.run.profile import check_path, load_profile
    for flag, value, least in (("--steps", args.steps, 1), ("--start", args.start, 0), ("--top", args.top, 1)):
        if value < least:
            raise ConfigError(f"{flag} {value} is out of range; it must be >= {least}"
                              + (" (profiled steps)" if flag == "--steps" else ""))
    check_path(args.out)
    cfg = load_config(args.config, args.set)
    cfg = config_mod.with_changes(cfg, {"monitor.profile_steps": args.steps, "monitor.profile_start": args.start})
    _before_run(cfg, args.out, args.replace)
    code = _run(cfg, args.out, args.progress)
    if code not in (0, 3):
        return code
    report = load_profile(args.out)
    print(f"profiled steps {report.window[0]}-{report.window[1]} · raw output {args.out}/{report.raw_dir}")
    print(report.table_text(args.top))
    comm = report.comm_op_share
    share = data_wait_text(report.data_wait_share, cfg.dataset_sink)
    print(f"op time {report.op_time_ms_per_step:.2f} ms/step · data-pipeline share {share} "
          f"of step time · communication ops {comm if isinstance(comm, str) else f'{comm:.1%} of op time'}")
    print(report.overhead_text())
    return code


def cmd_diagnose(args) -> int:
    """The bottleneck verdict of a run, written into its summary.json unless another process writes the run (then
    printed only, and said so)."""
    from helpers.tune.diagnose import diagnose, write_bottleneck
    record = load_run(args.run_dir)
    result = diagnose(record)
    try:
        folder_lock.hold(args.run_dir)
    except FolderBusy as busy:
        print(result.text())
        print(f"note: not written into its summary.json: {busy}", file=sys.stderr)
        return 0
    write_bottleneck(record, result)
    print(result.text())
    return 0


def cmd_tensorboard(args) -> int:
    from helpers.book.tensorboard import TensorBoardError, export_tensorboard

    def claim() -> None:
        _claim_output(args.out, args.replace, "a TensorBoard log folder",
                      lambda p: any(p.rglob("events.out.tfevents.*")))
    try:
        written = export_tensorboard(args.sources, args.out, before_writing=claim)
    except TensorBoardError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{len(written)} run(s) → {args.out}; view with: tensorboard --logdir {args.out}")
    return 0


def cmd_autotune(args) -> int:
    from helpers.tune.autotune import AutotuneError, autotune, check_budget
    from helpers.tune.rounds import RoundError, Workbook
    try:
        check_budget(args.budget_min)  # before the config is read: the cheaper check first
        cfg = config_mod.load_config(args.config, args.set)
        log = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
        if args.objective == "time_to_target":
            from helpers.tune.ttq_search import autotune_time_to_target
            result = autotune_time_to_target(cfg, args.out, args.budget_min, args.target_val_loss, seeds=args.seeds,
                                             repeats=args.repeats, eta=args.eta, log=log)
        elif args.target_val_loss is not None:
            raise AutotuneError(f"--target-val-loss {args.target_val_loss:g} is for --objective time_to_target; "
                                f"add it, or drop the target for a speed search")
        else:
            result = autotune(cfg, args.out, args.budget_min, repeats=args.repeats,
                              keep_global_batch=args.keep_global_batch, max_rounds=args.max_rounds, log=log)
    except (AutotuneError, RoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from helpers.book.report import before_after_table
    print(result.text())
    print(before_after_table(Workbook.open(args.out).before_after()).to_string())
    return 0


def cmd_export(args) -> int:
    """A run's model (its last checkpoint, or a .ckpt) → a Hugging Face GPT-2- or LLaMA-layout folder."""
    from helpers.run.checkpoints import damage, damaged_line, resume_source
    from helpers.run.hf_weights import export_checkpoint
    try:
        run_dir, ckpt = resume_source(args.source)
    except ConfigError:
        raise ConfigError(f"{args.source!r} holds no checkpoint to export; pass a run folder (every finished run has "
                          f"one) or one of its checkpoints/step_N.ckpt files") from None
    why = damage(ckpt)
    if why:
        raise ConfigError(damaged_line(ckpt, why, run_dir, export_to=args.out))
    load_run(run_dir)  # the layout comes from the run's config: a checkpoint outside a run record is one line
    made = not Path(args.out).exists()
    _claim_output(args.out, args.replace, "an export", lambda p: any(p.glob("*.safetensors")) or
                  (p / "config.json").exists())
    try:
        written = export_checkpoint(ckpt, args.out)[1]  # a full disk: one line, no half file (write_checkpoint)
    except BaseException:
        if made and [p.name for p in Path(args.out).iterdir()] == [folder_lock.LOCK_FILE]:
            shutil.rmtree(args.out)  # the folder this command made for an export it could not write
        raise
    print(f"{ckpt} → {written} (Hugging Face layout, with config.json); start a run from it with --set init_from={args.out}")
    return 0


def _claim_output(out: str, replace: bool, what: str, holds_output) -> None:
    """An output folder of a command: not a file, not a run record, locked for this process, and holding no
    earlier output (`holds_output(path)`) unless `replace` moves the whole folder aside first (said on stderr)."""
    from helpers.run.outdir import move_aside, record_files
    path = Path(out)

    def check() -> bool:  # whether there is earlier output to move aside (refused unless replace)
        if path.exists() and not path.is_dir():
            raise ConfigError(f"--out {out!r} is a file; {what} is written into a folder: pass a folder path")
        if path.is_dir() and record_files(path):
            raise ConfigError(f"--out {out!r} holds a run record; {what} goes into a folder of its own: pass "
                              f"another --out")
        if path.is_dir() and holds_output(path) and not replace:
            raise ConfigError(f"--out {out!r} already holds {what}; pass another --out, or --replace to move the old "
                              f"folder aside first. Nothing was written")
        return path.is_dir() and holds_output(path)
    check()  # before the lock file is made: a refusal writes nothing
    folder_lock.hold(path)
    if check():  # again as its one writer
        aside = move_aside(path)
        folder_lock.release(path)
        folder_lock.hold(path)
        print(f"moved the earlier {what} in {out} aside to {aside}", file=sys.stderr)


def cmd_prepare(args) -> int:
    """A corpus the workbook knows → a MindRecord set (train, val, tokenizer) that runs read with MindDataset."""
    from helpers.run.data import DataError
    from helpers.run.mindrecord import TOKENIZER_FILE, TRAIN_FILE, VAL_FILE, MindRecordError
    from helpers.run.to_mindrecord import write_corpus
    cfg = config_mod.absolute_paths(load_config(args.config, args.set))
    made = not Path(args.out).exists()
    # The lock stays on --out itself: the set is written into --out/.partial under it and moved into place when
    # whole, so a second prepare is refused and a killed one leaves only the .partial that readers refuse.
    _claim_output(args.out, args.replace, "a MindRecord set",
                  lambda p: any((p / name).exists() for name in (TRAIN_FILE, VAL_FILE, TOKENIZER_FILE)))
    try:
        w = write_corpus(cfg, args.out)  # removes its .partial on any failure
    except BaseException as exc:
        if made and [p.name for p in Path(args.out).iterdir()] == [folder_lock.LOCK_FILE]:
            shutil.rmtree(args.out)  # the folder this command made for a set it could not write
        if not isinstance(exc, (DataError, MindRecordError)):
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{w.train_rows} train + {w.val_rows} val rows of {w.row_tokens} tokens (vocabulary {w.vocab_size}) → "
          f"{w.folder}; train on it with --set data.format=mindrecord --set data.corpus={w.folder}")
    return 0


def cmd_import_config(args) -> int:
    """A MindFormers-style YAML → a workbook config YAML, its mapping table, and the planner's full-size estimate."""
    from helpers.book.planner import config_plan
    from helpers.mindformers import adapt, config_yaml, import_mindformers, read_yaml
    from helpers.mindformers.next_step import next_step
    from helpers.record import atomic_write_text
    from helpers.run.outdir import move_aside
    target = Path(args.out)
    if target.is_dir():
        raise ConfigError(f"--out {args.out!r} is a folder; name the YAML file to write, e.g. {args.out}/config.yaml")
    under = next((p for p in target.parents if p.exists() and not p.is_dir()), None)
    if under is not None:
        raise ConfigError(f"--out {args.out!r} cannot be written: {str(under)!r} is a file, not a folder; name a "
                          f"YAML file in a folder. Nothing was written")
    if target.exists() and not args.replace:
        raise ConfigError(f"--out {args.out!r} already exists; name another file, or --replace moves it aside "
                          f"first. Nothing was written")
    full = import_mindformers(read_yaml(args.source), reduce=bool(args.scale), source=args.source)
    out = adapt(full, args.target or "", args.scale or "")
    if target.exists():
        print(f"moved the earlier {args.out} aside to {move_aside(target)}", file=sys.stderr)
    target.parent.mkdir(parents=True, exist_ok=True)
    flags = " ".join(f"--{k} {v}" for k, v in (("target", args.target), ("scale", args.scale)) if v)
    atomic_write_text(target, config_yaml(out, args.source, flags))
    print(out.table())
    full_cfg = config_mod.from_dict(full.config)
    if not full_cfg.model.vocab_size:
        print("planner estimate: the recipe names no vocab_size (the tokenizer's); set model.vocab_size for one")
    else:
        _print_estimate(*config_plan(full_cfg))
    print(next_step(args.out, args.source, args.scale or ""))
    return 0


def _print_estimate(shape, strategy) -> None:
    """The planner's per-device memory estimate of an imported recipe at its full size, on one line."""
    from helpers.book.planner import GB, estimate
    e = estimate(shape, strategy)
    print(f"planner estimate at full size: {shape.n_params / 1e9:.2f} B parameters, {e.total / GB:.1f} GB per device "
          f"(weights {e.params / GB:.1f}, grads {e.grads / GB:.1f}, AdamW {e.optimizer / GB:.1f}, activations "
          f"{e.activations / GB:.1f}) with DP {strategy.dp}, micro-batch {strategy.micro_batch}, recompute "
          f"{'on' if strategy.recompute else 'off'}, {strategy.dtype}")


def add_config_arguments(p: argparse.ArgumentParser, what: str = "YAML config") -> None:
    """--config FILE and repeatable --set KEY=VALUE, for every command that builds a Config."""
    p.add_argument("--config", help=f"{what} (defaults when omitted)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key")


def add_progress_argument(p: argparse.ArgumentParser, default: str) -> None:
    """--progress bar|json|log|none."""
    p.add_argument("--progress", choices=PROGRESS_KINDS, default=default,
                   help="how progress shows: a bar, JSON lines, log lines, or nothing (default: a bar on a "
                        "terminal, log lines otherwise)")


def add_replace_argument(p: argparse.ArgumentParser, what: str = "run record") -> None:
    """--replace: what --out already holds is moved aside (one rename of the folder) instead of refusing."""
    p.add_argument("--replace", action="store_true",
                   help=f"if --out holds a {what}, move the folder whole to <out>.replaced-<time> first "
                        f"(default: refuse)")


def parser() -> argparse.ArgumentParser:
    """The `python -m helpers` command line: one subcommand per job, each calling its cmd_* function."""
    p = argparse.ArgumentParser(prog="python -m helpers", description="MindSpore LLM-training tuning workbook")
    sub = p.add_subparsers(dest="command", required=True)
    default_progress = "bar" if sys.stderr.isatty() else "log"
    _add_run_commands(sub, default_progress)
    _add_internal_commands(sub)
    s = sub.add_parser("show", help="print a run's summary table")
    s.add_argument("run_dir")
    s.set_defaults(func=cmd_show)
    _add_workbook_command(sub)
    _add_profile_commands(sub, default_progress)
    _add_autotune_command(sub)
    _add_bring_your_own_commands(sub)
    tb = sub.add_parser("tensorboard", help="TensorBoard event files from runs and workbooks (needs tensorboardX)")
    tb.add_argument("sources", nargs="+", metavar="RUN_OR_WORKBOOK", help="run or workbook folders")
    tb.add_argument("--out", required=True, help="log folder to write (then: tensorboard --logdir OUT)")
    add_replace_argument(tb, "event files")
    tb.set_defaults(func=cmd_tensorboard)
    return p


def _add_run_commands(sub, default_progress: str) -> None:
    """train and resume: one run, new or continued."""
    t = sub.add_parser("train", help="train one run and write its record")
    add_config_arguments(t)
    t.add_argument("--out", required=True, help="run directory to write (new, or empty)")
    add_replace_argument(t)
    add_progress_argument(t, default_progress)
    t.set_defaults(func=cmd_train)

    r = sub.add_parser("resume", help="continue a run from its last checkpoint")
    r.add_argument("run_dir")
    r.add_argument("--steps", type=int, help="new total step count")
    r.add_argument("--checkpoint", help="resume from this one of the run's checkpoints (a name such as "
                                        "step_000020.ckpt, or its path) instead of the newest")
    add_progress_argument(r, default_progress)
    r.set_defaults(func=cmd_resume)


def _add_internal_commands(sub) -> None:
    """arm and zygote: processes the rounds and the runner start, not the user."""
    am = sub.add_parser("arm", help="(internal) one arm of a speed round: a process that steps when asked")
    am.add_argument("--config", required=True)
    am.add_argument("--out", required=True)
    am.add_argument("--arm", required=True, choices=["reference", "candidate"])
    am.add_argument("--connect", required=True, help="host:port of the round's parent")
    am.add_argument("--extra-steps", type=int, default=0, help="measurement-only steps allowed past its last")
    am.set_defaults(func=cmd_arm)

    z = sub.add_parser("zygote", help="(internal) preload MindSpore, then fork one training child per request")
    z.add_argument("--fd", type=int, required=True, help="the Unix socket its caller passed")
    z.add_argument("--listen-fd", type=int, help="a listening Unix socket: serve whoever connects too")
    z.set_defaults(func=cmd_zygote)


def _add_workbook_command(sub) -> None:
    from helpers.book.notebooks import NOTEBOOK_TIMEOUT_S
    from helpers.paths import NOTEBOOKS_DIR
    w = sub.add_parser("workbook", help="run every notebook headless → executed copies, HTML, index.html")
    w.add_argument("--params", help="YAML mapping of notebook parameters (papermill -f); a notebook's name as a key "
                                    "takes a mapping for that notebook alone, e.g. '14_time_to_quality: {steps: 400}'")
    w.add_argument("--config", help="a config YAML every notebook starts from (its `config` parameter; preset, "
                                    "steps and corpus given as parameters apply on top)")
    w.add_argument("--out", help="report folder (default reports/<timestamp>; a 'latest' link goes next to it)")
    w.add_argument("--notebooks", default=str(NOTEBOOKS_DIR), help="folder of NN_*.ipynb notebooks")
    w.add_argument("--notebook-timeout", type=float, default=NOTEBOOK_TIMEOUT_S, metavar="S",
                   help=f"wall seconds one notebook may run before it is stopped and marked failed "
                        f"(default {NOTEBOOK_TIMEOUT_S:g})")
    w.set_defaults(func=cmd_workbook)


def _add_profile_commands(sub, default_progress: str) -> None:
    """profile and diagnose: where a run's time goes."""
    pf = sub.add_parser("profile", help="train with a profiler window; print the top operators and overhead")
    add_config_arguments(pf)
    pf.add_argument("--steps", type=int, default=40, help="profiled steps (default 40)")
    pf.add_argument("--start", type=int, default=0, help="first profiled step; 0 = after steady_after")
    pf.add_argument("--top", type=int, default=10, help="operators to print")
    pf.add_argument("--out", required=True, help="run directory to write (no '=' or ',' in the path)")
    add_replace_argument(pf)
    add_progress_argument(pf, default_progress)
    pf.set_defaults(func=cmd_profile)

    d = sub.add_parser("diagnose", help="bottleneck verdict, alarms and troubleshooting rows for a run")
    d.add_argument("run_dir")
    d.set_defaults(func=cmd_diagnose)


def _add_bring_your_own_commands(sub) -> None:
    """Bringing your own training: prepare (a corpus → MindRecord), import-config (a MindFormers YAML → a config)
    and export (the workbook's model out in a Hugging Face layout)."""
    pr = sub.add_parser("prepare", help="write the config's corpus as MindRecord token windows (MindSpore FileWriter)")
    add_config_arguments(pr, "YAML config whose data and model.seq_len to use")
    pr.add_argument("--to", required=True, choices=["mindrecord"], help="output format")
    pr.add_argument("--out", required=True, help="folder for train.mindrecord, val.mindrecord and tokenizer.json")
    add_replace_argument(pr, "MindRecord set")
    pr.set_defaults(func=cmd_prepare)
    ic = sub.add_parser("import-config", help="map a MindFormers-style training YAML onto a workbook config")
    ic.add_argument("source", help="the MindFormers YAML (model.model_config, runner_config, optimizer, …)")
    ic.add_argument("--out", required=True, help="workbook YAML to write")
    ic.add_argument("--target", choices=["cpu"], help="cpu: the recipe at its own size on this machine's CPU: "
                                                      "fp32, no flash attention or Ascend-only levels, data parallel "
                                                      "cut to the processes that fit here (the global batch kept "
                                                      "by accumulation)")
    ic.add_argument("--scale", choices=sorted(PRESETS), help="keep the recipe, shrink the dims to this preset and "
                                                             "run it on CPU in one process (a try-out); alone it "
                                                             "keeps the recipe's AMP (fp16 for bf16), with "
                                                             "--target cpu it runs in fp32")
    ic.add_argument("--replace", action="store_true", help="if --out exists, rename it to <out>.replaced-<time> "
                                                           "first (default: refuse)")
    ic.set_defaults(func=cmd_import_config)
    e = sub.add_parser("export", help="write a run's model as Hugging Face GPT-2 safetensors (+ config.json)")
    e.add_argument("source", help="run folder (its last checkpoint) or a checkpoints/step_N.ckpt file")
    e.add_argument("--out", required=True, help="folder to write model.safetensors and config.json into")
    add_replace_argument(e, "export")
    e.set_defaults(func=cmd_export)


def _add_autotune_command(sub) -> None:
    a = sub.add_parser("autotune", help="walk tuning rounds from a baseline within a time budget")
    add_config_arguments(a, "YAML config of the baseline")
    a.add_argument("--budget-min", type=float, required=True, help="wall-clock budget in minutes")
    a.add_argument("--out", required=True, help="workbook folder (a new one, or one to continue)")
    a.add_argument("--repeats", type=int, default=2, help="runs per config and round (default 2)")
    a.add_argument("--max-rounds", type=int, help="stop after this many rounds (default: no limit)")
    a.add_argument("--keep-global-batch", action="store_true",
                   help="batch rounds trade accumulation for micro-batch, keeping the global batch")
    a.add_argument("--objective", choices=["speed", "time_to_target"], default="speed",
                   help="speed: tokens/s rounds; time_to_target: least wall seconds to --target-val-loss, searching "
                        "the recipe and the speed levers (successive halving)")
    a.add_argument("--target-val-loss", type=float, help="validation loss to reach, nats/token (time_to_target)")
    a.add_argument("--seeds", type=int, default=2, help="seeds per arm of a time_to_target round (default 2)")
    a.add_argument("--eta", type=int, default=3, help="successive halving: promote the top 1/eta (default 3)")
    a.set_defaults(func=cmd_autotune)


INTERNAL = ("arm", "zygote")  # processes of the tool's own, whose tracebacks go to logs whole


def main(argv: list[str] | None = None) -> int:
    """`python -m helpers ARGV`: a known bad input is one `error:` line and exit 2; anything else a command did not
    expect is one line too (exit 1), its traceback with WORKBOOK_TRACEBACK=1."""
    args = parser().parse_args(argv)
    try:
        code = args.func(args)
        sys.stdout.flush()  # inside the try: a reader that left shows here, not as a traceback at exit
        return code
    except KNOWN_ERRORS as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader left (`show run | head`): stop quietly, as a shell tool does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except KeyboardInterrupt:  # a run's own Ctrl-C is answered where it trains (`_run`); this is any other
        print(f"interrupted: {args.command} stopped by Ctrl-C", file=sys.stderr)
        return 130
    except Exception as exc:
        if args.command in INTERNAL or os.environ.get("WORKBOOK_TRACEBACK"):
            raise
        first = str(exc).splitlines()[0] if str(exc) else ""
        print(f"error: {args.command} failed unexpectedly: {type(exc).__name__}: {first} (a bug of the workbook; "
              f"rerun with WORKBOOK_TRACEBACK=1 for where, and report it)", file=sys.stderr)
        return 1
