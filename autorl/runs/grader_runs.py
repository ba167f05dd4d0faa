"""A cluster's experiments as ``autorl results`` and ``autorl report`` show a home's runs (``--grader
URL``), read through the grader's admin API (``GET /v1/experiments[/{name}]`` and its
``/submissions``) with the admin token ``AUTORL_ADMIN_TOKEN``: one results row per finished
experiment, its recorded message as the row's note, its evaluation key from its recorded config,
and its report computed from its submissions as ``autorl report`` computes one from a home's store."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from functools import cached_property
from typing import Any, TypeVar

import httpx

from autorl.api.admin_client import (
    AdminClient,
    AuthenticationError,
    ExperimentNotFoundError,
    GraderUnavailableError,
    GradingError,
)
from autorl.api.answers import ExperimentAnswer
from autorl.errors import UsageError
from autorl.protocol.feedback import Feedback
from autorl.protocol.final import answer_results
from autorl.runs.results import ROW_STATUS, ResultRow, RunStatus, succeeded, utc_timestamp
from autorl.runs.run_sources import RunKey, resolve_run_id
from autorl.runs.seeds import RunSeed
from autorl.settings import AdminTokenSettings

A = TypeVar("A")

#: Where the admin token is found, for the messages that ask for it.
TOKEN_FIX = (
    "set AUTORL_ADMIN_TOKEN to the grader's admin token (a local grader keeps it in "
    "$AUTORL_HOME/grader-admin-token; a cluster's is in the autorl-admin-token Secret, docs/KUBERNETES.md)"
)


class GraderReaderSettings(AdminTokenSettings):
    """The admin token that `autorl results --grader` and `autorl report --grader` send. Any token
    is sent as it is: the grader says whether it is its own."""

    def accepts_any_admin_token(self) -> bool:
        return True


def answered_columns(view: ExperimentAnswer | None, requested: Feedback, status: RunStatus) -> dict[str, Any]:
    """A run's results columns that come from the grader's last answer (None: it never answered;
    ``requested`` is then the feedback mode), every score on the test split, with its status and
    whether it succeeded: completed with at least one submission scored."""
    numbers = answer_results(view, requested)
    return {**numbers, "status": status, "success": succeeded(status, numbers["submissions"])}


def experiment_row(view: ExperimentAnswer) -> ResultRow | None:
    """The results row of a finished experiment (None while it has not finished), with the numbers
    `autorl run` records for a run."""
    status = ROW_STATUS.get(view.status)
    if status is None:
        return None
    ended = view.finished_at
    return ResultRow(
        run_id=view.name,
        timestamp=utc_timestamp(datetime.fromtimestamp(ended, UTC)) if ended is not None else "",
        task=view.task,
        agent=view.agent or "",
        driver_model=view.driver_model,
        base_model=view.model,
        duration_s=round(max(0.0, ended - view.created_at), 1)
        if ended is not None and view.created_at is not None
        else 0.0,
        workspace=view.workspace,
        **answered_columns(view, view.feedback, status),
    )


class GraderRuns:
    """The experiments of the grader at ``url``, as a :class:`~autorl.runs.run_sources.RunSource`."""

    def __init__(self, url: str, admin: AdminClient) -> None:
        self.url = url
        self.admin = admin
        self.where = f"the grader at {url}"
        self.listing = f"autorl results --grader {url}"

    @cached_property
    def experiments(self) -> list[ExperimentAnswer]:
        """Every experiment of the grader, oldest first."""
        return self._ask(self.admin.experiments)

    def rows(self) -> list[ResultRow]:
        rows = [row for view in self.experiments if (row := experiment_row(view)) is not None]
        unfinished = len(self.experiments) - len(rows)
        if unfinished:
            print(
                f"{unfinished} of the grader's experiments {'has' if unfinished == 1 else 'have'} not "
                "finished and no row yet; "
                f"the dashboard shows them live: {self.url.rstrip('/')}/ui",
                file=sys.stderr,
            )
        return rows

    def notes(self, run_ids: Sequence[str]) -> dict[str, str]:
        return {view.name: view.message for view in self.experiments if view.name in run_ids and view.message}

    def keys(self, run_ids: Sequence[str]) -> dict[str, RunKey]:
        from autorl.eval_config import recorded_key

        return {
            view.name: RunKey(recorded_key(view.eval_config), dict(view.eval_config))
            for view in self.experiments
            if view.name in run_ids
        }

    def seeds(self, run_ids: Sequence[str]) -> dict[str, RunSeed]:
        return {}  # a seed is `autorl run --repeat`'s, kept in a home's run folder: the grader has none

    def metrics(self, run_id: str) -> dict[str, Any]:
        """The run's report, computed now from its experiment and submissions."""
        from autorl.runs.reports import RunRecord, compute_metrics, seed_metrics

        experiment = self._ask(lambda: self.admin.experiment(run_id), run_id)
        submissions = self._ask(lambda: self.admin.submissions(run_id), run_id)
        return {
            **compute_metrics(RunRecord.of_answers(experiment, submissions), time.time()),
            **seed_metrics(None),
        }

    def resolve(self, given: str) -> str:
        """The experiment ``given`` names (its name or a unique prefix), finished or not."""
        return resolve_run_id(given, [view.name for view in self.experiments], self.where, self.listing)

    def _ask(self, request: Callable[[], A], name: str | None = None) -> A:
        """``request``'s answer; the grader's refusal or silence as a UsageError naming the fix."""
        try:
            return request()
        except AuthenticationError as exc:
            raise UsageError(
                f"the grader at {self.url} refused the admin token ({exc.detail}); {TOKEN_FIX}"
            ) from exc
        except ExperimentNotFoundError as exc:
            if name is not None:
                raise UsageError(f"no experiment {name!r} at the grader {self.url}: {exc.detail}") from exc
            raise UsageError(
                f"{self.url} has no admin API ({exc}): give --grader the grader's base URL "
                "(as http://HOST:PORT, without a path)"
            ) from exc
        except GraderUnavailableError as exc:
            raise UsageError(
                f"cannot read the experiments of the grader at {self.url}: {exc}; check that it runs and "
                "that --grader is its base URL (as http://HOST:PORT)"
            ) from exc
        except GradingError as exc:
            raise UsageError(
                f"the grader at {self.url} did not answer as an AutoRL grader's admin API ({exc}); "
                "give --grader the grader's base URL (as http://HOST:PORT)"
            ) from exc


