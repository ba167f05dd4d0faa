"""The task registry, the arith generator, data preparation and prompt rendering."""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from autorl.errors import ConfigurationError, UnknownTaskError
from autorl.tasks import Problem, Task, get_task, task_names
from autorl.tasks.arith import MAX_OPERAND, ArithTask, generate_problems
from autorl.tasks.base import ChatTokenizer, evaluation_messages, read_problems
from autorl.tasks.gsm8k import GSM8KTask, extract_answer, is_correct
from tests.support.hub_cache import build_gsm8k_cache

FIXTURE_DIR = Path(__file__).resolve().parents[1] / "data"
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


# --- registry ----------------------------------------------------------------------------------


def test_registry_lists_and_builds_tasks() -> None:
    assert task_names() == ["arith", "gsm8k"]
    for name in task_names():
        task = get_task(name)
        assert isinstance(task, Task)
        assert task.name == name
        assert f"at most {task.max_new_tokens} new tokens" in task.description()
        assert task.description().lower().startswith(f"# {name}")
        assert "train.jsonl" in task.description()


def test_generation_limits_gsm8k_as_the_reference_arith_short() -> None:
    # GSM8K's 512 is the reference's; arith's worked answers are one sentence, so its limit is short
    # and an untrained baseline does not decode 512 tokens a problem.
    assert get_task("gsm8k").max_new_tokens == 512
    arith = get_task("arith")
    # ASCII answers: no tokenizer needs more tokens than characters, so every worked answer fits.
    longest = max(len(p.answer) for p in arith.train_problems())
    assert arith.max_new_tokens == 64 and longest <= arith.max_new_tokens


def test_unknown_task_names_the_known_ones() -> None:
    with pytest.raises(UnknownTaskError, match=r"unknown task 'gsm9k'; known tasks: arith, gsm8k"):
        get_task("gsm9k")


# --- arith -------------------------------------------------------------------------------------


def _final(problem: Problem) -> int:
    return int(problem.answer.rsplit("#### ", 1)[1])


def test_arith_is_deterministic_by_seed() -> None:
    assert generate_problems(7, 50) == generate_problems(7, 50)
    assert generate_problems(7, 50) != generate_problems(8, 50)
    assert ArithTask(seed=3).test_problems(11) == ArithTask(seed=3).test_problems(11)


def test_arith_splits_have_the_promised_properties() -> None:
    task = ArithTask()
    train, test = task.train_problems(), task.test_problems(12345)
    assert len(train) == 2000
    assert len(test) >= 200
    # Every result one-digit operands give: 1..7 by subtraction, 4..18 by addition.
    assert {_final(p) for p in test} == set(range(1, 19))
    assert not {p.question for p in train} & {p.question for p in test}
    exemplar_questions = {shot["question"] for shot in task.exemplars()}
    for problem in train + test:
        answer = _final(problem)
        assert problem.question not in exemplar_questions
        assert str(answer) not in problem.question
        # The worked line's calculator annotation holds the arithmetic that gives the answer.
        calculation = re.search(r"<<(\d+)([+-])(\d+)=(\d+)>>", problem.answer)
        assert calculation is not None
        a, op, b, result = calculation.groups()
        assert int(a) + (int(b) if op == "+" else -int(b)) == int(result) == answer
        assert 2 <= int(a) <= MAX_OPERAND and 2 <= int(b) <= MAX_OPERAND
        assert is_correct(problem.answer, problem.answer)


def test_arith_exemplars_have_the_gsm8k_shape() -> None:
    shots = ArithTask().few_shot_messages()
    assert [m["role"] for m in shots] == ["user", "assistant"] * 4
    for question, response in zip(shots[::2], shots[1::2], strict=True):
        assert question["content"].startswith("Question: ")
        assert question["content"].endswith("\nLet's think step by step\nAnswer:")
        match = re.search(r"\nThe answer is (\d+)\n$", response["content"])
        assert match is not None
        assert extract_answer(response["content"]) == match.group(1)


def test_arith_data_files(tmp_path: Path) -> None:
    task = ArithTask()
    train_file = task.download_train_data(tmp_path / "data")
    assert train_file == tmp_path / "data" / "train.jsonl"
    assert read_problems(train_file) == task.train_problems()
    first = task.load_test_problems(tmp_path / "eval", limit=10)
    seed_file = tmp_path / "eval" / "arith" / "test-seed"
    assert first == task.test_problems(int(seed_file.read_text()))[:10]
    assert seed_file.stat().st_mode & 0o077 == 0
    # The same evaluator storage keeps its split; another storage draws another one.
    assert task.load_test_problems(tmp_path / "eval", limit=10) == first
    assert task.load_test_problems(tmp_path / "other", limit=10) != first


