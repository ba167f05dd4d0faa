"""Token → experiment, remembered for a moment: agents poll ``/time`` and ``/submissions/{id}``
in loops, and each poll would otherwise read the experiment row again.

Only tokens that matched are remembered, for at most ``TOKEN_CACHE_TTL_S``. Finishing, starting or
re-keying an experiment through this process's admin API forgets it at once; another grader
process serving the same database sees the change within ``TOKEN_CACHE_TTL_S``. What a stale entry
can reach is bounded: a submission is re-checked under the experiment's row lock before it is
written (``submissions.accept``), so a finished experiment never gets a submission in.
"""

from __future__ import annotations

import threading
import time

from autorl.store import Experiment
from autorl.store import repository as repo

#: How long a matched token is trusted without reading the database again.
TOKEN_CACHE_TTL_S = 1.0


class TokenCache:
    def __init__(self, ttl_s: float = TOKEN_CACHE_TTL_S) -> None:
        self._ttl_s = ttl_s
        self._entries: dict[str, tuple[float, Experiment]] = {}
        self._lock = threading.Lock()

    def get(self, token: str) -> Experiment | None:
        key = repo.hash_token(token)
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            if entry[0] <= time.monotonic():
                del self._entries[key]
                return None
            return entry[1]

    def put(self, token: str, experiment: Experiment) -> None:
        now = time.monotonic()
        with self._lock:
            # Expired entries leave on the way (only matched tokens enter, so this stays small).
            for key in [key for key, (expires, _) in self._entries.items() if expires <= now]:
                del self._entries[key]
            self._entries[repo.hash_token(token)] = (now + self._ttl_s, experiment)

    def forget(self, experiment_name: str) -> None:
        with self._lock:
            for key in [key for key, (_, cached) in self._entries.items() if cached.name == experiment_name]:
                del self._entries[key]
