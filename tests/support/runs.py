"""Experiments with evaluated submissions, written through the store's own functions
(the same calls the grader and workers make), for tests of what people look at: the dashboard and
run reports. Evaluating real models would only make these tests slower, not more real."""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from autorl.store import Database, FailureReason, Feedback, Split, claims, experiments, outcomes, submissions
from tests.support.grading import RegisteredExperiment

WORKER = "test-worker"
EVAL_CONFIG = {"task": "gsm8k", "backend": "hf", "protocol": "opencompass", "limit": None}


@dataclass(frozen=True)
class SeededExperiment:
    name: str
    token: str
    workspace: Path

    def as_agent(self) -> RegisteredExperiment:
        """The experiment as its agent reaches it."""
        return RegisteredExperiment(
            name=self.name,
            token=self.token,
            url_path=f"/a/{self.token}",
            workspace=self.workspace,
            output_dir=self.workspace / "output",
            view={},
        )


def create_experiment(
    db: Database,
    workspace: Path,
    *,
    timeout_s: int = 3600,
    started_minutes_ago: float | None = 0.0,
    feedback: Feedback = Feedback.TEST,
) -> SeededExperiment:
    """An experiment of the tiny model; its budget started that long ago (``None``: not started)."""
    name = f"exp-{uuid.uuid4().hex[:10]}"
    token = experiments.new_token()
    (workspace / "output").mkdir(parents=True, exist_ok=True)
    with db.session() as session:
        experiment = experiments.create_experiment(
            session,
            token=token,
            name=name,
            task="gsm8k",
            model="builtin:tiny-qwen2",
            base_model_dir=str(workspace / "models" / "base"),
            workspace=str(workspace),
            output_dir=str(workspace / "output"),
            agent="example_grpo",
            timeout_s=timeout_s,
            max_submissions=100,
            eval_config=EVAL_CONFIG,
            eval_key=uuid.uuid4().hex,
            feedback=feedback,
            **(
                {"validation_eval_config": EVAL_CONFIG, "validation_eval_key": uuid.uuid4().hex}
                if feedback == Feedback.SEALED
                else {}
            ),
        )
        if started_minutes_ago is not None:
            experiments.start_budget(session, experiment)
            assert experiment.start_time is not None and experiment.end_time is not None
            experiment.start_time -= timedelta(minutes=started_minutes_ago)
            experiment.end_time -= timedelta(minutes=started_minutes_ago)
    return SeededExperiment(name=name, token=token, workspace=workspace)


def add_submission(
    db: Database,
    name: str,
    *,
    scores: dict[str, float] | None = None,
    error: str | None = None,
    minutes: float | None = None,
    files: str | None = None,
    baseline: bool = False,
    folder: str | None = None,
    correctness: str | None = None,
    split: Split = Split.TEST,
    final_of: int | None = None,
) -> int:
    """A submission made ``minutes`` after the budget started: scored with ``scores`` (headline =
    opencompass), failed with ``error``, or left queued. ``files`` names its content: equal names are
    identical files (a second one reuses the first one's score, as the grader does). ``folder`` names
    its checkpoint folder in ``output/`` (default: a random one). ``correctness`` is its per-problem
    correctness string (autorl.protocol.statistics), all taken on the same problems; ``n_samples`` is its
    length, else 10. ``split`` is the split it is evaluated on (a baseline on validation is the
    sealed experiment's baseline there); ``final_of`` makes it the sealed experiment's final
    evaluation of that submission, on test."""
    fingerprint = hashlib.sha256((files or uuid.uuid4().hex).encode()).hexdigest()
    with db.session() as session:
        experiment = experiments.get_experiment(session, name)
        submission = submissions.create_submission(
            session,
            experiment,
            model_path=str(Path(experiment.output_dir) / (folder or f"ckpt-{uuid.uuid4().hex[:6]}")),
            fingerprint=fingerprint,
            is_baseline=baseline,
            split=Split.TEST if final_of is not None else split,
            final_of=final_of,
        )
        if baseline and split == Split.VALIDATION:
            experiment.validation_baseline_submission_id = submission.id
        elif baseline:
            experiment.baseline_submission_id = submission.id
        if final_of is not None:
            experiment.final_submission_id = submission.id
        if minutes is not None and experiment.start_time is not None:
            submission.created_at = experiment.start_time + timedelta(minutes=minutes)
        submission_id = submission.id
        already_scored = submission.status.final
    if already_scored or (scores is None and error is None):
        return submission_id
    with db.session() as session:
        assert claims.claim(session, submission_id, worker=WORKER, lease_s=60)
    with db.session() as session:
        if scores is not None:
            outcomes.record_score(
                session,
                submission_id,
                worker=WORKER,
                scores=scores,
                n_samples=len(correctness) if correctness else 10,
                seconds=1.5,
                correctness=correctness,
                problems_digest=PROBLEMS_DIGEST if correctness else None,
            )
        else:
            outcomes.record_failure(
                session,
                submission_id,
                error=error or "failed",
                reason=FailureReason.EVALUATION,
                worker=WORKER,
            )
    return submission_id


