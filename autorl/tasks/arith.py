"""arith: synthetic one-step word problems in the GSM8K format, generated offline.

Each problem adds or subtracts two one-digit numbers, so that a tiny model trained for minutes on a
CPU learns it: the platform's demo (``make run``) shows a randomly initialised model going from 0 to
most answers right without network access. Answers are GSM8K answer fields
(``... <<a+b=c>>c ... #### c``) and the prompt has the gsm8k_gen_1d7fe4 shape, so scoring is
exactly GSM8K's.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from pathlib import Path

from autorl.tasks.base import Problem, write_problems
from autorl.tasks.gsm8k import GSM8KFormatTask
from autorl.tasks.seeds import secret_seed

DEFAULT_SEED = 0
TRAIN_SIZE = 2000
TEST_SIZE = 200
#: Operands are drawn uniformly from 2..MAX_OPERAND (1 is left out so that no question reads
#: "1 apples").
MAX_OPERAND = 9
# One-digit operands are what the builtin 2-layer model learns within a CPU demo's budget: fine-tuned
# on 32 problems a step it got 35% of the test split right after 270 steps, 50% after 430 and 96%
# after 600 (at 16 a step: 40-76% after 750 steps, three data orders). With operands up to 19 it
# stayed below 20% after 2,500 steps, up to 49 below 10%. Names and items keep the questions varied
# (about 11,000 distinct ones) while the arithmetic stays learnable.
_OPERANDS = range(2, MAX_OPERAND + 1)

_NAMES = ("Ann", "Ben", "Cleo", "Dan", "Eva", "Finn", "Gia", "Hugo")
_ITEMS = ("apples", "pens", "cards", "books", "shells", "coins", "cups", "eggs")


@dataclass(frozen=True)
class _Template:
    question: str
    working: str
    subtract: bool


# {n}: a name, {i}: an item (plural), {a} and {b}: the operands, {c}: the result,
# {calc}: the GSM8K calculator annotation (left out of the few-shot exemplars, as in GSM8K's).
_TEMPLATES = (
    _Template(
        "{n} has {a} {i}. {n} gets {b} more {i}. How many {i} does {n} have now?",
        "{n} has {a} + {b} = {calc}{c} {i} now.",
        subtract=False,
    ),
    _Template(
        "{n} has {a} {i}. {n} gives away {b} {i}. How many {i} does {n} have left?",
        "{n} has {a} - {b} = {calc}{c} {i} left.",
        subtract=True,
    ),
    _Template(
        "There are {a} {i} in a box. {n} puts in {b} more {i}. How many {i} are in the box now?",
        "The box holds {a} + {b} = {calc}{c} {i} now.",
        subtract=False,
    ),
    _Template(
        "There are {a} {i} on a table. {n} takes {b} {i} away. How many {i} are on the table now?",
        "The table holds {a} - {b} = {calc}{c} {i} now.",
        subtract=True,
    ),
)

# One exemplar per template; generated problems never repeat these questions.
_EXEMPLAR_SPECS = (
    (0, "Ivy", "stamps", 6, 7),
    (1, "Jack", "marbles", 9, 4),
    (2, "Kim", "beads", 3, 8),
    (3, "Leo", "plates", 8, 6),
)


def _render(
    template: _Template, name: str, item: str, a: int, b: int, *, annotate: bool
) -> tuple[str, str, int]:
    """The question, the worked answer line and the result."""
    sign, c = ("-", a - b) if template.subtract else ("+", a + b)
    calc = f"<<{a}{sign}{b}={c}>>" if annotate else ""
    fields = {"n": name, "i": item, "a": a, "b": b, "c": c, "calc": calc}
    return template.question.format(**fields), template.working.format(**fields), c


def _exemplar_shots() -> list[dict[str, str]]:
    shots = []
    for index, name, item, a, b in _EXEMPLAR_SPECS:
        question, working, c = _render(_TEMPLATES[index], name, item, a, b, annotate=False)
        shots.append({"question": question, "response": f"{working}\nThe answer is {c}\n"})
    return shots


def generate_problems(seed: int, count: int) -> list[Problem]:
    """``count`` distinct problems, the same for the same seed.

    Each answer is a positive integer that does not occur anywhere in its question's text (not
    even inside a larger number), so it cannot be copied from the question.
    """
    rng = random.Random(seed)
    seen = {shot["question"] for shot in _exemplar_shots()}
    problems: list[Problem] = []
    while len(problems) < count:
        template = rng.choice(_TEMPLATES)
        a, b = rng.choices(_OPERANDS, k=2)
        if template.subtract and a <= b:
            a, b = b, a
            if a == b:
                continue
        question, working, c = _render(template, rng.choice(_NAMES), rng.choice(_ITEMS), a, b, annotate=True)
        problem = Problem(question, f"{working}\n#### {c}")
        if question in seen or not follows_generator_rules(problem):
            continue
        seen.add(question)
        problems.append(problem)
    return problems


_CALCULATION = re.compile(r"<<(\d+)([+-])(\d+)=(\d+)>>")


def follows_generator_rules(problem: Problem) -> bool:
    """Whether ``problem``'s numbers keep the generator's rules: one sum or difference of two
    operands from 2 to :data:`MAX_OPERAND`, whose result is positive, is the ``#### N`` answer and
    occurs nowhere in the question (not even inside a larger number)."""
    calculations = _CALCULATION.findall(problem.answer)
    if len(calculations) != 1:
        return False
    a, sign, b, c = calculations[0]
    left, right, result = int(a), int(b), int(c)
    return (
        left in _OPERANDS
        and right in _OPERANDS
        and result == (left - right if sign == "-" else left + right)
        and result > 0
        and problem.answer.endswith(f"\n#### {result}")
        and c not in problem.question
    )


#: The file in the evaluator's data folder that holds the test split's secret seed.
TEST_SEED_FILE = "test-seed"


class ArithTask(GSM8KFormatTask):
    """Offline arithmetic word problems.

    The train split comes from a public seed (it is the agent's anyway); the test split from a
    secret seed kept in the evaluator's own storage, created once and readable by the platform
    alone, so no code an agent can read or import rebuilds it. Test questions never repeat a train
    question; both splits are drawn from the same distribution.
    """

    name = "arith"
    #: A worked answer here is one sentence and `#### N` (under 40 tokens of the builtin tokenizer);
    #: 64 leaves room, and an untrained model's reply no longer costs 512 steps of decoding.
    max_new_tokens = 64

    def __init__(self, seed: int = DEFAULT_SEED, train_size: int = TRAIN_SIZE, test_size: int = TEST_SIZE):
        self.seed = seed
        self.train_size = train_size
        self.test_size = test_size

    def train_problems(self) -> list[Problem]:
        """The train split: the first ``train_size`` problems of the seeded stream."""
        return generate_problems(self.seed, self.train_size + self.test_size)[: self.train_size]

    def test_problems(self, secret_seed: int) -> list[Problem]:
        """The test split drawn from ``secret_seed``: ``test_size`` problems, none a train question."""
        train = {problem.question for problem in self.train_problems()}
        # Distinct problems, at most len(train) of them train questions: enough remain.
        drawn = generate_problems(secret_seed, self.test_size + len(train))
        return [problem for problem in drawn if problem.question not in train][: self.test_size]

    def description(self) -> str:
        return _DESCRIPTION.format(
            train_size=self.train_size, max_operand=MAX_OPERAND, max_new_tokens=self.max_new_tokens
        )

    def exemplars(self) -> list[dict[str, str]]:
        return _exemplar_shots()

    def download_train_data(self, target_dir: Path, *, source_dir: Path | None = None) -> Path:
        """Write the generated train split to ``target_dir/train.jsonl`` (kept if present).

        ``source_dir`` is accepted for the common interface and unused: nothing is downloaded.
        """
        target = target_dir / "train.jsonl"
        if target.is_file():
            return target
        return write_problems(target, self.train_problems())

    def load_test_problems(
        self, eval_data_dir: Path, *, source_dir: Path | None = None, limit: int | None = None
    ) -> list[Problem]:
        """The test split of this evaluator storage's secret seed; the first ``limit`` if set."""
        problems = self.test_problems(secret_test_seed(eval_data_dir / self.name))
        return problems if limit is None else problems[:limit]


def secret_test_seed(folder: Path) -> int:
    """The test split's seed: :func:`~autorl.tasks.seeds.secret_seed` in ``folder/test-seed``."""
    return secret_seed(folder, TEST_SEED_FILE)


_DESCRIPTION = """\
# arith

Short arithmetic word problems: one addition or subtraction of two numbers from 2 to \
{max_operand}, e.g. "Ann has 8 apples. Ann gets 7 more apples. How many apples does Ann have now?".

## Data

`$DATA_PATH/train.jsonl` holds {train_size} problems: one JSON object a line with `question` and
`answer`. The answer field follows GSM8K: worked reasoning with a calculator annotation such as
`<<8+7=15>>`, ending in a line `#### N` with the final answer. The test split is drawn from the
same distribution with a seed only the evaluator holds: it is never shown and cannot be rebuilt.

## Evaluation

Exactly as for GSM8K: four worked examples, then `Question: ...\\nLet's think step by step\\nAnswer:`
in the model's chat template; greedy, at most {max_new_tokens} new tokens. The score is exact-match accuracy
(0-100) as OpenCompass computes it: the reply is cut at the first `Question:` and the last number
in what remains is the prediction.

`autorl.tasks.gsm8k.reward(completions, answer)` is a ready TRL reward function (+1 / -1).
"""
