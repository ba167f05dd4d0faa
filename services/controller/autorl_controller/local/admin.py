"""A small client of the grader's admin API (docs/ARCHITECTURE.md, "Admin API")."""

from __future__ import annotations

import time
from typing import Any

import httpx

from autorl.client import GraderUnavailableError, GradingError

#: Blocking admin calls (the baseline) are held by the grader for at most this long.
ADMIN_WAIT_S = 540.0


class AdminClient:
    def __init__(
        self, base_url: str, admin_token: str, *, transport: httpx.BaseTransport | None = None
    ) -> None:
        self._http = httpx.Client(
            base_url=base_url.rstrip("/"),
            headers={"Authorization": f"Bearer {admin_token}"},
            timeout=30.0,
            transport=transport,
        )

    def close(self) -> None:
        self._http.close()

    def _call(
        self, method: str, path: str, *, timeout_s: float | None = None, **kwargs: Any
    ) -> httpx.Response:
        try:
            response = self._http.request(method, path, timeout=timeout_s or 30.0, **kwargs)
        except httpx.TransportError as exc:
            raise GraderUnavailableError(503, f"cannot reach the grader ({type(exc).__name__})") from exc
        if response.status_code >= 400:
            try:
                detail = str(response.json().get("detail"))
            except ValueError:
                detail = response.text[:300]
            raise GradingError(response.status_code, detail, method=method, url=path)
        return response

    def ready(self) -> bool:
        try:
            return self._http.get("/readyz", timeout=2.0).status_code == 200
        except httpx.TransportError:
            return False

    def register(self, **body: Any) -> dict[str, Any]:
        data: dict[str, Any] = self._call("POST", "/v1/experiments", json=body).json()
        return data

    def experiment(self, name: str) -> dict[str, Any]:
        data: dict[str, Any] = self._call("GET", f"/v1/experiments/{name}").json()
        return data

    def submissions(self, name: str) -> list[dict[str, Any]]:
        data: list[dict[str, Any]] = self._call("GET", f"/v1/experiments/{name}/submissions").json()
        return data

    def baseline(self, name: str, *, max_wait_s: float, poll_s: float = 2.0) -> dict[str, Any]:
        """Ask for the baseline (scored once per cache key) and wait until it is final."""
        deadline = time.monotonic() + max_wait_s
        wait = min(ADMIN_WAIT_S, max_wait_s)
        response = self._call(
            "POST",
            f"/v1/experiments/{name}/baseline",
            params={"wait": "true", "timeout_s": wait},
            timeout_s=wait + 30.0,
        )
        view: dict[str, Any] = response.json()
        while view.get("status") not in ("scored", "failed") and time.monotonic() < deadline:
            time.sleep(poll_s)
            experiment = self.experiment(name)
            view = {
                "status": experiment.get("baseline_status"),
                "score": experiment.get("baseline_score"),
                "error": experiment.get("baseline_error"),
            }
        return view

    def start(self, name: str) -> dict[str, Any]:
        data: dict[str, Any] = self._call("POST", f"/v1/experiments/{name}/start", json={}).json()
        return data

    def finish(self, name: str, status: str, message: str | None = None) -> dict[str, Any]:
        data: dict[str, Any] = self._call(
            "POST", f"/v1/experiments/{name}/finish", json={"status": status, "message": message}
        ).json()
        return data
