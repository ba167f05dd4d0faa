"""`autorl run --feedback test|sealed` and the agent runner's `prepare --feedback`: test by
default, sealed when asked, anything else refused by the parser (exit 2) naming the choices."""

from __future__ import annotations

import pytest

from autorl.cli import build_parser

RUN = ["run", "-a", "example_grpo", "-t", "arith", "-m", "builtin:tiny-qwen2", "--timeout", "60"]
PREPARE = ["agent-runner", "prepare", "--task", "arith", "--model", "builtin:tiny-qwen2", "--workspace", "/w"]


@pytest.mark.parametrize(("command", "name"), [(RUN, "feedback"), (PREPARE, "prepare_feedback")])
def test_feedback_is_test_by_default_sealed_when_asked_and_nothing_else(
    command: list[str], name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = build_parser()
    assert getattr(parser.parse_args(command), name) == "test"
    assert getattr(parser.parse_args([*command, "--feedback", "sealed"]), name) == "sealed"
    with pytest.raises(SystemExit) as refused:
        parser.parse_args([*command, "--feedback", "validation"])
    assert refused.value.code == 2
    assert "invalid choice: 'validation' (choose from" in capsys.readouterr().err
