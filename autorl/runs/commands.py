"""The commands that read past runs: ``autorl results`` (the runs of ``$AUTORL_HOME/results.csv`` as a
table, filtered, compared side by side under equal evaluation keys only, or grouped into the agent
summary; docs/LOCAL.md, "Results") and ``autorl report`` (a run's report, written again, and its
summary); with ``--grader URL`` both read a grader's experiments instead (autorl.runs.grader_runs)."""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autorl.errors import UsageError
from autorl.runs.repeats import (
    PairedComparison,
    RepeatGroup,
    aggregate_json,
    group_runs,
    paired_comparison,
    why_not_paired,
)
from autorl.runs.results import COLUMNS, ResultRow, csv_text, format_cell
from autorl.runs.results_table import metric_cell, print_results
from autorl.runs.run_sources import HomeRuns, RunKey, RunSource, resolve_run_id
from autorl.runs.seeds import RunSeed
from autorl.runs.summary import SUMMARY_COLUMNS, AgentSummary, RunOutcome, summarize
from autorl.untrusted_text import printable, rich_text

if TYPE_CHECKING:
    from autorl.settings import HomeSettings


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


def select_runs(rows: list[ResultRow], wanted: Sequence[str], source: RunSource) -> list[ResultRow]:
    """The rows of the given run ids (or unique prefixes of them), oldest first."""
    run_ids = [row.run_id for row in rows]
    chosen = {resolve_run_id(given, run_ids, source.where, source.listing) for given in wanted}
    return [row for row in rows if row.run_id in chosen]


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
    def of(cls, rows: Sequence[ResultRow], source: RunSource, keys: dict[str, RunKey]) -> RunComparison:
        seeds = source.seeds([row.run_id for row in rows])
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


def _print_comparison(rows: list[ResultRow], source: RunSource, comparison: RunComparison) -> None:
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
    reports = [source.metrics(row.run_id) for row in rows]
    for name in COMPARED_METRICS:
        table.add_row(name, *[metric_cell(r.get(name)) for r in reports])
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


def _home_runs(home: Path | None) -> HomeRuns:
    """The runs of the home a command reads; a ``--home`` that is a file is refused (exit 2)."""
    if home is not None and home.expanduser().exists() and not home.expanduser().is_dir():
        raise UsageError(
            f"--home names {home}, which is a file, not a folder; give --home the platform's home folder "
            "(the folder that holds results.csv and runs/)"
        )
    return HomeRuns(_home_settings(home))


@contextmanager
def _runs_of(args: argparse.Namespace) -> Iterator[RunSource]:
    """The runs a command reads: the grader's experiments with ``--grader``, else the home's runs."""
    if args.grader is None:
        yield _home_runs(args.home)
        return
    from autorl.runs.grader_runs import grader_runs

    with grader_runs(args.grader) as runs:
        yield runs


def _run(args: argparse.Namespace) -> int:
    if args.summary and args.compare:
        raise UsageError(
            "--summary groups every run and --compare shows chosen runs side by side: give one of them "
            "(narrow the summary with --task, --agent or --model)"
        )
    with _runs_of(args) as source:
        return _show(args, source)


def _show(args: argparse.Namespace, source: RunSource) -> int:
    row_filter = RowFilter(task=args.task, agent=args.agent, model=args.model)
    rows = [row for row in source.rows() if row_filter.matches(row)]
    comparison: RunComparison | None = None
    if args.compare:
        rows = select_runs(rows, args.compare, source)
        keys = source.keys([row.run_id for row in rows])
        check_same_key(rows, keys)
        check_same_feedback(rows)
        comparison = RunComparison.of(rows, source, keys)
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
        _print_comparison(rows, source, comparison)
    elif rows:
        title = "AutoRL runs" if args.grader is None else f"Experiments of the grader at {args.grader}"
        notes = source.notes([row.run_id for row in rows])
        print_results(rows, notes, source.metrics, title=title, wide=args.wide)
    elif row_filter.describe():
        print(f"no runs match {row_filter.describe()} in {source.where}", file=sys.stderr)
    elif isinstance(source, HomeRuns) and not source.home.exists():
        flag = "AUTORL_HOME" if args.home is None else "--home"
        print(
            f"no runs recorded yet: the home {printable(str(source.home))} does not exist (check {flag}; "
            "`autorl run` creates it)",
            file=sys.stderr,
        )
    else:
        print(f"no runs recorded yet in {source.where}", file=sys.stderr)
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
    parser.add_argument(
        "--wide",
        action="store_true",
        help="the table with every column (intervals, the final result on test, feedback, duration, "
        "how each run ended); without it the table fits 100 columns",
    )
    parser.add_argument("--home", type=Path, default=None, help="platform home (default: $AUTORL_HOME)")
    _add_grader_option(parser, "list the experiments of the grader at this URL instead of this home's runs")
    parser.set_defaults(func=_run)


def _add_grader_option(parser: argparse.ArgumentParser, purpose: str) -> None:
    parser.add_argument(
        "--grader",
        default=None,
        metavar="URL",
        help=f"{purpose}, through its admin API (as http://HOST:PORT; the admin token from "
        "AUTORL_ADMIN_TOKEN)",
    )


def _report(args: argparse.Namespace) -> int:
    if args.grader is not None:
        from autorl.runs.grader_runs import grader_runs

        with grader_runs(args.grader) as experiments:
            metrics = experiments.metrics(experiments.resolve(args.run))
        _print_report(metrics, args.json)
        return 0
    import time

    from autorl.runs.reports import report_run

    runs = _home_runs(args.home)
    given = Path(args.run)
    run_id = resolve_run_id(
        given.name if given.is_dir() else args.run,
        runs.stored_run_ids(),
        f"the database of {runs.home} (or AUTORL_DATABASE_URL)",
        runs.listing,
    )
    report = report_run(runs.settings, run_id, time.time())
    _print_report(report.metrics, args.json)
    if not args.json:
        print(f"metrics: {printable(str(report.metrics_path))}\nplot:    {printable(str(report.plot_path))}")
    return 0


def _print_report(metrics: dict[str, Any], as_json: bool) -> None:
    """A run's report: its metrics as JSON, or its summary (and seed) for a person."""
    from autorl.runs.reports import summary_lines

    if as_json:
        print(json.dumps(metrics, indent=2))
        return
    for line in summary_lines(metrics):  # escaped by summary_lines
        print(line)
    seed = metrics.get("seed")
    if seed is not None:
        repeats = metrics.get("repeats") or 1
        of = f" (repeat {metrics.get('repeat')} of {repeats})" if repeats > 1 else ""
        print(f"seed:    {seed}{of}")


def register_report(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "report",
        help="(re)write a run's reports/metrics.json and score-trajectory PNG",
        description="Compute a run's metrics (valid-submission rate, time to best, monotonic ratio, "
        "copies of the base model, share of the budget used, ...) from the database and write "
        "$AUTORL_HOME/runs/RUN/reports/metrics.json and reports/figures/score_trajectory.png.",
    )
    parser.add_argument(
        "run",
        metavar="RUN",
        help="the run id (as in `autorl results`), a unique prefix of it, or its run folder",
    )
    parser.add_argument("--home", type=Path, default=None, help="platform home (default: $AUTORL_HOME)")
    parser.add_argument("--json", action="store_true", help="print only the metrics, as JSON")
    _add_grader_option(parser, "summarise an experiment of the grader at this URL (nothing is written)")
    parser.set_defaults(func=_report)
