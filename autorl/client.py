"""The typed HTTP client an agent uses to talk to the grader.

    from autorl.client import GradingClient

    client = GradingClient.from_env()          # GRADING_SERVER_URL (+ AUTORL_TOKEN)
    result = client.submit("output/epoch-1")   # blocks until the checkpoint is scored
    print(result.score, result.improvement, client.time().remaining_s)

``GRADING_SERVER_URL`` is a capability URL (``http://HOST:PORT/a/<token>``): appending a route
is enough to be authenticated. A root URL with ``AUTORL_TOKEN`` sends the token as a bearer header.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import httpx

from autorl.errors import AutoRLError

#: The grader answers a blocking /submit within 540 s; the read timeout must outlast that.
SUBMIT_READ_TIMEOUT_S = 600.0
#: Every other call is quick.
DEFAULT_TIMEOUT_S = 30.0
#: Between two polls of a submission that is still being evaluated.
POLL_INTERVAL_S = 5.0

FINAL_STATUSES = frozenset({"scored", "failed"})


class GradingError(AutoRLError):
    """The grader refused a request. ``detail`` is the server's reason, which names the fix."""

    def __init__(self, status_code: int, detail: str, *, method: str = "", url: str = "") -> None:
        self.status_code = status_code
        self.detail = detail
        where = f" ({method} {url})" if method else ""
        super().__init__(f"grader answered {status_code}{where}: {detail}")


class AuthenticationError(GradingError):
    """401: no token, or not this experiment's."""


class DeadlineError(GradingError):
    """403: the time budget is over; nothing more is accepted."""


class SubmissionRejectedError(GradingError):
    """400/422: the checkpoint or request breaks a rule (path outside output/, adapter, pickle)."""


class SubmissionNotFoundError(GradingError):
    """404: no such submission in this experiment."""


class TooManySubmissionsError(GradingError):
    """429: the experiment reached its submission limit."""


class GraderUnavailableError(GradingError):
    """5xx or no connection: the grader or its database is down; retrying later may work."""


class SubmissionTimeoutError(AutoRLError):
    """The submission was still not scored when the caller's wait ran out; it remains queued."""

    def __init__(self, submission_id: int, waited_s: float) -> None:
        self.submission_id = submission_id
        super().__init__(
            f"submission {submission_id} not scored after {waited_s:.0f} s; "
            f"it keeps its place: poll it later with submission({submission_id})"
        )


_ERROR_BY_STATUS: dict[int, type[GradingError]] = {
    400: SubmissionRejectedError,
    401: AuthenticationError,
    403: DeadlineError,
    404: SubmissionNotFoundError,
    422: SubmissionRejectedError,
    429: TooManySubmissionsError,
}


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


@dataclass(frozen=True)
class Best:
    submission_id: int | None
    score: float | None

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> Best:
        data = data or {}
        return cls(_optional_int(data.get("submission_id")), _optional_float(data.get("score")))


@dataclass(frozen=True)
class SubmissionResult:
    """A submission as the grader reports it. ``score`` is the headline (OpenCompass protocol)."""

    submission_id: int
    status: str  # queued | running | scored | failed
    score: float | None = None
    baseline_score: float | None = None
    improvement: float | None = None
    best: Best | None = None
    total_submissions: int | None = None
    queue_position: int | None = None
    model_path: str | None = None
    error: str | None = None
    scores: dict[str, float | None] = field(default_factory=dict)
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def final(self) -> bool:
        return self.status in FINAL_STATUSES

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SubmissionResult:
        return cls(
            submission_id=int(data["submission_id"]),
            status=str(data.get("status", "queued")),
            score=_optional_float(data.get("score")),
            baseline_score=_optional_float(data.get("baseline_score")),
            improvement=_optional_float(data.get("improvement")),
            best=Best.from_json(data["best"]) if data.get("best") is not None else None,
            total_submissions=_optional_int(data.get("total_submissions")),
            queue_position=_optional_int(data.get("queue_position")),
            model_path=data.get("model_path"),
            error=data.get("error"),
            scores={k: _optional_float(v) for k, v in (data.get("scores") or {}).items()},
            raw=dict(data),
        )


@dataclass(frozen=True)
class Scores:
    """This experiment's submissions (the baseline excluded) and the best so far."""

    baseline_score: float | None
    best: Best
    total_submissions: int
    submissions: list[SubmissionResult]
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Scores:
        return cls(
            baseline_score=_optional_float(data.get("baseline_score")),
            best=Best.from_json(data.get("best")),
            total_submissions=int(data.get("total_submissions") or 0),
            submissions=[SubmissionResult.from_json(s) for s in data.get("submissions") or []],
            raw=dict(data),
        )


