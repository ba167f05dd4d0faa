"""What ``autorl run`` shows while it works: phase, time left, each submission and its score.

On a terminal this is a rich live panel; otherwise (CI, a log file) one line per change, so that
a log reads as a history rather than a pile of redraws, plus a status line every
:data:`STATUS_INTERVAL_S` while the agent runs (time left, latest and best score).

Every text it is given can quote the agent (its paths, its errors, a note of what could not be
verified): each is shown here escaped and at most :data:`MAX_LINE_CHARS` long, whoever the caller.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from autorl.api.answers import ExperimentAnswer, SubmissionAnswer
from autorl.protocol.feedback import Feedback
from autorl.untrusted_text import printable_within, rich_text, shortened

#: Seconds between status lines in a log (no live panel) while the agent runs.
STATUS_INTERVAL_S = 30.0
#: Characters of one line or phase it shows (an agent's string can be any length).
MAX_LINE_CHARS = 1_000


def shown(text: str) -> str:
    """``text`` as a progress line shows it: escaped, one line, at most :data:`MAX_LINE_CHARS` long."""
    return printable_within(text, MAX_LINE_CHARS)


def fmt_score(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def load_note() -> str | None:
    """What to tell the user when the machine is busier than its cores (the last minute's load
    average above the cores this process may use), else None."""
    cores = len(os.sched_getaffinity(0))
    load = os.getloadavg()[0]
    if load <= cores:
        return None
    return (
        f"the machine is loaded (load average {load:.1f} on {cores} core{'s' if cores > 1 else ''}): "
        "training and evaluation get less CPU than the budget assumes, so the agent does less in it"
    )


def fmt_duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 60}:{seconds % 60:02d}"


@dataclass
class _State:
    phase: str = "starting"
    detail: str = ""
    baseline: float | None = None
    best: float | None = None
    end_time: float | None = None
    submissions: dict[int, SubmissionAnswer] = field(default_factory=dict)


class Progress:
    """Thread-safe: the main thread sets phases, a poller thread feeds submissions."""

    def __init__(self, title: str, console: Console | None = None) -> None:
        # soft_wrap: a line in a log file stays one line (no wrapping at 80 columns).
        self.console = console or Console(stderr=True, soft_wrap=True)
        self.title = title
        self._state = _State()
        self._lock = threading.Lock()
        self._live: Live | None = None
        self._started = time.monotonic()
        self._last_status: float | None = None

    def __enter__(self) -> Progress:
        if self.console.is_terminal:
            self._live = Live(console=self.console, refresh_per_second=2, get_renderable=self._render)
            self._live.start()
        else:
            self.console.print(Text(shown(self.title)))
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None

    def _say(self, text: str) -> None:
        if self._live is None:
            # A Text, never markup: lines carry the agent's paths and errors, escaped here.
            self.console.print(Text(f"[{fmt_duration(time.monotonic() - self._started)}] {shown(text)}"))

    def phase(self, name: str, detail: str = "") -> None:
        with self._lock:
            unchanged = (self._state.phase, self._state.detail) == (name, detail)
            self._state.phase, self._state.detail = name, detail
        if not unchanged:
            self._say(f"phase={name}" + (f" {detail}" if detail else ""))

    def note(self, text: str) -> None:
        """A line that stays in the scrollback in both modes."""
        if self._live is not None:
            self._live.console.print(Text(shown(text)))
        else:
            self._say(text)

    def set_deadline(self, end_time: float | None) -> None:
        with self._lock:
            self._state.end_time = end_time
            self._last_status = time.monotonic()

    def status_line(self) -> str:
        """Phase, the agent's time left, the latest scored submission and the best score."""
        with self._lock:
            state = self._state
            remaining = None if state.end_time is None else state.end_time - time.time()
            latest = _latest_scored(state)
            best = state.best
        text = f"phase={state.phase}"
        if remaining is not None:
            text += f" time left {fmt_duration(remaining)}"
        if latest is not None:
            text += f", latest score {fmt_score(latest.score)} ({latest.model_path})"
        else:
            text += ", no score yet"
        return text + f", best {fmt_score(best)}, baseline {fmt_score(state.baseline)}"

    def tick(self) -> None:
        """Print the status line when :data:`STATUS_INTERVAL_S` has passed since the last one (logs
        only: the live panel shows the same at all times)."""
        with self._lock:
            due = (
                self._state.end_time is not None
                and self._last_status is not None
                and time.monotonic() - self._last_status >= STATUS_INTERVAL_S
            )
            if due:
                self._last_status = time.monotonic()
        if due:
            self._say(self.status_line())

    def set_baseline(self, score: float | None) -> None:
        with self._lock:
            self._state.baseline = score

    def update(self, experiment: ExperimentAnswer, submissions: list[SubmissionAnswer]) -> None:
        changed: list[str] = []
        sealed = experiment.feedback == Feedback.SEALED
        with self._lock:
            state = self._state
            # Sealed: submissions are scored and compared on validation; the one evaluation on
            # test at the end is shown as the final one, not as a submission.
            state.baseline = experiment.validation_baseline_score if sealed else experiment.baseline_score
            state.best = experiment.best_score
            for view in submissions:
                if view.is_baseline:
                    continue
                final = sealed and view.split == "test"
                old = state.submissions.get(view.submission_id)
                if old is None or old.status != view.status:
                    changed.append(("final evaluation on test: " if final else "") + self._describe(view))
                if not final:
                    state.submissions[view.submission_id] = view
        for line in changed:
            self._say(line)

    @staticmethod
    def _describe(view: SubmissionAnswer) -> str:
        # The agent's number where it has one: the id its own log and scores.json show.
        number = view.number if view.number is not None else view.submission_id
        text = f"submission {number} {view.model_path} status={view.status}"
        if view.status == "scored":
            text += f" score={fmt_score(view.score)} improvement={fmt_score(view.improvement)}"
        elif view.status == "failed" and view.error:
            text += f" error={shortened(view.error, 200)}"
        return text

    def _render(self) -> Group:
        with self._lock:
            state = self._state
            remaining = None if state.end_time is None else state.end_time - time.time()
            header = Text.assemble(
                (shown(self.title), "bold"),
                "\nphase: ",
                (shown(state.phase), "cyan"),
                f"  {shown(state.detail)}" if state.detail else "",
                "\nelapsed: ",
                fmt_duration(time.monotonic() - self._started),
                "   agent time left: ",
                fmt_duration(remaining) if remaining is not None else "-",
                "\nbaseline: ",
                fmt_score(state.baseline),
                "   latest: ",
                fmt_score(latest.score if (latest := _latest_scored(state)) else None),
                "   best: ",
                (fmt_score(state.best), "green"),
            )
            table = Table(show_edge=False, pad_edge=False)
            for column in ("id", "checkpoint", "status", "score", "improvement"):
                table.add_column(column)
            for sid, view in sorted(state.submissions.items())[-12:]:
                table.add_row(
                    str(sid),
                    rich_text(view.model_path),
                    view.status,
                    fmt_score(view.score),
                    fmt_score(view.improvement),
                )
        return Group(header, table) if state.submissions else Group(header)


def _latest_scored(state: _State) -> SubmissionAnswer | None:
    """The scored submission with the highest id (the latest submitted of those scored)."""
    scored = [view for _, view in sorted(state.submissions.items()) if view.status == "scored"]
    return scored[-1] if scored else None
