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


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--egress-allow", "192.168.1.0/24"], "--egress-allow opens destinations of --egress, which is off"),
        (
            ["--egress", "--egress-allow", "10.1.2.3/8"],
            "write the network, 10.0.0.0/8, or one address, 10.1.2.3",
        ),
        (["--egress", "--egress-allow", "llm.internal"], "is not an address or a network; give one such as"),
    ],
)
def test_a_bad_egress_allowance_is_refused_before_anything_starts(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    extra: list[str],
    message: str,
) -> None:
    from autorl.cli import main

    home = tmp_path / "home"
    monkeypatch.setenv("AUTORL_HOME", str(home))
    assert main([*BASE, *extra]) == 2
    assert message in capsys.readouterr().err
    assert not home.exists()


def test_egress_allowances_become_networks() -> None:
    import ipaddress

    from autorl.cli import build_parser
    from autorl_local.cli import check_egress

    args = build_parser().parse_args(
        [*BASE, "--egress", "--egress-allow", "192.168.1.0/24", "--egress-allow", "fd12::7"]
    )
    check_egress(args)
    assert args.egress_allow == [ipaddress.ip_network("192.168.1.0/24"), ipaddress.ip_network("fd12::7/128")]


def test_run_help_shows_every_default(capsys: pytest.CaptureFixture[str]) -> None:
    """Each option of `autorl run` with a default names it in --help (as the flag table in
    docs/LOCAL.md does): a newcomer sees what leaving a flag out means."""
    from autorl.cli import main

    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps the lines
    for shown in (
        "grader port on 127.0.0.1 (default: 8000)",
        "local evaluator worker processes (default: 1)",
        "(default: 600.0)",
        "(default: 30.0)",
        "(default: auto)",
        "(default: test)",
        "evaluation backend (default hf)",
    ):
        assert shown in text, shown
    assert "(default: None)" not in text and "(default: False)" not in text
