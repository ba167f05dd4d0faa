"""Run reports: ``reports/metrics.json`` and a score-trajectory PNG in a run's folder, ``autorl report``.

The metrics keep the reference AutoRL-Bench's names. Their definitions follow ours where the data
differs: the reference stores a failed evaluation as a score of 0 and so counts "score > 0" as valid;
here a failed evaluation has no score, so a *valid* submission is one that was scored (a real 0
counts). Submissions are the agent's own (never the baseline), in the order they were made; times
are seconds from the start of the agent's budget to when the submission was made.

The database is the truth: a report is computed from it, so ``autorl report RUN`` regenerates the
same report at any time after the run.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from itertools import pairwise
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from autorl.api.answers import Comparison as ComparisonAnswer
from autorl.api.answers import ExperimentAnswer, SubmissionAnswer
from autorl.errors import AutoRLError, UsageError
from autorl.protocol.feedback import Feedback
from autorl.protocol.final import answer_columns, results_columns
from autorl.protocol.statistics import TWIN_FLAG_P, Comparison, Evaluated, comparison_of, interval_of
from autorl.provenance.unverified import (
    MAX_MESSAGE_CHARS,
    TEST_UNVERIFIED,
    TWIN_UNVERIFIED,
    notes_in,
)
from autorl.runs.seeds import RunSeed, read_run_seed
from autorl.settings import HomeSettings
from autorl.store import Database, Experiment, Submission, SubmissionStatus, experiments
from autorl.store import submissions as submission_store
from autorl.untrusted_text import printable, printable_within

REPORTS_DIR = "reports"
METRICS_FILE = "metrics.json"
TRAJECTORY_PNG = "figures/score_trajectory.png"
#: Colours of the trajectory plot (tests find the points by them).
POINT_COLOR = "#1f77b4"
BEST_COLOR = "#d62728"
FAILED_COLOR = "#7f7f7f"
LINE_COLOR = "#aec7e8"
BASELINE_COLOR = "#2ca02c"


class ReportError(AutoRLError):
    """A report cannot be made (matplotlib missing, an unwritable folder)."""


class ReportPathError(ReportError, UsageError):
    """A report's folder cannot be made where it belongs (a file in its place): the home's keeper
    fixes it (exit 2)."""


def _epoch(moment: datetime | None) -> float | None:
    return None if moment is None else moment.timestamp()


@dataclass(frozen=True)
class SubmissionRecord:
    submission_id: int
    created_at: float
    status: str
    score: float | None
    is_copy_of_base: bool
    #: 95 % Wilson interval of the score and its comparison with the baseline (autorl.protocol.statistics).
    interval: tuple[float, float] | None = None
    comparison: Comparison | None = None

    @property
    def scored(self) -> bool:
        return self.status == SubmissionStatus.SCORED.value and self.score is not None


@dataclass(frozen=True)
class RunRecord:
    """What a report needs of one experiment, read from the store in one session."""

    run_id: str
    task: str
    base_model: str
    agent: str | None
    status: str
    protocol: str
    timeout_s: int
    start_time: float | None
    end_time: float | None  # the budget's deadline
    finished_at: float | None
    baseline: float | None
    submissions: tuple[SubmissionRecord, ...]
    #: The run's one result on the test split, as results.csv's columns from ``feedback`` to
    #: ``test_evaluations`` hold it (a sealed run's final evaluation; a test run's best).
    result: dict[str, Any]

    @classmethod
    def read(cls, session: Session, experiment: Experiment) -> RunRecord:
        # The agent's submissions on the split they were scored on during the budget (a sealed
        # run's validation split), against the baseline there; its final test evaluation is not one.
        baseline_row = submission_store.baseline_submission(
            session, experiment, experiments.feedback_split(experiment)
        )
        base_fingerprint = baseline_row.fingerprint if baseline_row is not None else None
        baseline = (
            baseline_row.score
            if baseline_row is not None and baseline_row.status == SubmissionStatus.SCORED
            else None
        )
        rows: Sequence[Submission] = submission_store.experiment_submissions(session, experiment)
        base_evaluation = Evaluated.of(baseline_row) if baseline is not None and baseline_row else None
        return cls(
            run_id=experiment.name,
            task=experiment.task,
            base_model=experiment.model,
            agent=experiment.agent,
            status=experiment.status.value,
            protocol=str(experiment.eval_config.get("protocol", "opencompass")),
            timeout_s=experiment.timeout_s,
            start_time=_epoch(experiment.start_time),
            end_time=_epoch(experiment.end_time),
            finished_at=_epoch(experiment.finished_at),
            baseline=baseline,
            submissions=tuple(
                SubmissionRecord(
                    submission_id=row.id,
                    created_at=row.created_at.timestamp(),
                    status=row.status.value,
                    score=row.score,
                    is_copy_of_base=base_fingerprint is not None and row.fingerprint == base_fingerprint,
                    # None for a row without a score (failed, queued): nothing to estimate.
                    interval=interval_of(Evaluated.of(row)),
                    comparison=comparison_of(Evaluated.of(row), base_evaluation),
                )
                for row in rows
                if row.by_agent
            ),
            result={**results_columns(session, experiment), "unverified": notes_in(experiment.message)},
        )

    @classmethod
    def of_answers(cls, experiment: ExperimentAnswer, submissions: Sequence[SubmissionAnswer]) -> RunRecord:
        """The same record from the grader's admin API: the experiment and every submission of it
        (``GET /v1/experiments/{name}`` and ``.../submissions``), for an experiment of a cluster.
        The answers carry what :meth:`read` computes: each submission's interval and comparison
        with the baseline on the split it was scored on, and the submission whose score it reused
        (a copy of the base model reuses the baseline's)."""
        split = experiment.feedback.scored_split
        baselines = [s for s in submissions if s.is_baseline and s.split == split]
        base_id = baselines[-1].submission_id if baselines else None
        baseline = (
            experiment.validation_baseline_score if split == "validation" else experiment.baseline_score
        )
        return cls(
            run_id=experiment.name,
            task=experiment.task,
            base_model=experiment.model,
            agent=experiment.agent,
            status=experiment.status,
            protocol=str(experiment.eval_config.get("protocol", "opencompass")),
            timeout_s=experiment.timeout_s or 0,
            start_time=experiment.start_time,
            end_time=experiment.end_time,
            finished_at=experiment.finished_at,
            baseline=baseline,
            submissions=tuple(
                SubmissionRecord(
                    submission_id=s.submission_id,
                    created_at=s.created_at or 0.0,
                    status=s.status,
                    score=s.score,
                    is_copy_of_base=base_id is not None and s.reused_from == base_id,
                    interval=None if s.interval is None else (s.interval[0], s.interval[1]),
                    comparison=None if s.comparison is None else _comparison(s.comparison),
                )
                # The agent's own submissions: a baseline and a final evaluation have no number.
                for s in submissions
                if not s.is_baseline and s.number is not None
            ),
            result={
                **answer_columns(experiment, experiment.feedback),
                "unverified": notes_in(experiment.message),
            },
        )


def _comparison(answer: ComparisonAnswer) -> Comparison:
    low, high = answer.interval
    first, second = answer.discordant
    return Comparison(answer.difference, (low, high), answer.p_value, (first, second))


def _since_start(run: RunRecord, moment: float) -> float | None:
    return None if run.start_time is None else round(moment - run.start_time, 1)


def _share(part: int, whole: int) -> float | None:
    return None if whole == 0 else round(part / whole, 4)


@dataclass(frozen=True)
class ScoredPoint:
    index: int  # 1-based position among the agent's submissions
    submission: SubmissionRecord
    score: float


def scored_points(run: RunRecord) -> list[ScoredPoint]:
    return [
        ScoredPoint(i, s, s.score)
        for i, s in enumerate(run.submissions, start=1)
        if s.scored and s.score is not None
    ]


def best_point(points: Sequence[ScoredPoint]) -> ScoredPoint | None:
    """The highest score; the earliest on a tie, as the grader's best submission."""
    return max(points, key=lambda p: (p.score, -p.index), default=None)


def best_uncertainty(best: SubmissionRecord | None) -> dict[str, Any]:
    """The best score's 95 % interval and its paired comparison with the baseline, flat (null
    where there is no best score, or nothing to compare it with)."""
    comparison = best.comparison if best is not None else None
    return {
        "best_interval": list(best.interval) if best is not None and best.interval is not None else None,
        "best_difference_interval": list(comparison.interval) if comparison is not None else None,
        "best_p_value": comparison.p_value if comparison is not None else None,
        "best_discordant": list(comparison.discordant) if comparison is not None else None,
        "best_distinguishable": comparison.distinguishable if comparison is not None else None,
    }


def uncertainty_lines(metrics: dict[str, Any], split: str | None = None) -> list[str]:
    """The best score's interval and its comparison with the baseline as summary lines (none
    without a best score). ``split`` names the split they are on where it is not the one the
    summary's best score is on (a sealed run's submissions: validation)."""
    interval = metrics.get("best_interval")
    if interval is None:
        return []
    if split is None:
        lines = [f"best 95 %    {interval[0]:.2f} to {interval[1]:.2f}"]
    else:
        lines = [f"{split:<12} best {metrics['best_score']:.2f}, 95 % {interval[0]:.2f} to {interval[1]:.2f}"]
    difference = metrics.get("best_difference_interval")
    if difference is not None:
        verdict = "distinguishable" if metrics.get("best_distinguishable") else "not distinguishable"
        on = "" if split is None else f" on {split}"
        lines.append(
            f"vs baseline  95 % {difference[0]:+.2f} to {difference[1]:+.2f} points{on}, "
            f"McNemar p = {metrics['best_p_value']:.3g}, {verdict}"
        )
    return lines


def _shown(lines: list[str]) -> list[str]:
    """Summary lines as printed: each escaped once and at most ``MAX_MESSAGE_CHARS`` long."""
    return [printable_within(line, MAX_MESSAGE_CHARS) for line in lines]


def final_lines(result: Mapping[str, Any]) -> list[str]:
    """Summary lines for the result on the test split (docs/PROTOCOL.md), from results.csv's
    columns ``feedback`` to ``test_evaluations`` (a row's, or a report's metrics); each escaped
    and bounded, to be printed as it is."""
    return _shown(_final_lines(result))


def _final_lines(result: Mapping[str, Any]) -> list[str]:
    feedback, selection, score = result.get("feedback"), result.get("selection"), result.get("final_score")
    if score is None:
        return [
            f"feedback     {feedback}",
            *([f"final        none ({selection} not scored)"] if selection else []),
            *provenance_lines(result),
        ]
    low, high, p_value = result.get("final_low"), result.get("final_high"), result.get("final_p_value")
    interval = f" [{low:.2f}, {high:.2f}]" if low is not None and high is not None else ""
    tested = "" if p_value is None else f", McNemar p={p_value:.3g}"
    return [
        f"feedback     {feedback}",
        f"final        {score:.2f}{interval} ({selection}{tested})",
        f"test evals   {result.get('test_evaluations')}",
        *provenance_lines(result),
    ]


def provenance_lines(result: Mapping[str, Any]) -> list[str]:
    """What the agent may have brought in, from results.csv's last columns and ``unverified``, the
    notes of what could not be verified (autorl.provenance.unverified); a finding is flagged with
    ``!``. The notes and the lineage can quote an agent's strings: each line is escaped here, once
    (a note escaped at its source is not escaped again), to be printed as it is, as a Text."""
    return _shown(_provenance_lines(result))


def _provenance_lines(result: Mapping[str, Any]) -> list[str]:
    lines = []
    notes: list[str] = list(result.get("unverified") or [])
    overlap = result.get("test_overlap")
    tests = [n.removeprefix(f"{TEST_UNVERIFIED}: ") for n in notes if n.startswith(TEST_UNVERIFIED)]
    unverified = f"  ! unverified: {tests[0]}" if tests else ""
    if overlap is not None:
        found = "  ! test problems found in the agent's files" if overlap else ""
        lines.append(f"test overlap {overlap}{found}{unverified}")
    elif tests:
        lines.append(f"test overlap unverified: {tests[0]}")
    twin, twin_p = result.get("twin_score"), result.get("twin_p_value")
    if twin is not None:
        flagged = twin_p is not None and twin_p < TWIN_FLAG_P
        tested = "" if twin_p is None else f" (gap against the base's: p={twin_p:.3g})"
        lines.append(f"twin split   {twin:.2f}{tested}" + ("  ! learned by heart?" if flagged else ""))
    lines += [f"twin split   {n.removeprefix('twin split ')}" for n in notes if n.startswith(TWIN_UNVERIFIED)]
    lineage = result.get("lineage")
    if lineage:
        lines.append(f"lineage      {lineage}  ! nearer this registered checkpoint than the base")
    return lines


def _points(value: float | None, *, signed: bool = False) -> str:
    if value is None:
        return "-"
    return f"{value:+.2f}" if signed else f"{value:.2f}"


def summary_lines(metrics: Mapping[str, Any]) -> list[str]:
    """A report as a person reads it (``autorl report``): the run, its headline numbers on the
    split its submissions were scored on (a sealed run's: validation, its result on test below),
    their uncertainty, its result on the test split, and how it used its submissions and budget;
    each line escaped, to be printed as it is."""
    return _shown(_summary_lines(metrics))


def _summary_lines(metrics: Mapping[str, Any]) -> list[str]:
    sealed = metrics.get("feedback") == Feedback.SEALED
    on = " (validation)" if sealed else ""
    scored, total = metrics.get("scored_submissions"), metrics.get("total_submissions")
    copies = metrics.get("copy_model_count")
    used = metrics.get("time_used_ratio")
    to_best = metrics.get("time_to_best")
    return [
        f"run          {metrics.get('run_id')}, {metrics.get('status')}",
        f"task         {metrics.get('task')}, base model {metrics.get('base_model')}, "
        f"agent {metrics.get('agent') or '-'}",
        f"baseline     {_points(metrics.get('baseline'))}{on}",
        f"best score   {_points(metrics.get('best_score'))}{on}",
        f"improvement  {_points(metrics.get('improvement'), signed=True)}{on}",
        *uncertainty_lines(dict(metrics), "validation" if sealed else None),
        *final_lines(metrics),
        f"submissions  {total}, {scored} scored"
        + ("" if not copies else f", {copies} cop{'y' if copies == 1 else 'ies'} of the base model"),
        "budget       "
        + ("-" if used is None else f"{used * 100:.0f} % used")
        + ("" if to_best is None else f", best after {to_best:.0f} s"),
    ]


def compute_metrics(run: RunRecord, now: float) -> dict[str, Any]:
    """The reference's process metrics, plus the run's identity and headline numbers, and its
    result on the test split under results.csv's names (``feedback`` to ``test_evaluations``).

    ``now`` stands in for the end of a run that has not finished yet (the dashboard shows live runs).
    """
    subs = run.submissions
    points = scored_points(run)
    finished = [s for s in subs if s.status in (SubmissionStatus.SCORED.value, SubmissionStatus.FAILED.value)]
    first_valid = points[0] if points else None
    best = best_point(points)
    best_score = best.score if best else None
    first_better = next((p for p in points if run.baseline is not None and p.score > run.baseline), None)
    rises = sum(1 for prev, cur in pairwise(points) if cur.score > prev.score)
    # The budget is used until the experiment finished (the agent's exit plus evaluations in flight),
    # never past its deadline.
    end = run.finished_at if run.finished_at is not None else now
    if run.end_time is not None:
        end = min(end, run.end_time)
    used_s = None if run.start_time is None else max(0.0, end - run.start_time)
    last_submit = max((s.created_at for s in subs), default=None)
    return {
        "run_id": run.run_id,
        "task": run.task,
        "base_model": run.base_model,
        "agent": run.agent,
        "status": run.status,
        "protocol": run.protocol,
        "baseline": run.baseline,
        "best_score": best_score,
        "best_submission": best.submission.submission_id if best else None,
        **best_uncertainty(best.submission if best else None),
        "improvement": None
        if best_score is None or run.baseline is None
        else round(best_score - run.baseline, 4),
        **run.result,
        "total_submissions": len(subs),
        "scored_submissions": len(points),
        "valid_submission_rate": _share(len(points), len(finished)),
        "first_valid_idx": first_valid.index if first_valid else None,
        "first_valid_delay": _since_start(run, first_valid.submission.created_at) if first_valid else None,
        "score_trajectory": [s.score if s.scored else None for s in subs],
        "time_to_first_improvement": _since_start(run, first_better.submission.created_at)
        if first_better
        else None,
        "time_to_best": _since_start(run, best.submission.created_at) if best else None,
        "monotonic_ratio": _share(rises, len(points) - 1) if len(points) >= 2 else None,
        "copy_model_count": sum(1 for s in subs if s.is_copy_of_base) if run.baseline is not None else None,
        "time_used_ratio": None if used_s is None or not run.timeout_s else round(used_s / run.timeout_s, 4),
        "last_submit_gap": None if last_submit is None else round(max(0.0, end - last_submit), 1),
    }


def seed_metrics(seed: RunSeed | None) -> dict[str, Any]:
    """The run's seed (its agent's AUTORL_SEED) and which of how many repeats it was; null for a
    run that recorded none (one not started by this machine's `autorl run`)."""
    return {
        "seed": None if seed is None else seed.seed,
        "repeat": None if seed is None else seed.repeat,
        "repeats": None if seed is None else seed.repeats,
    }


def plot_trajectory(run: RunRecord, target: Path, seed: RunSeed | None = None) -> Path:
    """A PNG of the headline score of each submission, in order: scored points, the best as a star,
    failed ones as crosses on the axis, the baseline as a dashed line."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # no display: reports are written by servers and CI
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ReportError(
            "matplotlib is not installed; install the ml extra (pip install 'autorl[ml]') to plot reports"
        ) from exc

    subs = run.submissions
    points = scored_points(run)
    best = best_point(points)
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    try:
        if points:
            ax.plot([p.index for p in points], [p.score for p in points], color=LINE_COLOR, zorder=1)
            others = [p for p in points if p is not best]
            ax.plot(
                [p.index for p in others],
                [p.score for p in others],
                linestyle="none",
                marker="o",
                markersize=8,
                color=POINT_COLOR,
                markeredgecolor=POINT_COLOR,
                label="scored submission",
                zorder=3,
            )
        if best is not None:
            ax.plot(
                [best.index],
                [best.score],
                linestyle="none",
                marker="*",
                markersize=16,
                color=BEST_COLOR,
                markeredgecolor=BEST_COLOR,
                label=f"best {best.score:.2f} (#{best.index})",
                zorder=4,
            )
        failed = [i for i, s in enumerate(subs, start=1) if s.status == SubmissionStatus.FAILED.value]
        if failed:
            ax.plot(
                failed,
                [0.0] * len(failed),
                linestyle="none",
                marker="x",
                markersize=9,
                markeredgewidth=3,
                color=FAILED_COLOR,
                label="failed",
                zorder=2,
            )
        if run.baseline is not None:
            ax.axhline(
                run.baseline,
                color=BASELINE_COLOR,
                linestyle="--",
                label=f"baseline {run.baseline:.2f}",
                zorder=0,
            )
        ax.set_xlabel("submission")
        ax.set_ylabel(f"score ({run.protocol})")
        named = f", {seed.describe()}" if seed is not None and seed.repeats > 1 else ""
        ax.set_title(f"{run.run_id}: score trajectory{named}")
        if subs:
            ax.set_xlim(0.5, len(subs) + 0.5)
            ax.set_xticks(range(1, len(subs) + 1) if len(subs) <= 20 else ax.get_xticks())
            # Outside the axes, so that no legend marker sits among the points.
            ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small", frameon=False)
        else:
            ax.text(0.5, 0.5, "no submissions", ha="center", va="center", transform=ax.transAxes)
        ax.grid(True, alpha=0.3)
        target.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(target, bbox_inches="tight")
    finally:
        plt.close(fig)
    return target


@dataclass(frozen=True)
class Report:
    metrics_path: Path
    plot_path: Path
    metrics: dict[str, Any]


def write_report(run: RunRecord, run_dir: Path, now: float, seed: RunSeed | None = None) -> Report:
    """Write RUN_DIR/reports/metrics.json and RUN_DIR/reports/figures/score_trajectory.png;
    ``seed`` is the run's recorded seed (``autorl run --repeat``), named in both.

    Both are written whole or not at all: each goes to a hidden name beside its place and is
    renamed there once both are written, so a failure leaves the last report as it was. A folder
    that cannot be made (a file in its place) is a ReportPathError naming it."""
    reports = run_dir / REPORTS_DIR
    metrics_path = reports / METRICS_FILE
    plot_path = reports / TRAJECTORY_PNG
    for folder in (reports, plot_path.parent):
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ReportPathError(
                f"cannot make the report folder {folder} ({exc.strerror or exc}); move aside what is "
                f"in its place (a file of that name) and run `autorl report {run.run_id}` again"
            ) from exc
    metrics = {**compute_metrics(run, now), **seed_metrics(seed)}
    suffix = f".{secrets.token_hex(4)}.tmp"
    partial_plot = plot_path.with_name(f".{plot_path.stem}{suffix}{plot_path.suffix}")
    partial_metrics = metrics_path.with_name(f".{metrics_path.name}{suffix}")
    try:
        plot_trajectory(run, partial_plot, seed)
        partial_metrics.write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")
        os.replace(partial_plot, plot_path)
        os.replace(partial_metrics, metrics_path)
    except OSError as exc:
        raise ReportError(
            f"cannot write the report in {reports}: {exc}; the last report is as it was: fix that and run "
            f"`autorl report {run.run_id}` again"
        ) from exc
    finally:
        partial_plot.unlink(missing_ok=True)
        partial_metrics.unlink(missing_ok=True)
    return Report(metrics_path=metrics_path, plot_path=plot_path, metrics=metrics)


def read_run(database_url: str, run_id: str) -> RunRecord:
    db = Database(database_url)
    try:
        with db.session() as session:
            return RunRecord.read(session, experiments.get_experiment(session, run_id))
    finally:
        db.dispose()


def report_run(settings: HomeSettings, run_id: str, now: float) -> Report:
    """The report of run ``run_id`` (its experiment in the settings' database), in HOME/runs/RUN_ID."""
    run = read_run(settings.database_url, run_id)
    return write_report(run, settings.home / "runs" / run_id, now, read_run_seed(settings.home, run_id))


def report_after_run(settings: HomeSettings, run_id: str) -> Report | None:
    """Write the report at the end of ``autorl run``; a missing report never fails the run."""
    try:
        report = report_run(settings, run_id, time.time())
    except AutoRLError as exc:
        print(f"autorl run: no report: {printable_within(str(exc), MAX_MESSAGE_CHARS)}", file=sys.stderr)
        return None
    print(f"autorl run: report in {printable(str(report.metrics_path.parent))}", file=sys.stderr)
    return report
