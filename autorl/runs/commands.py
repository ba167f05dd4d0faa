"""The commands that read past runs: ``autorl results`` (the runs of ``$AUTORL_HOME/results.csv`` as a
table, filtered, compared side by side under equal evaluation keys only, or grouped into the agent
summary; docs/LOCAL.md, "Results") and ``autorl report`` (a run's report, written again)."""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from autorl.errors import UsageError
from autorl.runs.repeats import (
    PairedComparison,
    RepeatGroup,
    aggregate_json,
    group_runs,
    paired_comparison,
    why_not_paired,
)
from autorl.runs.results import (
    COLUMNS,
    FLOAT_COLUMNS,
    ResultRow,
    csv_text,
    format_cell,
    read_rows,
    results_path,
)
from autorl.runs.seeds import RunSeed, read_run_seed
from autorl.runs.summary import SUMMARY_COLUMNS, AgentSummary, RunOutcome, summarize
from autorl.untrusted_text import printable, rich_text

if TYPE_CHECKING:
    from autorl.settings import HomeSettings
    from autorl.store import Experiment

T = TypeVar("T")


def _print_table(rows: list[ResultRow], home: Path, notes: dict[str, str]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if not console.is_terminal:
        console = Console(width=360)  # piped or redirected: whole values, not ellipses at 80 columns
    table = Table(title="AutoRL runs", title_justify="left")
    shown = ("run_id", "task", "agent", "base_model", "baseline", "best_score", "improvement")
    final = ("feedback", "final", "final 95 %", "final p", "selection", "test evals")
    numeric = {*FLOAT_COLUMNS, "submissions", "final", "final p", "test evals"}
    for name in (*shown, "best 95 %", *final, "submissions", "duration_s", "status", "note"):
        table.add_column(name, justify="right" if name in numeric else "left")
    for row in rows:
        cells = [format_cell(name, getattr(row, name)) or "-" for name in shown]
        final_interval = (
            _metric_cell([row.final_low, row.final_high])
            if row.final_low is not None and row.final_high is not None
            else "-"
        )
        # The best score's interval, from the run's report (runs without one show "-"); a sealed
        # run's best score is its final on test, whose interval the row holds (the report's best
        # is on validation).
        interval = (
            final_interval
            if row.feedback == "sealed"
            else _metric_cell(_report_metrics(home, row.run_id).get("best_interval"))
        )
        final_cells = [
            row.feedback,
            format_cell("final_score", row.final_score) or "-",
            final_interval,
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
            # How it ended, as recorded (why it failed, what its baseline waited for): text, escaped.
            rich_text(notes.get(row.run_id, "-")),
        )
    console.print(table)


@dataclass(frozen=True)
class RowFilter:
    """Exact matches on the columns people group runs by; ``None`` matches everything."""

    task: str | None = None
    agent: str | None = None
    model: str | None = None

    def matches(self, row: ResultRow) -> bool:
        return (
            (self.task is None or row.task == self.task)
            and (self.agent is None or row.agent == self.agent)
            and (self.model is None or row.base_model == self.model)
        )

    def describe(self) -> str:
        given = {"--task": self.task, "--agent": self.agent, "--model": self.model}
        return " ".join(f"{flag} {value}" for flag, value in given.items() if value is not None)


def select_runs(rows: list[ResultRow], wanted: Sequence[str]) -> list[ResultRow]:
    """The rows of the given run ids (or unique prefixes of them), oldest first."""
    chosen: dict[str, ResultRow] = {}
    for given in wanted:
        hits = [row for row in rows if row.run_id == given] or [r for r in rows if r.run_id.startswith(given)]
        if not hits:
            raise UsageError(f"no run {given!r} in results.csv; list the runs with `autorl results`")
        if len(hits) > 1:
            raise UsageError(f"{given!r} matches {len(hits)} runs ({_listed(hits)}); give more of the id")
        chosen[hits[0].run_id] = hits[0]
    return [row for row in rows if row.run_id in chosen]


#: How many of the runs an ambiguous prefix matches its refusal names; the rest are counted.
LISTED_MATCHES = 5


def _listed(rows: Sequence[ResultRow]) -> str:
    """The run ids of ``rows``, the first :data:`LISTED_MATCHES` named and the rest counted."""
    named = ", ".join(row.run_id for row in rows[:LISTED_MATCHES])
    rest = len(rows) - LISTED_MATCHES
    return f"{named} and {rest} more" if rest > 0 else named


def no_store(database_url: str) -> bool:
    """Whether the store is a SQLite file that does not exist (a home where nothing ran yet): reading
    it would create an empty database and fail on its missing tables."""
    return (
        database_url.startswith("sqlite:///") and not Path(database_url.removeprefix("sqlite:///")).is_file()
    )


#: Report metrics shown beside the results row when comparing runs (from each run's metrics.json).
COMPARED_METRICS = (
    "valid_submission_rate",
    "first_valid_idx",
    "time_to_best",
    "monotonic_ratio",
    "copy_model_count",
    "time_used_ratio",
    "best_interval",
    "best_difference_interval",
    "best_p_value",
    "best_distinguishable",
)


def _metric_cell(value: object) -> str:
    """A report metric as a cell: intervals as ``[low, high]`` in points, two decimals."""
    if value is None:
        return "-"
    if isinstance(value, list) and all(isinstance(v, float | int) for v in value):
        return "[" + ", ".join(f"{v:.2f}" for v in value) + "]"
    return str(value)


def _report_metrics(home: Path, run_id: str) -> dict[str, Any]:
    from autorl.runs.reports import METRICS_FILE, REPORTS_DIR

    path = home.expanduser() / "runs" / run_id / REPORTS_DIR / METRICS_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}  # no report (an older run): its row is compared without it
    return data if isinstance(data, dict) else {}