def check_grader_url(url: str) -> None:
    """Refuse (UsageError, exit 2) a ``--grader`` that the admin client could not send a request to:
    it is parsed as the client parses it, and must name a scheme, a host and, if any, a port."""
    try:
        parsed = httpx.URL(url.rstrip("/"))
    except httpx.InvalidURL as exc:
        problem = str(exc)
    else:
        problem = _url_problem(url, parsed)
    if problem:
        raise UsageError(
            f"--grader takes the grader's base URL, as http://HOST:PORT (e.g. http://127.0.0.1:8000), "
            f"not {url!r}: {problem}"
        )


def _url_problem(url: str, parsed: httpx.URL) -> str:
    if not url.startswith(("http://", "https://")):
        return "it must begin with http:// or https://"
    if any(c.isspace() or not c.isprintable() for c in url):
        return "it holds a space or a control character"
    if not parsed.host:
        return "it names no host"
    if parsed.port is not None and not 1 <= parsed.port <= 65535:
        return f"port {parsed.port} is not between 1 and 65535"
    if parsed.query or parsed.fragment:
        return "a base URL has no ?query or #fragment"
    return ""


@contextmanager
def grader_runs(url: str) -> Iterator[GraderRuns]:
    """The experiments of the grader at ``url``, read with ``AUTORL_ADMIN_TOKEN``."""
    check_grader_url(url)
    token = GraderReaderSettings().admin_token_value
    if not token:
        raise UsageError(f"no admin token to read the grader at {url}: {TOKEN_FIX}")
    with AdminClient(url, token, user_agent="autorl-results") as admin:
        yield GraderRuns(url, admin)
