"""`autorl.client.GradingClient` against a real grader over HTTP (real Postgres): typed results,
both ways of authenticating, the 202-then-poll path, and errors that carry the server's reason.

Scored submissions are covered end to end in tests/e2e (a worker evaluates them there)."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from autorl.client import (
    AuthenticationError,
    Best,
    DeadlineError,
    ExperimentConflictError,
    GraderUnavailableError,
    GradingClient,
    GradingError,
    NominatedAnswer,
    PendingSubmission,
    Scores,
    SubmissionNotFoundError,
    SubmissionRejectedError,
    SubmissionResult,
    SubmissionTimeoutError,
    TimeInfo,
    TooManySubmissionsError,
)
from autorl.errors import AutoRLError
from autorl.store import Database
from tests.support.grading import admin_headers, make_workspace, register, row_id
from tests.support.infra import ServedApp
from tests.support.runs import score_evaluation
from tests.support.settings import DeploymentSettings


def arith_experiment(
    served: ServedApp,
    settings: DeploymentSettings,
    base: Path,
    workspace: Path,
    timeout_s: int,
    **fields: Any,
) -> dict[str, str]:
    """An arith experiment registered and started through the admin API, as its agent reaches it."""
    with httpx.Client(base_url=served.url) as admin:
        registered = register(admin, settings, base, workspace, task="arith", timeout_s=timeout_s, **fields)
    return {
        "name": registered.name,
        "token": registered.token,
        "capability_url": f"{served.url}{registered.url_path}",
    }


@pytest.fixture
def experiment(
    served: ServedApp, settings: DeploymentSettings, tiny_base_model: Path, tmp_path: Path
) -> dict[str, str]:
    workspace = make_workspace(tmp_path)
    shutil.copytree(tiny_base_model, workspace / "output" / "copy")
    return {
        **arith_experiment(served, settings, tiny_base_model, workspace, 600),
        "workspace": str(workspace),
    }


def test_capability_url_alone_authenticates(experiment: dict[str, str]) -> None:
    with GradingClient.from_env({"GRADING_SERVER_URL": experiment["capability_url"]}) as client:
        assert client.health().status == "ok"
        budget = client.time()
        assert budget.start_time is not None and budget.end_time == pytest.approx(budget.start_time + 600)
        assert 0 < (budget.remaining_s or 0) <= 600 and budget.last_submit_time is None
        scores = client.scores()
        assert scores.total_submissions == 0 and scores.submissions == [] and scores.best.score is None


def test_root_url_with_token_sends_a_bearer_header(served: ServedApp, experiment: dict[str, str]) -> None:
    env = {"GRADING_SERVER_URL": served.url, "AUTORL_TOKEN": experiment["token"]}
    with GradingClient.from_env(env) as client:
        assert client.time().timeout_s == 600


def test_submit_without_waiting_then_poll(experiment: dict[str, str]) -> None:
    with GradingClient(experiment["capability_url"]) as client:
        queued = client.submit("output/copy", wait=False)
        assert queued.status == "queued" and queued.submission_id > 0 and not queued.final
        assert client.submission(queued.submission_id).status in ("queued", "running")
        assert [s.submission_id for s in client.scores().submissions] == [queued.submission_id]
        assert client.time().last_submit_time is not None


def test_blocking_submit_polls_after_the_servers_202(experiment: dict[str, str]) -> None:
    """The server holds /submit 0.5 s here, then answers 202; no worker runs, so the client's own
    limit ends the wait, and the submission keeps its place."""
    with GradingClient(experiment["capability_url"]) as client:
        started = time.monotonic()
        with pytest.raises(SubmissionTimeoutError, match="keeps its place") as caught:
            client.submit("output/copy", max_wait_s=2.0, poll_interval_s=0.2)
        assert 0.5 <= time.monotonic() - started < 10
        assert client.submission(caught.value.submission_id).status == "queued"


def test_refusals_carry_the_servers_reason(served: ServedApp, experiment: dict[str, str]) -> None:
    with (
        GradingClient(f"{served.url}/a/not-a-token") as stranger,
        pytest.raises(AuthenticationError) as caught,
    ):
        stranger.scores()
    assert caught.value.status_code == 401 and "GRADING_SERVER_URL" in caught.value.detail
    assert "not-a-token" not in str(caught.value)
    with GradingClient(experiment["capability_url"]) as client:
        with pytest.raises(SubmissionRejectedError) as rejected:
            client.submit("models/anything", wait=False)
        assert rejected.value.status_code == 400 and "OUTPUT_DIR" in rejected.value.detail
        with pytest.raises(SubmissionNotFoundError):
            client.submission(999_999_999)


def test_submission_after_the_deadline_is_refused_with_a_reason(
    served: ServedApp, settings: DeploymentSettings, tiny_base_model: Path, tmp_path: Path
) -> None:
    workspace = make_workspace(tmp_path)
    shutil.copytree(tiny_base_model, workspace / "output" / "late")
    registered = arith_experiment(served, settings, tiny_base_model, workspace, timeout_s=1)
    with GradingClient(registered["capability_url"]) as client:
        end_time = client.time().end_time
        assert end_time is not None
        time.sleep(max(0.0, end_time - time.time()) + 0.2)
        with pytest.raises(DeadlineError) as caught:
            client.submit("output/late", wait=False)
    assert caught.value.status_code == 403 and "end_time" in caught.value.detail


def test_answers_are_the_graders_models(experiment: dict[str, str]) -> None:
    """What a caller gets back is typed: each answer the model the grader declares for it."""
    with GradingClient(experiment["capability_url"]) as client:
        budget = client.time()
        assert isinstance(budget, TimeInfo) and budget.remaining == budget.remaining_s
        assert budget.now >= (budget.start_time or 0)
        receipt = client.submit("output/copy", wait=False)
        assert isinstance(receipt, PendingSubmission)
        # The copy's own tokenizer and generation config are not evaluated (the base model's are).
        assert receipt.queue_position == 1 and "tokenizer.json" in receipt.ignored_files
        polled = client.submission(receipt.submission_id)
        assert isinstance(polled, SubmissionResult) and not polled.final
        assert polled.model_path.endswith("output/copy") and polled.is_baseline is False
        assert polled.score is None and polled.scores.opencompass is None and polled.error is None
        assert polled.best == Best(submission_id=None, score=None) and polled.total_submissions == 1
        scores = client.scores()
        assert isinstance(scores, Scores) and scores.submissions == [polled]


def test_the_limit_and_a_finished_experiment_refuse_with_their_own_classes(
    served: ServedApp, settings: DeploymentSettings, tiny_base_model: Path, tmp_path: Path
) -> None:
    workspace = make_workspace(tmp_path)
    for name in ("a", "b"):
        shutil.copytree(tiny_base_model, workspace / "output" / name)
    registered = arith_experiment(served, settings, tiny_base_model, workspace, 600, max_submissions=1)
    with GradingClient(registered["capability_url"]) as client:
        client.submit("output/a", wait=False)
        with pytest.raises(TooManySubmissionsError) as limited:
            client.submit("output/b", wait=False)
        assert limited.value.status_code == 429 and "1" in limited.value.detail
        finished = httpx.post(
            f"{served.url}/v1/experiments/{registered['name']}/finish",
            json={"status": "completed"},
            headers=admin_headers(settings),
        )
        assert finished.status_code == 200, finished.text
        with pytest.raises(ExperimentConflictError) as closed:
            client.submit("output/b", wait=False)
    assert closed.value.status_code == 409 and "completed" in closed.value.detail
    assert isinstance(closed.value, GradingError) and not closed.value.retryable


def test_a_sealed_nomination_through_the_client(
    served: ServedApp, settings: DeploymentSettings, tiny_base_model: Path, tmp_path: Path
) -> None:
    """`nominate` sends POST /final: a submission not scored yet is refused with the grader's
    reason, a scored one is nominated with its validation score, a second nomination conflicts."""
    workspace = make_workspace(tmp_path)
    shutil.copytree(tiny_base_model, workspace / "output" / "a")
    registered = arith_experiment(served, settings, tiny_base_model, workspace, 600, feedback="sealed")
    db = Database(settings.database_url)
    with GradingClient(registered["capability_url"]) as client:
        pending = client.submit("output/a", wait=False)
        with pytest.raises(SubmissionRejectedError) as unscored:
            client.nominate(pending.submission_id)
        assert unscored.value.status_code == 400 and "scored" in unscored.value.detail
        evaluated = row_id(db, registered["name"], pending.submission_id)
        score_evaluation(db, evaluated, 40.0)
        nominated = client.nominate(pending.submission_id)
        assert isinstance(nominated, NominatedAnswer)
        assert (nominated.submission_id, nominated.split, nominated.score) == (
            pending.submission_id,
            "validation",
            40.0,
        )
        with pytest.raises(ExperimentConflictError) as twice:
            client.nominate(pending.submission_id)
        assert twice.value.status_code == 409
    db.dispose()


def test_a_nomination_in_test_mode_conflicts(experiment: dict[str, str]) -> None:
    with GradingClient(experiment["capability_url"]) as client:
        submitted = client.submit("output/copy", wait=False)
        with pytest.raises(ExperimentConflictError) as refused:
            client.nominate(submitted.submission_id)
    assert refused.value.status_code == 409 and "feedback: test" in refused.value.detail


def test_unreachable_grader_and_missing_url_are_clear() -> None:
    with pytest.raises(AutoRLError, match="GRADING_SERVER_URL is not set"):
        GradingClient.from_env({})
    with (
        GradingClient("http://127.0.0.1:9/a/token", timeout_s=2) as client,
        pytest.raises(AutoRLError) as caught,
    ):
        client.time()
    assert "cannot reach the grader" in str(caught.value) and "/a/token" not in str(caught.value)
    assert isinstance(caught.value, GraderUnavailableError) and caught.value.retryable