@dataclass(frozen=True)
class RunKey:
    """A run's evaluation key and the recorded fields it hashes (from this home's store)."""

    key: str
    config: dict[str, Any]


def _from_store(database_url: str, run_ids: Sequence[str], read: Callable[[Experiment], T]) -> dict[str, T]:
    """``read`` of each run whose experiment this home's store holds (others left out)."""
    from sqlalchemy import select
    from sqlalchemy.exc import SQLAlchemyError

    from autorl.store import Database, Experiment

    if no_store(database_url):
        return {}  # no store in this home (nothing created one to read)
    db = Database(database_url)
    try:
        with db.session() as session:
            found = session.scalars(select(Experiment).where(Experiment.name.in_(list(run_ids))))
            return {e.name: read(e) for e in found}
    except SQLAlchemyError:
        return {}  # a store without experiments yet
    finally:
        db.dispose()


def run_keys(database_url: str, run_ids: Sequence[str]) -> dict[str, RunKey]:
    """The evaluation key of each run whose experiment this home's store holds (others left out)."""
    return _from_store(database_url, run_ids, lambda e: RunKey(e.eval_key, dict(e.eval_config)))


def run_notes(database_url: str, run_ids: Sequence[str]) -> dict[str, str]:
    """How each run ended, in the words recorded when it finished: why it failed or stopped, and for
    a run that ended while its baseline waited, what for (its wait reason) and what to do."""
    notes = _from_store(database_url, run_ids, lambda e: e.message)
    return {run_id: note for run_id, note in notes.items() if note}


def check_same_key(rows: Sequence[ResultRow], keys: dict[str, RunKey]) -> None:
    """Refuse (UsageError, exit 2) to compare runs evaluated under different keys, naming the
    fields that differ. A run the store does not know has no key to compare: it may be compared
    only with runs the store does not know either."""
    known = [row for row in rows if row.run_id in keys]
    unknown = [row.run_id for row in rows if row.run_id not in keys]
    if known and unknown:
        raise UsageError(
            f"the evaluation key of {', '.join(unknown)} is not in this home's store, so it cannot be "
            f"compared with {known[0].run_id}: compare runs recorded in one home (--home)"
        )
    if not known:
        return
    from autorl.eval_config import differing_fields

    first = keys[known[0].run_id]
    for row in known[1:]:
        other = keys[row.run_id]
        if other.key != first.key:
            differing = differing_fields(first.config, other.config) or ["the key's encoding"]
            raise UsageError(
                f"runs {known[0].run_id} and {row.run_id} were evaluated under different evaluation keys "
                f"({first.key[:12]} and {other.key[:12]}): they differ in {', '.join(differing)}; "
                "their scores are not comparable, compare runs of one key only"
            )


