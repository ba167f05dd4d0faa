"""What agents poll in loops, remembered for a moment: ``/time`` and ``/submissions/{id}`` would
otherwise read the experiment row (and ``/time`` its latest submission) on every poll.

Two caches of this kind live in each grader process (``GraderState``): token → experiment (only
tokens that matched), and experiment → time of its latest submission. Entries last at most
``CACHE_TTL_S``. This process forgets at once what it changes itself: finishing, starting or
re-keying an experiment through its admin API, and accepting a submission. Another grader process
serving the same database sees such a change within ``CACHE_TTL_S``. What a stale entry can reach
is bounded: a submission is re-checked under the experiment's row lock before it is written
(``submissions.accept``), so a finished experiment never gets a submission in.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

#: How long an entry is trusted without reading the database again.
CACHE_TTL_S = 1.0


K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class ExpiringCache(Generic[K, V]):
    def __init__(self, ttl_s: float = CACHE_TTL_S) -> None:
        self._ttl_s = ttl_s
        self._entries: dict[K, tuple[float, V]] = {}
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            if entry[0] <= time.monotonic():
                del self._entries[key]
                return None
            return entry[1]

    def put(self, key: K, value: V) -> None:
        """Remember ``value`` for the TTL from now (a later ``put`` does not extend an entry
        that is still fresh: callers put only after a miss)."""
        now = time.monotonic()
        with self._lock:
            # Expired entries leave on the way, so the cache holds only what was used lately.
            for stale in [k for k, (expires, _) in self._entries.items() if expires <= now]:
                del self._entries[stale]
            self._entries[key] = (now + self._ttl_s, value)

    def forget(self, key: K) -> None:
        with self._lock:
            self._entries.pop(key, None)

    def forget_where(self, matches: Callable[[V], bool]) -> None:
        with self._lock:
            for key in [k for k, (_, value) in self._entries.items() if matches(value)]:
                del self._entries[key]
