"""The dashboard's routes as the app serves them, for tests that must cover every one."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.routing import APIRoute

from autorl_grader.dashboard.assets import CHARTJS_FILE

DASHBOARD_PREFIX = "/ui"


def dashboard_routes(app: FastAPI) -> list[tuple[str, str]]:
    """Every (method, example path) the app serves under /ui, whichever router added it: a route
    added later is covered by itself. A mount or other non-API route there fails loudly (its
    requests would bypass the checks these tests make)."""
    found = []
    for route in app.routes:
        path = str(getattr(route, "path", ""))
        if path != DASHBOARD_PREFIX and not path.startswith(DASHBOARD_PREFIX + "/"):
            continue
        assert isinstance(route, APIRoute), f"{path} is not an API route; cover it explicitly"
        example = path.replace("{name}", "some-exp").replace("{path:path}", CHARTJS_FILE)
        assert "{" not in example, f"no example value for a parameter of {path}"
        found.extend((method, example) for method in sorted(route.methods))
    return found
