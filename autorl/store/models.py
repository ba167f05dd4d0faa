"""Typed SQLAlchemy models. Times are timezone-aware UTC; the API turns them into epoch seconds."""

from __future__ import annotations

import enum
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    DateTime,
    Enum,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    and_,
    literal_column,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.hybrid import hybrid_property
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship
from sqlalchemy.sql import ColumnElement
from sqlalchemy.types import TypeDecorator

# The protocol's values, stored in these models (and imported from here by the store's callers).
from autorl.protocol.feedback import Feedback as Feedback
from autorl.protocol.feedback import Split as Split


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """A timezone-aware UTC timestamp on every database: SQLite stores no zone and hands back naive
    values, which would not compare with aware ones."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is not None and value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column; use autorl.store.models.utcnow()")
        return value.astimezone(UTC) if value is not None else None

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is not None and value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value


class Base(DeclarativeBase):
    pass


class SubmissionStatus(enum.StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SCORED = "scored"
    FAILED = "failed"

    @property
    def final(self) -> bool:
        return self in (SubmissionStatus.SCORED, SubmissionStatus.FAILED)


class FailureReason(enum.StrEnum):
    """Why an evaluation failed, in classes an operator acts on (the `reason` label of the metrics)."""

    SETUP = "setup"  # before the test split was loaded: the snapshot, its config, the backend's set-up
    EVALUATION = "evaluation"  # after it was loaded: loading or running the model on the test prompts
    TIMEOUT = "timeout"  # the evaluation passed its hard timeout and was killed
    INTERRUPTED = "interrupted"  # its workers stopped too many times (AUTORL_MAX_EVAL_ATTEMPTS)
    CANCELLED = "cancelled"  # the experiment finished before it was evaluated
    STOPPED = "stopped"  # an operator stopped its evaluation (RQ's stop-job command)


class ExperimentStatus(enum.StrEnum):
    PENDING = "pending"  # registered; the agent's budget has not started
    RUNNING = "running"  # budget started
    COMPLETED = "completed"
    INTERRUPTED = "interrupted"
    FAILED = "failed"
    TIMED_OUT = "timed_out"

    @property
    def finished(self) -> bool:
        return self not in (ExperimentStatus.PENDING, ExperimentStatus.RUNNING)


class Experiment(Base):
    __tablename__ = "experiments"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(253), unique=True)
    task: Mapped[str] = mapped_column(String(64))
    model: Mapped[str] = mapped_column(String(512))  # the source as given: hub id, path, builtin:NAME
    base_model_dir: Mapped[str] = mapped_column(Text)  # as the grader and evaluator see it
    workspace: Mapped[str] = mapped_column(Text)  # as the grader sees it
    agent_workspace: Mapped[str | None] = mapped_column(Text)  # as the agent sees it (a pod's mount point)
    output_dir: Mapped[str] = mapped_column(Text)
    agent: Mapped[str | None] = mapped_column(String(512))
    driver_model: Mapped[str | None] = mapped_column(String(512))
    token_hash: Mapped[str] = mapped_column(
        String(64), unique=True
    )  # sha256 hex; the token itself is never stored
    status: Mapped[ExperimentStatus] = mapped_column(
        Enum(ExperimentStatus, native_enum=False, length=16, values_callable=lambda e: [m.value for m in e]),
        default=ExperimentStatus.PENDING,
    )
    message: Mapped[str | None] = mapped_column(Text)
    timeout_s: Mapped[int] = mapped_column(Integer)
    max_submissions: Mapped[int] = mapped_column(Integer)
    eval_key: Mapped[str] = mapped_column(String(64))  # hash of task + protocol + backend settings
    eval_config: Mapped[dict[str, object]] = mapped_column(JSON)
    feedback: Mapped[Feedback] = mapped_column(
        Enum(Feedback, native_enum=False, length=16, values_callable=lambda e: [m.value for m in e]),
        default=Feedback.TEST,
        server_default=Feedback.TEST.value,
    )
    # Sealed only: the validation split's evaluation config and key (the test split's are above),
    # the baseline on it, the submission the agent nominated, and the one test evaluation at the end.
    validation_eval_key: Mapped[str | None] = mapped_column(String(64))
    validation_eval_config: Mapped[dict[str, object] | None] = mapped_column(JSON)
    validation_baseline_submission_id: Mapped[int | None] = mapped_column(Integer)
    nominated_submission_id: Mapped[int | None] = mapped_column(Integer)
    final_submission_id: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    start_time: Mapped[datetime | None] = mapped_column(UTCDateTime())
    end_time: Mapped[datetime | None] = mapped_column(UTCDateTime())
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    baseline_submission_id: Mapped[int | None] = mapped_column(Integer)
    # The grader copying a submission of this experiment now (one at a time) and until when its
    # lease holds (a grader that died while copying lets go when it runs out).
    snapshot_holder: Mapped[str | None] = mapped_column(String(32))
    snapshot_lease_until: Mapped[datetime | None] = mapped_column(UTCDateTime())
    # Submits refused after the grader had begun reading the checkpoint's weights (the files changed
    # under the copy): each counts against max_submissions as a submission does, though no row is
    # written for it (autorl_grader.submissions.count_refusal).
    costly_refusals: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # What the agent may have brought in (autorl.provenance, docs/PROTOCOL.md): the public checkpoints
    # registered for this experiment (folders or hub ids; the evaluators' AUTORL_KNOWN_CHECKPOINTS
    # come beside them), the test problems found in the agent's files once it has ended (None: not
    # read), and the final on the twin split with its paired test against the base model's gap.
    known_checkpoints: Mapped[list[str] | None] = mapped_column(JSON)
    test_overlap: Mapped[int | None] = mapped_column(Integer)
    twin_score: Mapped[float | None] = mapped_column(Float)
    twin_p_value: Mapped[float | None] = mapped_column(Float)

    submissions: Mapped[list[Submission]] = relationship(
        back_populates="experiment", order_by="Submission.id", foreign_keys="Submission.experiment_id"
    )


class Submission(Base):
    __tablename__ = "submissions"
    __table_args__ = (
        Index("ix_submissions_status", "status"),
        Index("ix_submissions_fingerprint", "eval_key", "fingerprint"),
        UniqueConstraint("experiment_id", "number", name="uq_submissions_number"),
    )

    #: The global id: the admin API's, the dashboard's and the evaluators'. Agents never see it.
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiments.id", ondelete="CASCADE"), index=True)
    # The agent's number of its submission (1, 2, ... per experiment, no gaps): the submission_id of
    # every agent-facing answer (docs/AGENTS.md, "The grading API"). Given under the experiment's
    # row lock as the row is inserted (submissions.create_submission); None for what is not the
    # agent's submission (a baseline, a sealed experiment's final evaluation).
    number: Mapped[int | None] = mapped_column(Integer)
    is_baseline: Mapped[bool] = mapped_column(Boolean, default=False)
    model_path: Mapped[str] = mapped_column(Text)  # as submitted, inside the experiment's output/
    fingerprint: Mapped[str] = mapped_column(String(64))  # of the snapshot's files
    # Folder name under the snapshot root (autorl.checkpoints.snapshot); None once no evaluation needs it.
    snapshot: Mapped[str | None] = mapped_column(String(64))
    # Files of the submitted folder that were not evaluated (trainer state, optimizer, ...).
    ignored_files: Mapped[list[str] | None] = mapped_column(JSON)
    eval_key: Mapped[str] = mapped_column(String(64))
    split: Mapped[Split] = mapped_column(
        Enum(Split, native_enum=False, length=16, values_callable=lambda e: [m.value for m in e]),
        default=Split.TEST,
        server_default=Split.TEST.value,
    )
    # The final test evaluation of a sealed experiment: the id of the agent's submission whose
    # files it evaluates (never shown to the agent, never counted as the agent's submission).
    final_of: Mapped[int | None] = mapped_column(Integer)
    status: Mapped[SubmissionStatus] = mapped_column(
        Enum(SubmissionStatus, native_enum=False, length=16, values_callable=lambda e: [m.value for m in e]),
        default=SubmissionStatus.QUEUED,
    )
    score: Mapped[float | None] = mapped_column(Float)  # headline: the experiment's protocol
    score_opencompass: Mapped[float | None] = mapped_column(Float)
    score_flexible: Mapped[float | None] = mapped_column(Float)
    score_strict: Mapped[float | None] = mapped_column(Float)
    n_samples: Mapped[int | None] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(Text)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    reused_from: Mapped[int | None] = mapped_column(Integer)  # id whose score identical weights reused
    # While queued: the id of the identical submission of the same experiment being evaluated now,
    # whose result this one takes instead of being evaluated again.
    waits_for: Mapped[int | None] = mapped_column(Integer)
    failure_reason: Mapped[FailureReason | None] = mapped_column(
        Enum(FailureReason, native_enum=False, length=16, values_callable=lambda e: [m.value for m in e])
    )
    eval_seconds: Mapped[float | None] = mapped_column(Float)
    worker: Mapped[str | None] = mapped_column(String(255))
    lease_expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    details: Mapped[dict[str, object] | None] = mapped_column(JSON)
    # Per problem of the evaluated split, in its order: "1" judged correct under the headline
    # protocol, "0" not (autorl.protocol.statistics); with the digest naming those problems, so that two
    # evaluations pair problem by problem. None for scores recorded before these were kept.
    correctness: Mapped[str | None] = mapped_column(Text)
    problems_digest: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    # One more on every UPDATE of the row, whoever makes it (the ORM's flush and every update()
    # statement add it): with the count of rows, a version of an experiment's submissions that
    # changes with every change to them, on every clock (submissions.submissions_version).
    revision: Mapped[int] = mapped_column(
        Integer, default=0, server_default="0", onupdate=literal_column("revision") + 1
    )

    experiment: Mapped[Experiment] = relationship(back_populates="submissions", foreign_keys=[experiment_id])

    @hybrid_property
    def by_agent(self) -> bool:
        """The agent's own submission: neither a baseline nor a sealed experiment's final evaluation.
        On a loaded row a bool; on the class a condition for a query."""
        return not self.is_baseline and self.final_of is None

    @by_agent.inplace.expression
    @classmethod
    def _by_agent_condition(cls) -> ColumnElement[bool]:
        return and_(cls.is_baseline.is_(False), cls.final_of.is_(None))


#: The scores a result carries, the headline one and each protocol's: what a reused result copies.
SCORE_COLUMNS = ("score", "score_opencompass", "score_flexible", "score_strict")
#: A result as a comparison needs it too: the scores and the per-problem results on named problems.
RESULT_COLUMNS = (*SCORE_COLUMNS, "n_samples", "correctness", "problems_digest")


def columns_of(row: Base, names: tuple[str, ...]) -> dict[str, Any]:
    """``row``'s values of the columns ``names``, to copy into another row."""
    return {name: getattr(row, name) for name in names}


