"""The suite's one wait (tests/support/waiting.py): it fails at once when the process it waits on has
ended, and past its bound otherwise, naming what it waited for with the log's tail."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.support.waiting import wait_for


def test_a_wait_on_an_ended_process_fails_at_once_with_its_log(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text("address already in use\n")
    started = time.monotonic()
    with pytest.raises(AssertionError, match="the process ended while waiting for the server") as failure:
        wait_for(lambda: False, "the server", 30, log=log, alive=lambda: False)
    assert time.monotonic() - started < 5 and "address already in use" in str(failure.value)


def test_a_wait_past_its_bound_says_so_and_one_that_holds_returns() -> None:
    with pytest.raises(AssertionError, match="timed out after 0 s waiting for the flag"):
        wait_for(lambda: False, "the flag", 0.05, 0.01, alive=lambda: True)
    rounds = iter([False, False, True])
    wait_for(lambda: next(rounds), "the third round", 5, 0.01, alive=lambda: True)
