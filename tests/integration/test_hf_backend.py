"""The in-process ``hf`` backend on a tiny model trained to answer half the fixture problems.

The backend's score must be strictly between 0 and 100 and equal ``accuracy()`` recomputed from
greedy outputs produced here, independently: one prompt at a time (no padding), with transformers
called directly, decoded with special tokens skipped. The backend batches (left padding, a last
batch of a different size), so equal outputs also show that padding changes nothing.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from autorl.checkpoints.snapshot import snapshot_base_model
from autorl.errors import ConfigurationError, EvaluationError
from autorl.eval_config import EvalConfig
from autorl.tasks import get_task
from autorl.tasks.gsm8k import PROTOCOLS, accuracy
from autorl_evaluator.backends import get_backend
from autorl_evaluator.backends.base import EvalResult
from autorl_evaluator.backends.hf.opencompass_chat import opencompass_messages
from autorl_evaluator.settings import WorkerSettings
from tests.support.models import EVAL_MAX_NEW_TOKENS, TrainedModel, greedy_ids

pytestmark = pytest.mark.slow

#: Not a divisor of the 16 fixture problems: batches of 5, 5, 5 and 1.
BATCH_SIZE = 5


def recorded(settings: WorkerSettings) -> EvalConfig:
    """The config a grader with these settings records for a gsm8k experiment."""
    return EvalConfig.record("gsm8k", settings)


def _independent_completions(model_dir: Path, questions: list[str]) -> list[str]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    task = get_task("gsm8k")
    tokenizer: Any = AutoTokenizer.from_pretrained(model_dir)
    model: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    texts = [
        tokenizer.apply_chat_template(
            opencompass_messages(task.build_messages(question)), tokenize=False, add_generation_prompt=True
        )
        for question in questions
    ]
    prompt_ids = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]
    # Ending where the model's own generation config says, as generate does by default.
    completions = greedy_ids(
        model,
        prompt_ids,
        EVAL_MAX_NEW_TOKENS,
        eos_token_id=model.generation_config.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return [tokenizer.decode(ids, skip_special_tokens=True) for ids in completions]


@pytest.fixture(scope="module")
def settings(tmp_path_factory: pytest.TempPathFactory) -> WorkerSettings:
    return WorkerSettings(
        home=tmp_path_factory.mktemp("home"),
        eval_max_new_tokens=EVAL_MAX_NEW_TOKENS,
        eval_batch_size=BATCH_SIZE,
        eval_device="cpu",
    )


def _contents(folder: Path) -> dict[str, tuple[bytes, int]]:
    return {path.name: (path.read_bytes(), path.stat().st_mtime_ns) for path in folder.iterdir()}


@pytest.fixture(scope="module")
def evaluated(trained_tiny_model: TrainedModel, settings: WorkerSettings) -> EvalResult:
    """The backend evaluates a snapshot (normalized files), as the worker hands it one."""
    assert settings.snapshot_dir is not None
    snapshot = snapshot_base_model(trained_tiny_model.path, settings.snapshot_dir)
    before = _contents(snapshot.path)
    result = get_backend("hf").evaluate(
        snapshot.path, get_task("gsm8k"), list(trained_tiny_model.problems), recorded(settings), settings
    )
    assert _contents(snapshot.path) == before, "the backend must only read the snapshot"
    return result


def test_score_is_between_0_and_100_and_equals_recomputed_accuracy(
    evaluated: EvalResult, trained_tiny_model: TrainedModel
) -> None:
    problems = list(trained_tiny_model.problems)
    answers = [problem.answer for problem in problems]
    independent = _independent_completions(
        trained_tiny_model.path, [problem.question for problem in problems]
    )
    assert 0 < evaluated.scores["opencompass"] < 100
    for protocol in PROTOCOLS:
        assert evaluated.scores[protocol] == accuracy(independent, answers, protocol)
    assert evaluated.completions == independent
    assert evaluated.n_samples == len(problems) == 16
    assert evaluated.scores["opencompass"] == pytest.approx(
        100 * len(trained_tiny_model.right) / len(problems)
    )


def test_result_records_how_it_ran(evaluated: EvalResult, settings: WorkerSettings) -> None:
    assert evaluated.details["backend"] == "hf"
    assert evaluated.details["device"] == "cpu"
    assert evaluated.details["batch_size"] == BATCH_SIZE
    assert evaluated.details["max_new_tokens"] == EVAL_MAX_NEW_TOKENS
    assert evaluated.details["truncated_prompts"] == 0
    assert evaluated.seconds > 0


def test_unloadable_weights_fail_with_the_fix_and_only_evaluator_storage_gets_the_cause(
    trained_tiny_model: TrainedModel, settings: WorkerSettings, tmp_path: Path
) -> None:
    """What transformers says names the evaluator's own paths (and could its devices' memory): the
    agent gets the fix in fixed words, the operator the cause."""
    from autorl_evaluator.backends.hf.backend import UNLOADABLE
    from autorl_evaluator.failures import agent_message, operator_detail

    broken = Path(shutil.copytree(trained_tiny_model.path, tmp_path / "broken"))
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(EvaluationError) as caught:
        get_backend("hf").evaluate(
            broken, get_task("gsm8k"), list(trained_tiny_model.problems[:2]), recorded(settings), settings
        )
    assert agent_message(caught.value) == UNLOADABLE and "save_pretrained" in UNLOADABLE
    assert "SafetensorError: Error while deserializing header" in operator_detail(caught.value)


def evaluate_trained(model: TrainedModel, settings: WorkerSettings) -> EvalResult:
    """The hf backend's evaluation of the trained tiny model on its problems."""
    return get_backend("hf").evaluate(
        model.path, get_task("gsm8k"), list(model.problems), recorded(settings), settings
    )


