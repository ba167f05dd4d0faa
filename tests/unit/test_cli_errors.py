"""What `autorl` prints for a bad setting, an unreachable or damaged database and a failure no
command names: one line each (exit 2 for input the user gives), never a traceback."""

from __future__ import annotations

import argparse
import errno
import logging
import socket
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from pydantic import BaseModel

from autorl import cli
from autorl.settings import HomeSettings
from autorl.store import db
from tests.unit.test_settings import bare_environment  # noqa: F401 - the fixture `home` asks for

CLOSED_PORT_DB = "postgresql+psycopg://autorl:pw-0a1b2c@127.0.0.1:1/autorl"


@pytest.fixture(autouse=True)
def home(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A home of the test's own, in an environment without the machine's AUTORL_* variables."""
    request.getfixturevalue("bare_environment")
    monkeypatch.setenv("AUTORL_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture(autouse=True)
def root_logging() -> Iterator[None]:
    """The root logger as it was: a service command sets its handler on the stderr of its test."""
    handlers, level = list(logging.root.handlers), logging.root.level
    yield
    logging.root.handlers[:] = handlers
    logging.root.setLevel(level)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = cli.main(list(argv))
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err


@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        ("AUTORL_EVAL_BATCH_SIZE", "abc", "AUTORL_EVAL_BATCH_SIZE='abc': expected a valid integer"),
        ("AUTORL_EVAL_BACKEND", "vllm", "AUTORL_EVAL_BACKEND='vllm': expected 'hf' or 'opencompass'"),
        ("AUTORL_EVAL_MAX_NEW_TOKENS", "-1", "AUTORL_EVAL_MAX_NEW_TOKENS='-1': expected greater than 0"),
        ("AUTORL_EVAL_LIMIT", "1\x1b[2J", r"AUTORL_EVAL_LIMIT='1\x1b[2J'"),
        ("AUTORL_DATABASE_URL", "notaurl", "AUTORL_DATABASE_URL='notaurl': not a database URL; use "),
        (
            "AUTORL_DATABASE_URL",
            "mysql://u:pw-0a1b2c@h/db",
            "mysql:// is not supported; use postgresql+psycopg",
        ),
        ("AUTORL_REDIS_URL", "notaurl", "AUTORL_REDIS_URL='notaurl': not a redis:// URL; use redis://"),
    ],
)
def test_a_bad_setting_is_one_line_naming_its_variable_value_and_what_is_expected(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    variable: str,
    value: str,
    expected: str,
) -> None:
    monkeypatch.setenv(variable, value)
    code, err = run(capsys, "worker", "--burst")
    assert code == cli.EXIT_BAD_INPUT
    assert err.splitlines() == [f"autorl worker: error: {err.splitlines()[0].split(': error: ', 1)[1]}"]
    assert expected in err
    assert "pw-0a1b2c" not in err and "\x1b" not in err


def test_postgres_urls_are_read_with_the_driver_the_platform_installs(tmp_path: Path) -> None:
    for url in (
        "postgresql://u:p@db/autorl",
        "postgres://u:p@db/autorl",
        "postgresql+psycopg://u:p@db/autorl",
    ):
        assert (
            HomeSettings(home=tmp_path, database_url=url).database_url == "postgresql+psycopg://u:p@db/autorl"
        )
    assert HomeSettings(home=tmp_path).database_url == f"sqlite:///{tmp_path / 'autorl.db'}"


def test_a_home_or_data_folder_that_is_a_file_is_refused_naming_its_variable(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    monkeypatch.setenv("AUTORL_HOME", str(a_file))
    code, err = run(capsys, "worker", "--burst")
    assert code == cli.EXIT_BAD_INPUT
    # Only the home: not the folders and database that would have been in it.
    assert err == f"autorl worker: error: AUTORL_HOME='{a_file}': is a file, not a folder; {cli_home_fix()}\n"
    monkeypatch.setenv("AUTORL_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("AUTORL_DATA_SOURCE_DIR", str(a_file))
    code, err = run(capsys, "test-data", "--task", "gsm8k")
    assert code == cli.EXIT_BAD_INPUT
    assert "AUTORL_DATA_SOURCE_DIR=" in err and "is a file, not a folder" in err


def cli_home_fix() -> str:
    from autorl.settings import HOME_FIX

    return HOME_FIX


def test_a_missing_or_unsafe_setting_is_bad_input(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    code, err = run(capsys, "grader")
    assert code == cli.EXIT_BAD_INPUT
    assert "AUTORL_ADMIN_TOKEN is empty" in err
    monkeypatch.setenv("AUTORL_REDIS_URL", "redis://127.0.0.1:1/0")
    code, err = run(capsys, "worker", "--burst")
    assert code == cli.EXIT_BAD_INPUT
    assert "AUTORL_REDIS_URL has no password" in err
    monkeypatch.delenv("AUTORL_REDIS_URL")
    monkeypatch.setenv("AUTORL_DATA_SOURCE_DIR", str(tmp_path / "missing"))
    code, err = run(capsys, "test-data", "--task", "gsm8k")
    assert code == cli.EXIT_BAD_INPUT
    assert "AUTORL_DATA_SOURCE_DIR names this folder" in err


def test_an_unreachable_database_is_waited_for_aloud_then_named_with_the_fix(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(db, "DATABASE_WAIT_S", 0.5)
    monkeypatch.setenv("AUTORL_DATABASE_URL", CLOSED_PORT_DB)
    monkeypatch.setenv("AUTORL_REDIS_URL", "redis://:pw-0a1b2c@127.0.0.1:1/0")
    monkeypatch.setenv("AUTORL_ADMIN_TOKEN", "a-long-enough-admin-token-0123456789")
    shown = "AUTORL_DATABASE_URL=postgresql+psycopg://autorl:***@127.0.0.1:1/autorl"
    for argv in (["worker", "--burst"], ["grader", "--port", str(free_port())]):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="autorl.store.db"):
            code, err = run(capsys, *argv)
        assert code == 1, argv
        assert f"waiting up to 0 s more for the database at {shown}" in caplog.text
        assert f"autorl {argv[0]}: error: the database at {shown} is unreachable after " in err
        assert "check that it is running and that AUTORL_DATABASE_URL names its host, port" in err
        assert "pw-0a1b2c" not in err + caplog.text


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_file_that_is_not_a_database_is_named_with_the_fix(
    capsys: pytest.CaptureFixture[str], home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AUTORL_LOCAL_MODE", "1")
    home.mkdir()
    database = home / "autorl.db"
    database.write_text("not a database\n" * 100)
    for argv in (["report", "some-run"], ["worker", "--burst"], ["grader", "--port", str(free_port())]):
        code, err = run(capsys, *argv)
        assert code == cli.EXIT_BAD_INPUT, (argv, err)
        assert f"the database file {database} is not a SQLite database (file is not a database)" in err
        assert f"move it aside (mv {database} {database}.bad" in err
    assert database.read_text() == "not a database\n" * 100


def failing(monkeypatch: pytest.MonkeyPatch, failure: Callable[[], object]) -> None:
    """`autorl boom` fails with ``failure()``."""

    def boom(_: argparse.Namespace) -> int:
        failure()
        return 0

    parser = argparse.ArgumentParser(prog="autorl")
    parser.add_subparsers(dest="command", required=True).add_parser("boom").set_defaults(func=boom)
    monkeypatch.setattr(cli, "build_parser", lambda: parser)


def raise_(exc: BaseException) -> Callable[[], object]:
    def fail() -> object:
        raise exc

    return fail


@pytest.mark.parametrize(
    ("exc", "code", "line"),
    [
        (
            IsADirectoryError(errno.EISDIR, "Is a directory", "/x/y"),
            2,
            "IsADirectoryError (EISDIR): Is a directory: /x/y",
        ),
        (
            NotADirectoryError(errno.ENOTDIR, "Not a directory", "/etc/passwd/a"),
            2,
            "Not a directory: /etc/passwd/a",
        ),
        (FileExistsError(errno.EEXIST, "File exists", "/a", None, "/b"), 2, "File exists: /a -> /b"),
        (
            OSError(errno.EADDRINUSE, "Address already in use"),
            2,
            "OSError (EADDRINUSE): Address already in use",
        ),
        (socket.gaierror(socket.EAI_NONAME, "Name or service not known"), 2, "cannot resolve a host name"),
        (OSError(errno.EIO, "Input/output error", "/disk"), 1, "OSError (EIO): Input/output error: /disk"),
    ],
)
def test_a_failed_file_or_network_operation_is_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, exc: OSError, code: int, line: str
) -> None:
    failing(monkeypatch, raise_(exc))
    status, err = run(capsys, "boom")
    assert status == code
    assert err.startswith("autorl boom: error: ") and err.count("\n") == 1
    assert line in err


class Shape(BaseModel):
    size: int


def test_an_unexpected_failure_is_one_line_and_its_traceback_is_asked_for(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    failing(monkeypatch, raise_(RuntimeError("boom\x1b[2J")))
    code, err = run(capsys, "boom")
    assert code == 1
    assert err == (
        r"autorl boom: internal error: RuntimeError: boom\x1b[2J "
        "(set AUTORL_TRACEBACK=1 to see its traceback)\n"
    )
    failing(monkeypatch, lambda: Shape.model_validate({"size": "x"}))  # not a setting: the platform's own
    code, err = run(capsys, "boom")
    assert code == 1 and err.startswith("autorl boom: internal error: ValidationError: 1 validation error")
    monkeypatch.setenv("AUTORL_TRACEBACK", "1")
    with pytest.raises(RuntimeError, match="boom"):
        failing(monkeypatch, raise_(RuntimeError("boom"))) or cli.main(["boom"])
