"""Who may wait for an unreadable checkpoint to become readable (autorl.snapshot's re-check).

A submit that finds a file the grader may not read re-checks it for a few seconds, in one of the
grader's worker threads. At most one submit per experiment waits so at a time: an agent that
submits unreadable folders in parallel ties up one thread, not all of them; the others are refused
at once, with the same message.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class UnreadableWaits:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: set[int] = set()

    @contextmanager
    def slot(self, experiment_id: int) -> Iterator[bool]:
        """Yields whether this submit may wait (no other submit of the experiment holds the slot)."""
        with self._lock:
            granted = experiment_id not in self._waiting
            self._waiting.add(experiment_id)
        try:
            yield granted
        finally:
            if granted:
                with self._lock:
                    self._waiting.discard(experiment_id)
