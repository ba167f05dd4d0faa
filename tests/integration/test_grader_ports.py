"""`autorl grader --admin-port`: the agent port serves only the agent API, the admin port everything.

This is what the chart's NetworkPolicy relies on (it cannot tell URL paths apart): the real command,
two real sockets, and the requests an agent would try on the port it is allowed to reach.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.support.infra import free_port, grader_process

AUTORL = str(Path(sys.executable).parent / "autorl")


@dataclass
class Grader:
    agent: str
    admin: str
    token: str


def grader_env(home: Path, agent_port: int, token: str) -> dict[str, str]:
    env = {
        **os.environ,
        "AUTORL_HOME": str(home),  # SQLite in its home; local dispatch: no Redis needed here
        "AUTORL_ADMIN_TOKEN": token,
    }
    # Without AUTORL_PUBLIC_URL agents are sent where the grader listens (--host, --port).
    for name in ("AUTORL_DATABASE_URL", "AUTORL_REDIS_URL", "AUTORL_LOCAL_MODE", "AUTORL_PUBLIC_URL"):
        env.pop(name, None)
    return env


@pytest.fixture(scope="module")
def grader(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Grader]:
    home = tmp_path_factory.mktemp("grader-ports")
    agent_port, admin_port = free_port(), free_port()
    token = secrets.token_hex(16)
    env = grader_env(home, agent_port, token)
    command = [AUTORL, "grader", "--host", "127.0.0.1", "--port", str(agent_port)]
    urls = [f"http://127.0.0.1:{port}" for port in (agent_port, admin_port)]
    with grader_process([*command, "--admin-port", str(admin_port), "--log-level", "warning"], env, urls):
        yield Grader(agent=urls[0], admin=urls[1], token=token)


def admin_headers(grader: Grader) -> dict[str, str]:
    return {"Authorization": f"Bearer {grader.token}"}


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/experiments"),
        ("POST", "/v1/experiments"),
        ("GET", "/v1/experiments/x"),
        ("POST", "/v1/experiments/x/finish"),
        ("GET", "/metrics"),
        ("GET", "/docs"),
        ("GET", "/openapi.json"),
        ("GET", "//v1/experiments"),
        ("GET", "/v1/experiments/"),
        ("GET", "/V1/experiments"),
        ("GET", "/ui"),
        ("POST", "/ui/login"),
        ("GET", "/ui/api/experiments"),
        ("GET", "/ui/static/chart.umd.min.js"),
    ],
)
def test_the_agent_port_never_serves_the_admin_api_or_metrics(grader: Grader, method: str, path: str) -> None:
    answer = httpx.request(method, f"{grader.agent}{path}", headers=admin_headers(grader), json={})
    assert answer.status_code == 404, answer.text
    assert "admin port" in answer.json()["detail"]


def test_the_admin_port_serves_everything_and_the_agent_port_the_agent_api(
    grader: Grader, tiny_base_model: Path, tmp_path: Path
) -> None:
    body = {
        "name": "ports",
        "task": "arith",
        "model": "builtin:tiny-qwen2",
        "timeout_s": 600,
        "workspace": str(tmp_path),
        "base_model_dir": str(tiny_base_model),
    }
    registered = httpx.post(f"{grader.admin}/v1/experiments", headers=admin_headers(grader), json=body)
    assert registered.status_code == 201, registered.text
    url = registered.json()["grading_server_url"]
    assert url.startswith(grader.agent + "/a/")  # agents are sent to the agent port
    assert httpx.get(f"{url}/time").status_code == 200
    assert httpx.get(f"{grader.agent}/time", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert httpx.get(f"{grader.agent}/health").status_code == 200
    assert httpx.get(f"{grader.agent}/readyz").status_code == 200
    assert httpx.get(f"{grader.admin}/metrics", headers=admin_headers(grader)).status_code == 200
    listed = httpx.get(f"{grader.admin}/v1/experiments", headers=admin_headers(grader))
    assert [e["name"] for e in listed.json()] == ["ports"]


def test_admin_port_equal_to_the_agent_port_is_refused(tmp_path: Path) -> None:
    env = {**os.environ, "AUTORL_HOME": str(tmp_path), "AUTORL_ADMIN_TOKEN": secrets.token_hex(16)}
    env.pop("AUTORL_DATABASE_URL", None)
    refused = subprocess.run(
        [AUTORL, "grader", "--port", "8123", "--admin-port", "8123"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 2
    assert "--admin-port must differ from --port" in refused.stderr


def test_every_request_on_the_agent_port_is_charged_to_a_fair_share(grader: Grader) -> None:
    # An agent's flood of paths the agent port does not serve, or of its probes, costs the grader
    # what its agent requests do: past its address's burst it is refused, paused, with Retry-After.
    flood = httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.9"), timeout=30)
    with flood:
        for path, served in (("nothing", 404), ("healthz", 200)):
            answers = []
            while len(answers) < 60 and (not answers or answers[-1].status_code != 429):
                answers.append(flood.get(f"{grader.agent}/{path}"))  # until the first refusal
            codes = [answer.status_code for answer in answers]
            assert set(codes) == {served, 429}, codes
            refused = answers[-1]
            assert int(refused.headers["retry-after"]) >= 1
            assert "from this address" in refused.json()["detail"]
        # The admin port is the platform's, and another address keeps its own share.
        assert flood.get(f"{grader.admin}/healthz").status_code == 200
    assert httpx.get(f"{grader.agent}/healthz").status_code == 200


def test_an_address_cannot_name_another_for_its_fair_share(tmp_path: Path) -> None:
    """A client on the grader's own machine (127.0.0.1 is where a proxy would be) saying it is a new
    address each time (X-Forwarded-For, Forwarded) is still charged as the address it connects from:
    its made-up tokens are refused, then paused."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [AUTORL, "grader", "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]
    with (
        grader_process(command, grader_env(tmp_path, port, secrets.token_hex(16)), [url]),
        httpx.Client() as client,
    ):
        codes: list[int] = []
        while len(codes) < 60 and 429 not in codes:
            forged = {"X-Forwarded-For": f"10.9.{len(codes)}.1", "Forwarded": f"for=10.8.{len(codes)}.1"}
            codes.append(client.get(f"{url}/a/made-up-{len(codes)}/time", headers=forged).status_code)
    assert set(codes) == {401, 429}, codes


def test_the_graders_own_events_are_logged(tmp_path: Path) -> None:
    env = {**os.environ, "AUTORL_HOME": str(tmp_path), "AUTORL_ADMIN_TOKEN": secrets.token_hex(16)}
    for name in ("AUTORL_DATABASE_URL", "AUTORL_REDIS_URL", "AUTORL_LOCAL_MODE"):
        env.pop(name, None)
    port = free_port()
    command = [AUTORL, "grader", "--host", "127.0.0.1", "--port", str(port)]
    with grader_process(command, env, [f"http://127.0.0.1:{port}"]) as process:
        pass
    assert process.stdout is not None
    assert "INFO autorl.grader event=grader_started" in process.stdout.read()
