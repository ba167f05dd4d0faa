"""`--grader URL` of `autorl results` and `autorl report`: a URL the admin client could not send a
request to is refused where the flag is read (exit 2, naming --grader and an example)."""

from __future__ import annotations

from pathlib import Path

import pytest

from autorl.cli import main


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://[::1", "Invalid port"),
        ("http://127.0.0.1:abc", "Invalid port: 'abc'"),
        ("http://127.0.0.1:0", "port 0 is not between 1 and 65535"),
        ("http://127.0.0.1:70000", "port 70000 is not between 1 and 65535"),
        ("http://", "it names no host"),
        ("http:// 127.0.0.1:8000", "a space or a control character"),
        ("http://127.0.0.1:8000/?x=1", "no ?query or #fragment"),
        ("127.0.0.1:8000", "it must begin with http:// or https://"),
    ],
)
@pytest.mark.parametrize("command", [["results"], ["report", "exp-1"]])
def test_a_grader_url_the_client_cannot_use_is_refused_with_an_example(
    url: str,
    why: str,
    command: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("AUTORL_HOME", str(tmp_path))
    monkeypatch.setenv("AUTORL_ADMIN_TOKEN", "any")  # past the token check: the URL is what is refused
    assert main([*command, "--grader", url]) == 2
    error = capsys.readouterr().err
    example = "as http://HOST:PORT (e.g. http://127.0.0.1:8000)"
    assert f"error: --grader takes the grader's base URL, {example}, not {url!r}: " in error
    assert why in error and "Traceback" not in error
