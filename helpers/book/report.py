"""Tables for the notebooks and the HTML index: pandas DataFrames built from run records and rounds.

Units are in the column names (ms, MiB, %). Medians across repeats; a missing figure reads 'n/a'.
"""
from __future__ import annotations

import html
import math
import os
from pathlib import Path
from statistics import median
from typing import Any, Iterable

import pandas as pd

from helpers.record import DATA_WAIT_UNMEASURED, RunRecord, median_summary, memory_label
from helpers.tune.rounds import load_runs
from helpers.units import MIB


def _num(value: Any, scale: float = 1.0, digits: int = 1):
    """Rounded number, or None for missing / non-finite values."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return None
    return round(value * scale, digits)


# MFU against each peak (helpers/run/peaks.py), named in the column: the summary names how each was found.
MFU_MATMUL, MFU_HARDWARE = "MFU (% of matmul peak)", "MFU (% of hardware peak)"


def run_row(record: RunRecord) -> dict[str, Any]:
    """One run as a table row: model, parallelism, batch, speed, MFU, memory, loss."""
    s, cfg = record.summary, record.config
    dp = cfg.parallel.data_parallel
    return {
        "run": record.path.name,
        "status": s.get("status"),
        "params (M)": _num(s.get("n_params"), 1e-6, 3),
        "data parallel": dp,
        "global batch": cfg.global_batch,
        "micro-batch/device": cfg.micro_batch_per_device,
        "step (ms)": _num(s.get("step_time_ms")),
        "tokens/s": _num(s.get("tokens_per_s"), digits=0),
        MFU_MATMUL: _num(s.get("mfu"), 100.0, 2),
        MFU_HARDWARE: _num(s.get("mfu_hardware"), 100.0, 2),
        f"{memory_label(s)} (MiB)": _num(s.get("peak_memory_bytes"), 1 / MIB, 0),  # RSS on CPU, device off it
        "data wait (%)": (_num(s.get("data_wait_share"), 100.0, 2) if s.get("data_wait_share") is not None
                          else DATA_WAIT_UNMEASURED if cfg.dataset_sink else None),
        "comm (% of step)": _num(s.get("comm_step_share"), 100.0, 2) if dp > 1 else "n/a (single process)",
        "compile (s)": _num(s.get("compile_s"), digits=2),
        f"loss after {s.get('steps')}": _num(s.get("loss_last"), digits=3),
        "val loss": _num(s.get("val_loss"), digits=3),
    }


def _median_row(rows: list[dict], label: str) -> dict:
    out = {}
    for key in rows[0]:
        values = [r.get(key) for r in rows]
        numbers = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool) and v is not None]
        if key == "run":
            out[key] = label
        elif len(numbers) == len(values):
            out[key] = round(median(numbers), 3)
        else:
            out[key] = values[0] if len(set(map(str, values))) == 1 else "mixed"
    return out


def runs_table(records: Iterable[RunRecord], median_label: str | None = "median") -> pd.DataFrame:
    """One row per run, plus a median row when there are several."""
    rows = [run_row(r) for r in records]
    if not rows:
        return pd.DataFrame()
    if median_label and len(rows) > 1:
        rows.append(_median_row(rows, median_label))
    return pd.DataFrame(rows).set_index("run")


def groups_table(groups: dict[str, list[RunRecord]]) -> pd.DataFrame:
    """One median row per labelled group of runs (a sweep, or reference vs candidate)."""
    rows = []
    for label, records in groups.items():
        if records:
            row = _median_row([run_row(r) for r in records], label)
            row["runs"] = len(records)
            rows.append(row)
    return pd.DataFrame(rows).set_index("run") if rows else pd.DataFrame()


def round_groups(result) -> dict[str, list[RunRecord]]:
    """{'reference': [...], 'candidate': [...]} records of a RoundResult."""
    return {"reference": load_runs(result.reference_runs), "candidate": load_runs(result.candidate_runs)}


def round_table(result) -> pd.DataFrame:
    """Reference vs candidate medians of one round."""
    return groups_table(round_groups(result))


def results_groups(results: list) -> dict[str, list[RunRecord]]:
    """{'reference': the first round's reference runs, '<name>': each round's candidate runs}."""
    groups = {"reference": load_runs(results[0].reference_runs)} if results else {}
    groups.update({r.name: load_runs(r.candidate_runs) for r in results})
    return groups


def verdict_lines(results: list) -> str:
    """verdict_text of each round, one per line (print it)."""
    return "\n".join(verdict_text(r) for r in results)


def break_even_table(compiled: dict[str, list[RunRecord]], others: dict[str, list[RunRecord]]) -> pd.DataFrame:
    """For each (compiled, other) pair: steps until the compiled run's start-up cost is paid back.

    compiled/others: {label: runs}; medians of compile_s (first step, s) and steady step time (ms)."""
    from helpers.tune.study import break_even_steps
    rows = []
    for c_label, c_runs in compiled.items():
        for o_label, o_runs in others.items():
            figures = [median_summary(c_runs, "compile_s"), median_summary(c_runs, "step_time_ms"),
                       median_summary(o_runs, "compile_s"), median_summary(o_runs, "step_time_ms")]
            steps = break_even_steps(*figures) if None not in figures else None
            rows.append({"compiled": c_label, "vs": o_label, "first step (s)": _num(figures[0], digits=2),
                         "step (ms)": _num(figures[1]), "other first step (s)": _num(figures[2], digits=2),
                         "other step (ms)": _num(figures[3]),
                         "break-even (steps)": "never (not faster)" if steps is None else math.ceil(steps)})
    return pd.DataFrame(rows)


def changes_text(changes: dict) -> str:
    """{'batch_size': (12, 24)} → 'batch_size 12 → 24'; floats to 4 significant digits ('lr 0.001 → 0.001414')
    unless that would print two different values alike."""
    def pair(a, b) -> tuple[str, str]:
        short = tuple(f"{v:.4g}" if isinstance(v, float) else str(v) for v in (a, b))
        return short if short[0] != short[1] or a == b else (repr(a), repr(b))
    return ", ".join(f"{k} {' → '.join(pair(a, b))}" for k, (a, b) in changes.items())


def verdict_text(result) -> str:
    """One line: round, change, decision and the verdict's reason (with its numbers)."""
    override = getattr(result, "override", None)
    note = f" (overridden: {override})" if override else ""
    return (f"Round {result.index} '{result.name}': {changes_text(result.changes)} → "
            f"{result.decision.upper()}{note} — {result.verdict.reason}")


