"""A local grader started without an admin token (``AUTORL_LOCAL_MODE=1 autorl grader``) is not
open to every user of the machine: it makes a token, keeps it owner-only in its home, prints it
once, and its admin API, ``/metrics`` and dashboard need it; a token file others can read stops it."""

from __future__ import annotations

import io
import os
import stat
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from pydantic import SecretStr

from autorl.errors import ConfigurationError
from autorl_grader.local_admin_token import ADMIN_TOKEN_FILE, OWNER_ONLY, with_local_admin_token
from autorl_grader.settings import GraderSettings
from tests.support.infra import free_port, stop_process
from tests.support.service_processes import wait_until_serving

AUTORL = str(Path(sys.executable).parent / "autorl")


def _local_environment(home: Path) -> dict[str, str]:
    env = {name: value for name, value in os.environ.items() if not name.startswith("AUTORL_")}
    return {**env, "AUTORL_HOME": str(home), "AUTORL_LOCAL_MODE": "1"}


def test_a_local_grader_without_a_token_makes_one_and_its_admin_api_needs_it(tmp_path: Path) -> None:
    home, port = tmp_path / "home", free_port()
    log = tmp_path / "grader.log"
    with log.open("wb") as out:
        grader = subprocess.Popen(
            [AUTORL, "grader", "--port", str(port), "--log-level", "warning"],
            env=_local_environment(home),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until_serving(base, grader, log)
        stored = home / ADMIN_TOKEN_FILE
        assert stat.S_IMODE(stored.stat().st_mode) == 0o600
        token = stored.read_text().strip()
        assert len(token) >= 32 and log.read_text().count(token) == 1  # printed once, when made
        for path in ("/metrics", "/v1/experiments"):
            assert httpx.get(base + path).status_code == 401, path
            wrong = httpx.get(base + path, headers={"Authorization": "Bearer not-the-token"})
            assert wrong.status_code == 401, path
            right = httpx.get(base + path, headers={"Authorization": f"Bearer {token}"})
            assert right.status_code == 200, (path, right.text)
    finally:
        stop_process(grader, timeout_s=10)


def test_a_later_start_reads_the_stored_token_and_never_prints_it(tmp_path: Path) -> None:
    settings = GraderSettings(home=tmp_path, local_mode=True)
    first, second = io.StringIO(), io.StringIO()
    token = with_local_admin_token(settings, first).admin_token_value
    assert with_local_admin_token(settings, second).admin_token_value == token
    assert token in first.getvalue() and token not in second.getvalue()
    assert str(tmp_path / ADMIN_TOKEN_FILE) in second.getvalue()
    given = GraderSettings(home=tmp_path / "other", local_mode=True, admin_token=SecretStr("mine"))
    assert with_local_admin_token(given).admin_token_value == "mine"  # a token set is kept
    assert not (tmp_path / "other").exists()


def test_a_token_file_others_can_read_stops_the_start_with_the_fix(tmp_path: Path) -> None:
    settings = GraderSettings(home=tmp_path, local_mode=True)
    with_local_admin_token(settings, io.StringIO())
    (tmp_path / ADMIN_TOKEN_FILE).chmod(0o644)
    with pytest.raises(ConfigurationError, match="chmod 600"):
        with_local_admin_token(settings, io.StringIO())


def test_the_operations_guide_says_a_local_grader_keeps_metrics_behind_its_token() -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "OPERATIONS.md").read_text(encoding="utf-8")
    section = text.split("## The grader: `GET /metrics` (admin token)", 1)[1].split("\n## ", 1)[0]
    assert f"`$AUTORL_HOME/{ADMIN_TOKEN_FILE}`" in section and f"(mode {OWNER_ONLY:04o})" in section
