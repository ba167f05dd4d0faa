"""The dashboard's routes as the app serves them, for tests that must cover every one."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from fastapi import FastAPI
from fastapi.routing import APIRoute

from autorl_grader.dashboard.assets import CHARTJS_FILE

DASHBOARD_PREFIX = "/ui"


def served_routes(app: FastAPI) -> Iterator[tuple[str, set[str], Any]]:
    """(path, methods, route) of every route the app serves, routers included. FastAPI resolves
    included routers lazily (`effective_route_contexts`, each with its full path); older
    releases copy their routes into `app.routes`."""
    for route in app.routes:
        contexts = getattr(route, "effective_route_contexts", None)
        if contexts is None:
            yield str(getattr(route, "path", "")), set(getattr(route, "methods", None) or ()), route
            continue
        for context in contexts():
            yield str(context.path), set(context.methods or ()), getattr(context, "original_route", context)


def dashboard_routes(app: FastAPI) -> list[tuple[str, str]]:
    """Every (method, example path) the app serves under /ui, whichever router added it: a route
    added later is covered by itself. A mount or other non-API route there fails loudly (its
    requests would bypass the checks these tests make)."""
    found = []
    for path, methods, route in served_routes(app):
        if path != DASHBOARD_PREFIX and not path.startswith(DASHBOARD_PREFIX + "/"):
            continue
        assert isinstance(route, APIRoute), f"{path} is not an API route; cover it explicitly"
        example = path.replace("{name}", "some-exp").replace("{path:path}", CHARTJS_FILE)
        assert "{" not in example, f"no example value for a parameter of {path}"
        found.extend((method, example) for method in sorted(methods))
    return sorted(set(found))