def interval_text(verdict) -> str:
    """A speed verdict's figure: 'tokens/s ×1.043, 99.3% interval ×1.011–×1.076 (16 pairs, paired)'; a
    convergence round's: its seed band in nats/token (a time-to-target round's: in seconds); '' when the round measured neither (failed)."""
    if getattr(verdict, "interval", None):
        low, high = verdict.interval
        return (f"tokens/s ×{verdict.speedup:.3f}, {verdict.level:.1%} interval ×{low:.3f}–×{high:.3f} "
                f"({verdict.pairs} pairs, {verdict.path})")
    if verdict.noise_band is not None and verdict.decision != "failed":
        unit = "s" if verdict.objective == "time_to_target" else "nats/token"
        return f"seed band ±{verdict.noise_band:.4g} {unit}"
    return ""


def speed_reading(result, others: dict[str, list[RunRecord]] | None = None) -> str:
    """What a round's runs measured, in sentences made from its records: the verdict with its reason, then the median
    tokens/s of each group in `others` (e.g. sweep points) as a ratio of the round's reference runs. A sweep point
    is one run with no interval of its own, so it gets a ratio, never a verdict."""
    ref = median_summary(load_runs(result.reference_runs), "tokens_per_s")
    lines = [verdict_text(result)]
    for label, records in (others or {}).items():
        tok = median_summary(records, "tokens_per_s")
        if label == "reference" or tok is None or not ref:
            continue
        lines.append(f"{label}: {tok:,.0f} tokens/s = ×{tok / ref:.2f} the round's reference ({ref:,.0f} tokens/s, "
                     f"median of {len(result.reference_runs)}); {len(records)} run(s), so a ratio, not a verdict")
    return "\n".join(lines)


