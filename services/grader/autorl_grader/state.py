"""What every request needs, built once per app from settings."""

from __future__ import annotations

from dataclasses import dataclass, field

from autorl.queue import Dispatcher, make_dispatcher
from autorl.settings import Settings
from autorl.store import Database
from autorl_grader.metrics import Metrics


@dataclass
class GraderState:
    settings: Settings
    db: Database
    dispatcher: Dispatcher
    metrics: Metrics = field(default_factory=Metrics)

    @classmethod
    def build(cls, settings: Settings) -> GraderState:
        assert settings.database_url is not None
        return cls(
            settings=settings, db=Database(settings.database_url), dispatcher=make_dispatcher(settings)
        )
