"""Blocking ``/submit`` requests wait here for their evaluation: one poller per event loop reads
the status of every awaited submission in one query each ``POLL_INTERVAL_S`` and wakes the waiters
whose submission is final, so the database sees one query per interval however many agents wait."""

from __future__ import annotations

import asyncio
import logging
import weakref

from starlette.concurrency import run_in_threadpool

from autorl.errors import ServiceUnavailableError
from autorl.store import Database, submissions

log = logging.getLogger("autorl.grader")
#: Seconds between two reads of the awaited submissions' statuses.
POLL_INTERVAL_S = 0.25


class _LoopWaits:
    """The waiters and the poller of one event loop."""

    def __init__(self) -> None:
        self.waiting: dict[int, set[asyncio.Event]] = {}
        self.poller: asyncio.Task[None] | None = None


class ResultWaits:
    def __init__(self, db: Database, interval_s: float = POLL_INTERVAL_S) -> None:
        self._db = db
        self._interval_s = interval_s
        self._loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopWaits] = (
            weakref.WeakKeyDictionary()
        )

    @property
    def waiting(self) -> int:
        """Requests waiting now, over all loops."""
        return sum(len(events) for waits in list(self._loops.values()) for events in waits.waiting.values())

    async def wait(self, submission_id: int, timeout_s: float) -> bool:
        """Until the submission is final (True) or ``timeout_s`` passed (False)."""
        loop = asyncio.get_running_loop()
        waits = self._loops.setdefault(loop, _LoopWaits())
        event = asyncio.Event()
        waits.waiting.setdefault(submission_id, set()).add(event)
        if waits.poller is None or waits.poller.done():
            waits.poller = loop.create_task(self._poll(waits))
        try:
            await asyncio.wait_for(event.wait(), timeout_s)
            return True
        except TimeoutError:
            return False
        finally:
            events = waits.waiting.get(submission_id, set())
            events.discard(event)
            if not events:
                waits.waiting.pop(submission_id, None)

    async def _poll(self, waits: _LoopWaits) -> None:
        while waits.waiting:
            await asyncio.sleep(self._interval_s)
            awaited = list(waits.waiting)
            if not awaited:
                break
            try:
                final = await run_in_threadpool(self._final_ids, awaited)
            except ServiceUnavailableError as exc:
                log.warning("event=result_poll_failed reason=%s", exc)
                continue
            except Exception:  # the poller outlives any one failure: waiters still time out cleanly
                log.exception("event=result_poll_failed")
                continue
            for submission_id in final:
                for event in waits.waiting.get(submission_id, ()):
                    event.set()

    def _final_ids(self, submission_ids: list[int]) -> list[int]:
        with self._db.read_session() as session:
            return submissions.final_submission_ids(session, submission_ids)