def check_same_feedback(rows: Sequence[ResultRow]) -> None:
    """Refuse (UsageError, exit 2) to compare a test-mode run with a sealed one: a best over many
    test scores and a single final evaluation are not the same measurement (docs/PROTOCOL.md)."""
    modes = {row.feedback for row in rows}
    if len(modes) > 1:
        test_run = next(row.run_id for row in rows if row.feedback == "test")
        sealed_run = next(row.run_id for row in rows if row.feedback != "test")
        raise UsageError(
            f"run {test_run} was scored with feedback test and {sealed_run} with feedback sealed: a best "
            "over test scores and one final evaluation are not comparable; compare runs of one feedback mode"
        )


@dataclass(frozen=True)
class RunComparison:
    """What ``--compare`` shows of its runs beside their rows: each one's seed and evaluation key,
    the runs grouped as repeats, and the paired test of two agents."""

    seeds: dict[str, RunSeed]
    keys: dict[str, RunKey]
    groups: list[RepeatGroup]
    paired: PairedComparison | None

    @classmethod
    def of(cls, rows: Sequence[ResultRow], home: Path, keys: dict[str, RunKey]) -> RunComparison:
        seeds = {row.run_id: seed for row in rows if (seed := read_run_seed(home, row.run_id)) is not None}
        groups = group_runs(rows, seeds, {run_id: key.key for run_id, key in keys.items()})
        return cls(seeds, keys, groups, paired_comparison(groups))

    def to_json(self, rows: Sequence[ResultRow]) -> dict[str, Any]:
        return {"runs": [row.to_json() for row in rows], **aggregate_json(self.groups, self.paired)}


def _number(value: float | None, *, signed: bool = False) -> str:
    if value is None or not math.isfinite(value):
        return "-"
    return f"{value:+.2f}" if signed else f"{value:.2f}"


def _runs_cell(group: RepeatGroup) -> str:
    """How many runs the group has; "2 of 3" where only 2 enter its means."""
    counted, given = len(group.counted), len(group.runs)
    return str(given) if counted == given else f"{counted} of {given}"


