"""The grader's access log is sampled per client: a flood adds a bounded number of lines, and one
client's flood hides neither another's requests nor a token (autorl_grader.access_log)."""

from __future__ import annotations

import io
import logging

import pytest

from autorl.untrusted_text import PrintableFormatter
from autorl_grader.access_log import (
    ACCESS_KEYS,
    LOGGED_ACCESSES,
    LOGGED_ACCESSES_EVERY,
    SampledAccessLog,
)
from autorl_grader.fair_share import CLIENT
from autorl_grader.logging_setup import RedactTokens, install_redaction

TOKEN = "secret-token-of-the-experiment"


def access(address: str, path: str = f"/a/{TOKEN}/scores", status: int = 429) -> logging.LogRecord:
    """The record uvicorn's access logger makes for one answer."""
    return logging.LogRecord(
        "uvicorn.access",
        logging.INFO,
        __file__,
        1,
        '%s - "%s %s HTTP/%s" %d',
        (f"{address}:51234", "GET", path, "1.1", status),
        None,
    )


def test_each_client_is_logged_one_by_one_then_once_per_many_with_its_count(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sampled = SampledAccessLog()
    flood = 3 * LOGGED_ACCESSES_EVERY + 7
    with caplog.at_level(logging.INFO, logger="autorl.grader"):
        passed = sum(sampled.filter(access("10.0.0.1")) for _ in range(flood))
        # Another client, during the flood: every one of its lines is written.
        assert all(sampled.filter(access("10.0.0.2")) for _ in range(10))
    assert passed == LOGGED_ACCESSES + (flood - LOGGED_ACCESSES) // LOGGED_ACCESSES_EVERY
    counts = [r.getMessage() for r in caplog.records if "event=access_sampled" in r.getMessage()]
    assert counts == [
        f"event=access_sampled client=address:10.0.0.1 requests={n} logged=first {LOGGED_ACCESSES} "
        f"then every {LOGGED_ACCESSES_EVERY}"
        for n in range(LOGGED_ACCESSES_EVERY, flood + 1, LOGGED_ACCESSES_EVERY)
        if n > LOGGED_ACCESSES
    ]


def test_the_client_is_the_fair_share_budget_and_its_name_is_no_token(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sampled = SampledAccessLog()
    with caplog.at_level(logging.INFO, logger="autorl.grader"):
        CLIENT.set("experiment:0123456789ab")
        try:
            # Two addresses of one experiment are one client; the controller's address is not it.
            for index in range(LOGGED_ACCESSES_EVERY + LOGGED_ACCESSES):
                sampled.filter(access(f"10.0.0.{index % 2 + 1}"))
        finally:
            CLIENT.set(None)
        assert sampled.filter(access("10.0.0.1", "/v1/experiments", 200))
    lines = [r.getMessage() for r in caplog.records]
    assert any("client=experiment:0123456789ab requests=" in line for line in lines)
    assert not any(TOKEN in line for line in lines)
    record = access("10.0.0.3")
    assert sampled.filter(record) and RedactTokens().filter(record)
    assert TOKEN not in record.getMessage()


def test_clients_counted_apart_are_bounded() -> None:
    sampled = SampledAccessLog()
    for index in range(ACCESS_KEYS + 500):
        sampled.filter(access(f"10.{index // 65536}.{index // 256 % 256}.{index % 256}"))
    assert len(sampled._requests) == ACCESS_KEYS + 1  # the rest share one count


def test_an_agents_string_in_the_graders_log_is_escaped_once_and_its_token_redacted() -> None:
    # As `autorl grader` logs: its filters on the grader's logger, the escaping formatter at the end.
    logger, stream = logging.getLogger("autorl.grader"), io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(PrintableFormatter("%(message)s"))
    install_redaction()
    logger.addHandler(handler)
    try:
        logger.warning("event=x path=%s", f"/a/{TOKEN}/ckpt\x1b[2J\\x")
    finally:
        logger.removeHandler(handler)
    assert stream.getvalue() == "event=x path=/a/<redacted>/ckpt\\x1b[2J\\\\x\n"
