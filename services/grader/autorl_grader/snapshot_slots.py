"""One submission of an experiment is checked and copied at a time (autorl.checkpoints.snapshot).

A submit first waits here, in the event loop, for its experiment's turn: waiting costs no worker
thread, so a burst of submits from one experiment holds one thread, not all of them, and other
experiments' submits go on. Then it takes the experiment's lease in the database (several grader
replicas share it) and checks the budget, the submission limit and the experiment's share of the
snapshot storage *before* anything is copied: past the limit (429) or the share (503) a submit is
refused without reading a file. Every submit refused there therefore
costs neither snapshot storage nor memory, and at most one snapshot per experiment is in progress.
A submit refused only once its checkpoint's weights were being read (its files changed under the
copy) cost that read, and counts against the limit as a submission does
(autorl_grader.submissions.count_refusal): the limit bounds the copies an experiment can cause.

The checks and the copy run on threads of their own (:attr:`SnapshotSlots.threads`), apart from the
agent API's other work: copies, however many experiments take them at once, never keep another
experiment's reads waiting for a thread. And a submit that must wait (files not readable yet,
another replica's lease) waits in the event loop between attempts, holding no thread: experiments
that wait together, each in its turn, take nothing from anyone.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TypeVar

import anyio.to_thread
from anyio import CapacityLimiter

from autorl.errors import ServiceUnavailableError, UnreadableCheckpointError

T = TypeVar("T")
#: How often a submit waiting for readable files or another replica's lease tries again.
RETRY_S = 0.25


class LeaseHeldError(ServiceUnavailableError):
    """Another grader replica holds the experiment's snapshot lease: tried again for a while."""


class SnapshotSlots:
    def __init__(self, threads: int, *, unreadable_wait_s: float, lease_wait_s: float) -> None:
        self._locks: dict[int, asyncio.Lock] = {}
        self._users: dict[int, int] = {}
        #: The threads every experiment's checks and copies run on.
        self.threads = CapacityLimiter(threads)
        self.unreadable_wait_s = unreadable_wait_s
        self.lease_wait_s = lease_wait_s

    @asynccontextmanager
    async def turn(self, experiment_id: int) -> AsyncIterator[None]:
        """Wait for, then hold, the experiment's turn in this process."""
        lock = self._locks.setdefault(experiment_id, asyncio.Lock())
        self._users[experiment_id] = self._users.get(experiment_id, 0) + 1
        try:
            async with lock:
                yield
        finally:
            self._users[experiment_id] -= 1
            if not self._users[experiment_id]:
                del self._users[experiment_id]
                del self._locks[experiment_id]

    async def take(
        self, experiment_id: int, attempt: Callable[[], T], ready: Callable[[], bool] | None = None
    ) -> T:
        """``attempt()`` (a submit's or a nomination's checks and copy) in the experiment's turn, on
        :attr:`threads`, tried again every :data:`RETRY_S` while its files are unreadable (for
        ``unreadable_wait_s``: files saved 0600 until the agent's pod adds group-read) or another
        replica holds the lease (for ``lease_wait_s``), each wait counted from its first refusal;
        then the last refusal stands. While unreadable, ``ready()`` (a look at the files, no
        database) is asked before the whole attempt is made again."""
        async with self.turn(experiment_id):
            first: dict[type, float] = {}
            while True:
                try:
                    return await anyio.to_thread.run_sync(functools.partial(attempt), limiter=self.threads)
                except (UnreadableCheckpointError, LeaseHeldError) as exc:
                    kind = (
                        UnreadableCheckpointError
                        if isinstance(exc, UnreadableCheckpointError)
                        else LeaseHeldError
                    )
                    waited = (
                        self.unreadable_wait_s if kind is UnreadableCheckpointError else self.lease_wait_s
                    )
                    deadline = first.setdefault(kind, time.monotonic()) + waited
                    if time.monotonic() + RETRY_S > deadline:
                        raise
                await asyncio.sleep(RETRY_S)
                if kind is UnreadableCheckpointError and ready is not None:
                    while time.monotonic() + RETRY_S <= deadline and not await anyio.to_thread.run_sync(
                        ready, limiter=self.threads
                    ):
                        await asyncio.sleep(RETRY_S)
