"""Sealed mode's validation split: carved deterministically from the train split, of GSM8K's
share (500 of 7,473), disjoint from what the agent gets and from the test split."""

from __future__ import annotations

from pathlib import Path

import pytest

from autorl.tasks import get_task
from autorl.tasks.arith import ArithTask
from autorl.tasks.base import (
    Problem,
    read_problems,
    split_train,
    validation_size,
    write_agent_train,
)

FIXTURE_DATA = Path(__file__).resolve().parents[1] / "data"


@pytest.mark.parametrize(("train", "expected"), [(7473, 500), (2000, 134), (40, 3), (2, 1), (1, 0), (0, 0)])
def test_the_validation_split_takes_gsm8ks_share_of_every_train_split(train: int, expected: int) -> None:
    assert validation_size(train) == expected


def test_the_division_is_deterministic_disjoint_and_keeps_the_order() -> None:
    problems = [Problem(f"q{i}", f"#### {i}") for i in range(7473)]
    train, validation = split_train(problems)
    assert (len(train), len(validation)) == (6973, 500)
    assert split_train(problems) == (train, validation)
    assert not {p.question for p in train} & {p.question for p in validation}
    assert sorted(train + validation, key=lambda p: int(p.question[1:])) == problems
    assert validation == sorted(validation, key=lambda p: int(p.question[1:]))
    # Not the first or last 500: drawn across the split with the fixed seed.
    assert validation != problems[:500] and validation != problems[-500:]


def test_gsm8k_validation_is_disjoint_from_the_agents_train_file_and_from_test(tmp_path: Path) -> None:
    task = get_task("gsm8k")
    whole = task.download_train_data(tmp_path / "whole", source_dir=FIXTURE_DATA)
    agent_file = write_agent_train(whole, tmp_path / "agent")
    validation = task.load_validation_problems(tmp_path / "eval", source_dir=FIXTURE_DATA)
    test = task.load_test_problems(tmp_path / "eval", source_dir=FIXTURE_DATA)
    agent = read_problems(agent_file)
    assert len(validation) == 3 and len(agent) == 37
    assert not {p.question for p in validation} & {p.question for p in agent}
    assert not {p.question for p in validation} & {p.question for p in test}
    assert {p.question for p in validation} | {p.question for p in agent} == {
        p.question for p in read_problems(whole)
    }


def test_arith_validation_is_disjoint_from_the_agents_train_file_and_from_test(tmp_path: Path) -> None:
    task = ArithTask()
    whole = task.download_train_data(tmp_path / "whole")
    agent = read_problems(write_agent_train(whole, tmp_path / "agent"))
    validation = task.load_validation_problems(tmp_path / "eval")
    test = task.load_test_problems(tmp_path / "eval")
    assert (len(agent), len(validation)) == (1866, 134)
    assert not {p.question for p in validation} & {p.question for p in agent}
    assert not {p.question for p in validation} & {p.question for p in test}
