"""What the grader's clients share: each call described once (:class:`Endpoint`: method, path,
body model, answer model), answers validated into the models of :mod:`autorl.api.answers`, and
refusals raised as one hierarchy of exceptions built from the grader's ``Refusal`` body.

Sending is the only part that differs between a blocking and an asyncio client, so both are
here, each a few lines over the same :class:`Call`. Nothing here needs the grader's own
packages (FastAPI): an agent's Python has the core and pydantic only.

Answers are read leniently (fields a newer grader adds are ignored): an agent's copy of the core
may be older than the grader it talks to.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from types import TracebackType
from typing import Any, Generic, Literal, Self, TypeVar, cast

import httpx
from pydantic import BaseModel, TypeAdapter, ValidationError

from autorl.api.answers import Refusal
from autorl.errors import AutoRLError

A = TypeVar("A")

#: How much of a body that is not a Refusal goes into an error message.
MAX_DETAIL_CHARS = 500


class GradingError(AutoRLError):
    """The grader refused a request. ``detail`` is the server's reason, which names the fix."""

    #: Worth trying again later: the grader (or a store behind it) is down, not refusing.
    retryable = False

    def __init__(
        self, status_code: int, detail: str, *, method: str = "", url: str = "", answered: bool = True
    ) -> None:
        self.status_code = status_code
        self.detail = detail
        where = f" ({method} {url})" if method else ""
        said = f"grader answered {status_code}" if answered else "no answer from the grader"
        super().__init__(f"{said}{where}: {detail}")


class AuthenticationError(GradingError):
    """401: no token, or the wrong one (not this experiment's, or not the admin token)."""


class DeadlineError(GradingError):
    """403: the time budget has not started or is over; nothing more is accepted."""


class RequestRejectedError(GradingError):
    """400/422: the request breaks a rule (a malformed body, an invalid field); the detail says which."""


class SubmissionRejectedError(RequestRejectedError):
    """400/422 from the agent API: the checkpoint or request breaks a rule (path outside output/,
    adapter, pickle)."""


class SubmissionNotFoundError(GradingError):
    """404: no such submission in this experiment."""


class ExperimentNotFoundError(GradingError):
    """404 from the admin API: no experiment of that name."""


class ExperimentConflictError(GradingError):
    """409: the experiment's state forbids it: the name is taken, or it has finished."""


class TooManySubmissionsError(GradingError):
    """429: the experiment reached its submission limit."""


class GraderUnavailableError(GradingError):
    """5xx or no connection: the grader or its database is down; retrying later may work."""

    retryable = True


Method = Literal["GET", "POST"]


@dataclass(frozen=True)
class Endpoint(Generic[A]):
    """One route: how to call it and what its answers are.

    ``answer`` is the type a success (200/201) holds; ``pending`` the model of a 202 (accepted,
    still being evaluated), for the routes that can wait for a score. ``A`` covers both.
    """

    method: Method
    path: str  # a template: "/v1/experiments/{name}"
    answer: Any
    refusals: Mapping[int, type[GradingError]]
    body: type[BaseModel] | None = None
    pending: Any = None

    @cached_property
    def _answers(self) -> dict[int, TypeAdapter[Any]]:
        adapters = {200: TypeAdapter(self.answer), 201: TypeAdapter(self.answer)}
        if self.pending is not None:
            adapters[202] = TypeAdapter(self.pending)
        return adapters

    def call(
        self,
        *,
        body: BaseModel | None = None,
        params: Mapping[str, str | float] | None = None,
        timeout_s: float | None = None,
        **path_params: str | int,
    ) -> Call[A]:
        if not (body is None if self.body is None else isinstance(body, self.body)):
            wanted = self.body.__name__ if self.body is not None else "no body"
            raise TypeError(f"{self.method} {self.path} takes {wanted}, not {type(body).__name__}")
        return Call(
            self,
            self.path.format(**path_params),
            json=None if body is None else body.model_dump(mode="json", exclude_unset=True),
            params=dict(params or {}),
            timeout_s=timeout_s,
        )

    def read(self, response: httpx.Response, route: str) -> A:
        """The answer as its model, or the refusal as its exception."""
        status = response.status_code
        if status >= 400:
            error = self.refusals.get(status, GraderUnavailableError if status >= 500 else GradingError)
            raise error(status, refusal_detail(response), method=self.method, url=route)
        adapter = self._answers.get(status)
        if adapter is None:
            raise GradingError(status, "an answer this client does not know", method=self.method, url=route)
        try:
            return cast(A, adapter.validate_json(response.content, extra="ignore"))
        except ValidationError as exc:
            detail = f"the answer is not the grader's {self.answer!r}: {exc.errors(include_url=False)}"
            raise GradingError(status, detail[:MAX_DETAIL_CHARS], method=self.method, url=route) from exc


