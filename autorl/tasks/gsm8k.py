"""GSM8K: data, the OpenCompass ``gsm8k_gen_1d7fe4`` prompt, answer extraction, reward and scoring.

Three scoring protocols, all on a 0-100 scale:

- ``opencompass`` reproduces OpenCompass's ``gsm8k_postprocess`` (prediction),
  ``gsm8k_dataset_postprocess`` (reference) and ``Gsm8kEvaluator`` (equality) exactly, after
  removing reasoning content the way its ``extract_non_reasoning_content`` does, so the in-process
  backend and OpenCompass agree on every sample. The headline score.
- ``flexible`` is :func:`is_correct`: the number after ``####``, else the last number.
- ``strict`` counts only an answer written after ``####``.
"""

from __future__ import annotations

import json
import re
from abc import abstractmethod
from collections.abc import Mapping, Sequence
from importlib.resources import files
from pathlib import Path
from typing import Any, Literal

from autorl.errors import ConfigurationError
from autorl.tasks.base import Problem, Task, read_problems, write_problems

ScoringProtocol = Literal["opencompass", "flexible", "strict"]
PROTOCOLS: tuple[ScoringProtocol, ...] = ("opencompass", "flexible", "strict")

HF_DATASET = "openai/gsm8k"
HF_CONFIG = "main"
#: Absolute numeric tolerance of :func:`is_correct` (and of OpenCompass's equality rule).
TOLERANCE = 1e-6

_NUMBER = r"-?\d[\d,]*\.?\d*"
_MARKED_ANSWER = re.compile(r"####\s*(" + _NUMBER + ")")
_ANY_NUMBER = re.compile(_NUMBER)
# OpenCompass's gsm8k_postprocess pattern: a comma ends a number, hence its comma quirk.
_OC_NUMBER = re.compile(r"\-?\d+\.\d+|\-?\d+")
_THINK_START = "<think>"
_THINK_END = "</think>"
_THINK_BLOCK = re.compile(_THINK_START + "(.*?)" + _THINK_END, re.DOTALL)

#: The user turn of OpenCompass's gsm8k_gen_1d7fe4 prompt.
QUESTION_TEMPLATE = "Question: {question}\nLet's think step by step\nAnswer:"


# --- answer extraction and the flexible / strict protocols -----------------------------------


def _clean_number(raw: str) -> str:
    number = raw.replace(",", "")
    return number[:-1] if number.endswith(".") else number


def extract_answer(text: str) -> str | None:
    """The number after the first ``####`` followed by one, else the last number; None if none.

    Commas and one trailing ``.`` are removed; the rest is kept as written (``42.0`` stays
    ``42.0``, ``$18.50`` gives ``18.50``).
    """
    marked = _MARKED_ANSWER.search(text)
    if marked:
        return _clean_number(marked.group(1))
    numbers = _ANY_NUMBER.findall(text)
    return _clean_number(numbers[-1]) if numbers else None


def _marked_answer(text: str) -> str | None:
    marked = _MARKED_ANSWER.search(text)
    return _clean_number(marked.group(1)) if marked else None


def _numerically_equal(predicted: str | None, expected: str | None) -> bool:
    if predicted is None or expected is None:
        return False
    try:
        return abs(float(predicted) - float(expected)) < TOLERANCE
    except (ValueError, OverflowError):
        return False


def is_correct(completion: str, reference: str) -> bool:
    """Whether ``completion``'s answer equals ``reference`` within 1e-6 (so ``42.0`` equals ``42``).

    ``reference`` is a GSM8K answer field (``"... #### 42"``) or a bare number.
    """
    return _numerically_equal(extract_answer(completion), extract_answer(reference))