@dataclass(frozen=True)
class TimeInfo:
    """The budget, in epoch seconds; ``None`` before the budget starts."""

    start_time: float | None
    timeout_s: float | None
    end_time: float | None
    remaining_s: float | None
    last_submit_time: float | None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TimeInfo:
        remaining = data.get("remaining_s", data.get("remaining"))
        return cls(
            start_time=_optional_float(data.get("start_time")),
            timeout_s=_optional_float(data.get("timeout_s")),
            end_time=_optional_float(data.get("end_time")),
            remaining_s=_optional_float(remaining),
            last_submit_time=_optional_float(data.get("last_submit_time")),
            raw=dict(data),
        )


def _detail(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text.strip()[:500] or response.reason_phrase
    if isinstance(body, Mapping) and "detail" in body:
        detail = body["detail"]
        return detail if isinstance(detail, str) else str(detail)
    return str(body)[:500]


class GradingClient:
    """Talks to one experiment's grading API. Use as a context manager, or call ``close()``."""

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        headers: dict[str, str] = {}
        # A capability URL already authenticates; a second credential could only disagree with it.
        if token and "/a/" not in self.base_url:
            headers["Authorization"] = f"Bearer {token}"
        self._timeout_s = timeout_s
        self._http = httpx.Client(headers=headers, timeout=timeout_s, transport=transport)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **kwargs: Any) -> GradingClient:
        env = os.environ if env is None else env
        url = env.get("GRADING_SERVER_URL", "").strip()
        if not url:
            raise AutoRLError(
                "GRADING_SERVER_URL is not set; the platform sets it for every agent "
                "(run under `autorl run` or pass the URL to GradingClient(url))"
            )
        return cls(url, env.get("AUTORL_TOKEN") or None, **kwargs)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _request(
        self, method: str, route: str, *, timeout_s: float | None = None, **kwargs: Any
    ) -> httpx.Response:
        url = f"{self.base_url}{route}"
        try:
            response = self._http.request(method, url, timeout=timeout_s or self._timeout_s, **kwargs)
        except httpx.TransportError as exc:
            raise GraderUnavailableError(
                503,
                f"cannot reach the grader ({type(exc).__name__}); is GRADING_SERVER_URL right?",
                method=method,
                url=route,  # the route only: a capability URL's token must not reach a message or a log
            ) from exc
        if response.status_code >= 400:
            status = response.status_code
            error = _ERROR_BY_STATUS.get(status, GraderUnavailableError if status >= 500 else GradingError)
            raise error(status, _detail(response), method=method, url=route)
        return response

    def health(self) -> dict[str, Any]:
        body: dict[str, Any] = self._request("GET", "/health").json()
        return body

    def time(self) -> TimeInfo:
        return TimeInfo.from_json(self._request("GET", "/time").json())

    def scores(self) -> Scores:
        return Scores.from_json(self._request("GET", "/scores").json())

    def submission(self, submission_id: int) -> SubmissionResult:
        return SubmissionResult.from_json(self._request("GET", f"/submissions/{int(submission_id)}").json())

    def submit(
        self,
        model_path: str | os.PathLike[str],
        *,
        wait: bool = True,
        max_wait_s: float | None = None,
        poll_interval_s: float = POLL_INTERVAL_S,
    ) -> SubmissionResult:
        """Submit a checkpoint folder (a full model in safetensors, inside ``output/``).

        With ``wait`` (the default) this returns the scored (or failed) submission: the grader
        holds the request for up to 540 s, and if it answers 202 first, this polls
        ``GET /submissions/{id}`` until the evaluation ends or ``max_wait_s`` runs out
        (then :class:`SubmissionTimeoutError`; the submission stays queued). Without ``wait`` it
        returns at once with status ``queued``.
        """
        started = time.monotonic()
        response = self._request(
            "POST",
            "/submit",
            params={"wait": "true" if wait else "false"},
            json={"model_path": str(Path(model_path))},
            timeout_s=SUBMIT_READ_TIMEOUT_S if wait else None,
        )
        submission = SubmissionResult.from_json(response.json())
        if not wait or submission.final:
            return submission
        return self.wait_for(
            submission.submission_id,
            max_wait_s=None if max_wait_s is None else max(0.0, max_wait_s - (time.monotonic() - started)),
            poll_interval_s=poll_interval_s,
        )

    def wait_for(
        self, submission_id: int, *, max_wait_s: float | None = None, poll_interval_s: float = POLL_INTERVAL_S
    ) -> SubmissionResult:
        """Poll a submission until it is scored or failed (or ``max_wait_s`` runs out)."""
        started = time.monotonic()
        while True:
            submission = self.submission(submission_id)
            if submission.final:
                return submission
            waited = time.monotonic() - started
            if max_wait_s is not None and waited >= max_wait_s:
                raise SubmissionTimeoutError(submission_id, waited)
            pause = poll_interval_s if max_wait_s is None else min(poll_interval_s, max_wait_s - waited)
            time.sleep(max(0.05, pause))
