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
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class SnapshotSlots:
    def __init__(self) -> None:
        self._locks: dict[int, asyncio.Lock] = {}
        self._users: dict[int, int] = {}

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
