"""The job function every queue runs: `evaluate(submission_id)`.

It claims the submission atomically, runs the backend named by the experiment's evaluation
settings on the submission's snapshot (the files the grader copied and fingerprinted at submit,
in storage the agent cannot write; never the agent's folder), and writes `scored` or `failed`.
While it works it renews a lease; a worker that dies stops renewing, and the grader's reconciler
hands the submission to another. Per-sample outputs and the errors raised once the test split is
loaded (they can quote test problems) stay in evaluator storage; the agent reads a message chosen
by :mod:`autorl_evaluator.failures`. An agent's evaluation runs within its time budget
(:mod:`autorl_evaluator.time_budget`); past it the submission fails with the reason ``timeout``,
counted against its limit. The snapshot is removed once the submission is final.

The evaluation itself (the split from evaluator storage, the key it is computed under, the backend,
the per-problem judgement) is :func:`load_split`, :func:`measured_config` and
:func:`evaluate_snapshot`, which ``autorl evaluate`` (:mod:`autorl_evaluator.evaluate_command`) runs
too, so that a checkpoint scored on its own scores as a submission of the same files.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from autorl.checkpoints.snapshot import remove_snapshot
from autorl.errors import AutoRLError
from autorl.eval_config import EvalConfig
from autorl.models.sources import resolve_model
from autorl.protocol.statistics import encode_correctness, problems_digest
from autorl.provenance.lineage import BASE, lineage
from autorl.store import (
    Database,
    Experiment,
    FailureReason,
    Split,
    Submission,
    claims,
    eval_keys,
    outcomes,
    sealed_final,
    submissions,
)
from autorl.tasks import get_task
from autorl.tasks.base import Problem, Task, split_sha256
from autorl.untrusted_text import log_printable_lines
from autorl_evaluator.backends.base import EvalResult
from autorl_evaluator.failures import agent_message, operator_detail, setup_message
from autorl_evaluator.settings import WorkerSettings
from autorl_evaluator.time_budget import BudgetExceededError, CpuMeter, TimeBudget, evaluation_budget
from autorl_evaluator.versions import backend_versions

log = logging.getLogger("autorl.evaluator")
#: A worker renews its lease this many times per lease period (a missed renewal is not fatal).
LEASE_RENEWALS = 4


def worker_name() -> str:
    return f"{worker_prefix(os.getpid())}{uuid.uuid4().hex[:8]}"


def worker_prefix(pid: int) -> str:
    """How the name of every claim process ``pid`` of this host makes begins (:func:`worker_name`)."""
    return f"{socket.gethostname()}:{pid}:"


@lru_cache(maxsize=4)
def _database(url: str) -> Database:
    return Database(url)


@contextmanager
def _lease(db: Database, submission_id: int, worker: str, lease_s: float) -> Iterator[None]:
    stop = threading.Event()

    def renew() -> None:
        while not stop.wait(lease_s / LEASE_RENEWALS):
            try:
                with db.session() as session:
                    claims.renew_lease(session, submission_id, worker=worker, lease_s=lease_s)
            except AutoRLError as exc:
                log.warning("event=lease_renew_failed submission=%d reason=%s", submission_id, exc)

    thread = threading.Thread(target=renew, name=f"lease-{submission_id}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)


def submission_dir(settings: WorkerSettings, submission_id: int) -> Path:
    """Evaluator-only storage of one submission: predictions, the full error of a failure."""
    return settings.eval_dir / "submissions" / str(submission_id)


def predictions_path(settings: WorkerSettings, submission_id: int) -> Path:
    return submission_dir(settings, submission_id) / "predictions.jsonl"


def snapshot_path(settings: WorkerSettings, snapshot: str | None) -> Path:
    """The snapshot folder; an AutoRLError (shown to the agent) when it is not there."""
    path = settings.snapshot_dir / snapshot if snapshot else None
    if path is None or not (path / "config.json").is_file():
        raise AutoRLError(
            "the submission's snapshot (the copy of its files taken at submit) is gone from "
            f"{settings.snapshot_dir}; submit the checkpoint again (an operator should check that the "
            "grader and the evaluators share AUTORL_SNAPSHOT_DIR)"
        )
    return path


@dataclass(frozen=True)
class SnapshotScore:
    """One snapshot evaluated on one split: what a submission records (and ``autorl evaluate``
    shows). ``result.completions`` answer test questions: evaluator-side only."""

    result: EvalResult
    #: The problems evaluated: the split's first ``limit`` (all without one), in the split's order.
    problems: list[Problem]
    #: Per problem, whether the headline protocol judged it correct (autorl.protocol.statistics).
    correctness: str
    #: Names the problems, so that two correctness strings pair only on the same ones.
    problems_digest: str


def load_split(task: Task, split: Split, settings: WorkerSettings) -> list[Problem]:
    """The whole split an evaluation reads, from evaluator storage (``AUTORL_EVAL_DIR/data``; cached
    there from ``AUTORL_DATA_SOURCE_DIR`` or the hub on first use): the test split, or sealed mode's
    validation split carved from the train split."""
    data_dir, source_dir = settings.eval_dir / "data", settings.data_source_dir
    if split == Split.VALIDATION:
        return task.load_validation_problems(data_dir, source_dir=source_dir)
    return task.load_test_problems(data_dir, source_dir=source_dir)


def measured_config(config: EvalConfig, split: list[Problem], settings: WorkerSettings) -> EvalConfig:
    """The config a score is computed under (its key): the recorded one with the whole split's hash
    and the versions of the packages the backend runs with, as they are here and now."""
    return config.with_measured(split_sha256(split), backend_versions(config.backend, settings))


def evaluate_snapshot(
    model_dir: Path,
    task: Task,
    split: list[Problem],
    evaluated: EvalConfig,
    settings: WorkerSettings,
    *,
    budget: TimeBudget | None = None,
) -> SnapshotScore:
    """Evaluate the model in ``model_dir`` (a snapshot) on ``split`` as ``evaluated`` (from
    :func:`measured_config`) says, with its backend, and judge each answer."""
    from autorl_evaluator.backends import get_backend

    problems = split if evaluated.limit is None else split[: evaluated.limit]
    backend = get_backend(evaluated.backend)
    result = backend.evaluate(model_dir, task, problems, evaluated, settings, budget=budget)
    answers = [problem.answer for problem in problems]
    correctness = encode_correctness(task.judge(result.completions, answers, evaluated.protocol))
    digest = problems_digest([text for problem in problems for text in (problem.question, problem.answer)])
    return SnapshotScore(result=result, problems=problems, correctness=correctness, problems_digest=digest)


def evaluate(submission_id: int, settings: WorkerSettings | None = None) -> dict[str, Any]:
    """Evaluate one submission. Safe to call twice or concurrently: only one claim succeeds."""
    settings = settings or WorkerSettings()
    db = _database(settings.database_url)
    worker = worker_name()
    with db.session() as session:
        if not claims.claim(session, submission_id, worker=worker, lease_s=settings.eval_lease_s):
            log.info("event=claim_skipped submission=%d", submission_id)
            return {"submission_id": submission_id, "claimed": False}
        submission: Submission = submissions.get_submission(session, submission_id)
        experiment: Experiment = submission.experiment
        split_name = submission.split
        # A sealed experiment's validation evaluation is recorded under the validation config.
        recorded_config = eval_keys.recorded_config(submission)
        snapshot, task_name, attempt = submission.snapshot, experiment.task, submission.attempts
        # A scored validation checkpoint may be the one the final test evaluation takes: the
        # grader decides, under the experiment's lock, which one it keeps (the best on
        # validation, or the nominated one) and removes the others (autorl_grader.submissions).
        keeps_snapshot = split_name == Split.VALIDATION and not submission.is_baseline
        # An agent's checkpoint gets what the base model needs (its baseline's measure), no more.
        budget = evaluation_budget(session, submission, settings)
        # Each agent checkpoint's distance to its base and to the registered public checkpoints.
        known = [*settings.known_checkpoints, *(experiment.known_checkpoints or [])]
        traced = known if submission.by_agent else []
        base_dir = Path(experiment.base_model_dir)
    log.info(
        "event=evaluation_started submission=%d split=%s attempt=%d worker=%s budget_s=%s",
        submission_id,
        split_name.value,
        attempt,
        worker,
        f"{budget.seconds:.0f}" if budget is not None else "-",
    )
    # What its threads ran and waited matters only past a budget.
    started, cpu = time.monotonic(), CpuMeter() if budget is not None else None
    test_data_loaded = False
    try:
        with _lease(db, submission_id, worker, settings.eval_lease_s):
            model_dir = snapshot_path(settings, snapshot)
            # The grader owns the evaluation settings: the backend is handed the recorded config
            # beside this worker's own settings (where the evaluation runs, not how it is scored).
            config = EvalConfig.model_validate(recorded_config)
            task = get_task(task_name)
            split = load_split(task, split_name, settings)
            test_data_loaded = True
            evaluated = measured_config(config, split, settings)
            with cpu or contextlib.nullcontext():
                scored = evaluate_snapshot(model_dir, task, split, evaluated, settings, budget=budget)
            seconds = time.monotonic() - started
            descent = trace_lineage(model_dir, base_dir, traced, settings) if traced else None
        result = scored.result
        _write_predictions(predictions_path(settings, submission_id), scored.problems, result.completions)
    except Exception as raised:
        exc: Exception = raised
        if isinstance(exc, BudgetExceededError) and budget is not None and cpu is not None:
            exc = budget.failure(exc, cpu.used())
        message = agent_message(exc) if test_data_loaded else setup_message(exc)
        # The set-up reads the split too: what either phase raised stays in evaluator storage.
        detail_path = _write_error(settings, submission_id, operator_detail(exc))
        log.warning(
            "event=evaluation_failed submission=%d phase=%s error_type=%s detail=%s",
            submission_id,
            "test" if test_data_loaded else "setup",
            type(exc).__name__,
            detail_path,
        )
        with db.session() as session:
            reason = FailureReason.EVALUATION if test_data_loaded else FailureReason.SETUP
            if isinstance(exc, BudgetExceededError):
                reason = FailureReason.TIMEOUT  # the checkpoint's: it counts against the limit
            final = outcomes.record_failure(
                session, submission_id, error=message, reason=reason, worker=worker
            )
            # Still needed: a copy that waited for this evaluation takes its snapshot, and a final
            # that failed for the evaluator's own fault is made again from it.
            needed = (
                final
                and snapshot is not None
                and sealed_final.snapshot_in_use(session, submission_id, snapshot)
            )
        if final and snapshot and not needed:
            _remove_snapshot(settings, snapshot)
        return {"submission_id": submission_id, "claimed": True, "status": "failed", "error": message}
    with db.session() as session:
        eval_keys.record_evaluation_key(
            session, submission_id, worker=worker, evaluated=evaluated.stored(), key=evaluated.key
        )
        recorded = outcomes.record_score(
            session,
            submission_id,
            worker=worker,
            scores=result.scores,
            n_samples=result.n_samples,
            seconds=seconds,
            details={
                **result.details,
                "eval_config": evaluated.stored(),
                **({"lineage": descent} if descent is not None else {}),
            },
            protocol=config.protocol,
            correctness=scored.correctness,
            problems_digest=scored.problems_digest,
        )
    if recorded and snapshot and not keeps_snapshot:
        _remove_snapshot(settings, snapshot)
    log.info(
        "event=evaluation_scored submission=%d score=%.4f samples=%d seconds=%.1f recorded=%s",
        submission_id,
        result.scores["opencompass"],
        result.n_samples,
        seconds,
        recorded,
    )
    return {"submission_id": submission_id, "claimed": True, "status": "scored", "scores": result.scores}


def trace_lineage(
    model_dir: Path, base_dir: Path, known: Sequence[str], settings: WorkerSettings
) -> dict[str, Any]:
    """The snapshot's :func:`autorl.provenance.lineage.lineage` record; a known checkpoint that cannot
    be had, or a failure of the comparison itself, is the platform's: named, never the checkpoint's."""
    resolved: list[tuple[str, Path]] = []
    skipped: dict[str, str] = {}
    for source in dict.fromkeys(known):
        try:
            resolved.append((source, resolve_model(source, settings.models_dir)))
        except Exception as exc:
            skipped[source] = f"not found: {exc}"
    try:
        found = lineage(model_dir, base_dir, resolved)
    except Exception as exc:
        log.warning("event=lineage_failed error_type=%s", type(exc).__name__)
        return {"nearest": None, "distances": {}, "skipped": {**skipped, BASE: f"not compared: {exc}"}}
    return {**found.to_json(), "skipped": {**skipped, **found.skipped}}


def _remove_snapshot(settings: WorkerSettings, snapshot: str) -> None:
    remove_snapshot(settings.snapshot_dir / snapshot)


def _write_error(settings: WorkerSettings, submission_id: int, detail: str) -> Path | None:
    """The full error in evaluator storage; None when it cannot be written (a full disk): the
    failure is still recorded."""
    path = submission_dir(settings, submission_id) / "error.txt"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(detail, encoding="utf-8")
    except OSError as exc:
        log.warning("event=error_detail_not_written submission=%d reason=%s", submission_id, exc.strerror)
        return None
    return path


def _write_predictions(path: Path, problems: list[Any], completions: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    try:
        with tmp.open("w", encoding="utf-8") as fh:
            for problem, completion in zip(problems, completions, strict=True):
                fh.write(
                    json.dumps(
                        {"question": problem.question, "answer": problem.answer, "completion": completion},
                        ensure_ascii=False,
                    )
                    + "\n"
                )
        tmp.replace(path)
    except OSError:
        tmp.unlink(missing_ok=True)  # a partial file would only fill the disk further
        raise


def main() -> int:
    """`python -m autorl_evaluator.jobs SUBMISSION_ID`: one evaluation in a process of its own."""
    import sys

    log_printable_lines(logging.INFO)
    result = evaluate(int(sys.argv[1]))
    return 0 if result.get("status") != "failed" else 1


if __name__ == "__main__":
    raise SystemExit(main())
