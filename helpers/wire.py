"""Messages between processes: one dataclass per message and one encoder/decoder pair for it, all here.

    StepRow        a training child's stdout (`--progress json`) or rank 0's msrun log → the parent's bar and live
                   view; encode_row / decode_row
    ArmReady, StepRequest, StepResult, FinishRequest
                   run/arm.py ↔ spawn/stepped.py over a localhost socket; encode / decode
    PairStart, PairDone
                   run/pair.py in rank 0 of msrun → its log → spawn/paired.py; encode / decode
    PairRequest    spawn/paired.py → every rank's dp_worker.py --pair (a file); encode_pair_request /
                   decode_pair_request
    RankFile       each msrun rank (spawn/dp_worker.py) → spawn/rankmerge.py (ranks/rank_K.json);
                   encode_rank_file / decode_rank_file

A tagged message travels as one line of JSON: {"kind": <the class's KIND>, ...its fields}; `decode` of a line that
is not one (a log line, a warning, a step row) returns None, so a reader can share a pipe or a log with other
output. A step row has no kind: it is the line `--progress json` has always printed (step, loss, tokens_per_s,
step_time_ms). The pair request and the rank files are whole files (a rank file is written like every JSON file of a
record, `record.json_text`).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from helpers.record import json_text

PAIRED_FILE = "paired.json"  # a round's pairs (run/pair.py, spawn/stepped.py, rankmerge); paired.Measurement reads it
PAIR_REQUEST_FILE = ".pair_request.json"  # a data-parallel paired round's request, in its round folder
RANKS_DIR = "ranks"  # a data-parallel run's per-rank files: ranks/rank_K.json


def paired_rank_file(rank: int) -> str:
    """The name of rank `rank`'s own pairs in a data-parallel paired round (rankmerge merges them to PAIRED_FILE)."""
    return f"paired_rank_{rank}.json"


def paired_rank_files(folder: str | Path) -> list[Path]:
    """Every rank's own pairs in the round folder `folder`, in name order."""
    return sorted(Path(folder).glob("paired_rank_*.json"))


def _known(cls, data: dict) -> dict:
    """The entries of `data` that are fields of `cls` (a newer sender's extra keys are ignored)."""
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in data.items() if k in names}


def _json_object(line: str) -> dict | None:
    """The JSON object on one line, or None for any other line (logs, warnings, blank)."""
    line = line.strip()
    if not line.startswith("{"):
        return None
    try:
        data = json.loads(line)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


# ------------------------------------------------------------------------------------------------ step rows

@dataclass
class StepRow:
    """Child → parent, one line per finished step: what a progress display needs (ms, tokens/s, nats/token)."""
    step: int
    loss: float
    tokens_per_s: float
    step_time_ms: float

    @classmethod
    def of(cls, row: dict) -> "StepRow":
        """The wire part of a full metrics row (the train loop builds those)."""
        return cls(**{f.name: row[f.name] for f in fields(cls)})


def encode_row(row: StepRow) -> str:
    """One JSON line (no newline): {"step", "loss", "tokens_per_s", "step_time_ms"}."""
    return json.dumps(asdict(row))


def decode_row(line: str) -> StepRow | None:
    """The step row on one line of a child's output, or None for any other line."""
    data = _json_object(line)
    if data is None or "kind" in data or not all(f.name in data for f in fields(StepRow)):
        return None
    return StepRow(**_known(StepRow, data))


# ---------------------------------------------------------------------- tagged messages: arms, paired progress

@dataclass
class ArmReady:
    """An arm process of a stepped round, built (model, optimizer, pipeline; nothing compiled yet) or failed
    doing so, to its parent: status "ok", or "failed" with `reason`."""
    KIND = "arm_ready"
    arm: str
    pid: int
    status: str
    reason: str = ""


@dataclass
class StepRequest:
    """Parent → arm: take `steps` more steps now (the arm's data gate is open meanwhile); warm=True: they are
    its warm-up (compile included), followed by one validation pass that compiles the eval graph."""
    KIND = "step"
    steps: int
    warm: bool = False


