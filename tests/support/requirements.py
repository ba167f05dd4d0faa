"""The one way a test says it needs something this machine may lack.

Where the dependency is missing the test is skipped with the reason; with the environment variable
``CI`` set (``make test`` sets it) the same test fails instead, so a suite that should exercise the
dependency cannot pass by quietly skipping it.

Use :func:`require` inside a test or fixture, or the ``requires`` marker on a test or a module::

    pytestmark = pytest.mark.requires(shutil.which("bwrap") is not None, reason="needs bubblewrap")
"""

from __future__ import annotations

import os

import pytest

MARKER = "requires"


def in_ci() -> bool:
    """Whether missing dependencies are failures (``CI`` set to anything but empty or ``0``)."""
    return os.environ.get("CI", "") not in ("", "0")


def require(condition: bool, reason: str) -> None:
    """Skip the current test when ``condition`` is false, or fail it when CI is set."""
    if not reason.strip():
        raise ValueError("require() needs a reason that names the missing dependency")
    if condition:
        return
    if in_ci():
        pytest.fail(f"{reason} (CI is set: this dependency must exist here)", pytrace=False)
    pytest.skip(reason)


def apply_requires_markers(item: pytest.Item) -> None:
    """Run :func:`require` for every ``requires(condition, reason=...)`` marker on ``item``."""
    for marker in item.iter_markers(name=MARKER):
        if len(marker.args) != 1 or set(marker.kwargs) != {"reason"}:
            raise pytest.UsageError(f"{item.nodeid}: use pytest.mark.{MARKER}(condition, reason='...')")
        require(bool(marker.args[0]), marker.kwargs["reason"])