def test_arith_test_split_cannot_be_rebuilt_from_public_code() -> None:
    """What an agent can import (the task, its public seed) gives the train split, never the test."""
    task = ArithTask()
    # About 11,000 distinct questions exist; the public stream's first 8,800 hold most of them.
    public = {p.question for p in generate_problems(task.seed, 4 * (task.train_size + task.test_size))}
    secret = {p.question for p in task.test_problems(secrets.randbits(63))}
    train = {p.question for p in task.train_problems()}
    assert not secret & train
    # The public stream's tail was the old test split: a fresh secret one shares little with it.
    assert len(secret & (public - train)) < len(secret)


# --- gsm8k data --------------------------------------------------------------------------------


def _fixture(split: str) -> list[Problem]:
    return read_problems(FIXTURE_DIR / "gsm8k" / f"{split}.jsonl")


@pytest.mark.parametrize("source", [FIXTURE_DIR, FIXTURE_DIR / "gsm8k"], ids=["task-folder", "flat"])
def test_gsm8k_train_data_from_a_source_folder(tmp_path: Path, source: Path) -> None:
    task = GSM8KTask()
    target = task.download_train_data(tmp_path, source_dir=source)
    assert target == tmp_path / "train.jsonl"
    assert read_problems(target) == _fixture("train")
    assert os.stat(target).st_mode & 0o777 == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["train.jsonl"]
    for line in target.read_text(encoding="utf-8").splitlines():
        assert set(json.loads(line)) == {"question", "answer"}


def test_gsm8k_train_data_is_written_once(tmp_path: Path) -> None:
    task = GSM8KTask()
    source = tmp_path / "source"
    source.mkdir()
    problem = Problem("Zoë pays 3 € for 4 crêpes. How much?", "3*4=<<3*4=12>>12\n#### 12")
    (source / "train.jsonl").write_text(
        json.dumps({"question": problem.question, "answer": problem.answer, "extra": 1}, ensure_ascii=False)
        + "\n",
        encoding="utf-8",
    )
    target = task.download_train_data(tmp_path / "data", source_dir=source)
    assert "Zoë pays 3 € for 4 crêpes" in target.read_text(encoding="utf-8")
    assert read_problems(target) == [problem]
    # Present already: kept as is, even when another source is named.
    assert task.download_train_data(tmp_path / "data", source_dir=FIXTURE_DIR) == target
    assert read_problems(target) == [problem]


def test_gsm8k_test_split_is_cached_for_the_evaluator(tmp_path: Path) -> None:
    task = GSM8KTask()
    problems = task.load_test_problems(tmp_path, source_dir=FIXTURE_DIR)
    assert problems == _fixture("test")
    cache = tmp_path / "gsm8k" / "test.jsonl"
    assert read_problems(cache) == problems
    # From the cache now: no source needed.
    assert task.load_test_problems(tmp_path, limit=5) == problems[:5]


def test_gsm8k_source_folder_without_the_split(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError) as refused:
        GSM8KTask().load_test_problems(tmp_path / "eval", source_dir=tmp_path)
    assert str(refused.value) == (
        f"data source folder {tmp_path} has no test split: put it at {tmp_path / 'gsm8k' / 'test.jsonl'} "
        f"or {tmp_path / 'test.jsonl'} (AUTORL_DATA_SOURCE_DIR names this folder)"
    )


def test_gsm8k_source_file_without_problems(tmp_path: Path) -> None:
    (tmp_path / "test.jsonl").write_text("")
    with pytest.raises(ConfigurationError) as refused:
        GSM8KTask().load_test_problems(tmp_path / "eval", source_dir=tmp_path)
    assert str(refused.value) == f"{tmp_path / 'test.jsonl'} holds no problems"
    assert not (tmp_path / "eval").exists(), "nothing cached from an empty source"


def test_gsm8k_source_file_without_final_answers(tmp_path: Path) -> None:
    (tmp_path / "train.jsonl").write_text(json.dumps({"question": "q", "answer": "42"}) + "\n")
    with pytest.raises(ConfigurationError, match=r"train.jsonl: problem 1 has no '#### N' answer line"):
        GSM8KTask().download_train_data(tmp_path / "data", source_dir=tmp_path)


def test_gsm8k_without_hub_or_source_names_the_setting(tmp_path: Path) -> None:
    # A fresh interpreter, so that the hub libraries read the offline switch at import.
    code = (
        "import sys; from pathlib import Path; from autorl.tasks import get_task\n"
        "get_task('gsm8k').download_train_data(Path(sys.argv[1]))\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    result = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "data")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0
    assert "ConfigurationError" in result.stderr
    assert "set AUTORL_DATA_SOURCE_DIR" in result.stderr
    assert not (tmp_path / "data" / "train.jsonl").exists()


@pytest.mark.parametrize("split", ["train", "test"])
def test_gsm8k_split_without_hub_or_source_names_the_split_and_the_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, split: str
) -> None:
    # In this interpreter: the hub's offline switch and empty caches, so nothing can be found.
    import datasets.config
    from huggingface_hub import constants

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "datasets")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    task = GSM8KTask()
    with pytest.raises(ConfigurationError) as refused:
        if split == "train":
            task.download_train_data(tmp_path / "data")
        else:
            task.load_test_problems(tmp_path / "eval")
    message = str(refused.value)
    # The hub's own error, by its class: what went wrong, for the operator to look up.
    cause = refused.value.__cause__
    assert cause is not None
    assert message.startswith(f"could not download openai/gsm8k (main, {split}): {type(cause).__name__}: ")
    assert message.endswith(
        "with no access to the Hugging Face hub, set AUTORL_DATA_SOURCE_DIR to a folder holding "
        "gsm8k/train.jsonl and gsm8k/test.jsonl (one {'question', 'answer'} object a line)"
    )
    assert not (tmp_path / "data").exists() and not (tmp_path / "eval").exists(), "nothing half-written"


