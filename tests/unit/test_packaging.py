"""The `autorl` command gathers its subcommands from installed services, and the light services
never pull in the machine-learning stack."""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

AUTORL = str(Path(sys.executable).parent / "autorl")


def test_every_service_adds_its_subcommand_through_entry_points() -> None:
    from importlib.metadata import entry_points

    names = {ep.name for ep in entry_points(group="autorl.commands")}
    assert {"grader", "worker", "controller", "agent-runner", "run"} <= names
    help_text = subprocess.run([AUTORL, "--help"], capture_output=True, text=True, check=True).stdout
    for command in ("grader", "worker", "controller", "run", "results", "report"):
        assert command in help_text


def test_unknown_subcommand_is_a_usage_error() -> None:
    result = subprocess.run([AUTORL, "frobnicate"], capture_output=True, text=True)
    assert result.returncode == 2
    assert "invalid choice" in result.stderr


@pytest.mark.parametrize(
    "module",
    [
        "autorl",
        "autorl.cli",
        "autorl.models.sources",
        "autorl.models.tiny",
        "autorl.tasks",
        "autorl.client",
        "autorl.runs.reports",
        "autorl_grader.main",
        "autorl_controller.operator.main",
        "autorl_controller.cli",
        "autorl_local.cli",
    ],
)
def test_light_modules_do_not_import_torch_or_transformers(module: str) -> None:
    code = (
        f"import sys, importlib; importlib.import_module({module!r}); "
        "heavy = [m for m in ('torch', 'transformers', 'trl', 'datasets', 'matplotlib') "
        "if m in sys.modules]; "
        "print(','.join(heavy))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "", f"{module} imported {result.stdout.strip()}"


@pytest.mark.parametrize("module", ["autorl.client", "autorl.api.admin_client"])
def test_clients_need_neither_fastapi_nor_a_service(module: str) -> None:
    """An agent's Python has the core and pydantic, not the grader's packages."""
    code = (
        f"import sys, importlib; importlib.import_module({module!r}); "
        "print(','.join(m for m in sys.modules if m.split('.')[0] in "
        "('fastapi', 'starlette', 'sqlalchemy', 'autorl_grader', 'autorl_controller')))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "", f"{module} imported {result.stdout.strip()}"


def test_bad_input_exits_2_also_when_run_as_a_module() -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "autorl.cli",
            "run",
            "-t",
            "arith",
            "-m",
            "builtin:tiny-qwen2",
            "--timeout",
            "-5",
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2, result.stderr
    assert "--timeout" in result.stderr


def test_the_controller_registers_only_the_operator() -> None:
    """`autorl run` comes from autorl-local: the controller's package does not need the agent runner."""
    from importlib.metadata import entry_points

    by_name = {ep.name: ep.value for ep in entry_points(group="autorl.commands")}
    assert by_name["run"] == "autorl_local.cli:register"
    parser = argparse.ArgumentParser()
    subparsers = parser.add_subparsers()
    importlib.import_module("autorl_controller.cli").register(subparsers)
    assert set(subparsers.choices) == {"controller"}
