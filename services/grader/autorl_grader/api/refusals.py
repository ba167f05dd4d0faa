"""The shape of every refusal, as the OpenAPI document declares it: ``detail`` (FastAPI's field)
and ``error`` (what reference clients read), the same text naming the fix."""

from __future__ import annotations

from typing import Any

from autorl.api.answers import Refusal

#: Declared on every route: a malformed request is refused with a Refusal, not FastAPI's default
#: list of validation errors.
REFUSAL_RESPONSES: dict[int | str, dict[str, Any]] = {
    422: {"model": Refusal, "description": "malformed request; the reason names the field and the fix"},
}


#: What each refusal status means, the same for every route that can answer it.
REFUSAL_MEANINGS: dict[int, str] = {
    400: "a body that is not JSON, or a request or checkpoint that breaks a rule; the reason names the fix",
    401: "missing, unknown or revoked credentials; the reason says which to send",
    403: "not allowed: outside the time budget, or never allowed to this caller",
    404: "no such experiment or submission",
    409: "the experiment's state forbids it: the name is taken, or it has finished",
    413: "the request body is over the grading API's limit",
    429: "past the experiment's fair share of the grader (retry after Retry-After seconds), or, for "
    "POST /submit, its submission limit is reached",
    503: "a store the grader needs is unreachable, the API is disabled, or the experiment's share of "
    "the evaluator storage is full; retry later (Retry-After where it knows when)",
}
#: The refusals that say when to come back.
_RETRY_AFTER = {
    "Retry-After": {"description": "seconds to wait before asking again", "schema": {"type": "integer"}}
}


def refusals(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` declaring ``codes`` as refusals (``Refusal`` bodies)."""
    return {
        code: {
            "model": Refusal,
            "description": REFUSAL_MEANINGS[code],
            **({"headers": _RETRY_AFTER} if code in (429, 503) else {}),
        }
        for code in codes
    }
