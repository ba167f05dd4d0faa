"""tools/gpu_gpu_wheelhouse.py picks what a GPU image without our services needs, from installed metadata."""

from __future__ import annotations

import importlib.metadata as metadata

import pytest

from tools import gpu_wheelhouse


def test_the_closure_follows_requirements_past_the_roots_and_leaves_out_what_the_image_has() -> None:
    needed = gpu_wheelhouse.missing_closure(gpu_wheelhouse.ROOTS, "3.12")
    # Reached only through other packages: fastapi → starlette, pydantic → pydantic-core,
    # alembic → mako, rq → croniter.
    assert {"starlette", "pydantic-core", "mako", "croniter"} <= set(needed)
    assert not set(needed) & gpu_wheelhouse.IMAGE_PACKAGES, "the image's own packages are not carried"
    for name, version in needed.items():
        assert metadata.version(name) == version, "each at the version the platform is tested with"


def test_a_requirement_only_an_older_python_has_is_followed_for_that_python() -> None:
    # The installed redis declares async-timeout for Python below 3.11.3 only; this environment
    # (3.11.3 or later) lacks it.
    assert "async-timeout" not in gpu_wheelhouse.missing_closure(["redis"], "3.12")
    with pytest.raises(SystemExit, match="async-timeout is not installed"):
        gpu_wheelhouse.missing_closure(["redis"], "3.11.2")
