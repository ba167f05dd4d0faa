"""What every task provides: data, the few-shot chat prompt, scoring and the RL reward."""

from __future__ import annotations

import hashlib
import json
import os
import random
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from autorl.errors import ConfigurationError


@dataclass(frozen=True)
class Problem:
    """One problem; ``answer`` is a GSM8K answer field (``"...reasoning... #### 42"``)."""

    question: str
    answer: str


class ChatTokenizer(Protocol):
    """The part of a transformers tokenizer that prompt rendering uses."""

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...


class Task(ABC):
    """A benchmark task. Instances are stateless; the registry builds them."""

    #: Registry key, e.g. ``"gsm8k"``.
    name: str
    #: Generation limit at evaluation (OpenCompass's ``max_out_len``).
    max_new_tokens: int = 512
    #: The version of the prompt the evaluator asks with (few-shot turns, question template, how
    #: turns are merged); part of the evaluation key. Change it whenever the prompt text changes.
    prompt_version: str = "1"

    @abstractmethod
    def description(self) -> str:
        """Markdown written to the workspace's ``description.md``."""

    @abstractmethod
    def download_train_data(self, target_dir: Path, *, source_dir: Path | None = None) -> Path:
        """Write ``target_dir/train.jsonl`` (once) and return its path."""

    @abstractmethod
    def load_test_problems(
        self, eval_data_dir: Path, *, source_dir: Path | None = None, limit: int | None = None
    ) -> list[Problem]:
        """The test split, in a fixed order; only the evaluator calls this."""

    def load_validation_problems(
        self, eval_data_dir: Path, *, source_dir: Path | None = None
    ) -> list[Problem]:
        """The validation split of sealed mode (:func:`split_train`): carved from the whole train
        split, which the evaluator keeps in its own storage (``eval_data_dir/<task>/train.jsonl``)."""
        whole = read_problems(self.download_train_data(eval_data_dir / self.name, source_dir=source_dir))
        return split_train(whole)[1]

    @abstractmethod
    def few_shot_messages(self) -> list[dict[str, str]]:
        """Four user/assistant exemplar pairs."""

    @abstractmethod
    def score(self, completions: Sequence[str], answers: Sequence[str]) -> dict[str, float]:
        """Accuracy (0-100, unrounded) under each protocol: ``opencompass``, ``flexible``, ``strict``."""

    @abstractmethod
    def judge(self, completions: Sequence[str], answers: Sequence[str], protocol: str) -> list[bool]:
        """Per completion, in order: whether it is correct under ``protocol`` (what ``score`` counts)."""

    @abstractmethod
    def reward(self, completions: Sequence[Any], answer: Any, **kwargs: Any) -> list[float]:
        """A TRL reward function: one float per completion."""

    @abstractmethod
    def build_messages(self, question: str) -> list[dict[str, str]]:
        """The few-shot turns followed by the user turn asking ``question``."""

    def render_prompt(self, tokenizer: ChatTokenizer, question: str, **template_kwargs: Any) -> str:
        """The prompt text exactly as the evaluator feeds it to the model: the few-shot turns and the
        question shaped as OpenCompass shapes them (:func:`evaluation_messages`), in the model's own
        chat template with the generation prompt. Agents that train on this text train on what is
        scored."""
        rendered = tokenizer.apply_chat_template(
            evaluation_messages(self.build_messages(question)),
            tokenize=False,
            add_generation_prompt=True,
            **template_kwargs,
        )
        if not isinstance(rendered, str):
            raise TypeError(f"apply_chat_template returned {type(rendered).__name__}, expected str")
        return rendered


#: What OpenCompass's default meta template appends to every user turn: its round is
#: ``HUMAN, SYSTEM→HUMAN, BOT``, and the empty SYSTEM slot becomes a HUMAN turn merged into the
#: previous one with a newline. The dataset config does not write it; the model sees it.
USER_TURN_SUFFIX = "\n"


def evaluation_messages(messages: Sequence[dict[str, str]]) -> list[dict[str, str]]:
    """Chat turns as OpenCompass (``HuggingFacewithChatTemplate``, ``VLLMwithChatTemplate``) hands them
    to the chat template: a newline after every user turn, empty turns dropped, consecutive turns of
    one role merged with a newline."""
    merged: list[dict[str, str]] = []
    for message in messages:
        content = message["content"] + USER_TURN_SUFFIX if message["role"] == "user" else message["content"]
        if not content:
            continue
        if merged and merged[-1]["role"] == message["role"]:
            merged[-1] = {"role": message["role"], "content": merged[-1]["content"] + "\n" + content}
        else:
            merged.append({"role": message["role"], "content": content})
    return merged