class BaselineCache(Base):
    """One baseline score per (task, base model, evaluation key): measured once, reused by every run."""

    __tablename__ = "baseline_cache"
    __table_args__ = (UniqueConstraint("task", "model", "eval_key", name="uq_baseline_key"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    task: Mapped[str] = mapped_column(String(64))
    model: Mapped[str] = mapped_column(String(512))
    eval_key: Mapped[str] = mapped_column(String(64))
    fingerprint: Mapped[str] = mapped_column(String(64))
    submission_id: Mapped[int] = mapped_column(Integer)
    score: Mapped[float] = mapped_column(Float)
    score_opencompass: Mapped[float | None] = mapped_column(Float)
    score_flexible: Mapped[float | None] = mapped_column(Float)
    score_strict: Mapped[float | None] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class EvaluationCache(Base):
    """One result of ``autorl evaluate`` per (snapshot fingerprint, evaluation key): the same files
    scored under the same key are never evaluated twice. It keeps what a comparison needs (the
    per-problem correctness and the digest of the problems), as a submission row does."""

    __tablename__ = "evaluation_cache"
    __table_args__ = (UniqueConstraint("fingerprint", "eval_key", name="uq_evaluation_cache_key"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    task: Mapped[str] = mapped_column(String(64))
    #: The model source as it was named when first evaluated (a folder, a hub id, builtin:NAME).
    model: Mapped[str] = mapped_column(Text)
    fingerprint: Mapped[str] = mapped_column(String(64))
    eval_key: Mapped[str] = mapped_column(String(64))
    eval_config: Mapped[dict[str, object]] = mapped_column(JSON)
    score: Mapped[float] = mapped_column(Float)
    score_opencompass: Mapped[float | None] = mapped_column(Float)
    score_flexible: Mapped[float | None] = mapped_column(Float)
    score_strict: Mapped[float | None] = mapped_column(Float)
    n_samples: Mapped[int] = mapped_column(Integer)
    correctness: Mapped[str] = mapped_column(Text)
    problems_digest: Mapped[str] = mapped_column(String(64))
    eval_seconds: Mapped[float] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class Evaluator(Base):
    """An evaluator worker that reports itself alive: which queue it takes work from, which
    backends it can run, and when it last said so. Rows of workers that stopped are deleted at
    their stop; those of workers that died age out (the grader counts only recent ones)."""

    __tablename__ = "evaluators"

    name: Mapped[str] = mapped_column(String(255), primary_key=True)
    queue: Mapped[str] = mapped_column(String(255), index=True)
    backends: Mapped[list[str]] = mapped_column(JSON)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    last_seen: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
