"""A worker's heartbeat outlives a report that fails for any reason (autorl_evaluator.presence):
the failure is logged and the worker is reported alive again by the next beat."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from autorl.store import Database, evaluator_presence, migrate
from autorl.store.models import Evaluator
from autorl_evaluator.presence import Presence
from autorl_evaluator.settings import WorkerSettings

#: Longer than a stopping worker waits for its heartbeat thread (five seconds past one beat).
SLOW_REPORT_S = 5.6


def test_the_heartbeat_survives_an_unexpected_failure_and_reports_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = Database(f"sqlite:///{tmp_path / 'autorl.db'}")
    migrate(db)
    real_report = evaluator_presence.report_evaluator
    failures = iter([KeyError("a bug"), ValueError("another")])

    def failing_twice(*args: Any, **kwargs: Any) -> None:
        failure = next(failures, None)
        if failure is not None:
            raise failure
        real_report(*args, **kwargs)

    monkeypatch.setattr(evaluator_presence, "report_evaluator", failing_twice)
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


def test_a_report_still_in_flight_when_the_worker_stops_does_not_outlive_the_delete(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A slow database holds a heartbeat past the worker's stop (longer than the thread is waited
    for): the worker is still not counted once it has stopped."""
    db = Database(f"sqlite:///{tmp_path / 'autorl.db'}")
    migrate(db)
    real_report = evaluator_presence.report_evaluator
    in_flight, stopping, written = threading.Event(), threading.Event(), threading.Event()
    calls = 0

    def slow_after_the_first(*args: Any, **kwargs: Any) -> None:
        nonlocal calls
        calls += 1
        if calls > 1:  # a heartbeat: it hangs until the worker has been stopping for a while
            in_flight.set()
            assert stopping.wait(10)
            time.sleep(SLOW_REPORT_S)
            real_report(*args, **kwargs)
            written.set()
            return
        real_report(*args, **kwargs)

    monkeypatch.setattr(evaluator_presence, "report_evaluator", slow_after_the_first)
    presence = Presence(db, WorkerSettings(evaluator_heartbeat_s=0.05))
    with presence:
        assert in_flight.wait(10)
        stopping.set()
    assert written.wait(10)
    with db.session() as session:
        assert session.scalars(select(Evaluator.name)).all() == []
