"""The example agent's settings: each flag's type comes from its field's annotation, and a value
out of its range is refused before anything trains, naming the flag, the value and the range."""

from __future__ import annotations

from dataclasses import fields

import pytest

from autorl_agents.example_config import ExampleGRPOConfig, build_parser, parse_config


@pytest.fixture(autouse=True)
def _no_platform_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AUTORL_AGENT_ARGS", raising=False)
    monkeypatch.setenv("AUTORL_SEED", "3")


def test_each_flag_parses_to_its_fields_type() -> None:
    config = parse_config(["--sft-epochs", "2", "--sft-time-fraction", "0.5", "--sft-learning-rate", "1e-4"])
    assert (config.sft_epochs, config.sft_time_fraction, config.sft_learning_rate) == (2, 0.5, 1e-4)
    assert isinstance(config.sft_epochs, int) and isinstance(config.sft_time_fraction, float)
    flags = {action.dest for action in build_parser()._actions} - {"help"}
    assert flags == {spec.name for spec in fields(ExampleGRPOConfig)}
    assert parse_config([]).seed == 3  # the run's AUTORL_SEED unless --seed is given
    assert parse_config(["--seed", "7"]).seed == 7


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--sft-time-fraction", "1.5"], "`--sft-time-fraction` must be between 0 and 1, got 1.5."),
        (["--sft-threshold", "-1"], "`--sft-threshold` must be between 0 and 100, got -1.0."),
        (["--num-generations", "1"], "`--num-generations` must be at least 2, got 1."),
        (["--grpo-learning-rate", "0"], "`--grpo-learning-rate` must be greater than 0, got 0.0."),
        (["--logging-steps", "0"], "`--logging-steps` must be at least 1, got 0."),
        (["--seed", "-1"], "`--seed` must be at least 0, got -1."),
    ],
)
def test_a_value_out_of_range_is_a_usage_error_naming_the_flag(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_config(argv)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_a_wrong_type_and_an_unknown_choice_are_refused_by_the_parser(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for argv in (["--sft-epochs", "two"], ["--rl", "ppo"]):
        with pytest.raises(SystemExit) as exited:
            parse_config(argv)
        assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "--sft-epochs: invalid int value: 'two'" in err and "--rl: invalid choice: 'ppo'" in err


def test_the_config_made_in_code_is_checked_too() -> None:
    with pytest.raises(ValueError, match="`--sft` must be one of auto, always, never, got 'sometimes'"):
        ExampleGRPOConfig(sft="sometimes")  # type: ignore[arg-type]
    assert ExampleGRPOConfig(sft_learning_rate=None).sft_learning_rate is None  # unset: the model's default
