"""`autorl run` refuses a number that cannot work before it starts anything: a message naming the
flag and the fix, exit status 2, no workspace, no service, no results row."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BASE = ["run", "-a", "example_grpo", "-t", "arith", "-m", "builtin:tiny-qwen2", "--timeout", "60"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--max-submissions", "0"], "--max-submissions must be from 1 to 2147483647"),
        (["--max-submissions", "-5"], "--max-submissions must be from 1 to 2147483647"),
        (["--max-submissions", "4294967296"], "--max-submissions must be from 1 to 2147483647"),
        (["--timeout", "0"], "--timeout must be a positive number of seconds"),
        (["--timeout", "nan"], "--timeout must be a positive number of seconds"),
        (["--timeout", "inf"], "--timeout must be a positive number of seconds"),
        (["--port", "70000"], "--port must be between 1 and 65535"),
        (["--workers", "0"], "--workers must be at least 1"),
        (["--finish-wait", "-1"], "--finish-wait must be a number of seconds, 0 or more"),
        (["--grace-period", "nan"], "--grace-period must be a number of seconds, 0 or more"),
        (["--repeat", "0"], "--repeat must be at least 1"),
        (["--repeat", "-2"], "leave it out for one run"),
    ],
)
def test_a_bad_number_is_refused_before_anything_starts(
    tmp_path: Path, extra: list[str], message: str
) -> None:
    home = tmp_path / "home"
    result = subprocess.run(
        [sys.executable, "-m", "autorl.cli", *BASE, *extra],
        env={**os.environ, "AUTORL_HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr
    assert not home.exists() or not any(home.rglob("*")), "nothing may be created before the refusal"


def test_repeats_in_a_given_workspace_get_a_folder_each_all_checked_before_the_first(tmp_path: Path) -> None:
    from autorl_local.repeats import repeat_workspaces

    given = tmp_path / "ws"
    assert repeat_workspaces(given, 1) == [given]
    assert repeat_workspaces(given, 3) == [given / "seed-0", given / "seed-1", given / "seed-2"]
    assert repeat_workspaces(None, 2) == [None, None]
    (given / "seed-1").mkdir(parents=True)
    (given / "seed-1" / "notes.txt").write_text("keep")
    home = tmp_path / "home"
    result = subprocess.run(
        [sys.executable, "-m", "autorl.cli", *BASE, "--repeat", "2", "--workspace", str(given)],
        env={**os.environ, "AUTORL_HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert f"workspace {given / 'seed-1'} is not empty" in result.stderr and "--workspace" in result.stderr
    assert not home.exists() or not any(home.rglob("*")), "the first repeat must not have started"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--timeout", "-60"], "--timeout must be a positive number of seconds"),
        (["--timeout", "nan"], "--timeout must be a positive number of seconds"),
        (["--grace-period", "-1"], "--grace-period must be a number of seconds, 0 or more"),
    ],
)
def test_the_agent_runner_refuses_a_bad_duration_before_it_starts(
    tmp_path: Path, extra: list[str], message: str
) -> None:
    workspace = tmp_path / "workspace"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "autorl.cli",
            "agent-runner",
            "--agent",
            "example_grpo",
            "--workspace",
            str(workspace),
            "--task",
            "arith",
            "--base-model",
            "builtin:tiny-qwen2",
            "--grading-url",
            "http://127.0.0.1:9/a/token",
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr
    assert not workspace.exists()