@dataclass
class StepResult:
    """Arm → parent: the steps' times and data waits (ms), the record's latest loss (None before its first row),
    its status once the record ended ("" while it goes on, "ok" once finished, "nan", "stopped", "failed", ...)
    and its resident memory after the steps (bytes)."""
    KIND = "stepped"
    times_ms: list[float]
    waits_ms: list[float | None]
    loss: float | None = None
    ended: str = ""
    rss_bytes: int = 0


@dataclass
class FinishRequest:
    """Parent → arm: the measurement is over. complete=True trains the record to its last step first; False stops
    it where it is (status 'stopped', with `reason`)."""
    KIND = "finish"
    complete: bool
    reason: str = ""


@dataclass
class PairStart:
    """A data-parallel paired process (rank 0) → its parent, through the msrun log: arm `arm` starts building."""
    KIND = "pair_start"
    arm: str


@dataclass
class PairDone:
    """A data-parallel paired process (rank 0) → its parent: pair `pair` of `max_pairs` is measured; `arms` maps
    each arm to the row its live view draws: {"step", "loss" (None before the record's first row), "tokens_per_s"
    (at the block's median step time)}."""
    KIND = "pair_done"
    pair: int
    max_pairs: int
    arms: dict[str, dict]


MESSAGES = {cls.KIND: cls for cls in (ArmReady, StepRequest, StepResult, FinishRequest, PairStart, PairDone)}


def encode(message) -> str:
    """One JSON line (no newline) for any tagged message class of this module (MESSAGES)."""
    return json.dumps({"kind": message.KIND, **asdict(message)})


def decode(line: str):
    """The tagged message on one line, or None when the line is not one of MESSAGES."""
    data = _json_object(line)
    cls = MESSAGES.get(data.get("kind")) if data is not None else None
    return None if cls is None else cls(**_known(cls, data))


# --------------------------------------------------------------------------------------------- pair request

@dataclass
class PairRequest:
    """spawn/paired.py → every rank of its msrun launch (dp_worker.py --pair FILE): both arms' config files, the
    round folder, the speed plan (`paired.SpeedPlan.to_dict()`) and each arm's profiler window (steps; 0 = the
    arm's own comm_profile_steps)."""
    reference: str
    candidate: str
    folder: str
    plan: dict
    profile_steps: int = 0


def encode_pair_request(request: PairRequest) -> str:
    """The request file's text (one JSON object)."""
    return json.dumps(asdict(request))


def decode_pair_request(text: str) -> PairRequest:
    """The request a file holds; ValueError/TypeError for a file that is not one."""
    return PairRequest(**_known(PairRequest, json.loads(text)))


# ----------------------------------------------------------------------------------------------- rank files

RANK_ROW_KEYS = ("step", "step_time_ms", "data_wait_ms", "loss", "grad_norm")  # what a rank file keeps per step


@dataclass
class RankFile:
    """One msrun rank → the parent's merge (rankmerge), RUN/ranks/rank_K.json: the rank's status, first step,
    wall seconds, peak RSS (bytes), per-step rows (RANK_ROW_KEYS; ms, nats/token) and its profiled collective time
    (`profile.comm_per_step`, None when not profiled)."""
    rank: int
    size: int
    status: str
    start_step: int
    wall_s: float
    peak_rss_bytes: int
    rows: list[dict]
    comm: dict | None

    @staticmethod
    def row(metrics_row: dict) -> dict:
        """The part of a metrics row a rank file keeps."""
        return {k: metrics_row[k] for k in RANK_ROW_KEYS}


def rank_file(run_dir: str | Path, rank: int) -> Path:
    """Where rank `rank` of the run in `run_dir` writes its RankFile."""
    return Path(run_dir) / RANKS_DIR / f"rank_{rank}.json"


def rank_files(run_dir: str | Path) -> list[Path]:
    """Every rank file of the run in `run_dir`, in name order."""
    return sorted((Path(run_dir) / RANKS_DIR).glob("rank_*.json"))


def encode_rank_file(rank: RankFile) -> str:
    """The file's text (`record.json_text`: indented, NaN/Inf as null)."""
    return json_text(asdict(rank))


def decode_rank_file(text: str) -> RankFile:
    """The rank file a text holds."""
    return RankFile(**_known(RankFile, json.loads(text)))
