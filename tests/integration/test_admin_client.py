"""`autorl.api.admin_client` against a real grader over HTTP (real Postgres): the blocking client that
`autorl run` uses and the asyncio one the operator uses answer the same typed models, refuse with
the same exception classes carrying the grader's reason, and say when retrying may help."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import pytest

from autorl.api.admin_client import (
    AdminClient,
    AsyncAdminClient,
    AuthenticationError,
    ExperimentConflictError,
    ExperimentNotFoundError,
    GraderUnavailableError,
)
from autorl.api.answers import ExperimentAnswer, PendingAnswer, RegisteredAnswer, SubmissionAnswer
from autorl.api.request_bodies import RegisterExperiment
from autorl.client import GradingClient
from tests.support.grading import make_workspace
from tests.support.infra import ServedApp
from tests.support.settings import DeploymentSettings

UNREACHABLE = "http://127.0.0.1:9"


@pytest.fixture
def admin_token(settings: DeploymentSettings) -> str:
    return settings.admin_token_value


def registration(base: Path, tmp_path: Path, **fields: object) -> RegisterExperiment:
    workspace = make_workspace(tmp_path)
    shutil.copytree(base, workspace / "output" / "copy")
    return RegisterExperiment.model_validate(
        {
            "name": f"admin-{uuid.uuid4().hex[:10]}",
            "task": "arith",
            "model": f"local:{base.name}-{workspace.name}",
            "timeout_s": 600,
            "workspace": str(workspace),
            "base_model_dir": str(base),
            **fields,
        }
    )


def test_blocking_client_runs_an_experiment_with_typed_answers(
    served: ServedApp, admin_token: str, tiny_base_model: Path, tmp_path: Path
) -> None:
    body = registration(tiny_base_model, tmp_path, agent="example_grpo", max_submissions=5)
    with AdminClient(served.url, admin_token) as admin:
        assert admin.ready()
        registered = admin.register(body)
        assert isinstance(registered, RegisteredAnswer)
        assert registered.name == body.name and registered.status == "pending"
        assert registered.grading_server_url.endswith(f"/a/{registered.token}")
        assert registered.max_submissions == 5 and registered.agent == "example_grpo"
        # The module's database holds the other tests' experiments too, whatever their order.
        assert [e.name for e in admin.experiments()].count(body.name) == 1

        queued = admin.baseline(body.name)  # no worker runs here: it stays queued
        assert isinstance(queued, PendingAnswer) and queued.status == "queued" and not queued.final
        waited = admin.wait_for_baseline(body.name, max_wait_s=0.5, poll_s=0.1)
        assert waited.baseline_status == "queued" and waited.baseline_submission == queued.submission_id

        started = admin.start(body.name)
        assert isinstance(started, ExperimentAnswer) and started.status == "running"
        assert started.start_time is not None and started.end_time == pytest.approx(started.start_time + 600)
        with GradingClient(f"{served.url}/a/{registered.token}") as agent:
            submitted = agent.submit("output/copy", wait=False)
        submissions = admin.submissions(body.name)
        assert all(isinstance(s, SubmissionAnswer) for s in submissions)
        assert [s.is_baseline for s in submissions] == [True, False]
        # The admin API's ids are the database's; the agent counts its own submissions.
        assert submissions[0].submission_id == queued.submission_id < submissions[1].submission_id
        assert submitted.submission_id == 1
        assert admin.experiment(body.name).in_flight == 2

        finished = admin.finish(body.name, "interrupted", "stopped by a test")
        assert finished.status == "interrupted" and finished.message == "stopped by a test"
        assert finished.in_flight == 0 and finished.finished_at is not None


def test_blocking_client_refusals_carry_the_graders_reason(
    served: ServedApp, admin_token: str, tiny_base_model: Path, tmp_path: Path
) -> None:
    body = registration(tiny_base_model, tmp_path)
    with AdminClient(served.url, admin_token) as admin:
        admin.register(body)
        with pytest.raises(ExperimentConflictError) as taken:
            admin.register(body)
        assert taken.value.status_code == 409 and body.name in taken.value.detail
        assert not taken.value.retryable
        with pytest.raises(ExperimentNotFoundError) as missing:
            admin.experiment("no-such-experiment")
        assert missing.value.status_code == 404 and "no-such-experiment" in missing.value.detail
        admin.finish(body.name, "failed")
        with pytest.raises(ExperimentConflictError, match="register a new one"):
            admin.start(body.name)
    with (
        AdminClient(served.url, "not-the-admin-token") as stranger,
        pytest.raises(AuthenticationError) as denied,
    ):
        stranger.experiments()
    assert denied.value.status_code == 401 and denied.value.detail
    assert "not-the-admin-token" not in str(denied.value)


def test_unreachable_grader_is_retryable_for_the_blocking_client() -> None:
    with AdminClient(UNREACHABLE, "token", timeout_s=2) as admin:
        assert not admin.ready()
        with pytest.raises(GraderUnavailableError) as caught:
            admin.experiment("any")
    assert caught.value.retryable and "cannot reach the grader" in caught.value.detail
    assert "GET /v1/experiments/any" in str(caught.value)


@pytest.mark.asyncio
async def test_async_client_drives_the_operators_calls(
    served: ServedApp, admin_token: str, tiny_base_model: Path, tmp_path: Path
) -> None:
    body = registration(tiny_base_model, tmp_path)
    admin = AsyncAdminClient(served.url, admin_token)
    try:
        registered = await admin.register(body)
        with pytest.raises(ExperimentConflictError):
            await admin.register(body)
        # A registration whose token was lost: a new token, the old one revoked.
        renewed = await admin.new_token(body.name)
        assert renewed.name == body.name and renewed.token != registered.token
        assert renewed.grading_server_url.endswith(f"/a/{renewed.token}")
        queued = await admin.baseline(body.name)
        assert isinstance(queued, PendingAnswer) and queued.status == "queued"
        view = await admin.experiment(body.name)
        assert view.baseline_status == "queued" and view.start_time is None
        started = await admin.start(body.name, start_time=view.created_at)
        assert started.start_time == pytest.approx(view.created_at)
        assert [s.is_baseline for s in await admin.submissions(body.name)] == [True]
        finished = await admin.finish(body.name, "timed_out", "the agent was stopped")
        assert finished.status == "timed_out"
        with pytest.raises(ExperimentNotFoundError) as missing:
            await admin.finish("no-such-experiment", "failed")
        assert missing.value.status_code == 404 and not missing.value.retryable
    finally:
        await admin.aclose()


@pytest.mark.asyncio
async def test_unreachable_grader_is_retryable_for_the_async_client() -> None:
    admin = AsyncAdminClient(UNREACHABLE, "token", timeout_s=2)
    try:
        with pytest.raises(GraderUnavailableError) as caught:
            await admin.experiment("any")
    finally:
        await admin.aclose()
    assert caught.value.retryable and caught.value.status_code == 503


def test_a_runs_end_whose_notes_quote_an_agents_huge_string_is_recorded_with_them(
    served: ServedApp, admin_token: str, tiny_base_model: Path, tmp_path: Path
) -> None:
    """A tensor name of two million characters in the final's index, quoted by the twin split's
    note and by the run's message, still lets ``autorl run`` record its end: the grader finishes the
    experiment (cancelling what was not evaluated) and keeps the note."""
    from types import SimpleNamespace

    from autorl.provenance.unverified import MAX_MESSAGE_CHARS, TWIN_UNVERIFIED, note, notes_in
    from autorl_local.experiment import LocalRun

    name = "\x1b]8;;https://evil.example\x1b\\x\x1b[2J\n" + "A" * 2_000_000
    body = registration(tiny_base_model, tmp_path)
    with AdminClient(served.url, admin_token) as admin:
        registered = admin.register(body)
        admin.start(body.name)
        with GradingClient(f"{served.url}/a/{registered.token}") as agent:
            agent.submit("output/copy", wait=False)
        twin = note(TWIN_UNVERIFIED, f"the final's folder can no longer be read: {name}")
        run = SimpleNamespace(
            registered=True, run_id=body.name, admin=admin, unverified=[twin], _stop_services=lambda: None
        )
        LocalRun._finalize(run, "completed", f"the agent ended; its log ends with: {name}", False)  # type: ignore[arg-type]
        finished = admin.experiment(body.name)
    assert finished.status == "completed" and finished.in_flight == 0
    assert finished.message is not None and len(finished.message) <= MAX_MESSAGE_CHARS
    assert finished.message.startswith("the agent ended; its log ends with: ")
    assert notes_in(finished.message) == [twin] and "\x1b" not in twin
