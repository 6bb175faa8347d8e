"""An ipywidgets panel for interactive rounds: pick a variable, type candidate values, run with live
progress bars and live loss and tokens/s curves, then keep / reject / roll back. It only fills parameters
and calls the same Workbook methods the headless notebooks call; every button's work is a plain method a
test can call."""
from __future__ import annotations

import html
from typing import Any

import ipywidgets as w
from IPython.display import display

from helpers.bounded_yaml import YamlRefused, load_text
from helpers.config import ConfigError, all_keys, flatten, with_changes
from helpers.tune.ledger import RoundError
from helpers.book.live import LiveCurves
from helpers.book.report import interval_text, round_table, verdict_text
from helpers.spawn.live import listen
from helpers.tune.study import slug


def parse_values(text: str) -> list[Any]:
    """'24, 48' → [24, 48]; each comma-separated item read as YAML (numbers, true/false, strings)."""
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items:
        raise ConfigError("no candidate values; type one or more, comma-separated, e.g. 24, 48")
    values = []
    for item in items:
        try:
            values.append(load_text(item))
        except YamlRefused as exc:
            raise ConfigError(f"candidate value {item!r} {exc}") from None
    return values


class RoundPanel:
    """Widgets over a Workbook (or anything with run_round / decide / rollback / best_config)."""

    def __init__(self, workbook, variable: str = "batch_size", values: str = ""):
        self.workbook = workbook
        self.last = None  # the most recent RoundResult run from this panel
        self.variable = w.Dropdown(options=all_keys(), value=variable, description="variable")
        self.values = w.Text(value=values, placeholder="candidate values, e.g. 24, 48", description="values")
        self.why = w.Text(placeholder="why (for the ledger)", description="why")
        self.run_button = w.Button(description="Run round", button_style="primary", icon="play")
        self.keep_button = w.Button(description="Keep", button_style="success")
        self.reject_button = w.Button(description="Reject", button_style="warning")
        self.rollback_button = w.Button(description="Roll back", button_style="danger", icon="undo")
        self.status = w.HTML(value="Pick a variable and candidate values, then run a round.")
        self.output = w.Output()  # the runner's tqdm.auto bars render here, live
        self.curves = w.Image(format="png", layout=w.Layout(max_width="960px"))  # live curves of the running round
        self.frames = 0  # curve frames drawn so far (a test reads it)
        self.run_button.on_click(lambda _: self.run())
        self.keep_button.on_click(lambda _: self.decide("keep"))
        self.reject_button.on_click(lambda _: self.decide("reject"))
        self.rollback_button.on_click(lambda _: self.roll_back())
        self.widget = w.VBox([
            w.HBox([self.variable, self.values, self.run_button]),
            w.HBox([self.keep_button, self.reject_button, self.rollback_button, self.why]),
            self.status, self.curves, self.output])

    def _ipython_display_(self):
        display(self.widget)

    def _say(self, text: str) -> None:
        self.status.value = text

    def run(self) -> list:
        """One round per candidate value of the chosen variable, each against the then-best config."""
        key = self.variable.value
        try:
            values = parse_values(self.values.value)
            best = self.workbook.best_config()
            for v in values:
                with_changes(best, {key: v})  # refuse a bad value before any run starts
        except ConfigError as exc:
            self._say(f"<b>error:</b> {exc}")
            return []
        results = []
        for v in values:
            curves = LiveCurves(self._frame, f"round {slug(key, v)}: loss")
            # in a kernel, Output swallows exceptions that reach it: catch them inside
            with self.output, listen(curves.add):
                try:
                    result = self.workbook.run_round(slug(key, v), {key: v}, progress=True)
                except (ConfigError, RoundError) as exc:  # e.g. no baseline pinned, value equals the best
                    self._say(f"<b>error:</b> {exc}")
                    break
                finally:
                    if curves.series:
                        curves.draw()  # the final frame stays in the panel
                display(round_table(result))
            results.append(result)
            self.last = result
            self._say(verdict_html(result))
        return results

    def _frame(self, png: bytes) -> None:
        self.curves.value = png
        self.frames += 1

    def decide(self, decision: str) -> None:
        """Record keep/reject for the last round (a human override of the rule when it differs)."""
        if self.last is None:
            self._say("<b>error:</b> run a round first; there is nothing to decide yet")
            return
        self.workbook.decide(self.last.index, decision, "widget", self.why.value or f"{decision} from the panel")
        self._say(f"round {self.last.index}: recorded <b>{decision}</b>")

    def roll_back(self) -> None:
        """Return the best config to what it was before the last round."""
        if self.last is None:
            self._say("<b>error:</b> run a round first; there is nothing to roll back")
            return
        current = flatten(self.workbook.rollback(self.last.index))
        values = ", ".join(f"{k}={current[k]!r}" for k in self.last.changes)
        self._say(f"rolled back to before round {self.last.index}: {values}")


def verdict_html(result) -> str:
    """The panel's status after a round: decision and interval in bold, then the verdict line with its rule."""
    head = f"<b>{result.decision.upper()}</b>"
    figure = interval_text(result.verdict)
    return (f"{head} — <b>{html.escape(figure)}</b><br>{html.escape(verdict_text(result))}"
            f"<br><i>rule: {html.escape(result.verdict.rule)}</i>")


def round_panel(workbook, variable: str = "batch_size", values: str = "") -> RoundPanel:
    """The panel, ready to display (a notebook cell's last line: `round_panel(wb)`)."""
    return RoundPanel(workbook, variable, values)


class SuggestionPanel:
    """One row per `suggest.Suggestion` (change, rule, evidence) with a button that runs it as a round."""

    def __init__(self, workbook, suggestions: list):
        self.workbook, self.suggestions = workbook, list(suggestions)
        self.results: list = []
        self.status = w.HTML(value=f"{len(self.suggestions)} suggested round(s); click one to run it." if
                             self.suggestions else "No rule fired on the best runs: nothing to suggest.")
        self.output = w.Output()
        rows = []
        for i, s in enumerate(self.suggestions):
            button = w.Button(description=f"Run {s.name}"[:40], button_style="primary", icon="play")
            button.on_click(lambda _, i=i: self.run(i))
            text = f"<b>{s.objective}</b> round — {s.rule}<br><i>{s.evidence}</i>"
            rows.append(w.HBox([button, w.HTML(value=text)]))
        self.widget = w.VBox([*rows, self.status, self.output])

    def _ipython_display_(self):
        display(self.widget)

    def run(self, i: int):
        """Run suggestion `i` against the current best; show its table and verdict (None on a refusal)."""
        with self.output:
            try:
                result = self.workbook.run_suggestion(self.suggestions[i], progress=True)
            except (ConfigError, RoundError) as exc:
                self.status.value = f"<b>error:</b> {exc}"
                return None
            display(round_table(result))
        self.results.append(result)
        self.status.value = verdict_text(result)
        return result


def suggestion_panel(workbook, suggestions: list) -> SuggestionPanel:
    """The 'next round to try' panel, ready to display (`suggestion_panel(wb, suggest_for(wb))`)."""
    return SuggestionPanel(workbook, suggestions)
