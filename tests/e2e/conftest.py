"""Fixtures shared by the end-to-end tests."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from tests.e2e.test_local_run import autorl_run  # noqa: F401  (a fixture: `autorl run` as a user runs it)
from tests.support.infra import free_port
from tests.support.kube_emulator import FIXTURE_DATA, Platform, operator_platform
from tests.support.settings import DeploymentSettings


@pytest.fixture(scope="module")
def grader_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def grader_settings(
    tmp_path_factory: pytest.TempPathFactory, pg_url: str, run_id: str, grader_port: int
) -> DeploymentSettings:
    """The operator tests' grader (test_operator*.py): this module's database and Redis prefix."""
    home = tmp_path_factory.mktemp("grader-home")
    return DeploymentSettings(
        home=home,
        # As the chart does: the grader's Service's DNS name, which resolves nowhere here. Agents get
        # the Service's cluster IP instead (the emulated Service's is 127.0.0.1), no name to look up.
        public_url=f"http://autorl-grader.autorl.svc:{grader_port}",
        database_url=pg_url,
        admin_token=secrets.token_hex(16),
        data_source_dir=FIXTURE_DATA,
        eval_device="cpu",
        eval_limit=4,
        eval_max_new_tokens=24,
        eval_batch_size=4,
        submit_wait_s=30.0,
        redis_key_prefix=f"autorl-test-{run_id}",
        # A baseline no evaluator takes is reported within seconds, and a worker seen within one.
        baseline_unavailable_s=1.0,
        evaluator_heartbeat_s=0.5,
    )


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def platform(
    grader_settings: DeploymentSettings, grader_port: int, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Platform]:
    """The grader, the emulated Kubernetes API and the operator, once per module
    (tests/support/kube_emulator.py)."""
    async with operator_platform(grader_settings, grader_port, tmp_path_factory.mktemp("shared")) as running:
        yield running
