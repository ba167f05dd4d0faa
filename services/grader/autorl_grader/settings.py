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
#: Each experiment's fair share of the grader (autorl_grader.fair_share): far above what an agent
#: polling its scores and time, or waiting on blocking submits, ever sends.
AGENT_REQUESTS_PER_S = 10.0
AGENT_REQUEST_BURST = 40
AGENT_REQUESTS_IN_FLIGHT = 8
#: Threads for the agent API's blocking work, and for everything else (admin API, dashboard, probes).
AGENT_THREADS = 16
ADMIN_THREADS = 40


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
    agent_requests_per_s: float = Field(
        default=AGENT_REQUESTS_PER_S,
        gt=0,
        description="Each experiment's fair share of the agent API: requests per second it may send on "
        "average (a token bucket). Past it, or past its burst or requests in flight, a request is "
        "answered 429 with Retry-After before its body is read or the database touched. Requests "
        "without a token the grader knows are also held to this share per client address.",
    )
    agent_request_burst: int = Field(
        default=AGENT_REQUEST_BURST,
        gt=0,
        description="How many agent requests an experiment may send at once above its rate per second "
        "(the token bucket's size).",
    )
    agent_requests_in_flight: int = Field(
        default=AGENT_REQUESTS_IN_FLIGHT,
        gt=0,
        description="Agent requests of one experiment the grader works on at once; a blocking /submit "
        "waiting for its score does not count.",
    )
    agent_threads: int = Field(
        default=AGENT_THREADS,
        gt=0,
        description="Threads that serve the agent API's blocking work (database reads), shared by every "
        "experiment, and as many again for submissions' checks and copies; the admin API, the dashboard "
        "and the probes have threads of their own (AUTORL_ADMIN_THREADS), so agents never hold up the "
        "controller.",
    )
    admin_threads: int = Field(
        default=ADMIN_THREADS,
        gt=0,
        description="Threads that serve the admin API, the dashboard and the probes.",
    )
    public_url: str = Field(
        default="http://127.0.0.1:8000",
        description="Base URL agents use to reach the grader; `autorl grader` without it: its own "
        "--host (127.0.0.1 for a wildcard) and --port.",
    )

    def accepts_any_admin_token(self) -> bool:
        return self.local_mode  # `autorl run` makes a token of its own; any will do on one machine
