"""What every request needs, built once per app from settings."""

from __future__ import annotations

from dataclasses import dataclass, field

from autorl.queue import Dispatcher, make_dispatcher
from autorl.settings import Settings
from autorl.store import Database
from autorl_grader.metrics import Metrics
from autorl_grader.result_waits import ResultWaits
from autorl_grader.token_cache import TokenCache


@dataclass
class GraderState:
    settings: Settings
    db: Database
    dispatcher: Dispatcher
    metrics: Metrics = field(default_factory=Metrics)
    tokens: TokenCache = field(default_factory=TokenCache)
    waits: ResultWaits = field(init=False)

    def __post_init__(self) -> None:
        self.waits = ResultWaits(self.db)

    @classmethod
    def build(cls, settings: Settings) -> GraderState:
        assert settings.database_url is not None
        return cls(
            settings=settings, db=Database(settings.database_url), dispatcher=make_dispatcher(settings)
        )