ROLLBACK = "rollback point (in the workbook folder)"


def in_workbook(rollback: Path) -> str:
    """A round's rollback point relative to its workbook folder (<workbook>/rounds/NN_name/rollback), so a table
    in a shared report names no machine path."""
    return Path(rollback).relative_to(Path(rollback).parents[2]).as_posix()


def rounds_table(rounds: list, failed_notebooks: dict[str, str] | None = None) -> pd.DataFrame:
    """Every round: change, objective, decision, speed-up, its interval (speed: the tokens/s ratio's interval, pairs
    and measurement path; convergence: the seed band), loss drift, memory ratio, reason; plus rows for notebooks
    that failed before their round was recorded (decision 'failed')."""
    rows = []
    for r in rounds:
        v = r.verdict
        rows.append({"round": r.index, "name": r.name, "change": changes_text(r.changes),
                     "objective": getattr(r, "objective", "speed"), "decision": r.decision,
                     "speed-up": _num(v.speedup, digits=3),
                     "interval": interval_text(v), "loss drift": _num(v.loss_drift, digits=4),
                     "memory ratio": _num(v.memory_ratio, digits=3), "reason": v.reason,
                     ROLLBACK: in_workbook(r.rollback) if getattr(r, "rollback", None) else ""})
    names = {r.name for r in rounds}
    for nb, error in (failed_notebooks or {}).items():
        if nb not in names:
            rows.append({"round": None, "name": nb, "change": "", "decision": "failed",
                         "reason": f"notebook failed: {error}"})
    return pd.DataFrame(rows, dtype=object)


def rounds_groups(wb) -> dict[str, list[RunRecord]]:
    """{'baseline': runs, '<NN name>': candidate runs, ...} for curves of every round."""
    groups = {"baseline": wb.baseline_runs()}
    for r in wb.rounds():
        groups[f"{r.index:02d} {r.name} ({r.decision})"] = load_runs(r.candidate_runs)
    return groups


def waterfall_steps(wb) -> tuple[float | None, list[tuple[str, float | None, str]]]:
    """(baseline median tokens/s, [(round label, speed-up vs its reference, decision)]) for plots.waterfall."""
    base = [r.summary.get("tokens_per_s") for r in wb.baseline_runs() if r.summary.get("tokens_per_s")]
    steps = [(f"{r.index:02d} {r.name}", r.verdict.speedup, r.decision) for r in wb.rounds()]
    return (median(base) if base else None), steps


def sweep_groups(points: list[tuple[Any, RunRecord]], key: str) -> dict[str, list[RunRecord]]:
    """(value, record) pairs of a sweep as {'key=value': [record]} groups for tables and curves."""
    return {f"{key}={value}": [record] for value, record in points}


def round_points(result, key: str) -> list[tuple[Any, RunRecord]]:
    """(value, record) pairs for a round's reference and candidate runs (first run of each), by `key`'s value."""
    old, new = result.changes[key]
    groups = round_groups(result)
    return [(v, g[0]) for v, g in ((old, groups["reference"]), (new, groups["candidate"])) if g]


def rollback_table(rounds: list) -> pd.DataFrame:
    """Each round's rollback point (its config, summary and last checkpoint) and decision."""
    return pd.DataFrame([{"round": r.index, "name": r.name, "decision": r.decision,
                          ROLLBACK: in_workbook(r.rollback)} for r in rounds],
                        columns=["round", "name", "decision", ROLLBACK])


