"""The images `make images GPU=0` builds, and the chart that names them.

Where podman cannot run containers (no podman, no user namespaces, no root) or an image was not
built, these tests skip with the reason; with CI set they fail instead (`make test-containers`
builds the images first).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.chart import render_chart as render_release
from tests.support.podman_pods import image_exists, podman_unavailable
from tests.support.requirements import require

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "autorl"
NAMESPACE = "autorl"
APP_VERSION = re.search(
    r'^appVersion:\s*"?([^"\s]+)"?', (CHART / "Chart.yaml").read_text(), re.MULTILINE
).group(1)  # type: ignore[union-attr]
#: The CPU variants `make images GPU=0` builds here, selected by the chart's per-component tags.
CPU_TAGS: dict[str, Any] = {
    "agents": {"image": {"tag": f"{APP_VERSION}-cpu"}},
    "evaluator": {"image": {"tag": f"{APP_VERSION}-cpu"}},
}
EXTERNAL_STORES: dict[str, Any] = {
    "postgresql": {"enabled": False, "external": {"existingSecret": "pg-url", "existingSecretKey": "url"}},
    "redis": {"enabled": False, "external": {"existingSecret": "redis-url", "existingSecretKey": "url"}},
}


def unavailable(reason: str) -> None:
    require(False, reason)


@pytest.fixture(scope="session")
def podman_ready() -> None:
    reason = podman_unavailable()
    if reason:
        unavailable(reason)


def merge(*layers: dict[str, Any]) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for layer in layers:
        for key, value in layer.items():
            if isinstance(value, dict) and isinstance(merged.get(key), dict):
                merged[key] = merge(merged[key], value)
            else:
                merged[key] = value
    return merged


def workload(documents: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    """The pod spec of a rendered Deployment (or other workload) by name."""
    for doc in documents:
        if doc["kind"] == kind and doc["metadata"]["name"] == name:
            spec: dict[str, Any] = (
                doc["spec"]["template"]["spec"] if "template" in doc["spec"] else doc["spec"]
            )
            return spec
    raise KeyError(f"{kind} {name} is not in the rendered chart")


def pod_spec(doc: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = doc["spec"]["template"]["spec"] if "template" in doc["spec"] else doc["spec"]
    return spec


def env_value(container: dict[str, Any], name: str) -> str:
    values = [item["value"] for item in container.get("env", []) if item["name"] == name and "value" in item]
    assert values, f"{container['name']} sets no {name}"
    return str(values[-1])


@pytest.fixture(scope="session")
def chart_images(podman_ready: None) -> Iterator[set[str]]:
    """Every AutoRL image the chart (with the CPU tags) and its controller's Jobs reference, built."""
    documents = render_chart(merge(EXTERNAL_STORES, CPU_TAGS), "lab")
    controller = workload(documents, "Deployment", "lab-autorl-controller")["containers"][0]
    images = {env_value(controller, "AUTORL_RUNNER_IMAGE")}
    for doc in documents:
        if doc["kind"] in {"Deployment", "StatefulSet", "Job", "Pod"}:
            spec = pod_spec(doc)
            for container in [*spec.get("initContainers", []), *spec["containers"]]:
                if "/autorl/" in container["image"]:
                    images.add(container["image"])
    missing = sorted(image for image in images if not image_exists(image))
    if missing:
        unavailable(f"images not built: {', '.join(missing)} (run `make images GPU=0`)")
    reason = podman_unavailable(sorted(images)[0])
    if reason:
        unavailable(reason)
    yield images


def render_chart(values: dict[str, Any], release: str) -> list[dict[str, Any]]:
    """The chart's objects as Helm renders them for an install in the test namespace."""
    return render_release(values, release=release, namespace=NAMESPACE)