class ProblemFileError(ConfigurationError, ValueError):
    """A problems file that is not JSON lines of ``{"question", "answer"}`` objects: the message names
    the file, the line and the fix (a ValueError too, as this refusal always was)."""


_PROBLEM_FILE_FIX = (
    'each line must be one JSON object with string "question" and "answer": fix the file or put a good '
    "copy in its place"
)


def read_problems(path: Path) -> list[Problem]:
    """Problems from a JSON-lines file of ``{"question", "answer"}`` objects; errors name the line."""
    problems: list[Problem] = []
    try:
        with path.open(encoding="utf-8") as lines:
            for number, line in enumerate(lines, start=1):
                if line.strip():
                    problems.append(_problem(path, number, line))
    except UnicodeDecodeError as exc:
        raise ProblemFileError(f"{path}: not UTF-8 text ({exc}); {_PROBLEM_FILE_FIX}") from exc
    return problems


def _problem(path: Path, number: int, line: str) -> Problem:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ProblemFileError(f"{path}:{number}: not JSON ({exc}); {_PROBLEM_FILE_FIX}") from exc
    if not (
        isinstance(record, dict)
        and isinstance(record.get("question"), str)
        and isinstance(record.get("answer"), str)
    ):
        raise ProblemFileError(
            f'{path}:{number}: expected an object with string "question" and "answer"; {_PROBLEM_FILE_FIX}'
        )
    return Problem(record["question"], record["answer"])


#: Sealed mode's validation split: GSM8K's is 500 of its 7,473 train problems; every task carves
#: the same share of its train split (arith: 134 of 2,000), chosen with this fixed seed.
VALIDATION_SEED = 20261204
VALIDATION_SHARE = (500, 7473)


def validation_size(train_size: int) -> int:
    """How many of ``train_size`` train problems the validation split takes (at least 1, at
    most all but 1, when there are two or more)."""
    share = round(train_size * VALIDATION_SHARE[0] / VALIDATION_SHARE[1])
    return max(1, min(share, train_size - 1)) if train_size >= 2 else 0


def split_train(problems: Sequence[Problem]) -> tuple[list[Problem], list[Problem]]:
    """The train split divided for sealed mode: (what the agent gets, the validation split).
    The validation problems are drawn with :data:`VALIDATION_SEED` from the positions of the
    whole train split, so the same split always gives the same division; both parts keep the
    split's order, and neither holds a problem of the other."""
    drawn = set(random.Random(VALIDATION_SEED).sample(range(len(problems)), validation_size(len(problems))))
    train = [problem for index, problem in enumerate(problems) if index not in drawn]
    validation = [problem for index, problem in enumerate(problems) if index in drawn]
    return train, validation


def write_agent_train(whole_train: Path, target_dir: Path) -> Path:
    """``target_dir/train.jsonl``: the whole train split at ``whole_train`` without the
    validation problems (what a sealed experiment's agent gets); written once."""
    target = target_dir / "train.jsonl"
    if target.is_file():
        return target
    return write_problems(target, split_train(read_problems(whole_train))[0])


def split_sha256(problems: Sequence[Problem]) -> str:
    """SHA-256 of a split as JSON lines: exactly the bytes :func:`write_problems` writes (so, for a
    split cached as a file, the file's bytes). Part of the evaluation key."""
    digest = hashlib.sha256()
    for problem in problems:
        digest.update((_problem_line(problem) + "\n").encode("utf-8"))
    return digest.hexdigest()


def _problem_line(problem: Problem) -> str:
    return json.dumps({"question": problem.question, "answer": problem.answer}, ensure_ascii=False)


def write_problems(path: Path, problems: Sequence[Problem]) -> Path:
    """Write JSON lines atomically: readers see the old file or the whole new one, never a part."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            for problem in problems:
                out.write(_problem_line(problem) + "\n")
            out.flush()
            os.fsync(out.fileno())
            # mkstemp creates 0600; the data is meant to be read by other users (a sandboxed agent).
            os.fchmod(out.fileno(), 0o644)
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    return path