def ledger_table(entries: list[dict]) -> pd.DataFrame:
    """The ledger's entries, oldest first: when, event, round, name, change, decision, who, why."""
    rows = [{"when": e.get("when"), "event": e.get("event"), "round": e.get("round"), "name": e.get("name"),
             "change": changes_text({k: tuple(v) for k, v in (e.get("changes") or {}).items()}),
             "decision": e.get("decision"), "best after": e.get("best_round"), "who": e.get("who"),
             "why": e.get("why", "")} for e in entries]
    return pd.DataFrame(rows)


_DISPLAY_UNITS = {"bytes": ("MiB", 1 / MIB), "fraction": ("%", 100.0)}


def _sig(value, digits: int = 4):
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        return value
    return float(f"{value:.{digits}g}") if value != int(value) else int(value)


def before_after_table(rows: list[dict]) -> pd.DataFrame:
    """Workbook.before_after() rows as a table indexed by metric; bytes shown in MiB and fractions in %; an
    interval column once the side-by-side row is there (the medians of runs taken apart have none)."""
    shown = []
    for row in rows:
        unit, scale = _DISPLAY_UNITS.get(row.get("unit"), (row.get("unit"), 1.0))
        shown.append({"metric": row["metric"], "unit": unit,
                      **{k: _sig(row[k] * scale) if row.get(k) is not None else None for k in ("baseline", "best")},
                      "best ÷ baseline": _sig(row["ratio"], 3) if row.get("ratio") is not None else None,
                      **({"interval": f"{row['level']:.1%}: ×{row['interval'][0]:.3f}–×{row['interval'][1]:.3f}, "
                                      f"{row['pairs']} pairs"} if row.get("interval") else {})})
    frame = pd.DataFrame(shown, dtype=object)  # object: whole numbers stay whole, no 809856.000
    if "interval" in frame:
        frame["interval"] = frame["interval"].fillna("")
    return frame.set_index("metric") if not frame.empty else frame


def relative_text(text: str, base: Path) -> str:
    """`text` with the absolute folder `base` written relative to it (a report folder shared elsewhere still reads)."""
    return text.replace(f"{base}{os.sep}", "").replace(str(base), ".")


def decision_figures(verdict) -> str:
    """The figures a decision rests on, short: the gate that decided it (`Verdict.gate`; a verdict recorded before
    gates were named has none), the interval (or seed band), then the loss drift and memory ratio the gates judged
    (a gate can turn a faster candidate into a reject)."""
    gates = [f"loss drift {verdict.loss_drift:+.2%}" if verdict.loss_drift is not None else "",
             f"memory ×{verdict.memory_ratio:.2f}" if verdict.memory_ratio is not None else ""]
    by = f"by {verdict.gate}:" if getattr(verdict, "gate", "") else ""
    return " ".join(x for x in [by, "; ".join(x for x in [interval_text(verdict), *gates] if x)] if x)


def rounds_html(rounds: list, failed_notebooks: dict[str, str] | None, base: Path) -> str:
    """index.html's rounds table, narrow enough for one screen: per round its number, name, change, one decision line
    (the decision and the figure that decided it: the interval, or the seed band), the full reason one click away
    (<details>), and its rollback point as a link relative to `base` (the report folder); then notebooks that
    failed before their round was recorded."""
    rows = []
    for r in rounds:
        v, override = r.verdict, getattr(r, "override", None)
        why = v.reason + (f" Overridden by a person: {override}." if override else "")
        rollback = os.path.relpath(r.rollback, base) if getattr(r, "rollback", None) else ""
        link = f'<a href="{html.escape(rollback)}/">{html.escape(rollback)}</a>' if rollback else ""
        rows.append(f'<tr class="{html.escape(r.decision.replace(" ", "-"))}"><td>{r.index}</td>'
                    f"<td>{html.escape(r.name)}</td><td>{html.escape(changes_text(r.changes))}</td>"
                    f"<td><b>{html.escape(r.decision.upper())}</b>{' (overridden)' if override else ''} "
                    f"{html.escape(decision_figures(v))}<details><summary>why</summary>"
                    f"{html.escape(relative_text(why, base))}</details></td><td>{link}</td></tr>")
    names = {r.name for r in rounds}
    for nb, error in (failed_notebooks or {}).items():
        if nb not in names:
            rows.append(f'<tr class="failed"><td></td><td>{html.escape(nb)}</td><td></td><td><b>FAILED</b> notebook '
                        f"failed before its round was recorded<details><summary>why</summary>"
                        f"notebook failed: {html.escape(relative_text(error, base))}</details></td><td></td></tr>")
    if not rows:
        return "<p>No rounds ran.</p>"
    return ('<table class="rounds"><colgroup><col style="width:4.5em"><col style="width:12em"><col style="width:13em">'
            '<col><col style="width:19em"></colgroup><tr><th>round</th><th>name</th><th>change</th><th>decision</th>'
            "<th>rollback point</th></tr>" + "".join(rows) + "</table>")


