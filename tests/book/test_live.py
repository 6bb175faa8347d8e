"""Live curves: rows the runner parses reach the panel's image and a notebook's display, frame by frame."""
from __future__ import annotations

from helpers.book.live import LiveCurves, live_curves
from helpers.book.widgets import RoundPanel
from helpers.spawn import paired, runner
from helpers.spawn.live import listen, publish
from helpers.wire import PairDone, StepRow, encode, encode_row
from tests.book.test_report import FakeWorkbook

PNG = b"\x89PNG"


def test_rows_the_runners_parse_reach_a_listener():
    got = []
    with listen(lambda label, row: got.append((label, row["step"]))):
        runner.show_row(None, "round 1 x candidate 1/2", encode_row(StepRow(3, 2.5, 900.0, 10.0)))
        runner.show_row(None, "ignored", "a log line, not a row")
        arms = {"reference": {"step": 12, "loss": 3.0, "tokens_per_s": 1000.0},
                "candidate": {"step": 12, "loss": None, "tokens_per_s": 1100.0}}
        paired.show_progress(None, "round 2 y", encode(PairDone(1, 8, arms)))
    publish("after the block", {"step": 1})  # nobody listens any more
    assert got == [("round 1 x candidate 1/2", 3), ("round 2 y reference", 12), ("round 2 y candidate", 12)]


def test_frames_are_throttled_and_differ_as_rows_arrive():
    frames = []
    curves = LiveCurves(frames.append, "t", min_interval_s=3600)
    for step in range(1, 6):
        curves.add("r candidate", {"step": step, "loss": 4.0 - 0.1 * step, "tokens_per_s": 1000.0 + step})
    assert len(frames) == 1 and frames[0].startswith(PNG)  # the first row draws; the rest wait for the interval
    curves.add("r reference", {"step": 1, "loss": None, "tokens_per_s": 990.0})  # a paired arm before its first row
    curves.draw()
    assert len(frames) == 2 and frames[1] != frames[0] and curves.frames == 2


def test_live_curves_in_a_cell_leave_the_final_frame(monkeypatch):
    shown = []

    class Handle:
        def update(self, obj):
            shown.append(obj.data)
    monkeypatch.setattr("IPython.display.display", lambda obj, display_id=None: shown.append(obj.data) or Handle())
    with live_curves("round: x", min_interval_s=0) as curves:
        publish("round 1 x reference 1/2", {"step": 1, "loss": 3.0, "tokens_per_s": 500.0})
        publish("round 1 x candidate 1/2", {"step": 1, "loss": 3.1, "tokens_per_s": 600.0})
    # a placeholder, a frame per row, then the final frame (the same picture as the last live one)
    assert len(shown) == 4 and len(set(shown)) == 3 and shown[-1] == shown[-2]
    assert curves.series.keys() == {"round 1 x reference 1/2", "round 1 x candidate 1/2"}


def test_the_round_panel_draws_live_curves_from_published_rows():
    class Publishing(FakeWorkbook):
        def run_round(self, name, changes, progress=True):
            for step in (1, 2):
                publish(f"round 1 {name} candidate 1/1", {"step": step, "loss": 3.0, "tokens_per_s": 700.0})
            return super().run_round(name, changes, progress)
    panel = RoundPanel(Publishing(), "batch_size", "16")
    panel.run()
    assert panel.frames >= 2 and bytes(panel.curves.value).startswith(PNG)
