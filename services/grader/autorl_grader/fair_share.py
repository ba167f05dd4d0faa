"""A fair share of the grader for each experiment, decided before any work.

Every agent request is charged to a budget before the grader reads its body, looks its token up or
touches the database: a number of requests in flight at once and a token bucket of requests per
second (a burst, refilled at a steady rate). Past either, the answer is 429 with a ``Retry-After``
header and the usual JSON refusal naming the budget, and the request costs the grader only its
parsing. So one experiment's agent, however many connections or addresses it sends from, takes at
most its share of the grader's threads, CPU and database, and the others keep theirs.

Whose budget a request is charged to comes from the request alone, never from the database: the
experiment token of the capability URL ``/a/<token>/...`` or of ``Authorization: Bearer``, as its
hash (``experiments.hash_token``). A token that the grader has found in its database is charged to its own
budget only: :meth:`FairShare.know` is called where a request is authenticated and where an
experiment is registered, and :meth:`FairShare.know_all` with every experiment's token when the
grader starts and on each pass of its reconciler, so that a restarted grader or another replica
knows the experiments it did not register before their first requests. Any other request (no
token, or one the grader has not matched) is charged to its token's budget, if it has one, and also
to a budget of its client address, so that a client sending a new made-up token with each request
is held to its address's share. Budgets are kept for at most :data:`BUDGET_KEYS` keys (the least
recently used with no request in flight are dropped), so that a client cannot grow the grader's
memory by inventing tokens or addresses, nor win its experiment's places in flight anew by having
its budget dropped.

A refusal is answered after a pause (the ``Retry-After`` it names, at most
:data:`REFUSAL_PAUSE_S`): a client that sends its next request as soon as it is answered, on as
many keep-alive connections as it may open, is refused about once per connection and second rather
than as fast as the grader can answer, so that answering refusals does not become the work that
slows everyone (the pause holds only a connection the client opened, which is capped per address).

A blocking ``POST /submit`` gives its place in flight back while it waits for its evaluation
(:func:`leave_in_flight`): a waiting request costs the grader no thread, and an agent waiting for a
score may go on polling. Charged are the agent routes, and every request on the agent port of a
grader that serves its admin API on a port of its own (:mod:`autorl_grader.ports`), whatever its
path: a probe, a path it does not serve (answered 404 once charged), so that no request an agent
can send there is free. The admin API, the dashboard and the probes on a shared port, or on the
admin port, are the platform's own callers.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Collection
from contextvars import ContextVar
from dataclasses import dataclass, field

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from autorl.store import experiments

#: Budgets (and known tokens) kept at most; past it the least recently used one is dropped.
BUDGET_KEYS = 10_000
#: Seconds a request refused for its requests in flight is told to wait.
IN_FLIGHT_RETRY_AFTER_S = 1
#: The longest a refusal waits before it is answered.
REFUSAL_PAUSE_S = 1.0
#: Where an admitted request's place in flight is kept in its ASGI scope.
SCOPE_KEY = "autorl.fair_share"
#: Set in a request's ASGI scope when it came to the agent port: then it is charged whatever its path.
AGENT_PORT_KEY = "autorl.agent_port"
#: The budget a request is charged to, as the access log names it (``experiment:<hash prefix>`` or
#: ``address:<client address>``); set for the request's task, None outside agent requests.
CLIENT: ContextVar[str | None] = ContextVar("autorl_fair_share_client", default=None)


@dataclass(frozen=True)
class Budget:
    """One experiment's (or one client address's) share of the grader."""

    requests_per_s: float
    burst: int
    in_flight: int

    def describe(self) -> str:
        return (
            f"{self.requests_per_s:g} requests per second (bursts of {self.burst}) "
            f"and {self.in_flight} requests at once"
        )


@dataclass
class Bucket:
    """What one key has used of its budget."""

    tokens: float
    updated: float
    in_flight: int = 0

    def wait_s(self, budget: Budget, now: float) -> float:
        """Seconds until a request may be admitted (0: now); refills the bucket to ``now``."""
        self.tokens = min(float(budget.burst), self.tokens + (now - self.updated) * budget.requests_per_s)
        self.updated = now
        if self.in_flight >= budget.in_flight:
            return float(IN_FLIGHT_RETRY_AFTER_S)
        if self.tokens >= 1.0:
            return 0.0
        return (1.0 - self.tokens) / budget.requests_per_s

    def take(self) -> None:
        self.tokens -= 1.0
        self.in_flight += 1


@dataclass
class Admission:
    """An admitted request's places in flight, given back once (when it is answered, or when it
    begins to wait for an evaluation)."""

    buckets: list[Bucket]
    released: bool = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            for bucket in self.buckets:
                bucket.in_flight -= 1


@dataclass
class Refusal:
    retry_after_s: int
    message: str


@dataclass
class FairShare:
    """The budgets of one grader process. Used from its event loop, except :meth:`know` and
    :meth:`forget` (any thread)."""

    budget: Budget
    clock: Callable[[], float] = time.monotonic
    max_keys: int = BUDGET_KEYS
    _buckets: OrderedDict[str, Bucket] = field(default_factory=OrderedDict)
    _known: OrderedDict[str, None] = field(default_factory=OrderedDict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def know(self, token_hash: str) -> None:
        """The token was found in the database: its requests are charged to its budget only."""
        with self._lock:
            self._known[token_hash] = None
            self._known.move_to_end(token_hash)
            while len(self._known) > self.max_keys:
                self._known.popitem(last=False)

    def know_all(self, token_hashes: Collection[str]) -> None:
        """Every one of these tokens was found in the database (oldest first)."""
        for token_hash in token_hashes:
            self.know(token_hash)

    def forget(self, token_hash: str) -> None:
        """The token matched no experiment (unknown or revoked)."""
        with self._lock:
            self._known.pop(token_hash, None)

    def known(self, token_hash: str) -> bool:
        with self._lock:
            return token_hash in self._known

    def admit(self, token_hash: str | None, address: str | None) -> Admission | Refusal:
        """Charges one request; an Admission to release once it is answered, or the Refusal."""
        keys = []
        if token_hash is not None:
            keys.append(f"experiment:{token_hash}")
        if token_hash is None or not self.known(token_hash):
            keys.append(f"address:{address}")
        now = self.clock()
        buckets = [self._bucket(key, now) for key in keys]
        waits = [bucket.wait_s(self.budget, now) for bucket in buckets]
        longest = max(range(len(keys)), key=lambda i: waits[i])
        if waits[longest] > 0:
            return self._refusal(waits[longest], by_address=keys[longest].startswith("address:"))
        for bucket in buckets:
            bucket.take()
        return Admission(buckets)

    def _bucket(self, key: str, now: float) -> Bucket:
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = Bucket(tokens=float(self.budget.burst), updated=now)
            self._make_room()
        else:
            self._buckets.move_to_end(key)
        return bucket

    def _make_room(self) -> None:
        """Drops the least recently used budgets past :attr:`max_keys`, never one with requests in
        flight: a budget dropped and made anew would give its key its places at once again. Those
        in flight are few (each holds a connection, and connections are capped)."""
        while len(self._buckets) > self.max_keys:
            idle = next((key for key, kept in self._buckets.items() if not kept.in_flight), None)
            if idle is None:
                return
            del self._buckets[idle]

    def _refusal(self, wait_s: float, *, by_address: bool) -> Refusal:
        retry_after = max(1, math.ceil(wait_s))
        whose = (
            "from this address without a token the grader knows (send your experiment's token: use "
            "the GRADING_SERVER_URL or AUTORL_TOKEN you were given)"
            if by_address
            else "for this experiment"
        )
        return Refusal(
            retry_after,
            f"too many requests {whose}: its fair share of the grader is {self.budget.describe()}; "
            f"retry after {retry_after} s (the Retry-After header)",
        )


def is_admitted_agent_request(scope: Scope) -> bool:
    """Whether the request is an agent's, admitted by :class:`FairShareLayer` (the outermost layer)."""
    return isinstance(scope.get(SCOPE_KEY), Admission)


