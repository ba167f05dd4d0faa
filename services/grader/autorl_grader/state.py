"""What every request needs, built once per app from settings."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from autorl.queue import Dispatcher, make_dispatcher
from autorl.settings import Settings
from autorl.store import Database
from autorl_grader.metrics import metrics_registry


@dataclass
class GraderState:
    settings: Settings
    db: Database
    dispatcher: Dispatcher
    metrics: CollectorRegistry

    @classmethod
    def build(cls, settings: Settings) -> GraderState:
        assert settings.database_url is not None
        db = Database(settings.database_url)
        return cls(
            settings=settings, db=db, dispatcher=make_dispatcher(settings), metrics=metrics_registry(db)
        )
