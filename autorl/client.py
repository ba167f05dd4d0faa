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
from pathlib import Path
from typing import Any, Literal, overload

import httpx

from autorl.api.answers import (
    FINAL_STATUSES,
    Best,
    HealthAnswer,
    NominatedAnswer,
    PendingAnswer,
    ScoresAnswer,
    SubmissionAnswer,
    TimeAnswer,
)
from autorl.api.endpoints import (
    AuthenticationError,
    BlockingClient,
    DeadlineError,
    Endpoint,
    ExperimentConflictError,
    GraderUnavailableError,
    GradingError,
    HttpCaller,
    SubmissionNotFoundError,
    SubmissionRejectedError,
    TooManySubmissionsError,
)
from autorl.api.request_bodies import NominateRequest, SubmitRequest
from autorl.errors import AutoRLError

__all__ = [
    "FINAL_STATUSES",
    "AuthenticationError",
    "Best",
    "DeadlineError",
    "ExperimentConflictError",
    "GraderUnavailableError",
    "GradingClient",
    "GradingError",
    "NominatedAnswer",
    "PendingSubmission",
    "Scores",
    "SubmissionNotFoundError",
    "SubmissionRejectedError",
    "SubmissionResult",
    "SubmissionTimeoutError",
    "TimeInfo",
    "TooManySubmissionsError",
]

#: The grader answers a blocking /submit within 540 s; the read timeout must outlast that.
SUBMIT_READ_TIMEOUT_S = 600.0
#: Every other call is quick.
DEFAULT_TIMEOUT_S = 30.0
#: Between two polls of a submission that is still being evaluated.
POLL_INTERVAL_S = 5.0

#: A submission as the grader reports it; ``score`` is the headline (OpenCompass protocol),
#: ``final`` tells whether it is scored or failed.
SubmissionResult = SubmissionAnswer
#: What ``submit(..., wait=False)`` answers at once: the id, ``status`` and ``queue_position``.
PendingSubmission = PendingAnswer
#: This experiment's submissions (the baseline excluded) and the best so far; ``submission_id``
#: counts the experiment's own submissions (1, 2, ...), as every id an agent is shown does.
Scores = ScoresAnswer
#: The budget, in epoch seconds; ``None`` before the budget starts.
TimeInfo = TimeAnswer


class SubmissionTimeoutError(AutoRLError):
    """The submission was still not scored when the caller's wait ran out; it remains queued."""

    def __init__(self, submission_id: int, waited_s: float) -> None:
        self.submission_id = submission_id
        super().__init__(
            f"submission {submission_id} not scored after {waited_s:.0f} s; "
            f"it keeps its place: poll it later with submission({submission_id})"
        )


#: The agent API's refusals; any other 4xx is a plain GradingError, a 5xx GraderUnavailableError.
AGENT_REFUSALS: dict[int, type[GradingError]] = {
    400: SubmissionRejectedError,
    401: AuthenticationError,
    403: DeadlineError,
    404: SubmissionNotFoundError,
    409: ExperimentConflictError,
    422: SubmissionRejectedError,
    429: TooManySubmissionsError,
}

HEALTH = Endpoint[HealthAnswer]("GET", "/health", HealthAnswer, AGENT_REFUSALS)
TIME = Endpoint[TimeAnswer]("GET", "/time", TimeAnswer, AGENT_REFUSALS)
SCORES = Endpoint[ScoresAnswer]("GET", "/scores", ScoresAnswer, AGENT_REFUSALS)
SUBMISSION = Endpoint[SubmissionAnswer](
    "GET", "/submissions/{submission_id}", SubmissionAnswer, AGENT_REFUSALS
)
SUBMIT = Endpoint[SubmissionAnswer | PendingAnswer](
    "POST",
    "/submit",
    SubmissionAnswer,
    AGENT_REFUSALS,
    body=SubmitRequest,
    # ?wait=false: 202 whatever it is, the whole answer where the score was known at once.
    pending=SubmissionAnswer | PendingAnswer,
)
NOMINATE = Endpoint[NominatedAnswer]("POST", "/final", NominatedAnswer, AGENT_REFUSALS, body=NominateRequest)