@pytest.fixture
def offline_hub_with_gsm8k(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The hub offline and a datasets cache that holds openai/gsm8k (both configurations), as a
    download from the hub leaves it; the hub's own cache empty."""
    import datasets.config
    from huggingface_hub import constants

    cache = tmp_path / "datasets"
    build_gsm8k_cache(cache, FIXTURE_DIR / "gsm8k", tmp_path / "build")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    return tmp_path


def test_gsm8k_train_split_comes_from_the_hub_datasets_main_config(offline_hub_with_gsm8k: Path) -> None:
    target = offline_hub_with_gsm8k / "data"
    GSM8KTask().download_train_data(target)
    assert read_problems(target / "train.jsonl") == _fixture("train")


def test_gsm8k_test_split_comes_from_the_hub_dataset_and_is_cached(offline_hub_with_gsm8k: Path) -> None:
    eval_dir = offline_hub_with_gsm8k / "eval"
    expected = _fixture("test")
    assert GSM8KTask().load_test_problems(eval_dir) == expected
    assert read_problems(eval_dir / "gsm8k" / "test.jsonl") == expected
    assert GSM8KTask().load_test_problems(eval_dir, limit=3) == expected[:3]


def test_gsm8k_download_without_the_datasets_package_names_the_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "datasets", None)  # `import datasets` raises ImportError
    with pytest.raises(ConfigurationError) as refused:
        GSM8KTask().download_train_data(tmp_path / "data")
    assert str(refused.value) == (
        "downloading openai/gsm8k needs the `datasets` package (pip install 'autorl[ml]'); with no "
        "access to the Hugging Face hub, set AUTORL_DATA_SOURCE_DIR to a folder holding "
        "gsm8k/train.jsonl and gsm8k/test.jsonl (one {'question', 'answer'} object a line)"
    )
    assert not (tmp_path / "data").exists()


# --- prompts -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def chat_tokenizer() -> ChatTokenizer:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    corpus = [p.question + " " + p.answer for p in _fixture("train")]
    backend.train_from_iterator(
        corpus, trainers.WordLevelTrainer(special_tokens=["[UNK]", "<|im_start|>", "<|im_end|>"])
    )
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", eos_token="<|im_end|>")
    tokenizer.chat_template = CHATML
    return tokenizer


def _turn(role: str, content: str) -> str:
    return f"<|im_start|>{role}\n{content}<|im_end|>\n"


def test_gsm8k_prompt_is_opencompass_4_shot(chat_tokenizer: ChatTokenizer) -> None:
    question = "A box has {n} 3 pens and 4 pencils. How many?"
    prompt = GSM8KTask().render_prompt(chat_tokenizer, question)
    turns = re.findall(r"<\|im_start\|>(\w+)\n(.*?)<\|im_end\|>\n", prompt, re.DOTALL)
    assert [role for role, _ in turns] == ["user", "assistant"] * 4 + ["user"]
    assert turns[0][1].startswith("Question: Angelo and Melanie want to plan")
    responses = [text for role, text in turns if role == "assistant"]
    assert [extract_answer(text) for text in responses] == ["4", "201", "140", "146"]
    assert all(re.search(r"\nThe answer is \d+\n$", text) for text in responses)
    assert prompt.endswith(
        _turn("user", f"Question: {question}\nLet's think step by step\nAnswer:\n")
        + "<|im_start|>assistant\n"
    )


def test_arith_prompt_uses_its_own_exemplars(chat_tokenizer: ChatTokenizer) -> None:
    task = ArithTask()
    problem = task.test_problems(7)[0]
    prompt = task.render_prompt(chat_tokenizer, problem.question)
    # OpenCompass's meta template ends every user turn with a newline; the training prompt does too.
    messages = evaluation_messages(task.build_messages(problem.question))
    assert all(m["content"].endswith("\n") for m in messages if m["role"] == "user")
    expected = "".join(_turn(m["role"], m["content"]) for m in messages)
    assert prompt == expected + "<|im_start|>assistant\n"
    assert "Angelo" not in prompt
    assert prompt.count("Let's think step by step") == 5
