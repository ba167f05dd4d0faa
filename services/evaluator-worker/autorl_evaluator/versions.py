"""The versions of the packages each backend evaluates with: part of the evaluation key.

``hf`` runs in this worker's own environment (torch, transformers). ``opencompass`` runs as a
subprocess of its own environment (``AUTORL_OPENCOMPASS_BIN``) and, with a resident engine, generates
in another (``AUTORL_VLLM_PYTHON``): each of those interpreters is asked which versions it imports
(one short ``importlib.metadata`` call in it, with OpenCompass's environment variables and no
``PYTHONPATH`` of the worker's), so a venv made with ``--system-site-packages`` or a wrapper script
that sets its own path reports what really runs. A command that is not a Python script (a binary, a
shell wrapper) cannot be asked: the ``site-packages`` of the venv holding it are read. A package
that is not installed is recorded as such, so installing it changes the key too.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from autorl_evaluator.failures import EvaluatorFaultError
from autorl_evaluator.settings import WorkerSettings, absolute_command

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
#: How long an interpreter gets to say its versions (it imports nothing but the standard library).
QUERY_TIMEOUT_S = 60.0
#: The worker's variables an interpreter is asked with: those OpenCompass's own runs get that can
#: decide where Python finds its packages or whether it starts at all.
QUERY_VARIABLES = ("PATH", "LD_LIBRARY_PATH", "LANG", "LC_ALL", "TMPDIR")

# Run as ``python -c QUERY package...``: prints {package: version or null}, as the import system
# would find each one on that interpreter's path.
_QUERY = """
import importlib.metadata as metadata, json, sys
def version(name):
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None
print(json.dumps({name: version(name) for name in sys.argv[1:]}))
"""


def backend_versions(backend: str, settings: WorkerSettings) -> dict[str, str]:
    """``{package: version}`` for the packages ``backend`` evaluates with, as installed here."""
    if backend == "opencompass":
        versions = command_versions(settings.opencompass_bin, OPENCOMPASS_PACKAGES)
        if settings.vllm_python is not None:
            engine = interpreter_versions(settings.vllm_python, RESIDENT_ENGINE_PACKAGES)
            versions.update({f"{ENGINE_PREFIX}{name}": version for name, version in engine.items()})
        return versions
    return installed_versions(HF_PACKAGES, None)


def script_python(command: Path) -> Path | None:
    """The interpreter a Python script runs in (its ``#!`` line), or None when ``command`` is not a
    Python script (a wrapper, a binary, a line with arguments, a missing file or interpreter)."""
    try:
        with command.open("rb") as handle:
            first = handle.readline(4096)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    parts = first[2:].decode("utf-8", errors="replace").split()
    if len(parts) != 1:
        return None
    python = Path(parts[0])
    if not python.name.startswith("python") or not python.is_file():
        return None
    return python


def command_versions(command: Path, packages: Sequence[str]) -> dict[str, str]:
    """Each package's version as the Python running ``command`` imports it; for a command that
    names no Python, as the venv holding it has it installed."""
    python = script_python(command)
    if python is None:
        return installed_versions(packages, venv_site_packages(command))
    return interpreter_versions(python, packages)


def interpreter_versions(python: Path, packages: Sequence[str]) -> dict[str, str]:
    """Each package's version as ``python`` (an interpreter, or a script that runs one) imports it.

    A failure to answer is the evaluator's (its environment is broken), never the submission's."""
    env = {name: os.environ[name] for name in QUERY_VARIABLES if name in os.environ}
    env.setdefault("PATH", os.defpath)
    program = str(absolute_command(python))  # it runs in a folder of its own
    with tempfile.TemporaryDirectory(prefix="autorl-versions-") as home:
        # An empty folder as working directory and home: nothing of the worker's on the path.
        try:
            done = subprocess.run(
                [program, "-c", _QUERY, *packages],
                cwd=home,
                env={**env, "HOME": home},
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=QUERY_TIMEOUT_S,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise EvaluatorFaultError(
                f"could not ask {python} for its package versions", detail=f"{type(exc).__name__}: {exc}"
            ) from exc
    try:
        found = json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else None
    except (IndexError, json.JSONDecodeError):
        found = None
    if not isinstance(found, dict):
        raise EvaluatorFaultError(
            f"could not ask {python} for its package versions (exit status {done.returncode})",
            detail=done.stderr[-4000:],
        )
    return {name: str(found.get(name) or NOT_INSTALLED) for name in packages}


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
