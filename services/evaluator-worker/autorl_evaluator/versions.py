"""The versions of the packages each backend evaluates with: part of the evaluation key.

``hf`` runs in this worker's own environment (torch, transformers); ``opencompass`` runs as a
subprocess of its own venv (``AUTORL_OPENCOMPASS_BIN``), whose installed distributions are read
from that venv's ``site-packages`` without starting it. A package that is not installed is
recorded as such, so installing it changes the key too.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Sequence
from pathlib import Path

from autorl_evaluator.settings import WorkerSettings

#: The packages whose versions can change an ``hf`` evaluation's numbers.
HF_PACKAGES = ("torch", "transformers")
#: The packages whose versions can change an ``opencompass`` evaluation's numbers (vLLM on a GPU).
OPENCOMPASS_PACKAGES = ("opencompass", "transformers", "torch", "vllm")
#: The packages of the resident engine's environment (``AUTORL_VLLM_PYTHON``), which generates in
#: place of OpenCompass's own vLLM: recorded as ``engine <package>``.
RESIDENT_ENGINE_PACKAGES = ("vllm", "torch", "transformers")
#: How the resident engine's packages are named among the versions.
ENGINE_PREFIX = "engine "
NOT_INSTALLED = "not installed"


def backend_versions(backend: str, settings: WorkerSettings) -> dict[str, str]:
    """``{package: version}`` for the packages ``backend`` evaluates with, as installed here."""
    if backend == "opencompass":
        versions = installed_versions(OPENCOMPASS_PACKAGES, venv_site_packages(settings.opencompass_bin))
        if settings.vllm_python is not None:
            engine = installed_versions(RESIDENT_ENGINE_PACKAGES, venv_site_packages(settings.vllm_python))
            versions.update({f"{ENGINE_PREFIX}{name}": version for name, version in engine.items()})
        return versions
    return installed_versions(HF_PACKAGES, None)


def venv_site_packages(command: Path) -> list[str]:
    """The ``site-packages`` folders of the venv whose ``bin/`` holds ``command`` (none: an empty list)."""
    root = command.parent.parent
    return sorted(str(path) for path in root.glob("lib/python*/site-packages") if path.is_dir())


def installed_versions(packages: Sequence[str], path: list[str] | None) -> dict[str, str]:
    """Each package's version in ``path`` (``None``: this interpreter's own environment)."""
    versions: dict[str, str] = {}
    for package in packages:
        if path is None:
            try:
                versions[package] = importlib.metadata.version(package)
            except importlib.metadata.PackageNotFoundError:
                versions[package] = NOT_INSTALLED
            continue
        found = [dist.version for dist in importlib.metadata.distributions(name=package, path=path)]
        versions[package] = found[0] if found else NOT_INSTALLED
    return versions
