"""The typed client of the grader's admin API (docs/ARCHITECTURE.md, "Admin API"): blocking for
``autorl run``, asyncio for the Kubernetes operator, both sending the same :class:`Endpoint`
descriptions, so a route, its body model and its answer model are written down once.

    with AdminClient(url, admin_token) as admin:
        registered = admin.register(RegisterExperiment(name="run-1", ...))
        admin.start("run-1").end_time

Every refusal raises a :class:`~autorl.api.endpoints.GradingError` subclass carrying the grader's
``status_code`` and ``detail``; ``retryable`` is true for a 5xx or a grader that does not answer.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx

from autorl.api.answers import (
    FINAL_STATUSES,
    ExperimentAnswer,
    PendingAnswer,
    ReadyAnswer,
    RegisteredAnswer,
    SubmissionAnswer,
    TokenAnswer,
)
from autorl.api.endpoints import (
    AsyncHttpCaller,
    AuthenticationError,
    BlockingClient,
    Call,
    Endpoint,
    ExperimentConflictError,
    ExperimentNotFoundError,
    GraderUnavailableError,
    GradingError,
    HttpCaller,
    RequestRejectedError,
)
from autorl.api.request_bodies import (
    FinishExperiment,
    FinishStatus,
    RecordProvenance,
    RegisterExperiment,
    StartBudget,
)

__all__ = [
    "AdminClient",
    "AsyncAdminClient",
    "AuthenticationError",
    "ExperimentConflictError",
    "ExperimentNotFoundError",
    "GraderUnavailableError",
    "GradingError",
    "RequestRejectedError",
]

DEFAULT_TIMEOUT_S = 30.0
#: Blocking admin calls (the baseline) are held by the grader for at most this long.
ADMIN_WAIT_S = 540.0
#: A readiness probe is answered at once or not at all.
READY_TIMEOUT_S = 2.0

#: The admin API's refusals; any other 4xx is a plain GradingError, a 5xx GraderUnavailableError.
ADMIN_REFUSALS: dict[int, type[GradingError]] = {
    400: RequestRejectedError,
    401: AuthenticationError,
    404: ExperimentNotFoundError,
    409: ExperimentConflictError,
    422: RequestRejectedError,
}

_EXPERIMENT = "/v1/experiments/{name}"
READY = Endpoint[ReadyAnswer]("GET", "/readyz", ReadyAnswer, ADMIN_REFUSALS)
REGISTER = Endpoint[RegisteredAnswer](
    "POST", "/v1/experiments", RegisteredAnswer, ADMIN_REFUSALS, body=RegisterExperiment
)
EXPERIMENTS = Endpoint[list[ExperimentAnswer]](
    "GET", "/v1/experiments", list[ExperimentAnswer], ADMIN_REFUSALS
)
EXPERIMENT = Endpoint[ExperimentAnswer]("GET", _EXPERIMENT, ExperimentAnswer, ADMIN_REFUSALS)
NEW_TOKEN = Endpoint[TokenAnswer]("POST", f"{_EXPERIMENT}/token", TokenAnswer, ADMIN_REFUSALS)
BASELINE = Endpoint[SubmissionAnswer | PendingAnswer](
    "POST", f"{_EXPERIMENT}/baseline", SubmissionAnswer, ADMIN_REFUSALS, pending=PendingAnswer
)
START = Endpoint[ExperimentAnswer](
    "POST", f"{_EXPERIMENT}/start", ExperimentAnswer, ADMIN_REFUSALS, body=StartBudget
)
FINISH = Endpoint[ExperimentAnswer](
    "POST", f"{_EXPERIMENT}/finish", ExperimentAnswer, ADMIN_REFUSALS, body=FinishExperiment
)
#: Sealed mode: after the agent has ended, the one evaluation on the test split (once).
FINAL = Endpoint[ExperimentAnswer]("POST", f"{_EXPERIMENT}/final", ExperimentAnswer, ADMIN_REFUSALS)
#: After the agent has ended: what it may have brought in (autorl.provenance).
PROVENANCE = Endpoint[ExperimentAnswer](
    "POST", f"{_EXPERIMENT}/provenance", ExperimentAnswer, ADMIN_REFUSALS, body=RecordProvenance
)
#: On a cluster, once the experiment is closed: the grader copies the agent's files (and the final's
#: snapshot) for an evaluator, which checks them (autorl_evaluator.provenance_job).
CHECK_PROVENANCE = Endpoint[ExperimentAnswer](
    "POST", f"{_EXPERIMENT}/provenance/check", ExperimentAnswer, ADMIN_REFUSALS
)
SUBMISSIONS = Endpoint[list[SubmissionAnswer]](
    "GET", f"{_EXPERIMENT}/submissions", list[SubmissionAnswer], ADMIN_REFUSALS
)


def baseline_call(name: str, wait_s: float | None) -> Call[SubmissionAnswer | PendingAnswer]:
    """Queue the base model's evaluation (once per cache key); with ``wait_s``, the grader holds
    the answer until it is scored or ``wait_s`` passes (then 202)."""
    if wait_s is None:
        return BASELINE.call(name=name)
    return BASELINE.call(name=name, params={"wait": "true", "timeout_s": wait_s}, timeout_s=wait_s + 30.0)


def start_call(name: str, start_time: float | None) -> Call[ExperimentAnswer]:
    """The agent's budget starts at ``start_time`` (epoch seconds; None: now)."""
    body = StartBudget() if start_time is None else StartBudget(start_time=start_time)
    return START.call(name=name, body=body)


