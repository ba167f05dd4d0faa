"""The grader's OpenAPI document, as it serves it."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from autorl_grader.main import create_app
from autorl_grader.settings import GraderSettings


def grader_document() -> dict[str, Any]:
    """The OpenAPI document the grader serves (it does not depend on the settings; nothing here
    connects to anything)."""
    with tempfile.TemporaryDirectory() as home:
        document_settings = GraderSettings(home=Path(home), database_url="sqlite://", local_mode=True)
        app = create_app(document_settings, reconcile=False)
        return app.openapi()
