"""An oversized request to the grader itself (on a cluster agents reach it without the sandbox's
relay) is answered with the limit and the fix, as every refusal, never with a reset connection;
the grader goes on serving. A real `autorl grader` process, over real sockets, with a client that
sends the whole request before it reads the answer (as reference agents do)."""

from __future__ import annotations

import http.client
import json
import socket
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from subprocess import Popen

import httpx
import pytest

from autorl.api.request_limits import (
    HEADERS_TOO_LARGE,
    MAX_AGENT_BODY_BYTES,
    MAX_BODY_BYTES,
    body_too_large,
)
from tests.support.grading import (
    RegisteredExperiment,
    admin_headers,
    copy_model,
    make_workspace,
    register,
    submit_accepted,
)
from tests.support.service_processes import serving_grader
from tests.support.settings import DeploymentSettings

FIVE_MB = 5 << 20
ADMIN_BODY_TOO_LARGE = body_too_large(MAX_BODY_BYTES)
#: Far more than the grader drops after a refusal before it closes the connection.
SEND_AT_MOST = 1 << 30


@dataclass
class Grader:
    port: int
    process: Popen[bytes]
    client: httpx.Client
    experiment: RegisteredExperiment
    admin: dict[str, str]


@pytest.fixture
def grader(
    make_settings: Callable[..., DeploymentSettings], tiny_base_model: Path, tmp_path: Path
) -> Iterator[Grader]:
    settings = make_settings(submit_wait_s=0.0)
    with serving_grader(settings, tmp_path / "grader.log") as (process, client):
        experiment = register(client, settings, tiny_base_model, make_workspace(tmp_path / "ws"))
        copy_model(tiny_base_model, experiment.output_dir / "m", unique=True)
        yield Grader(client.base_url.port or 0, process, client, experiment, admin_headers(settings))


def streamed(total: int, chunk: int = 64 << 10) -> Iterable[bytes]:
    """A body of ``total`` bytes without a Content-Length (sent chunked): only counting tells its size."""
    for _ in range(total // chunk):
        yield b" " * chunk


@pytest.mark.parametrize(
    ("route", "headers", "body", "status", "reason"),
    [
        (
            "submit",
            {"Content-Type": "application/json"},
            b'{"model_path": "' + b"x" * FIVE_MB + b'"}',
            413,
            body_too_large(MAX_AGENT_BODY_BYTES),
        ),
        (
            "submit",
            {"Content-Type": "application/json"},
            b'{"model_path": "output/m", "gpu": [' + b"0," * (MAX_BODY_BYTES // 4) + b"0]}",
            413,
            body_too_large(MAX_AGENT_BODY_BYTES),
        ),
        (
            "admin",
            {"Content-Type": "application/json"},
            streamed(FIVE_MB),
            413,
            body_too_large(MAX_BODY_BYTES),
        ),
        ("submit", {"X-Pad": "p" * (200 << 10)}, b'{"model_path": "output/m"}', 431, HEADERS_TOO_LARGE),
    ],
    ids=[
        "5 MB submit body",
        "a submit body an admin body could be",
        "5 MB admin body, streamed",
        "200 KB header",
    ],
)
def test_an_oversized_request_is_answered_with_the_limit_and_the_grader_serves_on(
    grader: Grader,
    route: str,
    headers: dict[str, str],
    body: bytes | Iterable[bytes],
    status: int,
    reason: str,
) -> None:
    if route == "submit":
        path, auth = f"{grader.experiment.url_path}/submit?wait=false", {}
    else:
        path, auth = "/v1/experiments", grader.admin
    connection = http.client.HTTPConnection("127.0.0.1", grader.port, timeout=60)
    try:
        connection.request("POST", path, body=body, headers={**headers, **auth})
        response = connection.getresponse()
        answer = json.loads(response.read())
    finally:
        connection.close()
    assert response.status == status and response.getheader("connection") == "close"
    assert response.getheader("content-type") == "application/json"
    assert answer == {"detail": reason, "error": reason}

    # A well-formed submit right after, on a new connection, is served as ever.
    submit_accepted(grader.client, grader.experiment, "output/m")
    assert grader.process.poll() is None
    assert grader.client.get(f"{grader.experiment.url_path}/scores").json()["total_submissions"] == 1


def test_a_client_that_never_stops_sending_is_cut_off_after_the_answer(grader: Grader) -> None:
    # Declares a terabyte, reads the refusal, then goes on sending: the grader drops what comes for
    # a bounded time and amount (request_limits.DRAIN_S, DRAIN_BYTES), then closes the connection.
    with socket.create_connection(("127.0.0.1", grader.port), timeout=60) as sock:
        sock.sendall(
            f"POST {grader.experiment.url_path}/submit HTTP/1.1\r\nHost: grader\r\n"
            f"Content-Type: application/json\r\nContent-Length: {1 << 40}\r\n\r\n".encode()
        )
        answer = b""
        while chunk := sock.recv(65536):  # the answer, then the grader's end of the stream
            answer += chunk
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 413 ")
        assert json.loads(body)["detail"] == body_too_large(MAX_AGENT_BODY_BYTES)
        sent = 0
        with pytest.raises((BrokenPipeError, ConnectionResetError)):
            while sent < SEND_AT_MOST:
                sock.sendall(b" " * (1 << 20))
                sent += 1 << 20
    assert sent > 0 and grader.process.poll() is None
    assert grader.client.get(f"{grader.experiment.url_path}/time").status_code == 200


@pytest.mark.parametrize(
    ("request_head", "status", "reason"),
    [
        (b"GET /time?" + b"q" * (200 << 10) + b" HTTP/1.1\r\nHost: grader\r\n\r\n", 431, HEADERS_TOO_LARGE),
        (
            b"GET /time HTTP/1.1\r\nHost: grader\r\n" + b"X-A: b\r\n" * (30 << 10) + b"\r\n",
            431,
            HEADERS_TOO_LARGE,
        ),
        (
            b"GET /time HTTP/1.1\r\nHost: grader\r\nX-Pad: " + b"p" * (100 << 10) + b"\r\n\r\n",
            431,
            HEADERS_TOO_LARGE,
        ),
        (b"GET /time HTTP/1.1\r\nHost grader\r\n\r\n", 400, "not a valid HTTP/1.1 request"),
    ],
    ids=["200 KB request line", "30,000 headers", "100 KB header in one write", "a header without a colon"],
)
def test_a_request_head_the_grader_cannot_take_is_answered_as_every_refusal(
    grader: Grader, request_head: bytes, status: int, reason: str
) -> None:
    with socket.create_connection(("127.0.0.1", grader.port), timeout=60) as sock:
        sock.sendall(request_head)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(f"HTTP/1.1 {status} ".encode()) and b"content-type: application/json" in head
    refusal = json.loads(body)
    assert refusal["detail"] == refusal["error"] and refusal["detail"].startswith(reason)
    assert grader.client.get(f"{grader.experiment.url_path}/time").status_code == 200
