"""The bottleneck of a run record: data-, compute-, communication-, memory-bound or balanced.

The bottleneck comes with the numbers that decided it, the thresholds used, the next tuning round to run,
the monitors' alarms and the troubleshooting rows whose symptoms appear in the record.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

from helpers.run.monitors import sustained_slope
from helpers.run.profile import load_profile
from helpers.record import (MetricColumns, RecordError, RunRecord, data_wait_share, data_wait_text, memory_fraction,
                            update_summary)

TROUBLESHOOTING = Path(__file__).with_name("troubleshooting.yaml")
MATMUL_OPS = {"MatMul", "BatchMatMul", "MatMulExt", "BatchMatMulExt", "Dense"}


@dataclass
class Thresholds:
    """Where each bottleneck starts. Shares are fractions of steady step time (data) or of op time."""
    data_wait_share: float = 0.25  # share of step time blocked on the next batch
    starved_step_share: float = 0.6  # MindData's analyzer anchor: device queue empty > 60% of the time
    starved_wait_fraction: float = 0.2  # a step is "starved" if it waited ≥ this fraction of its time
    comm_share: float = 0.2  # communication's share: of op time when profiled, else of merged step time
    dominant_op_share: float = 0.45  # one operator type's share of op time (nano's MatMul: ~36-39%)
    memory_fraction: float = 0.85  # peak memory / its memory (`record.memory_fraction`: RSS ÷ RAM, device ÷ device)
    no_learning_drop: float = 0.02  # relative loss drop below which a run "did not learn"
    no_learning_min_steps: int = 50
    slow_compile_s: float = 60.0


@dataclass
class Diagnosis:
    """The bottleneck, why, and what to run next; `findings` select the troubleshooting rows."""
    bottleneck: str
    reasons: list[str]
    evidence: dict
    thresholds: dict
    next_rounds: list[str]
    findings: list[str]
    alarms: list[dict] = field(default_factory=list)
    troubleshooting: list[dict] = field(default_factory=list)

    def text(self) -> str:
        """Human-readable report (what `python -m helpers diagnose` prints)."""
        lines = [f"bottleneck: {self.bottleneck}"]
        lines += [f"  because {r}" for r in self.reasons]
        lines.append("evidence: " + ", ".join(f"{k}={_fmt(v)}" for k, v in self.evidence.items()))
        lines.append("thresholds: " + ", ".join(f"{k}={v}" for k, v in self.thresholds.items()))
        lines.append("next round: " + ", ".join(self.next_rounds))
        for a in self.alarms:
            lines.append(f"alarm [{a['kind']}] step {a['step']}: {a['message']}")
        for row in self.troubleshooting:
            lines.append(f"symptom: {row['symptom']}\n  causes: {'; '.join(row['causes'])}\n  checks: "
                         f"{'; '.join(row['checks'])}\n  fix: {'; '.join(row['fix'])}\n  levers: "
                         f"{', '.join(row['levers'])}")
        return "\n".join(lines)


def _fmt(v) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def troubleshooting_table() -> list[dict]:
    """Every row of troubleshooting.yaml: symptom, when (the findings that show it), causes, checks, fix, levers
    (the config keys its fixes change)."""
    return yaml.safe_load(TROUBLESHOOTING.read_text(encoding="utf-8"))


def troubleshooting_by_lever() -> dict[str, list[str]]:
    """Each lever's troubleshooting rows: {config key: the symptoms whose fixes change it}, keys that no row
    names left out."""
    out: dict[str, list[str]] = {}
    for row in troubleshooting_table():
        for key in row["levers"]:
            out.setdefault(key, []).append(row["symptom"])
    return out


def troubleshooting_rows(findings: list[str]) -> list[dict]:
    """Rows of troubleshooting.yaml whose `when` names any of `findings`."""
    return [r for r in troubleshooting_table() if set(r["when"]) & set(findings)]


def _data_evidence(rows: MetricColumns, th: Thresholds) -> dict:
    """The steady rows' data-wait share (`record.data_wait_share`) and the share of steps starved of data; both
    None when the waits were not measured (sink mode) or there are no steady rows."""
    times, waits = rows["step_time_ms"], rows["data_wait_ms"]
    share = data_wait_share(times, waits)
    starved = int((waits >= th.starved_wait_fraction * times).sum()) if share is not None else None
    return {"data_wait_share": share, "starved_step_share": starved / len(rows) if starved is not None else None}


def _profile_evidence(record: RunRecord) -> dict:
    try:
        prof = load_profile(record.path)
    except RecordError:
        return {"dominant_op": "unknown: no profile (run python -m helpers profile)"}
    top = prof.ops[0]
    return {"dominant_op": top["name"], "dominant_op_share": top["share"], "comm_op_share": prof.comm_op_share}


def _comm_step_share(record: RunRecord) -> float | str:
    """Collective time ÷ merged step time (rankmerge), or why there is none."""
    if record.config.parallel.data_parallel == 1:
        return "not applicable: single process"
    value = record.summary.get("comm_step_share")
    return float(value) if isinstance(value, (int, float)) else "not measured"


def _comm(ev: dict) -> tuple[float | None, str]:
    """The communication share the rule reads and what it is a share of: op time when this run was profiled
    (its own comm ops), else the data-parallel step time."""
    if isinstance(ev.get("comm_op_share"), (int, float)):
        return float(ev["comm_op_share"]), "of op time"
    if isinstance(ev.get("comm_step_share"), (int, float)):
        return float(ev["comm_step_share"]), "of step time"
    return None, ""


def _memory_evidence(record: RunRecord, rows: MetricColumns) -> dict:
    mem = memory_fraction(record.summary, record.env)  # a device peak is a share of the device's memory
    has = rows.filled["rss_bytes"]
    return {"peak_memory_bytes": mem.peak, "memory_total_bytes": mem.total, "peak_memory_fraction": mem.fraction,
            "rss_slope_bytes_per_step": (sustained_slope(rows["step"][has], rows["rss_bytes"][has])
                                         if has.sum() >= 4 else None)}


def _next_rounds(bottleneck: str, ev: dict, findings: list[str]) -> list[str]:
    if bottleneck == "data-bound":
        return ["data_pipeline"]
    if bottleneck == "communication-bound":
        return ["gradient_fusion", "data_parallel"]
    if bottleneck == "memory-bound":
        return (["fix the leak (memory_growth alarm) first"] if "memory_growth" in findings else []) + \
            ["recompute", "batch_size (smaller, with grad_accum_steps)"]
    if bottleneck == "compute-bound" and ev.get("dominant_op") not in MATMUL_OPS:
        return [f"model/kernel change for {ev['dominant_op']} (e.g. model.norm=rmsnorm)", "batch_size"]
    return ["batch_size", "mixed_precision (pays where fp16 matmul units exist: Ascend/GPU)"]


def _checks(record: RunRecord, th: Thresholds) -> list[str]:
    s, found = record.summary, []
    if s.get("status") == "nan":
        found.append("nan")
    reason = (s.get("status_reason") or "").lower()
    if s.get("status") == "failed" and ("memory" in reason or "oom" in reason):
        found.append("failed_oom")
    first, last = s.get("loss_first"), s.get("loss_last")
    if (first and last is not None and math.isfinite(last) and s.get("steps", 0) >= th.no_learning_min_steps
            and (first - last) / first < th.no_learning_drop):
        found.append("no_learning")
    if (s.get("compile_s") or 0.0) >= th.slow_compile_s:
        found.append("slow_compile")
    return found


def diagnose(record: RunRecord, thresholds: Thresholds | None = None) -> Diagnosis:
    """Decide the bottleneck of a run from its metrics, summary, env and (if present) profile.

    Order: memory-bound (peak RSS ≥ memory_fraction of the machine, a memory_growth alarm or an OOM),
    communication-bound, data-bound, compute-bound (one op type ≥ dominant_op_share), else balanced.
    """
    th = thresholds or Thresholds()
    rows = record.speed_columns("data_wait_ms", "rss_bytes")
    alarms = list(record.summary.get("alarms") or [])
    alarm_kinds = sorted({a["kind"] for a in alarms})
    checks = _checks(record, th)
    ev = {**_data_evidence(rows, th), **_profile_evidence(record), **_memory_evidence(record, rows)}
    ev["comm_step_share"] = _comm_step_share(record)
    ev["steady_steps"] = len(rows)
    reasons: list[str] = []
    mem = memory_fraction(record.summary, record.env)
    frac, slope = mem.fraction, ev["rss_slope_bytes_per_step"]
    if frac is not None and frac >= th.memory_fraction:
        reasons.append(f"{mem.text()} (≥ {th.memory_fraction:.0%})")
    if "memory_growth" in alarm_kinds:
        reasons.append(f"memory_growth alarm: RSS grows {slope or 0.0:,.0f} bytes/step over the steady window")
    if "failed_oom" in checks:
        reasons.append("the run failed out of memory")
    bottleneck = "memory-bound" if reasons else ""
    comm, of_what = _comm(ev)
    if not bottleneck and comm is not None and comm >= th.comm_share:
        bottleneck, reasons = "communication-bound", [f"communication takes {comm:.0%} {of_what} "
                                                   f"(≥ {th.comm_share:.0%})"]
    share, starved = ev["data_wait_share"], ev["starved_step_share"]
    sink = record.config.dataset_sink
    if not bottleneck and share is not None and (share >= th.data_wait_share or starved >= th.starved_step_share):
        bottleneck = "data-bound"
        reasons = [f"data_wait_share {share:.0%} (threshold {th.data_wait_share:.0%}); {starved:.0%} of steady "
                   f"steps waited ≥ {th.starved_wait_fraction:.0%} of their time (threshold "
                   f"{th.starved_step_share:.0%}, MindData's queue-empty anchor)"]
    dom = ev.get("dominant_op_share")
    if not bottleneck and dom is not None and dom >= th.dominant_op_share:
        bottleneck, reasons = "compute-bound", [f"{ev['dominant_op']} takes {dom:.0%} of op time "
                                             f"(≥ {th.dominant_op_share:.0%}); data waits "
                                             + (f"only {share:.0%} of step time" if share is not None else
                                                f"{data_wait_text(share, sink)}")]
    if not bottleneck and not len(rows):
        bottleneck, reasons = "balanced", ["no steady steps to judge speed by (the run ended during warm-up)"]
    if not bottleneck:
        bottleneck = "balanced"
        wait = _fmt(share) if share is not None else data_wait_text(share, sink)
        reasons = [f"no limit crossed: data_wait_share {wait}, top op share {_fmt(dom)}, "
                   f"comm share {'n/a' if comm is None else f'{_fmt(comm)} {of_what}'}, peak memory fraction {_fmt(frac)}"]
    findings = [bottleneck, *alarm_kinds, *checks]
    return Diagnosis(bottleneck=bottleneck, reasons=reasons, evidence=ev, thresholds=asdict(th),
                     next_rounds=_next_rounds(bottleneck, ev, findings), findings=findings, alarms=alarms,
                     troubleshooting=troubleshooting_rows(findings))


def write_bottleneck(record: RunRecord, diagnosis: Diagnosis) -> None:
    """Add `bottleneck` and `bottleneck_evidence` to the run's summary.json (atomic rewrite)."""
    update_summary(record.path, {"bottleneck": diagnosis.bottleneck,
                                 "bottleneck_evidence": {**diagnosis.evidence, "reasons": diagnosis.reasons,
                                                         "thresholds": diagnosis.thresholds,
                                                         "next_rounds": diagnosis.next_rounds,
                                                         "findings": diagnosis.findings}})
