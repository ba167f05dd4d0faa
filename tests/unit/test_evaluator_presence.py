"""A worker's heartbeat outlives a report that fails for any reason (autorl_evaluator.presence):
the failure is logged and the worker is reported alive again by the next beat."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from autorl.store import Database, migrate
from autorl.store import repository as repo
from autorl.store.models import Evaluator
from autorl_evaluator.presence import Presence
from autorl_evaluator.settings import WorkerSettings


def test_the_heartbeat_survives_an_unexpected_failure_and_reports_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = Database(f"sqlite:///{tmp_path / 'autorl.db'}")
    migrate(db)
    real_report = repo.report_evaluator
    failures = iter([KeyError("a bug"), ValueError("another")])

    def failing_twice(*args: Any, **kwargs: Any) -> None:
        failure = next(failures, None)
        if failure is not None:
            raise failure
        real_report(*args, **kwargs)

    monkeypatch.setattr(repo, "report_evaluator", failing_twice)
    presence = Presence(db, WorkerSettings(evaluator_heartbeat_s=0.05))
    with caplog.at_level(logging.WARNING, logger="autorl.evaluator.presence"), presence:
        deadline = time.monotonic() + 10
        while True:
            with db.session() as session:
                if session.scalars(select(Evaluator.name)).all() == [presence.name]:
                    break
            assert time.monotonic() < deadline, caplog.text
            time.sleep(0.05)
    assert "event=presence_failed reason=KeyError" in caplog.text
    assert "event=presence_failed reason=ValueError" in caplog.text
