"""The table ``autorl results`` prints, for a home's runs and a grader's experiments alike.

Narrow by default: what a researcher reads first (run id, task, agent, base model, baseline → best,
improvement, status) in at most :data:`NARROW_WIDTH` columns (or the terminal's width, if less).
Run ids are printed whole, since they are what every other command takes; task, agent and model
are folded onto more lines where they do not fit, and where a run id is so long that they would not
fit beside it (a cluster's experiment names carry a uid) they go under it, in the run's column. How
each run ended follows the table. ``--wide`` prints every column, as results.csv holds them, with
each run's note in the last.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from autorl.provenance.unverified import printable_message
from autorl.runs.results import FLOAT_COLUMNS, ResultRow, format_cell
from autorl.untrusted_text import printable, rich_text

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

#: The narrow table's width, in terminal columns.
NARROW_WIDTH = 100
#: Piped or redirected, the wide table is this wide: whole values, not ellipses at 80 columns.
WIDE_WIDTH = 360
#: Task, agent and model go under the run id where a column of theirs would be narrower than this.
MIN_FOLDED_WIDTH = 8
#: The narrow table's columns: the run, what ran (folded where long), and its numbers.
RUN = "run"
FOLDED = ("task", "agent", "model")
NUMBERS = ("baseline → best", "impr", "status")
CAPTION = "scores on the test split (a sealed run's best is its final score); every column: --wide"


def metric_cell(value: object) -> str:
    """A report metric as a cell: intervals as ``[low, high]`` in points, two decimals."""
    if value is None:
        return "-"
    if isinstance(value, list) and all(isinstance(v, float | int) for v in value):
        return "[" + ", ".join(f"{v:.2f}" for v in value) + "]"
    return str(value)


def _score(value: float | None, *, signed: bool = False) -> str:
    if value is None:
        return "-"
    return f"{value:+.2f}" if signed else f"{value:.2f}"


def _console(width: int, *, cap: bool) -> Console:
    """A console ``width`` wide where output is piped; on a terminal, the terminal's width (at most
    ``width`` with ``cap``)."""
    from rich.console import Console

    console = Console()
    if not console.is_terminal:
        return Console(width=width)
    return Console(width=min(console.width, width)) if cap else console


def print_results(
    rows: Sequence[ResultRow],
    notes: dict[str, str],
    metrics: Callable[[str], dict[str, Any]],
    *,
    title: str,
    wide: bool,
) -> None:
    """The rows as a table; ``notes`` by run id (how each run ended); ``metrics`` reads a run's
    report (only for the wide table's best-score interval of a row that does not hold it)."""
    if wide:
        _console(WIDE_WIDTH, cap=False).print(_wide_table(rows, notes, metrics, title))
        return
    console = _console(NARROW_WIDTH, cap=True)
    table = narrow_table(rows, console.width, title)
    if _table_width(table) > console.width:  # run ids longer than the width: printed whole all the same
        console = _console(_table_width(table), cap=False)
    console.print(table)
    from rich.text import Text

    for row in rows:
        if row.run_id in notes:
            noted = printable_message(notes[row.run_id])
            console.print(Text(f"{printable(row.run_id)}: {noted}", overflow="fold"))


def _narrow_cells(row: ResultRow) -> dict[str, str]:
    """The narrow table's cells of ``row``, escaped (agent-controlled text is data)."""
    return {
        RUN: printable(row.run_id),
        "task": printable(row.task),
        "agent": printable(row.agent) or "-",
        "model": printable(row.base_model),
        "baseline → best": f"{_score(row.baseline)} → {_score(row.best_score)}",
        "impr": _score(row.improvement, signed=True),
        "status": row.status,
    }


def _cell_width(text: str) -> int:
    from rich.cells import cell_len

    return cell_len(text)


def narrow_table(rows: Sequence[ResultRow], width: int, title: str) -> Table:
    """The narrow table, its columns sized to fit ``width`` (see the module's docstring)."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    cells = [_narrow_cells(row) for row in rows]
    for row_cells in cells:
        row_cells["what"] = " · ".join(row_cells[name] for name in FOLDED)
    natural = {name: max([_cell_width(name)] + [_cell_width(c[name]) for c in cells]) for name in cells[0]}
    numbers = sum(natural[name] for name in NUMBERS)
    beside = width - natural[RUN] - numbers - _separators(1 + len(FOLDED) + len(NUMBERS))
    stacked = beside < MIN_FOLDED_WIDTH * len(FOLDED)
    table = Table(
        title=title,
        title_justify="left",
        caption=CAPTION,
        caption_justify="left",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        padding=(0, 1, 0, 0),
        show_lines=stacked,  # a blank line between rows of several lines each
    )
    if stacked:
        room = width - numbers - _separators(1 + len(NUMBERS))
        table.add_column(f"{RUN}\n{' · '.join(FOLDED)}", width=max(natural[RUN], min(natural["what"], room)))
    else:
        table.add_column(RUN, width=natural[RUN], no_wrap=True)
        for name, share in _shares({name: natural[name] for name in FOLDED}, beside).items():
            table.add_column(name, width=share, overflow="fold")
    for name in NUMBERS:
        table.add_column(
            name, width=natural[name], no_wrap=True, justify="left" if name == "status" else "right"
        )
    for row_cells in cells:  # escaped by _narrow_cells
        what = [Text(f"{row_cells[RUN]}\n{row_cells['what']}", overflow="fold")] if stacked else None
        table.add_row(
            *(what or [Text(row_cells[name], overflow="fold") for name in (RUN, *FOLDED)]),
            *(Text(row_cells[name]) for name in NUMBERS),
        )
    return table


def _separators(columns: int) -> int:
    """What the narrow table's box and padding add to its columns' widths: a space and a
    separator between two columns."""
    return 2 * (columns - 1)


def _shares(natural: dict[str, int], room: int) -> dict[str, int]:
    """The widths of the folded columns in ``room``: each at most its widest cell, the narrowest
    served first, the rest shared evenly."""
    widths: dict[str, int] = {}
    for served, name in enumerate(sorted(natural, key=natural.__getitem__)):
        widths[name] = min(natural[name], room // (len(natural) - served))
        room -= widths[name]
    return {name: widths[name] for name in natural}


def _table_width(table: Table) -> int:
    return sum(column.width or 0 for column in table.columns) + _separators(len(table.columns))


def _wide_table(
    rows: Sequence[ResultRow], notes: dict[str, str], metrics: Callable[[str], dict[str, Any]], title: str
) -> Table:
    from rich.table import Table
    from rich.text import Text

    table = Table(title=title, title_justify="left")
    shown = ("run_id", "task", "agent", "base_model", "baseline", "best_score", "improvement")
    final = ("feedback", "final", "final 95 %", "final p", "selection", "test evals")
    numeric = {*FLOAT_COLUMNS, "submissions", "final", "final p", "test evals"}
    for name in (*shown, "best 95 %", *final, "submissions", "duration_s", "status", "note"):
        table.add_column(name, justify="right" if name in numeric else "left")
    for row in rows:
        cells = [format_cell(name, getattr(row, name)) or "-" for name in shown]
        final_interval = (
            metric_cell([row.final_low, row.final_high])
            if row.final_low is not None and row.final_high is not None
            else None
        )
        # The best score's interval: a row's result on test is its best (test) or its final score
        # (sealed), so its interval is the best's; a row written before those columns takes it from
        # the run's report ("-" without one).
        if final_interval is not None:
            interval = final_interval
        elif row.best_score is not None and row.feedback == "test":
            interval = metric_cell(metrics(row.run_id).get("best_interval"))
        else:
            interval = "-"
        final_cells = [
            row.feedback,
            format_cell("final_score", row.final_score) or "-",
            final_interval or "-",
            format_cell("final_p_value", row.final_p_value) or "-",
            row.selection or "-",
            "-" if row.test_evaluations is None else str(row.test_evaluations),
        ]
        table.add_row(
            *map(rich_text, cells),
            interval,
            *map(rich_text, final_cells),
            str(row.submissions),
            f"{row.duration_s:.0f}",
            row.status,
            # How it ended, as recorded (why it failed, what its baseline waited for): text, each part
            # escaped once (its notes of what was not verified are escaped where they are made).
            Text(printable_message(notes.get(row.run_id, "-"))),
        )
    return table
