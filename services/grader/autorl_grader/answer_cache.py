"""Heavy agent answers kept per experiment until its submissions change: ``GET /scores`` builds one
view per submission (hundreds of KB for a hundred submissions with long paths), which an agent
can ask for in a loop. Each entry is the answer's encoded body, kept under the version of the
experiment's submissions it was built from (``autorl.store.submissions.submissions_version``: their count and
the sum of their revisions, which every insert or update raises). A request reads the version, one
indexed aggregate, and is answered from the cache only when it is unchanged, so no answer is ever
staler than the database, whichever grader replica or evaluator changed it.

Bounded: at most :data:`MAX_CACHED_BYTES` in all (the experiments used longest ago leave first),
and :data:`PAGES_PER_EXPERIMENT` pages of each experiment.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass, field

#: The most bytes of answers one grader process keeps.
MAX_CACHED_BYTES = 64 * 1024 * 1024
#: The most pages (distinct ``after``/``limit``) kept for one experiment.
PAGES_PER_EXPERIMENT = 8

Version = tuple[int, int]


@dataclass
class _Entry:
    version: Version
    pages: OrderedDict[Hashable, bytes] = field(default_factory=OrderedDict)

    @property
    def size(self) -> int:
        return sum(len(body) for body in self.pages.values())


class AnswerCache:
    """Answers by experiment id, page and version: thread-safe (routes run in a thread pool)."""

    def __init__(self, max_bytes: int = MAX_CACHED_BYTES, pages: int = PAGES_PER_EXPERIMENT) -> None:
        self._max_bytes = max_bytes
        self._pages = pages
        self._entries: OrderedDict[int, _Entry] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, experiment_id: int, version: Version, page: Hashable) -> bytes | None:
        """The body built for ``page`` at ``version``, or None (never one of another version)."""
        with self._lock:
            entry = self._entries.get(experiment_id)
            if entry is None or entry.version != version or page not in entry.pages:
                return None
            self._entries.move_to_end(experiment_id)
            entry.pages.move_to_end(page)
            return entry.pages[page]

    def put(self, experiment_id: int, version: Version, page: Hashable, body: bytes) -> None:
        """Keep ``body`` as ``page`` at ``version``; what the experiment kept at another version goes."""
        if len(body) > self._max_bytes:
            return
        with self._lock:
            entry = self._entries.pop(experiment_id, None)
            if entry is not None:
                self._bytes -= entry.size
            if entry is None or entry.version != version:
                entry = _Entry(version)
            entry.pages.pop(page, None)
            entry.pages[page] = body
            while len(entry.pages) > self._pages:
                entry.pages.popitem(last=False)
            self._entries[experiment_id] = entry
            self._bytes += entry.size
            while self._bytes > self._max_bytes:
                _, oldest = self._entries.popitem(last=False)
                self._bytes -= oldest.size

    @property
    def size_bytes(self) -> int:
        with self._lock:
            return self._bytes
