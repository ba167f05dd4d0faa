"""The access log, sampled per client: a client decides how often it calls, not how large the
grader's log grows.

uvicorn writes one access line per request. Here each client's lines are written one by one up to
:data:`LOGGED_ACCESSES`; past that, one line per :data:`LOGGED_ACCESSES_EVERY` more, with an
``event=access_sampled`` line before it that counts the client's requests so far (as the relay's
and the connection refusals' lines are sampled). A client is the budget the fair share charged the
request to (an experiment, named by a prefix of its token's hash, never the token; or a client
address), else the client address: so one experiment's flood neither fills the disk nor hides
another's requests or the controller's. At most :data:`ACCESS_KEYS` clients are counted apart;
past that, the rest share one count. Tokens in the lines themselves are redacted
(:mod:`autorl_grader.logging_setup`).
"""

from __future__ import annotations

import logging
import threading
from collections import Counter

from autorl_grader.fair_share import CLIENT

LOGGED_ACCESSES = 1000
LOGGED_ACCESSES_EVERY = 1000
ACCESS_KEYS = 4096
#: Where the counting lines go (the grader's own logger: redacted and escaped as its other lines).
log = logging.getLogger("autorl.grader")


class SampledAccessLog(logging.Filter):
    """A filter on ``uvicorn.access``: passes each client's first lines, then one per
    LOGGED_ACCESSES_EVERY, each of those after a line with the count."""

    def __init__(self) -> None:
        super().__init__()
        self._requests: Counter[str] = Counter()
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        client = CLIENT.get() or _address(record)
        with self._lock:
            if client not in self._requests and len(self._requests) >= ACCESS_KEYS:
                client = "others"
            self._requests[client] += 1
            requests = self._requests[client]
        if requests <= LOGGED_ACCESSES:
            return True
        if requests % LOGGED_ACCESSES_EVERY:
            return False
        log.info(
            "event=access_sampled client=%s requests=%d logged=first %d then every %d",
            client,
            requests,
            LOGGED_ACCESSES,
            LOGGED_ACCESSES_EVERY,
        )
        return True


def _address(record: logging.LogRecord) -> str:
    """The client address of uvicorn's access line (its first argument, ``host:port``)."""
    args = record.args if isinstance(record.args, tuple) else ()
    client = str(args[0]) if args else "unknown"
    return "address:" + client.rsplit(":", 1)[0]


def install_access_sampling() -> None:
    """Samples ``uvicorn.access`` (first among its filters, so that dropped lines cost nothing more)."""
    logger = logging.getLogger("uvicorn.access")
    if not any(isinstance(f, SampledAccessLog) for f in logger.filters):
        logger.filters.insert(0, SampledAccessLog())