def _completion_text(completion: Any) -> str:
    """A completion as TRL passes it: a string, or (conversational) a list of chat messages."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Sequence) and completion and isinstance(completion[-1], Mapping):
        content = completion[-1].get("content", "")
        if isinstance(content, str):
            return content
        # Multimodal-style content: a list of typed parts, of which only text can hold an answer.
        return "".join(part.get("text", "") for part in content if isinstance(part, Mapping))
    kind = type(completion).__name__
    raise TypeError(f"a completion must be a string or a list of chat messages, got {kind}")


def reward(completions: Sequence[Any], answer: Sequence[str] | str, **kwargs: Any) -> list[float]:
    """TRL reward function: +1.0 where :func:`is_correct`, else -1.0.

    ``answer`` is the dataset column TRL passes through (one reference per completion), or a
    single reference for all of them; other keyword arguments (``prompts``, ...) are ignored.
    """
    references = [answer] * len(completions) if isinstance(answer, str) else list(answer)
    if len(references) != len(completions):
        raise ValueError(f"{len(completions)} completions but {len(references)} answers")
    return [
        1.0 if is_correct(_completion_text(c), ref) else -1.0
        for c, ref in zip(completions, references, strict=True)
    ]


# --- the OpenCompass protocol ----------------------------------------------------------------


def strip_reasoning(text: str) -> str:
    """Remove reasoning content as OpenCompass's ``extract_non_reasoning_content`` does.

    With a ``</think>`` but no ``<think>`` the text after the last ``</think>`` is kept; otherwise
    every ``<think>…</think>`` block is removed (an unclosed ``<think>`` is left alone). The result
    is stripped of surrounding whitespace either way.
    """
    if _THINK_START not in text and _THINK_END in text:
        return text.split(_THINK_END)[-1].strip()
    return _THINK_BLOCK.sub("", text).strip()


def opencompass_postprocess(text: str) -> str:
    """OpenCompass's ``gsm8k_postprocess``, to the character.

    The text is cut at the first ``Question:`` (a model that goes on to invent the next few-shot
    turn is not penalised), then the last match of ``-?\\d+\\.\\d+|-?\\d+`` is returned, or
    ``"NULL"`` when there is none. Quirks kept on purpose: commas are not part of a number, so
    ``1,234`` yields ``"234"``; ``####`` gets no special treatment (``#### 42 apples, 3 left``
    yields ``"3"``); a ``-`` between numbers makes the second negative (``5-3`` yields ``"-3"``).
    """
    numbers = _OC_NUMBER.findall(text.split("Question:")[0])
    return numbers[-1] if numbers else "NULL"


def _opencompass_reference(reference: str) -> str:
    """OpenCompass's ``gsm8k_dataset_postprocess``: the text after the first ``#### `` (up to a
    second one), commas removed. A bare number, which OpenCompass never sees, is used as is
    (commas removed) rather than raising as OpenCompass would."""
    parts = reference.split("#### ")
    return (parts[1] if len(parts) > 1 else reference).replace(",", "")


def _opencompass_is_equal(prediction: str, reference: str) -> bool:
    """``Gsm8kEvaluator.is_equal``: string equality, else ``|float(pred) - int(ref)| < 1e-6``.

    ``int`` means a non-integer reference is only ever matched character for character
    (``18.50`` does not match ``18.5``), and any conversion error counts as wrong.
    """
    if prediction == reference:
        return True
    try:
        return abs(float(prediction) - int(reference)) < TOLERANCE
    except (ValueError, OverflowError):
        return False


def _opencompass_correct(completion: str, reference: str) -> bool:
    prediction = opencompass_postprocess(strip_reasoning(completion))
    return _opencompass_is_equal(prediction, _opencompass_reference(reference))


def _strict_correct(completion: str, reference: str) -> bool:
    return _numerically_equal(_marked_answer(completion), extract_answer(reference))


_JUDGES = {"opencompass": _opencompass_correct, "flexible": is_correct, "strict": _strict_correct}


def judgements(
    completions: Sequence[str], references: Sequence[str], protocol: ScoringProtocol | str = "opencompass"
) -> list[bool]:
    """Whether each completion is judged correct under ``protocol``, in order.

    ``references`` are GSM8K answer fields or bare numbers. Raises ``ValueError`` on empty or
    unequal-length input and on an unknown protocol.
    """
    if protocol not in _JUDGES:
        raise ValueError(f"unknown protocol {protocol!r}; use one of {', '.join(PROTOCOLS)}")
    if not completions:
        raise ValueError("no completions to score")
    if len(completions) != len(references):
        raise ValueError(f"{len(completions)} completions but {len(references)} references")
    judge = _JUDGES[protocol]
    return [judge(c, r) for c, r in zip(completions, references, strict=True)]


def accuracy(
    completions: Sequence[str], references: Sequence[str], protocol: ScoringProtocol = "opencompass"
) -> float:
    """Percentage (0-100, unrounded) of completions judged correct under ``protocol``
    (:func:`judgements`, whose errors it raises)."""
    judged = judgements(completions, references, protocol)
    return 100 * sum(judged) / len(judged)


# --- tasks in the GSM8K format -----------------------------------------------------------------


def question_turn(question: str) -> str:
    """The user turn asking ``question``."""
    # Substituted as OpenCompass's safe_format does (str.replace): a question may hold braces.
    return QUESTION_TEMPLATE.replace("{question}", question)


class GSM8KFormatTask(Task):
    """A task whose answers are GSM8K answer fields, asked with the gsm8k_gen_1d7fe4 prompt shape."""

    max_new_tokens = 512
    #: OpenCompass's gsm8k_gen_1d7fe4 prompt, turns merged as its chat wrappers merge them.
    prompt_version = "gsm8k_gen_1d7fe4/1"

    @abstractmethod
    def exemplars(self) -> list[dict[str, str]]:
        """The four few-shot ``{"question", "response"}`` pairs (responses end ``The answer is N``)."""

    def few_shot_messages(self) -> list[dict[str, str]]:
        messages: list[dict[str, str]] = []
        for shot in self.exemplars():
            messages.append({"role": "user", "content": question_turn(shot["question"])})
            messages.append({"role": "assistant", "content": shot["response"]})
        return messages

    def build_messages(self, question: str) -> list[dict[str, str]]:
        return [*self.few_shot_messages(), {"role": "user", "content": question_turn(question)}]

    def score(self, completions: Sequence[str], answers: Sequence[str]) -> dict[str, float]:
        return {protocol: accuracy(completions, answers, protocol) for protocol in PROTOCOLS}

    def judge(self, completions: Sequence[str], answers: Sequence[str], protocol: str) -> list[bool]:
        return judgements(completions, answers, protocol)

    def reward(self, completions: Sequence[Any], answer: Any, **kwargs: Any) -> list[float]:
        return reward(completions, answer, **kwargs)


def _source_file(source_dir: Path, task: str, split: str) -> Path:
    candidates = [source_dir / task / f"{split}.jsonl", source_dir / f"{split}.jsonl"]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise ConfigurationError(
        f"data source folder {source_dir} has no {split} split: put it at "
        f"{candidates[0]} or {candidates[1]} (AUTORL_DATA_SOURCE_DIR names this folder)"
    )


def _read_gsm8k_file(path: Path) -> list[Problem]:
    problems = read_problems(path)
    for number, problem in enumerate(problems, start=1):
        # The OpenCompass reference rule needs "#### " to find the answer.
        if "#### " not in problem.answer:
            raise ConfigurationError(f"{path}: problem {number} has no '#### N' answer line")
    if not problems:
        raise ConfigurationError(f"{path} holds no problems")
    return problems


def _download_split(split: str) -> list[Problem]:
    fix = (
        "with no access to the Hugging Face hub, set AUTORL_DATA_SOURCE_DIR to a folder holding "
        "gsm8k/train.jsonl and gsm8k/test.jsonl (one {'question', 'answer'} object a line)"
    )
    try:
        import datasets
    except ImportError as exc:
        raise ConfigurationError(
            f"downloading {HF_DATASET} needs the `datasets` package (pip install 'autorl[ml]'); {fix}"
        ) from exc
    try:
        rows = datasets.load_dataset(HF_DATASET, HF_CONFIG, split=split)
    except Exception as exc:  # network, hub and offline-mode failures all have the same fix
        raise ConfigurationError(
            f"could not download {HF_DATASET} ({HF_CONFIG}, {split}): {type(exc).__name__}: {exc}; {fix}"
        ) from exc
    return [Problem(str(row["question"]), str(row["answer"])) for row in rows]


class GSM8KTask(GSM8KFormatTask):
    """Grade-school math word problems: 7,473 train, 1,319 test."""

    name = "gsm8k"

    def description(self) -> str:
        return _DESCRIPTION

    def exemplars(self) -> list[dict[str, str]]:
        text = files("autorl.tasks").joinpath("data/gsm8k_few_shot.json").read_text(encoding="utf-8")
        shots: list[dict[str, str]] = json.loads(text)
        return shots

    def download_train_data(self, target_dir: Path, *, source_dir: Path | None = None) -> Path:
        """``target_dir/train.jsonl`` from ``source_dir`` (air-gapped) or the hub; kept if present."""
        target = target_dir / "train.jsonl"
        if target.is_file():
            return target
        problems = (
            _read_gsm8k_file(_source_file(source_dir, self.name, "train"))
            if source_dir is not None
            else _download_split("train")
        )
        return write_problems(target, problems)

    def load_test_problems(
        self, eval_data_dir: Path, *, source_dir: Path | None = None, limit: int | None = None
    ) -> list[Problem]:
        """The test split, cached as ``eval_data_dir/gsm8k/test.jsonl``; the first ``limit`` if set."""
        cache = eval_data_dir / self.name / "test.jsonl"
        if not cache.is_file():
            problems = (
                _read_gsm8k_file(_source_file(source_dir, self.name, "test"))
                if source_dir is not None
                else _download_split("test")
            )
            write_problems(cache, problems)
        problems = _read_gsm8k_file(cache)
        return problems if limit is None else problems[:limit]


_DESCRIPTION = """\
# GSM8K

Grade-school math word problems. Each needs a few steps of arithmetic and has one integer answer.

## Data

`$DATA_PATH/train.jsonl` holds the train split: one JSON object a line with `question` and
`answer`. The answer field is worked reasoning with calculator annotations such as
`<<48/2=24>>`, ending in a line `#### N` with the final answer. The test split is never shown.

## Evaluation

Your model is asked each test question in its own chat template, after four worked examples
(OpenCompass `gsm8k_gen_1d7fe4`): every user turn reads
`Question: ...\\nLet's think step by step\\nAnswer:` and every example answer ends with
`The answer is N`. Generation is greedy, at most 512 new tokens.

The score is exact-match accuracy (0-100) as OpenCompass computes it: reasoning inside
`<think>...</think>` is removed, the reply is cut at the first `Question:`, and the last number in
what remains is the prediction. Write the final answer as the last number, without thousands
separators: in `1,234` only `234` counts.

`autorl.tasks.gsm8k.reward(completions, answer)` is a ready TRL reward function (+1 / -1).
"""
