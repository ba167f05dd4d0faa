"""The shape of every refusal, as the OpenAPI document declares it: ``detail`` (FastAPI's field)
and ``error`` (what reference clients read), the same text naming the fix."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel


class Refusal(BaseModel):
    detail: str
    error: str


#: Declared on every route: a malformed request is refused with a Refusal, not FastAPI's default
#: list of validation errors.
REFUSAL_RESPONSES: dict[int | str, dict[str, Any]] = {
    422: {"model": Refusal, "description": "malformed request; the reason names the field and the fix"},
}