def finish_call(name: str, status: FinishStatus, message: str | None) -> Call[ExperimentAnswer]:
    return FINISH.call(name=name, body=FinishExperiment(status=status, message=message))


def _http_options(admin_token: str, user_agent: str) -> dict[str, Any]:
    return {"headers": {"Authorization": f"Bearer {admin_token}", "User-Agent": user_agent}}


class AdminClient(BlockingClient):
    """The admin API, blocking (``autorl run``). Use as a context manager, or call ``close()``."""

    def __init__(
        self,
        base_url: str,
        admin_token: str,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        transport: httpx.BaseTransport | None = None,
        user_agent: str = "autorl-run",
    ) -> None:
        http = httpx.Client(
            base_url=base_url.rstrip("/"), transport=transport, **_http_options(admin_token, user_agent)
        )
        self._caller = HttpCaller(http, timeout_s=timeout_s)

    def ready(self) -> bool:
        """Whether the grader answers and reaches its database and queue."""
        try:
            self._caller.send(READY.call(timeout_s=READY_TIMEOUT_S))
        except GradingError:
            return False
        return True

    def register(self, body: RegisterExperiment) -> RegisteredAnswer:
        """409 (ExperimentConflictError): the name is taken."""
        return self._caller.send(REGISTER.call(body=body))

    def experiments(self) -> list[ExperimentAnswer]:
        return self._caller.send(EXPERIMENTS.call())

    def experiment(self, name: str) -> ExperimentAnswer:
        return self._caller.send(EXPERIMENT.call(name=name))

    def new_token(self, name: str) -> TokenAnswer:
        """Issue a new agent token, revoking the old one (a registration whose token was lost)."""
        return self._caller.send(NEW_TOKEN.call(name=name))

    def baseline(self, name: str, *, wait_s: float | None = None) -> SubmissionAnswer | PendingAnswer:
        return self._caller.send(baseline_call(name, wait_s))

    def wait_for_baseline(
        self,
        name: str,
        *,
        max_wait_s: float,
        poll_s: float = 2.0,
        on_wait: Callable[[ExperimentAnswer], None] | None = None,
    ) -> ExperimentAnswer:
        """Ask for the baseline and wait until it is scored or failed, or ``max_wait_s`` has passed;
        answers the experiment as it then is (``baseline_status``, ``baseline_score``, ...).
        ``on_wait`` sees the experiment at every poll (its ``waiting``: why no evaluator took it yet)."""
        deadline = time.monotonic() + max_wait_s
        self.baseline(name, wait_s=None if on_wait is not None else min(ADMIN_WAIT_S, max_wait_s))
        experiment = self.experiment(name)
        while experiment.baseline_status not in FINAL_STATUSES and time.monotonic() < deadline:
            if on_wait is not None:
                on_wait(experiment)
            time.sleep(poll_s)
            experiment = self.experiment(name)
        return experiment

    def start(self, name: str, start_time: float | None = None) -> ExperimentAnswer:
        return self._caller.send(start_call(name, start_time))

    def final(self, name: str) -> ExperimentAnswer:
        """Sealed: create the one evaluation on the test split (its ``final``; ``in_flight``
        counts it until scored). A test experiment's answer is its plain view."""
        return self._caller.send(FINAL.call(name=name))

    def finish(self, name: str, status: FinishStatus, message: str | None = None) -> ExperimentAnswer:
        return self._caller.send(finish_call(name, status, message))

    def record_provenance(self, name: str, **found: float | int) -> ExperimentAnswer:
        """Record ``test_overlap``, ``twin_score`` and/or ``twin_p_value`` (those given)."""
        return self._caller.send(PROVENANCE.call(name=name, body=RecordProvenance.model_validate(found)))

    def submissions(self, name: str) -> list[SubmissionAnswer]:
        """Every submission of the experiment, the baseline included, oldest first."""
        return self._caller.send(SUBMISSIONS.call(name=name))