def comparison_html(workbook_dir: str | os.PathLike, failed_notebooks: dict[str, str] | None = None,
                    base: str | os.PathLike | None = None) -> str:
    """HTML of the before/after table and the rounds table (`rounds_html`) for index.html, paths relative to `base`
    (default: the workbook folder's parent, the report folder); a note when there is no workbook."""
    path = Path(workbook_dir)
    base = Path(base) if base is not None else path.parent
    try:
        from helpers.tune.rounds import Workbook
        wb = Workbook.open(path)
        before_after = before_after_table(wb.before_after())
        rounds = wb.rounds()
    except Exception as exc:  # no workbook (baseline failed) or an unreadable one: say so, keep the index
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        failed = rounds_html([], failed_notebooks, base) if failed_notebooks else ""
        return f"<p>No before/after table: {html.escape(relative_text(why, base))}</p>" + failed
    return before_after.to_html(na_rep="n/a") + "<h2>Rounds</h2>" + rounds_html(rounds, failed_notebooks, base)


# ------------------------------------------------------------------------------------- environment

def environment_table(env: dict, peak: dict | float | None, hardware: dict | None = None) -> pd.DataFrame:
    """What the runs run on: versions, device, threads, cores, memory source, and both peaks MFU divides by.

    peak: `peaks.peak_flops_info`'s dict (the achievable matmul peak: FLOP/s, its shapes, when and at what load it
    was measured, cached or new) or FLOP/s; hardware: `peaks.hardware_peak`'s dict (FLOP/s and its arithmetic)."""
    info = peak if isinstance(peak, dict) else {"flops": peak}
    hw = hardware or {}
    rows = [("python", env.get("python")), *[(name, ver) for name, ver in env.get("packages", {}).items()],
            ("platform", env.get("platform")), ("cpu", env.get("cpu_model")), ("cores", env.get("cpu_count")),
            ("memory (GiB)", _num(env.get("memory_total_bytes"), 1 / 2 ** 30, 1)),
            ("device", env.get("device_target")), ("op threads", env.get("threads")),
            ("memory source", env.get("memory_source")), ("git commit", env.get("git_commit")),
            ("hardware peak (GFLOP/s)", _num(hw.get("flops"), 1e-9, 1)), ("hardware peak: how", hw.get("arithmetic")),
            ("achievable matmul peak (GFLOP/s, measured)", _num(info.get("flops"), 1e-9, 1)),
            *[(what, info[key]) for what, key in (("achievable peak: what", "name"),
                                                  ("achievable peak measured at", "measured_at"),
                                                  ("1-min load average while measured", "load_avg_1m"),
                                                  ("cores other processes used while measured", "others_cores"),
                                                  ("achievable peak source", "source")) if key in info]]
    return pd.DataFrame(rows, columns=["what", "value"]).set_index("what")


# -------------------------------------------------------------------------------------- evaluation

