"""The example agent's ``--rollouts`` setting (``auto``: the fast path on a CUDA GPU and for a tiny
model; ``fast``; ``trl``) and the GRPO settings whose defaults follow the model's size."""

from __future__ import annotations

import pytest

from autorl_agents.example_config import GRPOSizes, grpo_sizes, parse_config


def test_rollouts_default_to_auto_and_take_fast_or_trl(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AUTORL_AGENT_ARGS", raising=False)
    assert parse_config([]).rollouts == "auto"
    assert parse_config(["--rollouts", "trl"]).rollouts == "trl"
    assert parse_config(["--rollouts", "fast"]).rollouts == "fast"
    monkeypatch.setenv("AUTORL_AGENT_ARGS", "--rollouts trl")
    assert parse_config([]).rollouts == "trl"


def test_an_unknown_rollout_engine_is_refused_with_the_choices(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_config(["--rollouts", "vllm"])
    err = capsys.readouterr().err
    # argparse quotes the choices in some Python versions and not in others.
    assert "--rollouts: invalid choice: 'vllm'" in err and all(c in err for c in ("auto", "fast", "trl"))


def test_grpo_sizes_follow_the_model_unless_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AUTORL_AGENT_ARGS", raising=False)
    defaults = parse_config([])
    assert grpo_sizes(defaults, tiny=True) == GRPOSizes(
        learning_rate=5e-5, num_generations=8, prompts_per_step=16
    )
    # The reference example agent's settings for a real model.
    assert grpo_sizes(defaults, tiny=False) == GRPOSizes(
        learning_rate=1e-6, num_generations=4, prompts_per_step=2
    )
    given = parse_config(
        ["--grpo-learning-rate", "3e-4", "--num-generations", "6", "--grpo-prompts-per-step", "5"]
    )
    for tiny in (True, False):
        assert grpo_sizes(given, tiny=tiny) == GRPOSizes(
            learning_rate=3e-4, num_generations=6, prompts_per_step=5
        )


def test_the_help_names_each_size_default(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_config(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "(default: 5e-5 for a tiny model, 1e-6 otherwise)" in out
    assert "(default: 16 for a tiny model, 2 otherwise)" in out
    assert "(default: 8 for a tiny model, 4 otherwise)" in out