class AsyncAdminClient:
    """The admin API, asyncio (the operator). Call ``aclose()`` when done."""

    def __init__(
        self,
        base_url: str,
        admin_token: str,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        transport: httpx.AsyncBaseTransport | None = None,
        user_agent: str = "autorl-controller",
    ) -> None:
        http = httpx.AsyncClient(
            base_url=base_url.rstrip("/"), transport=transport, **_http_options(admin_token, user_agent)
        )
        self._caller = AsyncHttpCaller(http, timeout_s=timeout_s)

    async def aclose(self) -> None:
        await self._caller.aclose()

    async def register(self, body: RegisterExperiment) -> RegisteredAnswer:
        """409 (ExperimentConflictError): the name is taken."""
        return await self._caller.send(REGISTER.call(body=body))

    async def experiments(self) -> list[ExperimentAnswer]:
        return await self._caller.send(EXPERIMENTS.call())

    async def experiment(self, name: str) -> ExperimentAnswer:
        return await self._caller.send(EXPERIMENT.call(name=name))

    async def new_token(self, name: str) -> TokenAnswer:
        """Issue a new agent token, revoking the old one (a registration whose token was lost)."""
        return await self._caller.send(NEW_TOKEN.call(name=name))

    async def baseline(self, name: str, *, wait_s: float | None = None) -> SubmissionAnswer | PendingAnswer:
        return await self._caller.send(baseline_call(name, wait_s))

    async def start(self, name: str, start_time: float | None = None) -> ExperimentAnswer:
        return await self._caller.send(start_call(name, start_time))

    async def final(self, name: str) -> ExperimentAnswer:
        """Sealed: create the one evaluation on the test split (see :meth:`AdminClient.final`)."""
        return await self._caller.send(FINAL.call(name=name))

    async def finish(self, name: str, status: FinishStatus, message: str | None = None) -> ExperimentAnswer:
        return await self._caller.send(finish_call(name, status, message))

    async def check_provenance(self, name: str) -> ExperimentAnswer:
        """A closed experiment: have its agent's files and its final checked by an evaluator (once;
        its ``test_overlap`` is set when done)."""
        return await self._caller.send(CHECK_PROVENANCE.call(name=name))

    async def submissions(self, name: str) -> list[SubmissionAnswer]:
        """Every submission of the experiment, the baseline included, oldest first."""
        return await self._caller.send(SUBMISSIONS.call(name=name))
