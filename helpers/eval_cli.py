"""`python -m helpers profile ...` and `python -m helpers diagnose RUN_DIR`."""
from __future__ import annotations

from .config import load_config, with_changes
from .record import load_run


def cmd_profile(args) -> int:
    from .cli import _run
    from .profile import check_path, load_profile
    check_path(args.out)
    cfg = load_config(args.config, args.set)
    cfg = with_changes(cfg, {"monitor.profile_steps": args.steps, "monitor.profile_start": args.start})
    code = _run(cfg, args.out, args.progress)
    if code not in (0, 3):
        return code
    report = load_profile(args.out)
    print(f"profiled steps {report.window[0]}-{report.window[1]} · raw output {args.out}/{report.raw_dir}")
    print(report.table_text(args.top))
    print(f"op time {report.op_time_ms_per_step:.2f} ms/step · data-pipeline share {report.data_wait_share:.1%} "
          f"· communication share {report.comm_share if isinstance(report.comm_share, str) else f'{report.comm_share:.1%}'}")
    print(report.overhead_text())
    return code


def cmd_diagnose(args) -> int:
    from .diagnose import diagnose, write_verdict
    record = load_run(args.run_dir)
    result = diagnose(record)
    write_verdict(record, result)
    print(result.text())
    return 0


def add_commands(sub, default_progress: str) -> None:
    """Register the `profile` and `diagnose` subcommands on an argparse subparsers object."""
    from .cli import add_config_arguments, add_progress_argument
    p = sub.add_parser("profile", help="train with a profiler window; print the top operators and overhead")
    add_config_arguments(p)
    p.add_argument("--steps", type=int, default=40, help="profiled steps (default 40)")
    p.add_argument("--start", type=int, default=0, help="first profiled step; 0 = after steady_after")
    p.add_argument("--top", type=int, default=10, help="operators to print")
    p.add_argument("--out", required=True, help="run directory to write (no '=' or ',' in the path)")
    add_progress_argument(p, default_progress)
    p.set_defaults(func=cmd_profile)

    d = sub.add_parser("diagnose", help="bottleneck verdict, alarms and troubleshooting rows for a run")
    d.add_argument("run_dir")
    d.set_defaults(func=cmd_diagnose)

