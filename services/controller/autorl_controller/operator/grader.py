"""The grader's admin API, as the controller calls it (docs/ARCHITECTURE.md, "Admin API")."""

from __future__ import annotations

from typing import Any, Literal

import httpx

FinishStatus = Literal["completed", "interrupted", "failed", "timed_out"]


class GraderError(Exception):
    """The grader refused a call (``status`` 4xx) or could not be reached (5xx, or 0: no answer)."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"grader {status}: {detail}" if status else f"grader unreachable: {detail}")
        self.status = status
        self.detail = detail

    @property
    def retryable(self) -> bool:
        """Worth trying again later: the grader (or its database) is down, not refusing."""
        return self.status == 0 or self.status >= 500


class GraderAdmin:
    """One method per admin route; every answer is the grader's JSON view."""

    def __init__(self, base_url: str, admin_token: str, *, timeout_s: float = 30.0) -> None:
        self._client = httpx.AsyncClient(
            base_url=base_url.rstrip("/"),
            headers={"Authorization": f"Bearer {admin_token}", "User-Agent": "autorl-controller"},
            timeout=timeout_s,
        )

    async def aclose(self) -> None:
        await self._client.aclose()

    async def _call(self, method: str, path: str, json: dict[str, Any] | None = None) -> Any:
        try:
            response = await self._client.request(method, path, json=json)
        except httpx.HTTPError as exc:
            raise GraderError(0, f"{method} {path}: {exc}") from exc
        if response.is_error:
            try:
                detail = str(response.json().get("detail", response.text))
            except ValueError:
                detail = response.text
            raise GraderError(response.status_code, detail)
        return response.json()

    async def register(self, payload: dict[str, Any]) -> dict[str, Any]:
        """Register an experiment; the answer holds ``token`` and ``grading_server_url``. 409: exists."""
        result: dict[str, Any] = await self._call("POST", "/v1/experiments", payload)
        return result

    async def new_token(self, name: str) -> dict[str, Any]:
        """Issue a new agent token, revoking the old one (a registration whose token was lost)."""
        result: dict[str, Any] = await self._call("POST", f"/v1/experiments/{name}/token")
        return result

    async def experiment(self, name: str) -> dict[str, Any] | None:
        try:
            result: dict[str, Any] = await self._call("GET", f"/v1/experiments/{name}")
        except GraderError as exc:
            if exc.status == 404:
                return None
            raise
        return result

    async def request_baseline(self, name: str) -> dict[str, Any]:
        """Queue the base model's evaluation (once per cache key); does not wait for the score."""
        result: dict[str, Any] = await self._call("POST", f"/v1/experiments/{name}/baseline")
        return result

    async def start(self, name: str, start_time: float | None = None) -> dict[str, Any]:
        """The agent's budget starts at ``start_time`` (epoch seconds; None: now)."""
        body = {} if start_time is None else {"start_time": start_time}
        result: dict[str, Any] = await self._call("POST", f"/v1/experiments/{name}/start", body)
        return result

    async def finish(self, name: str, status: FinishStatus, message: str | None = None) -> dict[str, Any]:
        result: dict[str, Any] = await self._call(
            "POST", f"/v1/experiments/{name}/finish", {"status": status, "message": message}
        )
        return result
