"""The grader's settings (environment prefix ``AUTORL_``). Field descriptions double as documentation."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from autorl.settings import AdminTokenSettings, PlatformSettings

SUBMIT_WAIT_S = 540.0
#: How long a submit waits for an unreadable checkpoint to become readable (the agent pod's group-read
#: keeper walks the workspace every second) before it is refused.
UNREADABLE_WAIT_S = 10.0
RECONCILE_INTERVAL_S = 15.0
#: Snapshots one experiment may hold at once (evaluator storage is shared by every experiment).
SNAPSHOTS_PER_EXPERIMENT = 8


class GraderSettings(PlatformSettings, AdminTokenSettings):
    """The agent API, the admin API and the reconciler that keeps the queue fed."""

    ADMIN_TOKEN_FIX: ClassVar[str] = (
        "set it to a random secret (e.g. `openssl rand -hex 32`) or set AUTORL_LOCAL_MODE=1 "
        "on a single machine"
    )

    submit_wait_s: float = Field(
        default=SUBMIT_WAIT_S, ge=0, description="How long a blocking /submit waits before answering 202."
    )
    unreadable_wait_s: float = Field(
        default=UNREADABLE_WAIT_S,
        ge=0,
        description="How long /submit waits, re-checking, for a checkpoint the grader may not read yet "
        "(files saved 0600, before the agent pod adds group-read) before refusing it with 400.",
    )
    snapshot_lease_s: float = Field(
        default=600.0,
        gt=0,
        description="How long a grader holds an experiment's snapshot lease while it copies one checkpoint "
        "(one at a time per experiment); a grader that dies while copying lets go after this.",
    )
    snapshot_wait_s: float = Field(
        default=60.0,
        ge=0,
        description="How long /submit waits for another grader replica copying a checkpoint of the same "
        "experiment before answering 503.",
    )
    baseline_unavailable_s: float = Field(
        default=300.0,
        ge=0,
        description="A baseline that no evaluator has taken for this long, while no evaluator takes work "
        "for its backend, is reported as EvaluatorsUnavailable (a condition, not a failure) with the fix.",
    )
    max_submissions: int = Field(default=100, gt=0, description="Default per-experiment submission limit.")
    snapshots_per_experiment: int = Field(
        default=SNAPSHOTS_PER_EXPERIMENT,
        gt=0,
        description="Snapshots one experiment may hold at once in the evaluator storage (its share of "
        "AUTORL_SNAPSHOT_DIR): checkpoints waiting for or in evaluation, and in a sealed experiment the one "
        "kept for its final. A submit past it is refused (503, Retry-After) before any file is read and "
        "does not count against the limit; size the snapshot volume for this many checkpoints per "
        "experiment running at once (each up to the base model's tensors stored as F32).",
    )
    max_eval_attempts: int = Field(
        default=3, gt=0, description="Evaluation attempts before a submission fails."
    )
    reconcile_interval_s: float = Field(
        default=RECONCILE_INTERVAL_S,
        gt=0,
        description="How often the grader requeues dead workers' submissions and feeds the queue from "
        "the database (what Redis lost).",
    )
    public_url: str = Field(
        default="http://127.0.0.1:8000", description="Base URL agents use to reach the grader."
    )

    def accepts_any_admin_token(self) -> bool:
        return self.local_mode  # `autorl run` makes a token of its own; any will do on one machine