class GradingClient(BlockingClient):
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
        http = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout_s, transport=transport)
        self._caller = HttpCaller(
            http, timeout_s=timeout_s, unreachable_hint="; is GRADING_SERVER_URL right?"
        )

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

    def health(self) -> HealthAnswer:
        return self._caller.send(HEALTH.call())

    def time(self) -> TimeInfo:
        return self._caller.send(TIME.call())

    def scores(self) -> Scores:
        """Every submission of this experiment (the baseline excluded), oldest first, and the best
        so far: ``GET /scores`` page after page until ``next_after`` is null. Totals are the last
        page's."""
        page = self.scores_page()
        submissions = list(page.submissions)
        while page.next_after is not None:
            page = self.scores_page(after=page.next_after)
            submissions += page.submissions
        return page.model_copy(update={"submissions": submissions})

    def scores_page(self, after: int = 0, limit: int | None = None) -> Scores:
        """One page of ``GET /scores``: the submissions numbered above ``after``, at most ``limit``
        (the server's default: every one the experiment's limit allows); ``next_after`` is where
        the next page begins, null on the last."""
        params: dict[str, str | float] = {"after": after}
        if limit is not None:
            params["limit"] = limit
        return self._caller.send(SCORES.call(params=params))

    def submission(self, submission_id: int) -> SubmissionResult:
        return self._caller.send(SUBMISSION.call(submission_id=int(submission_id)))

    def nominate(self, submission_id: int) -> NominatedAnswer:
        """Sealed mode: nominate one of your scored submissions, once, inside the budget, for the
        experiment's one evaluation on the test split (``POST /final``). Answers its validation
        score; the test score is never shown. Refused: a second nomination or test mode
        (:class:`ExperimentConflictError`), an id that is not a scored submission of yours
        (:class:`SubmissionRejectedError`), outside the budget (:class:`DeadlineError`)."""
        return self._caller.send(NOMINATE.call(body=NominateRequest(submission_id=int(submission_id))))

    @overload
    def submit(
        self,
        model_path: str | os.PathLike[str],
        *,
        wait: Literal[True] = ...,
        max_wait_s: float | None = ...,
        poll_interval_s: float = ...,
    ) -> SubmissionResult: ...

    @overload
    def submit(
        self,
        model_path: str | os.PathLike[str],
        *,
        wait: bool,
        max_wait_s: float | None = ...,
        poll_interval_s: float = ...,
    ) -> SubmissionResult | PendingSubmission: ...

    def submit(
        self,
        model_path: str | os.PathLike[str],
        *,
        wait: bool = True,
        max_wait_s: float | None = None,
        poll_interval_s: float = POLL_INTERVAL_S,
    ) -> SubmissionResult | PendingSubmission:
        """Submit a checkpoint folder (a full model in safetensors, inside ``output/``).

        With ``wait`` (the default) this returns the scored (or failed) submission: the grader
        holds the request for up to 540 s, and if it answers 202 first, this polls
        ``GET /submissions/{id}`` until the evaluation ends or ``max_wait_s`` runs out
        (then :class:`SubmissionTimeoutError`; the submission stays queued). Without ``wait`` it
        returns at once: a :data:`PendingSubmission` (status ``queued``, its ``queue_position``),
        or the result itself when an identical checkpoint's score was reused.
        """
        started = time.monotonic()
        submission = self._caller.send(
            SUBMIT.call(
                body=SubmitRequest(model_path=str(Path(model_path))),
                params={"wait": "true" if wait else "false"},
                timeout_s=SUBMIT_READ_TIMEOUT_S if wait else None,
            )
        )
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
