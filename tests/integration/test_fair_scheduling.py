"""Experiments share the evaluators fairly: baselines first, then round robin across experiments, so
an experiment that floods the queue cannot starve another. Checked for local workers (the
submissions table is the queue, on SQLite and Postgres) and for RQ (a real worker, real Redis)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from redis import Redis

from autorl.store import Database, Submission, SubmissionStatus, claims, outcomes, submissions
from autorl_evaluator.rq_worker import evaluation_queue
from autorl_grader.main import create_app
from tests.support.grading import admin_headers, make_workspace, register, submit_copies, work_the_queue
from tests.support.settings import DeploymentSettings

FLOOD = 4


def flood_then_one_then_a_baseline(
    client: TestClient, settings: DeploymentSettings, base: Path, tmp_path: Path
) -> tuple[list[int], int, int]:
    """A floods, then B submits once, then C's baseline is requested. Returns the three's ids."""
    flooding = register(client, settings, base, make_workspace(tmp_path))
    single = register(client, settings, base, make_workspace(tmp_path))
    late = register(client, settings, base, make_workspace(tmp_path), model=f"local:late-{tmp_path.name}")
    flood = submit_copies(client, flooding, base, FLOOD, "a")
    (one,) = submit_copies(client, single, base, 1, "b")
    baseline = client.post(f"/v1/experiments/{late.name}/baseline", headers=admin_headers(settings))
    assert baseline.status_code == 202, baseline.text
    return flood, one, int(baseline.json()["submission_id"])


@pytest.fixture(params=["sqlite", "postgres"])
def local_settings(
    request: pytest.FixtureRequest, make_settings: Callable[..., DeploymentSettings]
) -> DeploymentSettings:
    if request.param == "sqlite":
        return make_settings(local_mode=True, submit_wait_s=0.0)
    return make_settings(database_url=request.getfixturevalue("fresh_pg_url"), submit_wait_s=0.0)


def test_local_workers_take_baselines_first_then_experiments_in_turn(
    local_settings: DeploymentSettings, tiny_base_model: Path, tmp_path: Path
) -> None:
    with TestClient(create_app(local_settings, reconcile=False)) as client:
        flood, one, baseline = flood_then_one_then_a_baseline(
            client, local_settings, tiny_base_model, tmp_path
        )
    db = Database(local_settings.database_url or "")
    order: list[int] = []
    with db.session() as session:  # two workers: while one evaluates A's first, the other takes B's
        first = claims.next_claimable_id(session)
        assert first == baseline
        assert claims.claim(session, first, worker="w0", lease_s=60)
    with db.session() as session:
        taken = claims.next_claimable_id(session)
        assert taken is not None and claims.claim(session, taken, worker="w1", lease_s=60)
    with db.session() as session:
        busy = claims.next_claimable_id(session)
        assert (taken, busy) == (flood[0], one)  # A has one running: B goes before A's older ones
    for worker, submission_id in (("w0", first), ("w1", taken)):
        with db.session() as session:
            assert outcomes.record_score(
                session, submission_id, worker=worker, scores={"opencompass": 1.0}, n_samples=1, seconds=1
            )
        order.append(submission_id)
    while True:  # one worker from here on: still A's and B's in turn, never a run of A's
        with db.session() as session:
            submission_id = claims.next_claimable_id(session)
            if submission_id is None:
                break
            assert claims.claim(session, submission_id, worker="w", lease_s=60)
            assert outcomes.record_score(
                session, submission_id, worker="w", scores={"opencompass": 1.0}, n_samples=1, seconds=1
            )
        order.append(submission_id)
    db.dispose()
    assert order == [baseline, flood[0], one, *flood[1:]]


def test_rq_worker_serves_a_single_submission_after_at_most_one_of_a_flood(
    make_isolated_settings: Callable[..., DeploymentSettings],
    tiny_base_model: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = make_isolated_settings(eval_limit=1, eval_max_new_tokens=2, submit_wait_s=0.0)
    with TestClient(create_app(settings, reconcile=False)) as client:
        flood, one, baseline = flood_then_one_then_a_baseline(client, settings, tiny_base_model, tmp_path)
    redis = Redis.from_url(settings.redis_url or "")
    queue = evaluation_queue(settings.queue_name, redis)
    # Redis holds one job per experiment (plus baselines): the rest wait in the database.
    assert len(queue.job_ids) == 3 and queue.job_ids[0].endswith(f"-submission-{baseline}")
    db = Database(settings.database_url or "")
    work_the_queue(settings, redis, db, monkeypatch)
    with db.session() as session:
        rows = session.query(Submission).order_by(Submission.started_at).all()
        assert [r.status for r in rows] == [SubmissionStatus.SCORED] * (FLOOD + 2), [r.error for r in rows]
        order = [r.id for r in rows]
        attempts = {r.id: r.attempts for r in rows}
    db.dispose()
    # B's one submission is served after at most one of A's flood, then the rest of A's. Their own
    # order is the local test's (oldest first): here an attempt that fails on a loaded machine and is
    # retried goes back to the queue's end, and started_at is its last attempt's.
    assert order[:3] == [baseline, flood[0], one], (order, attempts)
    assert sorted(order[3:]) == flood[1:], (order, attempts)


def test_rq_puts_a_submission_made_while_a_flood_runs_before_the_floods_waiting_job(
    make_isolated_settings: Callable[..., DeploymentSettings], tiny_base_model: Path, tmp_path: Path
) -> None:
    """A's next job always waits in Redis while its current one runs; B submits one checkpoint at a
    time. B's job goes before A's waiting one (A has one running, B none), not behind it as
    queued: else A would get two turns for each of B's."""
    from autorl.queue import make_dispatcher

    settings = make_isolated_settings(submit_wait_s=0.0)
    redis = Redis.from_url(settings.redis_url or "")
    queue = evaluation_queue(settings.queue_name, redis)
    db = Database(settings.database_url or "")
    try:
        with TestClient(create_app(settings, reconcile=False)) as client:
            flooding = register(client, settings, tiny_base_model, make_workspace(tmp_path))
            single = register(client, settings, tiny_base_model, make_workspace(tmp_path))
            running, waiting = submit_copies(client, flooding, tiny_base_model, 2, "a")
            # A worker takes A's first job and claims it; starting it feeds the queue A's next.
            assert [job.rsplit("-", 1)[1] for job in queue.job_ids] == [str(running)]
            redis.lpop(queue.key)
            with db.session() as session:
                assert claims.claim(session, running, worker="w0", lease_s=60)
            make_dispatcher(settings).dispatch(db)
            assert [job.rsplit("-", 1)[1] for job in queue.job_ids] == [str(waiting)]
            (one,) = submit_copies(client, single, tiny_base_model, 1, "b")
        assert [job.rsplit("-", 1)[1] for job in queue.job_ids] == [str(one), str(waiting)]
    finally:
        db.dispose()


def test_a_sealed_experiments_final_evaluation_goes_before_any_agents_submissions(
    local_settings: DeploymentSettings, tiny_base_model: Path, tmp_path: Path
) -> None:
    """The one test evaluation of a sealed experiment is made after its agent: an agent that queued
    many validation submissions just before its end (or another experiment's flood) must not leave
    it waiting until the experiment closes without a result. Only baselines go before it."""
    from autorl.store import Split

    with TestClient(create_app(local_settings, reconcile=False)) as client:
        flood, one, baseline = flood_then_one_then_a_baseline(
            client, local_settings, tiny_base_model, tmp_path
        )
    db = Database(local_settings.database_url or "")
    try:
        with db.session() as session:
            single = submissions.get_submission(session, one).experiment
            final = submissions.create_submission(
                session,
                single,
                model_path="output/b0",
                fingerprint="a-final-evaluation",
                split=Split.TEST,
                final_of=one,
            ).id
        with db.session() as session:
            order = claims.claimable_in_fair_order(session)
        assert [c.submission_id for c in order[:2]] == [baseline, final]
        assert [c.ahead for c in order] == [True, True] + [False] * (len(order) - 2)
        assert {c.submission_id for c in order[2:]} == {*flood, one}
    finally:
        db.dispose()
