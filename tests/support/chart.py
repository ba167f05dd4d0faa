"""The chart's objects as Helm renders them (helm-python-sdk), NOTES.txt left out."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import helm_python as helm
import yaml

CHART = Path(__file__).resolve().parents[2] / "charts" / "autorl"


def render_chart(
    values: dict[str, Any], *, release: str, namespace: str, is_install: bool = True
) -> list[dict[str, Any]]:
    """Validate ``values`` against the chart's schema, then render every object of the release."""
    with helm.Chart.load(CHART) as chart:
        chart.validate_schema(values)
        manifests = chart.render(values, name=release, namespace=namespace, is_install=is_install)
    return [
        doc
        for path, text in sorted(manifests.items())
        if not path.endswith("NOTES.txt")
        for doc in yaml.safe_load_all(text)
        if doc
    ]