def _print_repeats(console: Any, comparison: RunComparison) -> None:
    """Each group's runs, seeds, and mean ± SEM of the final score and the improvement; then the
    paired test of two agents across seeds, or why there is none."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title="Repeats: mean ± SEM over each group's runs", title_justify="left")
    for name in ("task", "agent", "base_model", "feedback", "eval_key", "runs", "seeds"):
        table.add_column(name, justify="right" if name == "runs" else "left")
    for name in ("final mean", "final SEM", "impr mean", "impr SEM"):
        table.add_column(name, justify="right")
    for group in comparison.groups:
        final, improvement = group.final_score, group.improvement
        seeds = sorted({run.seed for run in group.counted if run.seed is not None})
        table.add_row(
            *map(rich_text, (group.task, group.agent, group.base_model, group.feedback)),
            (group.eval_key or "-")[:12],
            _runs_cell(group),
            ", ".join(map(str, seeds)) or "-",
            _number(final.mean),
            _number(final.sem),
            _number(improvement.mean, signed=True),
            _number(improvement.sem),
        )
    console.print(table)
    paired = comparison.paired
    if paired is None:
        console.print(Text(f"paired test: none: {why_not_paired(comparison.groups)}"))
        return
    names = f"{printable(paired.second.agent)} - {printable(paired.first.agent)}"
    test = paired.test
    lines = []
    if test is not None:
        interval = (
            f" (95 % t interval {test.interval[0]:+.2f} to {test.interval[1]:+.2f})"
            if test.interval is not None
            else ""
        )
        lines.append(
            f"paired difference of the final score, {names}, over seeds "
            f"{', '.join(map(str, paired.seeds))} (n={test.n}): {test.mean_difference:+.2f} points{interval}"
        )
    if paired.testable and test is not None and test.p_value is not None:
        statistic = "inf" if test.statistic is None else f"{test.statistic:.3f}"
        lines.append(f"paired t-test: t = {statistic}, df = {test.n - 1}, p = {test.p_value:.3g}")
    else:
        lines.append(f"paired t-test: {paired.reason}")
    if paired.ambiguous_seeds:
        shown = ", ".join(map(str, paired.ambiguous_seeds))
        lines.append(
            f"left out: seeds {shown} (more than one run of one agent has them; compare one run per seed)"
        )
    for line in lines:
        console.print(Text(line))


def _print_comparison(rows: list[ResultRow], home: Path, comparison: RunComparison) -> None:
    from rich.console import Console
    from rich.table import Table

    keys = comparison.keys
    console = Console()
    if not console.is_terminal:
        console = Console(width=240)
    table = Table(title="AutoRL runs side by side", title_justify="left")
    table.add_column("")
    for row in rows:
        table.add_column(rich_text(row.run_id), justify="right")
    for name in (name for name in COLUMNS[1:] if name != "workspace"):
        table.add_row(name, *[rich_text(format_cell(name, getattr(row, name)) or "-") for row in rows])
    reports = [_report_metrics(home, row.run_id) for row in rows]
    for name in COMPARED_METRICS:
        table.add_row(name, *[_metric_cell(r.get(name)) for r in reports])
    table.add_row("eval_key", *[keys[row.run_id].key if row.run_id in keys else "-" for row in rows])
    table.add_row("seed", *[_seed_cell(comparison.seeds.get(row.run_id)) for row in rows])
    console.print(table)
    _print_repeats(console, comparison)


def _seed_cell(seed: RunSeed | None) -> str:
    if seed is None:
        return "-"
    return str(seed.seed) + (f" ({seed.repeat}/{seed.repeats})" if seed.repeats > 1 else "")


def summary_of(rows: Sequence[ResultRow]) -> list[AgentSummary]:
    """The agent summary of these runs: grouped by task, agent, base model and feedback mode."""
    return summarize(
        RunOutcome(
            task=row.task,
            agent=row.agent,
            model=row.base_model,
            feedback=row.feedback,
            baseline=row.baseline,
            best_score=row.best_score,
            improvement=row.improvement,
            submissions=row.submissions,
            success=row.success,
        )
        for row in rows
    )


def _summary_cell(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(round(value, 4)) if math.isfinite(value) else ""
    return str(value)


def summary_csv_text(summaries: Sequence[AgentSummary]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(SUMMARY_COLUMNS)
    for summary in summaries:
        writer.writerow([_summary_cell(getattr(summary, name)) for name in SUMMARY_COLUMNS])
    return buffer.getvalue()


def _print_summary(summaries: Sequence[AgentSummary]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if not console.is_terminal:
        console = Console(width=240)
    table = Table(title="AutoRL agent summary", title_justify="left")
    for name in ("task", "agent", "base_model", "feedback"):
        table.add_column(name)
    numbers = ("runs", "succeeded", "baseline", "best", "mean_best", "best_impr", "mean_impr", "submissions")
    for name in numbers:
        table.add_column(name, justify="right")

    def score(value: float | None, *, signed: bool = False) -> str:
        return "-" if value is None else (f"{value:+.2f}" if signed else f"{value:.2f}")

    for s in summaries:
        table.add_row(
            *map(rich_text, (s.task, s.agent, s.model, s.feedback)),
            str(s.runs),
            str(s.succeeded),
            score(s.baseline),
            score(s.best_score),
            score(s.mean_best_score),
            score(s.best_improvement, signed=True),
            score(s.mean_improvement, signed=True),
            str(s.submissions),
        )
    console.print(table)


def _home_settings(home: Path | None) -> HomeSettings:
    """The home a command reads: ``--home``, else ``$AUTORL_HOME``."""
    from autorl.settings import HomeSettings

    return HomeSettings() if home is None else HomeSettings(home=home)


def _run(args: argparse.Namespace) -> int:
    from autorl.runs.run_lock import recover_orphaned_runs

    if args.summary and args.compare:
        raise UsageError(
            "--summary groups every run and --compare shows chosen runs side by side: give one of them "
            "(narrow the summary with --task, --agent or --model)"
        )
    settings = _home_settings(args.home)
    home = settings.home
    # A run whose `autorl run` was killed wrote no row: record it now, as interrupted.
    for row in recover_orphaned_runs(home, settings.database_url):
        print(f"run {row.run_id} was killed before it finished; recorded as interrupted", file=sys.stderr)
    row_filter = RowFilter(task=args.task, agent=args.agent, model=args.model)
    rows = [row for row in read_rows(home) if row_filter.matches(row)]
    comparison: RunComparison | None = None
    if args.compare:
        rows = select_runs(rows, args.compare)
        keys = run_keys(settings.database_url, [row.run_id for row in rows])
        check_same_key(rows, keys)
        check_same_feedback(rows)
        comparison = RunComparison.of(rows, home, keys)
    if args.summary and (rows or args.json or args.csv):
        summaries = summary_of(rows)
        if args.json:
            print(json.dumps([summary.to_json() for summary in summaries], indent=2))
        elif args.csv:
            sys.stdout.write(summary_csv_text(summaries))
        else:
            _print_summary(summaries)
    elif args.json and comparison is not None:
        # The rows (as --json prints them) under "runs", with the repeats' aggregate beside them.
        print(json.dumps(comparison.to_json(rows), indent=2))
    elif args.json:
        # Only the JSON document on stdout, so that `autorl results --json | jq` works.
        print(json.dumps([row.to_json() for row in rows], indent=2))
    elif args.csv:
        sys.stdout.write(csv_text(rows, header=True))
    elif comparison is not None:
        _print_comparison(rows, home, comparison)
    elif rows:
        _print_table(rows, home, run_notes(settings.database_url, [row.run_id for row in rows]))
    elif row_filter.describe():
        print(f"no runs match {row_filter.describe()} in {results_path(home)}", file=sys.stderr)
    else:
        print(f"no runs recorded yet in {results_path(home)}", file=sys.stderr)
    return 0


def register_results(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "results",
        help="show the results of past runs ($AUTORL_HOME/results.csv)",
        description="One row per run: baseline, best score, improvement, submissions, status. "
        "Filter by task, agent or model; compare runs side by side with --compare; group them by "
        "task, agent, base model and feedback mode with --summary.",
    )
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--csv", action="store_true", help="print the rows as CSV, with the header")
    output.add_argument("--json", action="store_true", help="print a JSON list of rows, oldest first")
    parser.add_argument("--task", default=None, help="only runs of this task")
    parser.add_argument("--agent", default=None, help="only runs of this agent")
    parser.add_argument("--model", default=None, help="only runs of this base model")
    parser.add_argument(
        "--compare",
        nargs="+",
        default=None,
        metavar="RUN",
        help="show these runs side by side (run ids or unique prefixes), with their report metrics and "
        "seeds, then grouped as repeats (mean ± SEM of the final score and the improvement per task, "
        "agent, model, feedback and key; the paired t-test of two agents across seeds); runs evaluated "
        "under different evaluation keys are refused, naming the fields that differ",
    )
    parser.add_argument(
        "--summary",
        action="store_true",
        help="the agent summary: runs grouped by task, agent, base model and feedback mode, with how "
        "many ran and succeeded, the mean baseline, the best and mean best score and improvement, and "
        "the scored submissions (with --json or --csv in that form)",
    )
    parser.add_argument("--home", type=Path, default=None, help="platform home (default: $AUTORL_HOME)")
    parser.set_defaults(func=_run)


def _report(args: argparse.Namespace) -> int:
    import time

    from autorl.errors import NotFoundError
    from autorl.runs.reports import report_run

    settings = _home_settings(args.home)
    given = Path(args.run)
    run_id = given.name if given.is_dir() else args.run
    if no_store(settings.database_url):
        raise UsageError(
            f"no runs recorded yet in {settings.home} (it has no database): start one with `autorl run`, "
            "list them with `autorl results`"
        )
    try:
        report = report_run(settings, run_id, time.time())
    except NotFoundError as exc:
        raise UsageError(
            f"no run {run_id!r} in the database of {settings.home} (or AUTORL_DATABASE_URL); "
            "list the runs with `autorl results`"
        ) from exc
    if args.json:
        print(json.dumps(report.metrics, indent=2))
    else:
        seed = report.metrics.get("seed")
        if seed is not None:
            repeats = report.metrics.get("repeats") or 1
            of = f" (repeat {report.metrics.get('repeat')} of {repeats})" if repeats > 1 else ""
            print(f"seed:    {seed}{of}")
        print(f"metrics: {report.metrics_path}\nplot:    {report.plot_path}")
    return 0


def register_report(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "report",
        help="(re)write a run's reports/metrics.json and score-trajectory PNG",
        description="Compute a run's metrics (valid-submission rate, time to best, monotonic ratio, "
        "copies of the base model, share of the budget used, ...) from the database and write "
        "$AUTORL_HOME/runs/RUN/reports/metrics.json and reports/figures/score_trajectory.png.",
    )
    parser.add_argument("run", metavar="RUN", help="the run id (as in `autorl results`) or its run folder")
    parser.add_argument("--home", type=Path, default=None, help="platform home (default: $AUTORL_HOME)")
    parser.add_argument("--json", action="store_true", help="print only the metrics, as JSON")
    parser.set_defaults(func=_report)