def leave_in_flight(scope: Scope) -> None:
    """The request no longer holds a place in flight (a blocking submit, waiting for its score)."""
    admission = scope.get(SCOPE_KEY)
    if isinstance(admission, Admission):
        admission.release()


def request_token(scope: Scope) -> str | None:
    """The experiment token a request carries: its capability URL's, else its bearer token."""
    path: str = scope.get("path", "")
    if path.startswith("/a/"):
        token = path[3:].split("/", 1)[0]
        if token:
            return token
    scheme, _, value = Headers(scope=scope).get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return None


class FairShareLayer:
    """ASGI middleware: charges every agent request to its budget before the app runs (module
    docstring). ``agent_roots``: the first path segments of the agent routes served at the root
    (``submit``, ``scores``, ...); everything under ``/a/``, and every request that came to the
    agent port (:data:`AGENT_PORT_KEY`), is an agent request too."""

    def __init__(self, app: ASGIApp, *, fair_share: FairShare, agent_roots: Collection[str]) -> None:
        self.app = app
        self.fair_share = fair_share
        self.agent_roots = frozenset(agent_roots)

    def is_agent_request(self, scope: Scope) -> bool:
        first = scope.get("path", "").lstrip("/").split("/", 1)[0]
        return bool(scope.get(AGENT_PORT_KEY)) or first == "a" or first in self.agent_roots

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.is_agent_request(scope):
            await self.app(scope, receive, send)
            return
        token = request_token(scope)
        token_hash = experiments.hash_token(token) if token is not None else None
        address = scope["client"][0] if scope.get("client") else None
        CLIENT.set(f"experiment:{token_hash[:12]}" if token_hash is not None else f"address:{address}")
        decision = self.fair_share.admit(token_hash, address)
        if isinstance(decision, Refusal):
            await self._refuse(decision, scope, receive, send)
            return
        scope[SCOPE_KEY] = decision
        try:
            await self.app(scope, receive, send)
        finally:
            decision.release()

    @staticmethod
    async def _refuse(refusal: Refusal, scope: Scope, receive: Receive, send: Send) -> None:
        headers = {"Retry-After": str(refusal.retry_after_s)}
        request_headers = Headers(scope=scope)
        if request_headers.get("transfer-encoding") or request_headers.get("content-length", "0") != "0":
            # Its body is never read: the connection closes after the answer (the server drops
            # what the client still sends, bounded), rather than be read to reach the next request.
            headers["Connection"] = "close"
        answer = JSONResponse(
            {"detail": refusal.message, "error": refusal.message}, status_code=429, headers=headers
        )
        await asyncio.sleep(min(refusal.retry_after_s, REFUSAL_PAUSE_S))

        async def no_body() -> Message:
            return {"type": "http.disconnect"}

        await answer(scope, no_body, send)
