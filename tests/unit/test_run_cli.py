"""`autorl run` refuses a number that cannot work before it starts anything: a message naming the
flag and the fix, exit status 2, no workspace, no service, no results row."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BASE = ["run", "-a", "example_grpo", "-t", "arith", "-m", "builtin:tiny-qwen2", "--timeout", "60"]


@pytest.fixture
def nothing_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Preparing the model is the first step that costs: a command that reaches it has not refused."""

    def started(*args: object, **kwargs: object) -> None:
        raise AssertionError("the command went on to prepare the model instead of refusing")

    monkeypatch.setattr("autorl.models.sources.resolve_model", started)
    monkeypatch.setattr("autorl_local.experiment.resolve_model", started)


def refusal(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """``autorl ARGV`` in this process: it must exit 2 (from the command or from argparse) with no
    traceback; returns what it printed."""
    from autorl.cli import main

    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own refusal
        code = exc.code  # type: ignore[assignment]
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    return " ".join(err.split())


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
        (["--workers", "0"], "--workers must be from 1 to 64"),
        (["--finish-wait", "-1"], "--finish-wait must be a number of seconds, 0 or more"),
        (["--grace-period", "nan"], "--grace-period must be a number of seconds, 0 or more"),
        (["--repeat", "0"], "--repeat must be from 1 to 1000"),
        (["--repeat", "-2"], "leave it out for one run"),
        (["--timeout", "1e12"], "--timeout must be at most 2592000 seconds (30 days), not 1e+12"),
        (["--timeout", "1e100"], "--timeout must be at most 2592000 seconds (30 days)"),
        (["--workers", "100000"], "--workers must be from 1 to 64"),
        (["--repeat", "100000"], "--repeat must be from 1 to 1000"),
        (["--finish-wait", "1e300"], "--finish-wait must be at most 2592000 seconds"),
        (["--grace-period", "1e300"], "--grace-period must be at most 2592000 seconds"),
        (["-m", ""], "--model is empty"),
        (["-a", ""], "--agent is empty"),
        (["-t", " "], "--task is empty"),
        (["--known-checkpoint", ""], "--known-checkpoint is empty"),
        (["--env-file", ""], "argument --env-file: is empty; pass a path"),
        (["--workspace", ""], "argument --workspace: is empty; pass a path"),
        (["--env", "KEY=a\x00b"], "--env KEY: holds a NUL byte"),
        (["--egress-allow", "192.168.1.0/24"], "--egress-allow opens destinations of --egress, which is off"),
        (
            ["--egress", "--egress-allow", "10.1.2.3/8"],
            "write the network, 10.0.0.0/8, or one address, 10.1.2.3",
        ),
        (["--egress", "--egress-allow", "llm.internal"], "is not an address or a network; give one such as"),
    ],
)
def test_a_bad_number_empty_value_or_egress_allowance_is_refused_before_anything_starts(
    nothing_starts: None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    extra: list[str],
    message: str,
) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("AUTORL_HOME", str(home))
    assert message in refusal([*BASE, *extra], capsys)
    assert not home.exists(), "nothing may be created before the refusal"


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
        (["--timeout", "1e12"], "--timeout must be at most 2592000 seconds (30 days)"),
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


def test_an_env_file_the_agent_cannot_take_is_refused_naming_the_file_and_line(
    nothing_starts: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("AUTORL_HOME", str(home))
    nul = tmp_path / "keys.env"
    nul.write_bytes(b"OK=1\nKEY=a\x00b\n")
    assert f"--env-file {nul}, line 2: holds a NUL byte" in refusal([*BASE, "--env-file", str(nul)], capsys)
    folder = tmp_path / "keys"
    folder.mkdir()
    said = refusal([*BASE, "--env-file", str(folder)], capsys)
    assert f"--env-file {folder} is a folder; pass the path of the .env file itself" in said
    assert not home.exists()


@pytest.mark.parametrize("where", ["file/sub", "file/sub/deeper", "/proc/autorl-nope"])
def test_a_workspace_that_cannot_be_created_is_refused_before_anything_starts(
    nothing_starts: None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    where: str,
) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("AUTORL_HOME", str(home))
    (tmp_path / "file").write_text("a file")
    workspace = tmp_path / where
    said = refusal([*BASE, "--workspace", str(workspace)], capsys)
    assert f"workspace {workspace} cannot be created" in said and "--workspace" in said
    assert not home.exists() and (tmp_path / "file").read_text() == "a file"


def test_prepare_refuses_an_unusable_workspace_before_it_fills_the_cache(
    nothing_starts: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv("AUTORL_CACHE_DIR", str(cache))
    (tmp_path / "file").write_text("a file")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "notes.txt").write_text("keep")
    prepare = ["agent-runner", "prepare", "-t", "arith", "-m", "builtin:tiny-qwen2", "--workspace"]
    assert "workspace" in refusal([*prepare, str(tmp_path / "file")], capsys)
    assert "is not empty" in refusal([*prepare, str(tmp_path / "full")], capsys)
    assert "cannot be created" in refusal([*prepare, str(tmp_path / "file" / "ws")], capsys)
    assert "--timeout must be at most 2592000" in refusal(
        [*prepare, str(tmp_path / "ws"), "--timeout", "1e12"], capsys
    )
    assert not cache.exists(), "the cache must not be filled for a workspace that is refused"
    assert (tmp_path / "full" / "notes.txt").read_text() == "keep"


def test_prepare_takes_the_task_given_before_it_or_says_where_to_put_it(
    nothing_starts: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from autorl.cli import build_parser
    from autorl_agent_runner.cli import _prepare_inputs

    for name in ("TASK", "BASE_MODEL", "WORKSPACE"):
        monkeypatch.delenv(name, raising=False)
    args = build_parser().parse_args(
        ["agent-runner", "--task", "arith", "prepare", "-m", "builtin:tiny-qwen2", "--workspace", "ws"]
    )
    assert _prepare_inputs(args) == ("arith", "builtin:tiny-qwen2", Path("ws"))
    said = refusal(["agent-runner", "prepare", "-m", "builtin:tiny-qwen2", "--workspace", "ws"], capsys)
    assert "prepare needs --task: pass it after prepare, e.g. autorl agent-runner prepare --task" in said
