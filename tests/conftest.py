"""Shared fixtures. Each test module gets its own Postgres database and Redis key prefix (so its
own queues); each test run starts its own Redis server."""

from __future__ import annotations

import functools
import os
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.infra import new_run_id, postgres_database, private_redis
from tests.support.mutation_order import cheapest_first
from tests.support.requirements import apply_requires_markers
from tests.support.settings import DeploymentSettings
from tests.support.suite_order import costliest_first

pytest_plugins = ["pytester", "tests.support.fixtures"]

REPO_ROOT = Path(__file__).resolve().parents[1]
FIXTURE_DATA = REPO_ROOT / "tests" / "data"


#: Fixtures that outlive one test and hold nothing a test changes: artifacts built once and only read
#: (models, a finished run's outputs, rendered charts), and pytest's own. Any other fixture wider than
#: one test (a database, Redis, a running grader) is state that one test can leave for the next.
READ_ONLY_SHARED = frozenset(
    {
        "event_loop_policy",
        "tmp_path_factory",
        "worker_id",
        "testrun_uid",
        "run_id",
        "tiny_base_model",
        "trained_tiny_model",
        "chat_tokenizer",
        "model_and_prompts",
        "reference",
        "evaluated",
        "settings",
        "hostile",
        "agent_python",
        "rendered",
        "checkpoints",
        "allocations",
        "problems",
        "saved_by_transformers5",
        "opencompass_side",
        "opencompass_run",
        "podman_ready",
        "chart_images",
        "sharp_checkpoint",
        "worker_run",
    }
)


def shares_state(item: pytest.Item) -> bool:
    """Whether the test reaches a fixture wider than itself that a test can change: only such a test
    can pass or fail by the order tests run in through its fixtures. The walk starts at what the test
    asks for and goes through function-scoped fixtures into theirs; it stops at a read-only shared
    fixture (whatever that one was built from is reached only through its finished value). The run's
    Redis server is shared only by key prefix: a test with a prefix of its own (``fresh_queue_prefix``)
    shares nothing there."""
    definitions = item._fixtureinfo.name2fixturedefs  # type: ignore[attr-defined]
    own_queue = "fresh_queue_prefix" in item.fixturenames  # type: ignore[attr-defined]
    seen: set[str] = set()
    waiting = list(item._fixtureinfo.initialnames)  # type: ignore[attr-defined]
    while waiting:
        name = waiting.pop()
        if name in seen or not definitions.get(name):
            continue
        seen.add(name)
        fixture = definitions[name][-1]
        if fixture.scope == "function":
            waiting.extend(fixture.argnames)
        elif name not in READ_ONLY_SHARED and not (name == "redis_url" and own_queue):
            return True
    return False


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """``requires`` markers skip a test without its dependency, or fail it when CI is set."""
    apply_requires_markers(item)


def order_independent(item: pytest.Item) -> bool:
    """Whether ``make test``'s reverse pass may leave the test out: it shares nothing a test can
    change, and it is slow or starts what it needs of its own (an integration or end-to-end test: a
    database, a service, a sandboxed process of its own). Quick unit tests all run again in reverse:
    they are cheap, and a module global one of them leaves behind is what another order would show;
    a slow one that shares nothing (it runs pytest in a child process) is left out."""
    if shares_state(item):
        return False
    return item.get_closest_marker("slow") is not None or not item.nodeid.startswith("tests/unit/")


def pytest_itemcollected(item: pytest.Item) -> None:
    """A test that order cannot break (:func:`order_independent`) is marked ``order_independent``."""
    if order_independent(item):
        item.add_marker(pytest.mark.order_independent)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under a mutant (``make mutation``), its tests run cheapest first (support/mutation_order.py);
    in xdist's processes, the costliest modules are handed out first (support/suite_order.py)."""
    if "__mutmut_" in os.environ.get("MUTANT_UNDER_TEST", ""):
        items[:] = cheapest_first(items)
    elif hasattr(config, "workerinput"):  # an xdist process (not a pytest it starts in turn)
        items[:] = costliest_first(items)


@pytest.fixture(scope="module")
def run_id() -> str:
    """One id per test module: each module gets a database and a Redis DB index of its own, so
    modules pass in any order and in parallel (no rows or jobs left by another module)."""
    return new_run_id()


@pytest.fixture(scope="module")
def pg_url(run_id: str) -> Iterator[str]:
    with postgres_database(run_id) as url:
        from autorl.store import migrate

        migrate(url)
        yield url


@pytest.fixture
def fresh_pg_url() -> Iterator[str]:
    """A database of this test's own: for tests whose workers take whatever is queued (the run's
    shared database keeps other tests' unevaluated submissions)."""
    with postgres_database(new_run_id()) as url:
        from autorl.store import migrate

        migrate(url)
        yield url


@pytest.fixture
def fresh_queue_prefix(run_id: str) -> str:
    """A Redis key prefix (so a queue) of this test's own."""
    return f"autorl-test-{run_id}-{new_run_id()}"


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with private_redis(new_run_id(), tmp_path_factory.mktemp("redis")) as url:
        yield url


@pytest.fixture
def make_settings(tmp_path: Path, run_id: str) -> Callable[..., DeploymentSettings]:
    """One deployment's settings (the grader's and its workers') isolated in a temporary home; pass
    database_url/redis_url to use the real servers."""

    def build(**overrides: object) -> DeploymentSettings:
        values: dict[str, object] = {
            "home": tmp_path / "home",
            "admin_token": secrets.token_hex(16),
            "redis_key_prefix": f"autorl-test-{run_id}",
            "data_source_dir": FIXTURE_DATA,
            "eval_device": "cpu",
            "submit_wait_s": 120.0,
        }
        values.update(overrides)
        return DeploymentSettings(**values)  # type: ignore[arg-type]

    return build


@pytest.fixture
def make_isolated_settings(
    make_settings: Callable[..., DeploymentSettings],
    fresh_pg_url: str,
    redis_url: str,
    fresh_queue_prefix: str,
) -> Callable[..., DeploymentSettings]:
    """:func:`make_settings` on a database and a Redis queue of this test's own: for tests whose
    workers take whatever is queued, or that count queue positions and evaluators."""
    return functools.partial(
        make_settings, database_url=fresh_pg_url, redis_url=redis_url, redis_key_prefix=fresh_queue_prefix
    )


#: A models folder kept across test runs (tools/mutation.py sets it: each mutant is a test run of
#: its own, and the builtin model is built once, deterministically, then read from there).
MODELS_CACHE_ENV = "AUTORL_TEST_MODELS_DIR"


@pytest.fixture(scope="session")
def tiny_base_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The untrained `builtin:tiny-qwen2`, built once per test run (or once, with $AUTORL_TEST_MODELS_DIR)."""
    from autorl.models.sources import resolve_model

    cache = os.environ.get(MODELS_CACHE_ENV)
    return resolve_model("builtin:tiny-qwen2", Path(cache) if cache else tmp_path_factory.mktemp("models"))
