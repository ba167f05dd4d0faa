"""Fuzzing the grader through its own OpenAPI document (schemathesis), against real Postgres, with
valid agent and admin credentials so that generated requests get past authentication: no answer
is a server error, every status is one the document declares for that operation, and every answer
matches the schema the document declares for it.

A fixed number of examples per operation, drawn deterministically, so a run is reproducible."""

from __future__ import annotations

import json
import os
import secrets
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from fastapi import FastAPI
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from pydantic import SecretStr
from schemathesis import Case
from schemathesis.checks import not_a_server_error
from schemathesis.core.result import Err
from schemathesis.schemas import APIOperation
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from autorl_grader.main import create_app
from autorl_grader.settings import GraderSettings
from tests.support.grading import copy_model, make_workspace, register
from tests.support.openapi import grader_document

#: Examples per operation: every operation of the document, within the suite's time.
EXAMPLES_PER_OPERATION = 20
#: Where the run's counts go when set (``bench/run_all.py`` sets it: bench/results/grader_fuzz.json).
REPORT_ENV = "AUTORL_FUZZ_REPORT"
STATUSES: Counter[str] = Counter()
OPERATIONS: Counter[str] = Counter()
FAILURES: Counter[str] = Counter()
ADMIN_PREFIXES = ("/v1/", "/metrics")


@dataclass
class FuzzTarget:
    app: FastAPI
    agent_token: str
    admin_token: str


@pytest.fixture(scope="module")
def target(
    pg_url: str, tiny_base_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[FuzzTarget]:
    home = tmp_path_factory.mktemp("fuzz")
    grader_settings = GraderSettings(
        home=home / "home",
        database_url=pg_url,
        admin_token=SecretStr(secrets.token_hex(16)),
        submit_wait_s=0.5,
    )
    app = create_app(grader_settings, reconcile=False)
    with TestClient(app) as client:  # runs the start-up: migrations
        experiment = register(client, grader_settings, tiny_base_model, make_workspace(home))
        copy_model(tiny_base_model, experiment.output_dir / "ckpt", unique=True)
        yield FuzzTarget(app, experiment.token, grader_settings.admin_token_value)


schema = schemathesis.openapi.from_dict(grader_document())
CHECKS: list[Callable[..., bool | None]] = [
    not_a_server_error,
    response_schema_conformance,
    content_type_conformance,
    status_code_conformance,  # every status an answer has is one the document declares
]


def _operations() -> list[APIOperation[Any, Any, Any, Any]]:
    """Every operation of the document; one the document cannot describe fails the collection."""
    operations = []
    for result in schema.get_all_operations():
        if isinstance(result, Err):
            raise result.err()
        operations.append(result.ok())
    return operations


#: Each operation a test of its own, its id the operation's label (``GET /healthz``).
OPERATIONS_OF_DOCUMENT = _operations()


@pytest.mark.parametrize("operation", OPERATIONS_OF_DOCUMENT, ids=lambda operation: operation.label)
def test_no_server_error_and_every_answer_matches_the_document(
    operation: APIOperation[Any, Any, Any, Any], target: FuzzTarget
) -> None:
    admin = operation.path.startswith(ADMIN_PREFIXES)
    token = target.admin_token if admin else target.agent_token

    @given(case=operation.as_strategy())
    @settings(
        max_examples=EXAMPLES_PER_OPERATION,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def call(case: Case[Any]) -> None:
        parameters = case.path_parameters
        if parameters is not None and "token" in parameters:
            parameters["token"] = target.agent_token
        OPERATIONS[operation.label] += 1
        try:
            response = case.call_and_validate(
                app=target.app, headers={"Authorization": f"Bearer {token}"}, checks=CHECKS
            )
        except Exception:
            FAILURES[operation.label] += 1
            raise
        STATUSES[str(response.status_code)] += 1

    call()


@pytest.fixture(scope="module", autouse=True)
def report() -> Iterator[None]:
    yield
    path = os.environ.get(REPORT_ENV)
    if path and OPERATIONS:
        result = {
            "benchmark": "grader_fuzz",
            "command": f"{REPORT_ENV}=bench/results/grader_fuzz.json .venv/bin/python -m pytest "
            "tests/integration/test_grader_fuzz.py",
            "date": time.strftime("%Y-%m-%d", time.gmtime()),
            "tool": f"schemathesis {schemathesis.__version__}",
            "examples_per_operation": EXAMPLES_PER_OPERATION,
            "operations": len(OPERATIONS),
            "cases": sum(OPERATIONS.values()),
            "statuses": dict(sorted(STATUSES.items())),
            "server_errors": sum(n for code, n in STATUSES.items() if code.startswith("5")),
            "failed_operations": dict(FAILURES),
        }
        Path(path).write_text(json.dumps(result, indent=2) + "\n")
