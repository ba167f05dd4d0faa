"""The package versions an evaluation key records are those the backend's interpreters import: a
venv that sees the system's packages, a wrapper that sets its own path, and OpenCompass's real
environment each report what runs there; an interpreter that cannot answer is the evaluator's fault."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from autorl_evaluator.failures import EvaluatorFaultError
from autorl_evaluator.settings import WorkerSettings
from autorl_evaluator.versions import (
    ENGINE_PREFIX,
    NOT_INSTALLED,
    backend_versions,
    command_versions,
    installed_versions,
    interpreter_versions,
    venv_site_packages,
)
from tests.unit.test_warm_opencompass import executable

REPO_ROOT = Path(__file__).resolve().parents[2]


def installed_dist(site: Path, name: str, version: str) -> None:
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


def test_a_wrapper_that_sets_its_own_path_reports_the_packages_it_runs_with(tmp_path: Path) -> None:
    """A resident engine's Python given as a wrapper script (its packages on a PYTHONPATH it sets):
    the versions are those the wrapped interpreter finds, not "not installed"."""
    site = tmp_path / "site"
    installed_dist(site, "vllm", "0.25.0")
    wrapper = executable(
        tmp_path / "vllm-python", f'#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} "$@"\n'
    )
    assert venv_site_packages(wrapper) == []  # nothing to read beside it
    command = executable(tmp_path / "opencompass", "#!/bin/sh\n")
    versions = backend_versions("opencompass", WorkerSettings(opencompass_bin=command, vllm_python=wrapper))
    assert versions[f"{ENGINE_PREFIX}vllm"] == "0.25.0"
    assert versions[f"{ENGINE_PREFIX}transformers"] == importlib.metadata.version("transformers")
    assert versions[f"{ENGINE_PREFIX}torch"] == importlib.metadata.version("torch")


def test_a_venv_that_sees_the_system_packages_reports_them(tmp_path: Path) -> None:
    """OpenCompass in a ``--system-site-packages`` venv (torch from the machine's own Python): its
    script's interpreter reports the system's packages, which the venv's own folder does not hold."""
    base = Path(getattr(sys, "_base_executable", sys.executable))
    venv.EnvBuilder(system_site_packages=True, with_pip=False, symlinks=True).create(tmp_path / "oc")
    python = tmp_path / "oc" / "bin" / "python"
    command = executable(tmp_path / "oc" / "bin" / "opencompass", f"#!{python}\n")
    # The base interpreter's pip: in the system's site-packages, not the venv's own.
    pip = subprocess.run(
        [str(base), "-c", "import importlib.metadata as m; print(m.version('pip'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert installed_versions(["pip"], venv_site_packages(command)) == {"pip": NOT_INSTALLED}
    assert command_versions(command, ["pip", "no-such-package"]) == {
        "pip": pip,
        "no-such-package": NOT_INSTALLED,
    }


def test_the_worker_s_own_path_does_not_leak_into_what_an_interpreter_reports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker's PYTHONPATH and working folder are not OpenCompass's: a package found only there
    is not installed for it."""
    site = tmp_path / "worker-site"
    installed_dist(site, "opencompass", "9.9.9")
    monkeypatch.setenv("PYTHONPATH", str(site))
    monkeypatch.chdir(site)
    assert interpreter_versions(Path(sys.executable), ["opencompass"]) == {"opencompass": NOT_INSTALLED}


def test_the_opencompass_environment_reports_its_own_opencompass() -> None:
    command = REPO_ROOT / ".venv-opencompass" / "bin" / "opencompass"
    installed = {
        dist.metadata["Name"].lower(): dist.version
        for dist in importlib.metadata.distributions(path=venv_site_packages(command))
    }
    versions = backend_versions("opencompass", WorkerSettings(opencompass_bin=command))
    assert versions["opencompass"] == installed["opencompass"]
    assert versions["transformers"] == installed["transformers"]
    assert versions["vllm"] == NOT_INSTALLED


def test_an_interpreter_that_cannot_answer_is_the_evaluator_s_fault(tmp_path: Path) -> None:
    broken = executable(tmp_path / "python3", "#!/bin/sh\necho 'libpython missing' >&2\nexit 3\n")
    with pytest.raises(EvaluatorFaultError, match="not your checkpoint's fault") as raised:
        interpreter_versions(broken, ["vllm"])
    assert "exit status 3" in str(raised.value)
    assert "libpython missing" in raised.value.detail
    with pytest.raises(EvaluatorFaultError, match="could not ask"):
        interpreter_versions(tmp_path / "absent", ["vllm"])


def test_a_relative_interpreter_path_is_taken_from_the_worker_s_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``AUTORL_VLLM_PYTHON=.venv/bin/python``, say: the question runs in an empty folder of its own,
    but the path means the interpreter beside the worker, as everywhere else the worker uses it."""
    site = tmp_path / "site"
    installed_dist(site, "vllm", "0.25.0")
    (tmp_path / "bin").mkdir()
    executable(tmp_path / "bin" / "python3", f'#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} "$@"\n')
    monkeypatch.chdir(tmp_path)
    assert interpreter_versions(Path("bin/python3"), ["vllm"]) == {"vllm": "0.25.0"}


def test_the_worker_s_commands_are_absolute_wherever_they_are_run_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine, OpenCompass and the version question each run in a folder of their own: a
    relative setting means the worker's folder, a bare name the PATH's, and a venv's link stays
    the venv's (not resolved to its base interpreter). The default OpenCompass command is the
    repository's, never the working folder's."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("AUTORL_OPENCOMPASS_BIN", raising=False)
    venv.EnvBuilder(with_pip=False, symlinks=True).create(tmp_path / "env")
    settings = WorkerSettings(vllm_python=Path("env/bin/python"))
    assert settings.vllm_python == tmp_path / "env" / "bin" / "python"
    assert settings.opencompass_bin == REPO_ROOT / ".venv-opencompass" / "bin" / "opencompass"
    assert (
        WorkerSettings(opencompass_bin=Path("oc/bin/opencompass")).opencompass_bin
        == tmp_path / "oc" / "bin" / "opencompass"
    )
    monkeypatch.setenv("PATH", str(tmp_path / "env" / "bin"))
    assert WorkerSettings(vllm_python=Path("python")).vllm_python == tmp_path / "env" / "bin" / "python"
