"""What every request needs, built once per app from settings."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from anyio import CapacityLimiter
from prometheus_client import CollectorRegistry

from autorl.queue import Dispatcher, make_dispatcher
from autorl.store import Database, Experiment, experiments
from autorl_grader.answer_cache import AnswerCache
from autorl_grader.expiring_cache import ExpiringCache
from autorl_grader.fair_share import Budget, FairShare
from autorl_grader.metrics import metrics_registry
from autorl_grader.result_waits import ResultWaits
from autorl_grader.settings import GraderSettings
from autorl_grader.snapshot_slots import SnapshotSlots


@dataclass(frozen=True)
class LastSubmit:
    """The time of an experiment's latest submission, or None when it has none yet."""

    at: datetime | None


@dataclass
class GraderState:
    settings: GraderSettings
    db: Database
    dispatcher: Dispatcher
    metrics: CollectorRegistry
    #: Token hash → its experiment; experiment id → time of its latest submission (expiring_cache).
    tokens: ExpiringCache[str, Experiment] = field(default_factory=ExpiringCache)
    last_submits: ExpiringCache[int, LastSubmit] = field(default_factory=ExpiringCache)
    #: Experiment id → its heavy answers (GET /scores pages) while its submissions are unchanged.
    answers: AnswerCache = field(default_factory=AnswerCache)
    waits: ResultWaits = field(init=False)
    snapshot_slots: SnapshotSlots = field(init=False)
    #: Each experiment's budget of agent requests (fair_share), and the agent API's threads.
    fair_share: FairShare = field(init=False)
    agent_threads: CapacityLimiter = field(init=False)

    def __post_init__(self) -> None:
        self.waits = ResultWaits(self.db)
        settings = self.settings
        self.fair_share = FairShare(
            Budget(
                settings.agent_requests_per_s, settings.agent_request_burst, settings.agent_requests_in_flight
            )
        )
        self.agent_threads = CapacityLimiter(settings.agent_threads)
        # As many again for checks and copies (snapshot_slots), which never wait on these.
        self.snapshot_slots = SnapshotSlots(
            settings.agent_threads,
            unreadable_wait_s=settings.unreadable_wait_s,
            lease_wait_s=settings.snapshot_wait_s,
        )

    def know_experiment_tokens(self) -> None:
        """The fair share learns every experiment's token from the database (those of the latest
        experiments, as many as it keeps): the ones another replica registered, or registered before
        this process started, are charged to their own budgets from their first request."""
        with self.db.read_session() as session:
            hashes = experiments.recent_token_hashes(session, self.fair_share.max_keys)
        self.fair_share.know_all(hashes)

    def forget_experiment(self, name: str) -> None:
        """After this process changed the experiment's row (finish, start, new token)."""
        self.tokens.forget_where(lambda experiment: experiment.name == name)

    @classmethod
    def build(cls, settings: GraderSettings) -> GraderState:
        db = Database(settings.database_url)
        return cls(
            settings=settings, db=db, dispatcher=make_dispatcher(settings), metrics=metrics_registry(db)
        )
