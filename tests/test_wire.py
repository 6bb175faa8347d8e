"""Every message between processes round-trips through its one encoder and decoder (helpers/wire.py)."""
from __future__ import annotations

import ast
import dataclasses
import json
from pathlib import Path

import pytest

from helpers import wire
from helpers.record import json_text
from helpers.wire import (ArmReady, FinishRequest, PairDone, PairRequest, PairStart, RankFile, StepRequest,
                          StepResult, StepRow, decode, decode_pair_request, decode_rank_file, decode_row, encode,
                          encode_pair_request, encode_rank_file, encode_row)

HELPERS = Path(__file__).resolve().parent.parent / "helpers"

# message → (its encoder, its decoder, an example): the one pair each message travels through
MESSAGES = {
    StepRow: (encode_row, decode_row, StepRow(7, 2.5, 1234.5, 41.25)),
    ArmReady: (encode, decode, ArmReady("candidate", 4242, "failed", "ConfigError: bad")),
    StepRequest: (encode, decode, StepRequest(8, warm=True)),
    StepResult: (encode, decode, StepResult([70.5, 71.0], [0.25, None], 3.75, "ok", 123456789)),
    FinishRequest: (encode, decode, FinishRequest(False, "the other arm ended first")),
    PairStart: (encode, decode, PairStart("reference")),
    PairDone: (encode, decode, PairDone(3, 8, {"reference": {"step": 20, "loss": None, "tokens_per_s": 900.0},
                                               "candidate": {"step": 20, "loss": 3.5, "tokens_per_s": 950.0}})),
    PairRequest: (encode_pair_request, decode_pair_request,
                  PairRequest("/r/.reference.x.yaml", "/r/.candidate.y.yaml", "/r", {"block_steps": 4, "looks": [8]},
                              8)),
    RankFile: (encode_rank_file, decode_rank_file,
               RankFile(1, 2, "ok", 1, 12.5, 2 ** 30, [{"step": 1, "step_time_ms": 80.0, "data_wait_ms": 0.5,
                                                        "loss": 4.0, "grad_norm": 1.5}],
                        {"first_step": 4, "steps": 4, "comm_ms_per_step": 2.0})),
}


@pytest.mark.parametrize("cls", list(MESSAGES), ids=lambda c: c.__name__)
def test_each_message_round_trips_through_its_encoder_and_decoder(cls):
    encoder, decoder, message = MESSAGES[cls]
    text = encoder(message)
    assert decoder(text) == message
    if encoder is not encode_rank_file and encoder is not encode_pair_request:
        assert "\n" not in text  # one line on a pipe, a socket or a log


def test_every_message_class_of_the_wire_module_has_its_pair_here():
    """A message added to wire.py without a round trip here fails."""
    defined = {obj for obj in vars(wire).values() if dataclasses.is_dataclass(obj) and obj.__module__ == wire.__name__}
    assert defined == set(MESSAGES)
    assert set(wire.MESSAGES.values()) == {c for c, (e, _, _) in MESSAGES.items() if e is encode}


def test_a_step_row_is_the_line_progress_json_always_printed():
    row = {"step": 3, "step_time_ms": 10.0, "data_wait_ms": 0.1, "tokens": 512, "tokens_per_s": 900.0, "loss": 2.5,
           "lr": 1e-3}
    line = encode_row(StepRow.of(row))
    assert line == '{"step": 3, "loss": 2.5, "tokens_per_s": 900.0, "step_time_ms": 10.0}'
    assert decode_row(line + "\n") == StepRow(3, 2.5, 900.0, 10.0)


@pytest.mark.parametrize("line", ["", "step 3/10 loss 2.5", "{not json", "[1, 2]", '{"step": 3}',
                                  encode(PairStart("reference"))])
def test_other_lines_are_not_step_rows(line):
    assert decode_row(line) is None


@pytest.mark.parametrize("line", ["", "WARNING: something", "{not json", '{"kind": "nobody"}',
                                  encode_row(StepRow(1, 2.0, 3.0, 4.0))])
def test_other_lines_are_not_tagged_messages(line):
    assert decode(line) is None


def test_a_rank_file_is_written_like_every_json_file_of_a_record():
    _, _, rank = MESSAGES[RankFile]
    assert encode_rank_file(rank) == json_text(dataclasses.asdict(rank))
    nan_row = dataclasses.replace(rank, rows=[{**rank.rows[0], "loss": float("nan")}])
    assert decode_rank_file(encode_rank_file(nan_row)).rows[0]["loss"] is None  # NaN → null, as in summary.json
    assert RankFile.row({**rank.rows[0], "tokens": 512, "lr": 0.1}) == rank.rows[0]


def test_a_newer_senders_extra_fields_are_ignored():
    line = json.dumps({"kind": "pair_start", "arm": "candidate", "added_later": 1})
    assert decode(line) == PairStart("candidate")
    text = json.dumps({**dataclasses.asdict(MESSAGES[PairRequest][2]), "added_later": 1})
    assert decode_pair_request(text) == MESSAGES[PairRequest][2]


# Modules that send or receive these messages: they call no json encoder of their own (every message goes through
# wire.py). The json reads left are of files that are not messages between processes, each named with why.
MESSAGE_MODULES = ("run/rows.py", "run/arm.py", "run/pair.py", "spawn/stepped.py", "spawn/paired.py",
                   "spawn/dp_worker.py", "spawn/rankmerge.py", "spawn/runner.py", "spawn/msrun.py")
JSON_READS = {"run/pair.py": "an arm's own summary.json, in this process",
              "spawn/paired.py": "paired.json, merged by rankmerge in this same process",
              "spawn/rankmerge.py": "each rank's paired_rank_K.json (a paired round's log, a dict: paired.Measurement)"}


def _json_calls(path: Path) -> set[str]:
    calls = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "json"
                and node.attr in ("dumps", "loads", "dump", "load")):
            calls.add(node.attr)
    return calls


@pytest.mark.parametrize("module", MESSAGE_MODULES)
def test_message_modules_encode_nothing_by_hand(module):
    calls = _json_calls(HELPERS / module)
    assert not calls & {"dumps", "dump"}, f"{module} encodes JSON itself; add the message to helpers/wire.py"
    assert not calls & {"loads", "load"} or module in JSON_READS, f"{module} decodes JSON itself"
