"""The API server's ``Status`` object of a refused request, for the emulated cluster's refusals."""

from __future__ import annotations

from typing import Any


def failure(code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    """A ``Status`` with ``status: Failure``, as the API server answers with HTTP ``code``."""
    status: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
    }
    if details is not None:
        status["details"] = details
    status["code"] = code
    return status
