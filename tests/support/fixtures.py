"""Fixtures every test folder shares; ``tests/conftest.py`` loads them.

- ``trained_tiny_model``: the tiny model trained once per test run.
- A grader on the module's database (real Postgres), and what a test of it reaches: ``settings``,
  ``client`` (in-process), ``served`` and ``grader`` (over real HTTP), ``db`` (its store),
  ``register_experiment`` (through the admin API) and ``experiment`` (one registered and started);
  ``grading`` bundles the in-process grader's (a :class:`~tests.support.grading.Grader`).
  A module that needs other settings overrides ``settings`` (or ``pg_url``, for a database of each
  test's own): every fixture here built on it follows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from autorl.tasks import get_task
from tests.support.grading import Grader, RegisteredExperiment, new_experiment
from tests.support.infra import ServedApp, serve
from tests.support.models import TrainedModel, train_tiny_model
from tests.support.settings import DeploymentSettings

if TYPE_CHECKING:
    import httpx
    from fastapi.testclient import TestClient

    from autorl.store import Database

FIXTURE_DATA = Path(__file__).resolve().parents[1] / "data"


@pytest.fixture(scope="session")
def trained_tiny_model(tmp_path_factory: pytest.TempPathFactory) -> TrainedModel:
    """``builtin:tiny-qwen2`` trained to answer the even-numbered GSM8K fixture test problems
    right and the others wrong (see :mod:`tests.support.models`); trained once per test run.

    The problems are loaded the way the evaluator loads them (``load_test_problems`` from the
    fixture data), so any prefix of two or more (``AUTORL_EVAL_LIMIT``) scores strictly between
    0 and 100. Evaluate it with ``eval_max_new_tokens=EVAL_MAX_NEW_TOKENS`` to keep it fast.
    """
    task = get_task("gsm8k")
    problems = task.load_test_problems(tmp_path_factory.mktemp("eval-data"), source_dir=FIXTURE_DATA)
    return train_tiny_model(tmp_path_factory.mktemp("trained") / "model", problems, task_name=task.name)


@pytest.fixture
def settings(make_settings: Callable[..., DeploymentSettings], pg_url: str) -> DeploymentSettings:
    """The grader's (and its workers') settings on the module's database; a blocking submit waits
    0.5 s before it answers 202."""
    return make_settings(database_url=pg_url, submit_wait_s=0.5)


@pytest.fixture
def client(settings: DeploymentSettings) -> Iterator[TestClient]:
    """The grader in-process (its reconciler off), started and stopped around the test."""
    from fastapi.testclient import TestClient

    from autorl_grader.main import create_app

    with TestClient(create_app(settings, reconcile=False)) as test_client:
        yield test_client


@pytest.fixture
def served(settings: DeploymentSettings) -> Iterator[ServedApp]:
    """The grader served over real HTTP on a free port (its reconciler off)."""
    from autorl_grader.main import create_app

    with serve(create_app(settings, reconcile=False)) as app:
        yield app


@pytest.fixture
def grader(served: ServedApp) -> Iterator[httpx.Client]:
    """An HTTP client of the served grader."""
    import httpx

    with httpx.Client(base_url=served.url, timeout=60) as http:
        yield http


@pytest.fixture
def db(settings: DeploymentSettings) -> Iterator[Database]:
    """The grader's store, as the grader and its workers reach it."""
    from autorl.store import Database

    database = Database(settings.database_url or "")
    yield database
    database.dispose()


@pytest.fixture
def register_experiment(
    client: TestClient, settings: DeploymentSettings, tiny_base_model: Path, tmp_path: Path
) -> Callable[..., RegisteredExperiment]:
    """Registers an experiment of the tiny base model through the admin API, in a workspace of its
    own in ``tmp_path``, and starts it (unless ``start=False``); ``fields`` go into the registration."""

    def build(**fields: Any) -> RegisteredExperiment:
        return new_experiment(client, settings, tiny_base_model, tmp_path, **fields)

    return build


@pytest.fixture
def grading(
    client: TestClient, settings: DeploymentSettings, db: Database, tiny_base_model: Path, tmp_path: Path
) -> Grader:
    """The in-process grader, its settings and store, and experiments of the tiny base model in
    workspaces of their own in ``tmp_path``, as one."""
    return Grader(client, settings, db, tiny_base_model, tmp_path)


@pytest.fixture
def experiment(register_experiment: Callable[..., RegisteredExperiment]) -> RegisteredExperiment:
    """An experiment registered through the admin API and started."""
    return register_experiment()