def assert_same_answers(result: EvalResult, reference: EvalResult) -> None:
    """``result`` has the reference evaluation's completions, problem by problem, and its scores."""
    assert result.completions == reference.completions
    assert result.scores == reference.scores


def test_backends_by_name() -> None:
    assert get_backend("hf").name == "hf"
    assert get_backend("opencompass").name == "opencompass"
    with pytest.raises(ConfigurationError, match=r"set AUTORL_EVAL_BACKEND to one of hf, opencompass"):
        get_backend("vllm-direct")


def test_out_of_memory_halves_the_batch_and_keeps_every_completion(
    evaluated: EvalResult,
    trained_tiny_model: TrainedModel,
    settings: WorkerSettings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A GPU out-of-memory error cannot be produced on this machine; batches above two prompts are
    made to raise it, the way CUDA does, and the real generation runs for the smaller ones."""
    import torch

    from autorl.decoding import greedy_engine

    real = greedy_engine._decode_batch
    sizes: list[int] = []

    def small_batches_only(
        forward: Any, shape: Any, prefix: Any, shared: int, suffixes: Any, *args: Any
    ) -> Any:
        sizes.append(len(suffixes))
        if len(suffixes) > 2:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(forward, shape, prefix, shared, suffixes, *args)

    monkeypatch.setattr(greedy_engine, "_decode_batch", small_batches_only)
    result = evaluate_trained(trained_tiny_model, settings)
    assert sizes[:3] == [BATCH_SIZE, 2, 2]  # 5 → 2, then it stays at the size that fits
    assert_same_answers(result, evaluated)


def test_an_architecture_the_engine_does_not_know_decodes_with_generate_to_the_same_completions(
    evaluated: EvalResult,
    trained_tiny_model: TrainedModel,
    settings: WorkerSettings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from autorl.decoding import greedy_engine

    monkeypatch.setattr(greedy_engine, "SUPPORTED_MODEL_TYPES", frozenset())
    result = evaluate_trained(trained_tiny_model, settings)
    assert evaluated.details["engine"] == "greedy"
    assert result.details["engine"] == "generate"
    assert result.details["shared_prefix_ids"] == 0
    assert_same_answers(result, evaluated)


def test_a_warm_evaluation_swaps_weights_and_scores_as_a_cold_one(
    evaluated: EvalResult,
    trained_tiny_model: TrainedModel,
    tiny_base_model: Path,
    settings: WorkerSettings,
    tmp_path: Path,
) -> None:
    from autorl_evaluator.backends.hf.warm_models import RESIDENT

    # Same files but the untrained base's weights: the model made resident first.
    other = Path(shutil.copytree(trained_tiny_model.path, tmp_path / "other"))
    shutil.copyfile(tiny_base_model / "model.safetensors", other / "model.safetensors")
    warm = settings.model_copy(update={"eval_warm_worker": True})
    problems = list(trained_tiny_model.problems)
    try:
        first = get_backend("hf").evaluate(other, get_task("gsm8k"), problems, recorded(warm), warm)
        second = get_backend("hf").evaluate(
            trained_tiny_model.path, get_task("gsm8k"), problems, recorded(warm), warm
        )
    finally:
        RESIDENT.clear()
    assert first.details["weights_swapped_into_resident_model"] is False
    assert second.details["weights_swapped_into_resident_model"] is True
    assert first.completions != evaluated.completions  # the resident model really had other weights
    assert_same_answers(second, evaluated)
    assert evaluated.details["weights_swapped_into_resident_model"] is False