def train_loss_near(record: RunRecord, step: int, window: int = 5) -> float:
    """Mean raw training loss over the `window` steps up to `step` (the EMA lags while loss falls fast)."""
    losses = [r["loss"] for r in record.metrics if step - window < r["step"] <= step and r.get("loss") is not None]
    return sum(losses) / len(losses) if losses else float("nan")


def overfit_check(record: RunRecord) -> str:
    """One line: train vs validation loss at the first and last validation pass, and what the trend says.

    Overfitting: validation loss rose at the last pass while training loss fell; past the sweet spot:
    validation loss is above its best; otherwise validation loss still falls with training loss."""
    evals = [r for r in record.metrics if r.get("val_loss") is not None]
    if len(evals) < 2:
        return (f"only {len(evals)} validation pass(es) in this run: set eval_every below steps "
                f"({record.summary.get('steps')}) to see a trend")
    first, prev, last = evals[0], evals[-2], evals[-1]
    train = {e["step"]: train_loss_near(record, e["step"]) for e in (first, prev, last)}
    best = min(evals, key=lambda e: e["val_loss"])
    if last["val_loss"] > prev["val_loss"] and train[last["step"]] < train[prev["step"]]:
        verdict = (f"overfitting: validation loss rose {prev['val_loss']:.3f} → {last['val_loss']:.3f} "
                   f"while training loss fell")
    elif last["val_loss"] > best["val_loss"]:
        verdict = (f"past the sweet spot: validation loss is above its best "
                   f"({best['val_loss']:.3f} at step {best['step']})")
    else:
        verdict = f"no overfitting: validation loss still falls ({prev['val_loss']:.3f} → {last['val_loss']:.3f})"

    def at(e):
        t = train[e["step"]]
        return f"step {e['step']}: train {t:.3f}, val {e['val_loss']:.3f} (gap {e['val_loss'] - t:+.3f})"
    return f"{at(first)}; {at(last)} → {verdict}"


def eval_table(record: RunRecord) -> pd.DataFrame:
    """The validation passes of a run: step, train loss (mean of the 5 steps up to it, and EMA), val loss,
    val perplexity, grad norm."""
    rows = [{"step": r["step"], "train loss (mean of 5)": _num(train_loss_near(record, r["step"]), digits=3),
             "train loss EMA": _num(r["loss_ema"], digits=3),
             "val loss": _num(r["val_loss"], digits=3), "val PPL": _num(r["val_ppl"], digits=2),
             "grad norm": _num(r["grad_norm"], digits=3)}
            for r in record.metrics if r.get("val_loss") is not None]
    return pd.DataFrame(rows).set_index("step") if rows else pd.DataFrame()


def alarms_table(record: RunRecord) -> pd.DataFrame | str:
    """The monitors' alarms of a run (kind, step, message), or a line saying there were none."""
    alarms = record.summary.get("alarms") or []
    if not alarms:
        return f"no alarms in {record.summary.get('steps')} steps (monitors: grad norm, NaN, spikes, memory, overfit)"
    return pd.DataFrame([{k: a.get(k) for k in ("kind", "step", "message")} for a in alarms]).set_index("step")


# ------------------------------------------------------------------------------ AMP audit, convergence

def amp_audit_table(record: RunRecord) -> pd.DataFrame | str:
    """The run's AMP dtype audit (dtype_audit.json): each leaf cell, its kind, input and compute dtype, whether
    `fp32_cells` protects it and whether it honours that; a line saying why when the run has none (O0)."""
    import json
    audit = Path(record.path) / "dtype_audit.json"
    if not audit.is_file():
        return (f"no dtype audit in {record.path.name}: only runs with amp_level O1-O3 write one "
                f"(this one ran amp_level={record.config.amp_level})")
    rows = json.loads(audit.read_text(encoding="utf-8"))
    return pd.DataFrame([{"cell": r["name"], "kind": r["kind"], "input dtype": r["input_dtype"],
                          "compute dtype": r["compute_dtype"], "asked fp32": r["protected"], "ok": r["ok"]}
                         for r in rows]).set_index("cell")


