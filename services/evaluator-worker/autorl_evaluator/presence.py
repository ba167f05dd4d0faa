"""An evaluator reports itself alive: the grader tells operators whether anyone will take their work.

Each worker writes one row (its name, the queue it takes work from, the backends it can run) when it
starts and again every ``evaluator_heartbeat_s`` from a background thread, and deletes it when it
stops. A worker that dies leaves a row that stops being renewed; the grader counts only fresh rows.

Reports and the final delete take one lock, and no report is written once stopping has begun: a
report still in flight when the worker stops (a slow database) finishes before the delete, never
after it, so a stopped worker is never counted again.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import secrets
import socket
import threading
from types import TracebackType

from autorl.errors import ServiceUnavailableError
from autorl.store import Database, evaluator_presence
from autorl_evaluator.settings import WorkerSettings

log = logging.getLogger("autorl.evaluator.presence")


def runnable_backends(settings: WorkerSettings) -> list[str]:
    """The backends this worker can run: ``hf`` with torch installed, ``opencompass`` with its command."""
    backends = []
    if importlib.util.find_spec("torch") is not None:
        backends.append("hf")
    if settings.opencompass_bin.is_file() and os.access(settings.opencompass_bin, os.X_OK):
        backends.append("opencompass")
    return backends


class Presence:
    """``with Presence(db, settings):`` around a worker's loop."""

    def __init__(self, db: Database, settings: WorkerSettings) -> None:
        self.db = db
        self.settings = settings
        self.name = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        self.backends = runnable_backends(settings)
        self._stop = threading.Event()
        self._writing = threading.Lock()
        self._thread = threading.Thread(target=self._beat, name="evaluator-presence", daemon=True)

    def report(self) -> None:
        with self._writing:
            if self._stop.is_set():
                return
            self._write_report()

    def _write_report(self) -> None:
        try:
            with self.db.session() as session:
                evaluator_presence.report_evaluator(
                    session, name=self.name, queue=self.settings.work_queue, backends=self.backends
                )
        except Exception as exc:
            reason = exc if isinstance(exc, ServiceUnavailableError) else type(exc).__name__
            log.warning("event=presence_failed reason=%s", reason)

    def _beat(self) -> None:
        while not self._stop.wait(self.settings.evaluator_heartbeat_s):
            self.report()

    def __enter__(self) -> Presence:
        self.report()
        self._thread.start()
        log.info(
            "event=evaluator_present name=%s queue=%s backends=%s",
            self.name,
            self.settings.work_queue,
            ",".join(self.backends) or "-",
        )
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        with self._writing:  # waits for a report in flight; none starts after this
            try:
                with self.db.session() as session:
                    evaluator_presence.forget_evaluator(session, self.name)
            except ServiceUnavailableError as exc:
                log.warning("event=presence_forget_failed reason=%s", exc)
        self._thread.join(timeout=self.settings.evaluator_heartbeat_s + 5)