@dataclass(frozen=True)
class Call(Generic[A]):
    """An endpoint with its arguments filled in, ready to send."""

    endpoint: Endpoint[A]
    route: str  # the path only: a capability URL's token must not reach a message or a log
    json: dict[str, Any] | None = None
    params: dict[str, str | float] = field(default_factory=dict)
    timeout_s: float | None = None

    def unreachable(self, exc: httpx.TransportError, hint: str) -> GraderUnavailableError:
        return GraderUnavailableError(
            503,
            f"cannot reach the grader ({type(exc).__name__}){hint}",
            method=self.endpoint.method,
            url=self.route,
            answered=False,
        )


def refusal_detail(response: httpx.Response) -> str:
    """The reason of a refusal: the Refusal's ``detail``, else whichever of ``detail``/``error`` a
    reference-style server sent, else the body's text."""
    try:
        body = response.json()
    except ValueError:
        return response.text.strip()[:MAX_DETAIL_CHARS] or response.reason_phrase
    try:
        return Refusal.model_validate(body, extra="ignore").detail
    except ValidationError:
        pass
    if isinstance(body, Mapping):
        reason = body.get("detail") or body.get("error")
        if reason:
            return reason if isinstance(reason, str) else str(reason)[:MAX_DETAIL_CHARS]
    return str(body)[:MAX_DETAIL_CHARS]


class _Caller:
    def __init__(self, *, timeout_s: float, unreachable_hint: str = "") -> None:
        self._timeout_s = timeout_s
        self._hint = unreachable_hint

    def _request(self, call: Call[Any]) -> dict[str, Any]:
        return {
            "method": call.endpoint.method,
            "url": call.route,
            "json": call.json,
            "params": call.params,
            "timeout": call.timeout_s or self._timeout_s,
        }


class HttpCaller(_Caller):
    """Sends calls on a blocking httpx client (whose ``base_url`` is the grader's)."""

    def __init__(self, http: httpx.Client, *, timeout_s: float, unreachable_hint: str = "") -> None:
        super().__init__(timeout_s=timeout_s, unreachable_hint=unreachable_hint)
        self._http = http

    def send(self, call: Call[A]) -> A:
        try:
            response = self._http.request(**self._request(call))
        except httpx.TransportError as exc:
            raise call.unreachable(exc, self._hint) from exc
        return call.endpoint.read(response, call.route)

    def close(self) -> None:
        self._http.close()


class AsyncHttpCaller(_Caller):
    """Sends calls on an asyncio httpx client (whose ``base_url`` is the grader's)."""

    def __init__(self, http: httpx.AsyncClient, *, timeout_s: float, unreachable_hint: str = "") -> None:
        super().__init__(timeout_s=timeout_s, unreachable_hint=unreachable_hint)
        self._http = http

    async def send(self, call: Call[A]) -> A:
        try:
            response = await self._http.request(**self._request(call))
        except httpx.TransportError as exc:
            raise call.unreachable(exc, self._hint) from exc
        return call.endpoint.read(response, call.route)

    async def aclose(self) -> None:
        await self._http.aclose()


class BlockingClient:
    """A client holding one :class:`HttpCaller`: closes it, also as a context manager."""

    _caller: HttpCaller

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        self._caller.close()