def score_evaluation(db: Database, submission_id: int, score: float, *, seconds: float = 1.0) -> None:
    """An evaluator worker's result path for a score: ``submission_id`` (the database's id)
    claimed, then scored ``score`` under every protocol, on 10 samples in ``seconds``."""
    with db.session() as session:
        assert claims.claim(session, submission_id, worker=WORKER, lease_s=60)
    with db.session() as session:
        every_protocol = {"opencompass": score, "flexible": score, "strict": score}
        assert outcomes.record_score(
            session, submission_id, worker=WORKER, scores=every_protocol, n_samples=10, seconds=seconds
        )


def fail_evaluation(
    db: Database, submission_id: int, error: str, *, reason: FailureReason = FailureReason.EVALUATION
) -> None:
    """An evaluator worker's result path for a failure: ``submission_id`` (the database's id)
    claimed, then failed with ``error``."""
    with db.session() as session:
        assert claims.claim(session, submission_id, worker=WORKER, lease_s=60)
    with db.session() as session:
        assert outcomes.record_failure(session, submission_id, error=error, reason=reason, worker=WORKER)


#: The digest of the problems every seeded correctness string was taken on.
PROBLEMS_DIGEST = "0" * 64


def scores(value: float, strict: float | None = None) -> dict[str, float]:
    """Scores under the three protocols: flexible one point above, strict as given (or equal)."""
    return {"opencompass": value, "flexible": value + 1.0, "strict": value if strict is None else strict}


def finish(db: Database, name: str, status: str = "completed") -> None:
    from autorl.store.models import ExperimentStatus

    with db.session() as session:
        experiments.finish_experiment(
            session, experiments.get_experiment(session, name), ExperimentStatus(status)
        )


@dataclass(frozen=True)
class SealedRun:
    """A sealed experiment seeded by :func:`sealed_experiment`, with the ids of what it holds."""

    run: SeededExperiment
    test_baseline: int
    validation_baseline: int
    nominated: int
    best: int
    final: int


def sealed_experiment(db: Database, workspace: Path) -> SealedRun:
    """A sealed experiment whose budget started 30 minutes ago, on 10 problems per split: the
    baseline on test (10 %) and on validation (20 %), two agent submissions on validation (30 % at
    minute 1, nominated; 60 % at minute 2, the best there), and the final evaluation of the
    nominated one on test (50 %, at minute 12)."""
    run = create_experiment(db, workspace, started_minutes_ago=30, feedback=Feedback.SEALED)

    def scored(
        percent: int, files: str, minutes: float | None, split: Split, *, final_of: int | None = None
    ) -> int:
        ones = percent // 10
        return add_submission(
            db,
            run.name,
            scores=scores(float(percent)),
            correctness="1" * ones + "0" * (10 - ones),
            files=files,
            minutes=minutes,
            baseline=minutes is None,
            split=split,
            final_of=final_of,
        )

    test_baseline = scored(10, "base", None, Split.TEST)
    validation_baseline = scored(20, "base", None, Split.VALIDATION)
    nominated = scored(30, "a", 1, Split.VALIDATION)
    best = scored(60, "b", 2, Split.VALIDATION)
    with db.session() as session:
        experiments.get_experiment(session, run.name).nominated_submission_id = nominated
    final = scored(50, "a", 12, Split.TEST, final_of=nominated)
    return SealedRun(run, test_baseline, validation_baseline, nominated, best, final)
