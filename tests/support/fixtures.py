"""Session fixtures that build models; ``tests/conftest.py`` imports them."""

from __future__ import annotations

from pathlib import Path

import pytest

from autorl.tasks import get_task
from tests.support.models import TrainedModel, train_tiny_model

FIXTURE_DATA = Path(__file__).resolve().parents[1] / "data"


@pytest.fixture(scope="session")
def trained_tiny_model(tmp_path_factory: pytest.TempPathFactory) -> TrainedModel:
    """``builtin:tiny-qwen2`` trained to answer the even-numbered GSM8K fixture test problems
    right and the others wrong (see :mod:`tests.support.models`); trained once per test run.

    The problems are loaded the way the evaluator loads them (``load_test_problems`` from the
    fixture data), so any prefix of two or more (``AUTORL_EVAL_LIMIT``) scores strictly between
    0 and 100. Evaluate it with ``eval_max_new_tokens=EVAL_MAX_NEW_TOKENS`` to keep it fast.
    """
    task = get_task("gsm8k")
    problems = task.load_test_problems(tmp_path_factory.mktemp("eval-data"), source_dir=FIXTURE_DATA)
    return train_tiny_model(tmp_path_factory.mktemp("trained") / "model", problems, task_name=task.name)
