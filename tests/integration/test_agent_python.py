"""The agents' Python that `make setup` builds (.venv-agent): what agents import is there, the
platform's services and drivers are not, and nothing of the repository is on its import path."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from autorl_agent_runner.agent_python import AGENT_PACKAGES, AGENT_VENV_NAME, find_agent_python

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def agent_python() -> Path:
    python = Path(sys.prefix).absolute().parent / AGENT_VENV_NAME / "bin" / "python"
    assert python.is_file(), f"{python} is missing: run `make setup`"
    return python


def run(python: Path, code: str) -> subprocess.CompletedProcess[str]:
    # Away from the repository, as an agent runs (in its workspace): the current folder is on sys.path.
    return subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=300, cwd="/")


def test_agent_python_imports_what_agents_import(agent_python: Path) -> None:
    modules = [*AGENT_PACKAGES, "autorl.client", "autorl.tasks", "autorl_agents.example_grpo"]
    imported = run(agent_python, "import " + ", ".join(modules) + "; from trl import GRPOConfig, GRPOTrainer")
    assert imported.returncode == 0, imported.stderr


@pytest.mark.parametrize(
    "module",
    [
        "autorl_agent_runner",
        "autorl_grader",
        "autorl_evaluator",
        "autorl_controller",
        "autorl_local",
        "sqlalchemy",
        "psycopg",
        "redis",
        "rq",
    ],
)
def test_agent_python_holds_none_of_the_platforms_services(agent_python: Path, module: str) -> None:
    assert run(agent_python, f"import {module}").returncode != 0


def test_agent_python_reads_nothing_of_the_repository(agent_python: Path) -> None:
    """Copies, not editable links: a sandbox showing the agent this environment shows it no source
    folder (nor tests/data) of the repository it was built from."""
    code = (
        "import json, sys, autorl, autorl_agents as agents; "
        "print(json.dumps([*sys.path, autorl.__file__, agents.__file__]))"
    )
    paths = [Path(p).resolve() for p in json.loads(run(agent_python, code).stdout) if p]
    venv = agent_python.parent.parent.resolve()
    repo = REPO_ROOT.resolve()
    assert [p for p in paths if p.is_relative_to(repo) and not p.is_relative_to(venv)] == []


def test_the_platform_finds_it_beside_its_own_environment(agent_python: Path) -> None:
    assert find_agent_python(None).interpreter.parent == agent_python.parent
