"""The grader's OpenAPI document, as it serves it."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import Any

import httpx
from jsonschema import Draft202012Validator

from autorl_grader.main import create_app
from autorl_grader.settings import GraderSettings


def grader_document() -> dict[str, Any]:
    """The OpenAPI document the grader serves (it does not depend on the settings; nothing here
    connects to anything)."""
    with tempfile.TemporaryDirectory() as home:
        document_settings = GraderSettings(home=Path(home), database_url="sqlite://", local_mode=True)
        app = create_app(document_settings, reconcile=False)
        return app.openapi()


def declared_schema(document: dict[str, Any], method: str, path: str, status: int) -> dict[str, Any]:
    """The JSON schema the document declares for ``method path`` answering ``status`` (``path`` as
    requested, e.g. ``/a/TOKEN/submissions/3``), with the document's components beside it so that
    its ``$ref``s resolve. An answer the document does not declare fails the test here."""
    for template, operations in document["paths"].items():
        pattern = re.sub(r"\\\{[^/]+?\\\}", "[^/]+", re.escape(template))
        if re.fullmatch(pattern, path) and method.lower() in operations:
            responses = operations[method.lower()]["responses"]
            declared = responses.get(str(status)) or responses.get("default")
            assert declared is not None, f"{method} {template} answered {status}, which it does not declare"
            schema = declared["content"]["application/json"]["schema"]
            return {**schema, "components": document["components"]}
    raise AssertionError(f"{method} {path} is not in the OpenAPI document")


def assert_matches_document(document: dict[str, Any], response: httpx.Response) -> None:
    """The JSON answer validates against the response model the document declares for its route
    and status code (every error listed, not only the first)."""
    schema = declared_schema(
        document, response.request.method, response.request.url.path, response.status_code
    )
    validator = Draft202012Validator(schema)
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(response.json())]
    assert not errors, (
        f"{response.request.method} {response.request.url.path} {response.status_code}: {errors}"
    )