def amp_audit_text(record: RunRecord) -> str:
    """One line: which cell kinds compute in which dtype, and the cells asked for fp32 that compute lower."""
    audit = record.summary.get("amp_audit")
    if not audit:
        return f"no AMP audit: {record.path.name} ran amp_level={record.config.amp_level}"
    dtypes = "; ".join(f"{d}: {', '.join(kinds)}" for d, kinds in audit.items() if d != "unprotected")
    flagged = audit.get("unprotected") or []
    cells = ", ".join(record.config.fp32_cells) or "none"
    return (f"{record.config.amp_level} with fp32_cells=[{cells}] — {dtypes}; unprotected (asked fp32, computing "
            f"lower): {', '.join(flagged) if flagged else 'none'}")


def convergence_table(result) -> pd.DataFrame:
    """A convergence round run by run: arm, seed, validation loss at the common token count, final validation
    loss, seconds to the target loss and tokens/s (the numbers behind the verdict)."""
    from helpers.tune.convergence import compare_tokens, eval_curve, figures, time_to_target, val_loss_at
    groups = round_groups(result)
    runs = [*groups["reference"], *groups["candidate"]]
    tokens, fig = compare_tokens(runs), figures(groups["reference"], groups["candidate"])
    rows = [{"arm": arm, "seed": r.config.seed, f"val loss @ {tokens:,.0f} tokens": _num(val_loss_at(r, tokens),
                                                                                      digits=4),
             "final val loss": _num(float(eval_curve(r)[1][-1]), digits=4),
             f"s to val loss {fig.target:.4f}": _num(time_to_target(r, fig.target), digits=1),
             "tokens/s": _num(r.summary.get("tokens_per_s"), digits=0)}
            for arm, group in groups.items() for r in group]
    return pd.DataFrame(rows)


def _ended(record: RunRecord) -> str:
    """How a run ended, in a few words: its early-end reason (target, time cap) or 'all steps'."""
    reason = record.summary.get("status_reason") or ""
    if record.status != "ok":
        return record.status
    return "target reached" if reason.startswith("reached") else "time cap" if reason.startswith("time cap") \
        else "all steps"


def time_to_target_table(groups: dict[str, list[RunRecord]], target: float) -> pd.DataFrame:
    """Run by run: group, seed, steps run, how it ended, seconds to `target` (wall seconds since its process
    started, evaluation included; empty = did not reach), final validation loss and tokens/s."""
    from helpers.tune.convergence import eval_curve, time_to_target
    rows = []
    for group, records in groups.items():
        for r in records:
            t = time_to_target(r, target)
            final = eval_curve(r)[1]
            rows.append({"group": group, "seed": r.config.seed, "steps run": len(r.metrics), "ended": _ended(r),
                         f"s to val loss {target:.4f}": _num(t), "reached": t is not None,
                         "final val loss": _num(float(final[-1]), digits=4) if final.size else None,
                         "tokens/s": _num(r.summary.get("tokens_per_s"), digits=0)})
    return pd.DataFrame(rows)


def time_to_target_before_after(wb, target: float | None = None) -> pd.DataFrame:
    """Baseline vs current best of a workbook in seconds to `target` (default: the best's target_val_loss):
    each side's runs and their mean — a mean only when every run reached it; ratio = baseline ÷ best."""
    from helpers.tune.convergence import seed_times_text, time_to_target
    target = target or wb.best_config().target_val_loss
    sides = {"baseline": wb.baseline_runs(), "best": wb.best_runs()}
    times = {k: [time_to_target(r, target) for r in v] for k, v in sides.items()}
    means = {k: (sum(v) / len(v) if v and None not in v else None) for k, v in times.items()}
    ratio = means["baseline"] / means["best"] if None not in means.values() else None
    return pd.DataFrame([{"metric": f"s to val loss {target:.4f}", "baseline": seed_times_text(times["baseline"]),
                          "best": seed_times_text(times["best"]), "baseline ÷ best": _num(ratio, digits=2)}])
