"""The example agent's ``--rollouts`` setting: ``auto`` (the fast path on a CUDA GPU) or ``trl``."""

from __future__ import annotations

import pytest

from autorl_agent_runner.agents.example_config import parse_config


def test_rollouts_default_to_auto_and_take_trl(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AUTORL_AGENT_ARGS", raising=False)
    assert parse_config([]).rollouts == "auto"
    assert parse_config(["--rollouts", "trl"]).rollouts == "trl"
    monkeypatch.setenv("AUTORL_AGENT_ARGS", "--rollouts trl")
    assert parse_config([]).rollouts == "trl"


def test_an_unknown_rollout_engine_is_refused_with_the_choices(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_config(["--rollouts", "vllm"])
    err = capsys.readouterr().err
    # argparse quotes the choices in some Python versions and not in others.
    assert "--rollouts: invalid choice: 'vllm'" in err and "auto" in err and "trl" in err
