"""Twin splits: each test problem asked again with other numbers and its answer recomputed, so that a
model that learned the public test set by heart scores on the problems and not on their twins."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from autorl.provenance.twins import (
    TWIN_SEED_FILE,
    arith_twin,
    kept_share,
    twin_for,
    twin_problem,
    twin_seed,
    twin_split,
)
from autorl.tasks.arith import MAX_OPERAND, ArithTask, generate_problems
from autorl.tasks.base import Problem, read_problems

GSM8K_DATA = Path(__file__).resolve().parents[1] / "data" / "gsm8k"
#: The share of the fixture problems that has a twin is about 97% (95-98% over 40 seeds); the pencil
#: problem (its answer rounds 12.5 packs up to 13 outside any annotation) never has one.
KEPT_FLOOR = 0.85

NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")
ANNOTATION = re.compile(r"<<([^<>=]*)=([^<>=]*)>>")
ARITHMETIC = re.compile(r"[\d.+\-*/() ]+")

NATALIA = Problem(
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips to friends "
    "in May. How many clips did Natalia sell altogether in April and May?",
    "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
    "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72",
)


def gsm8k_problems() -> list[Problem]:
    return read_problems(GSM8K_DATA / "test.jsonl") + read_problems(GSM8K_DATA / "train.jsonl")


def python_value(expression: str) -> float:
    """The oracle: Python's own arithmetic, on a string of digits and operators only."""
    assert ARITHMETIC.fullmatch(expression), expression
    value = eval(expression, {"__builtins__": {}})
    assert isinstance(value, int | float)
    return float(value)


def numbers(text: str) -> list[str]:
    return NUMBER.findall(text)


def assert_clean_twin(original: Problem, twin: Problem) -> None:
    """What every twin must be: the original's words with other numbers, consistently; every
    annotation true; the final answer a non-negative integer, the last result, not the original's."""
    assert twin.question != original.question
    # Only numbers change, in the question and in the solution.
    assert NUMBER.sub("#", twin.question) == NUMBER.sub("#", original.question)
    assert NUMBER.sub("#", twin.answer) == NUMBER.sub("#", original.answer)
    # The same original number became the same new number wherever it occurs in the question.
    mapping: dict[str, set[str]] = {}
    for before, after in zip(numbers(original.question), numbers(twin.question), strict=True):
        mapping.setdefault(before, set()).add(after)
    assert all(len(new) == 1 for new in mapping.values()), mapping
    results = []
    calculations = zip(ANNOTATION.findall(original.answer), ANNOTATION.findall(twin.answer), strict=True)
    for (_, was), (expression, result) in calculations:
        assert python_value(expression) == pytest.approx(float(result), rel=1e-12), (expression, result)
        # A whole number of things stays whole (half of 48 clips, not half of 47).
        assert "." in was or result.isdigit(), (was, result)
        results.append(float(result))
    final = twin.answer.rsplit("#### ", 1)[1]
    assert final.isdigit()
    assert int(final) == results[-1]
    assert final != original.answer.rsplit("#### ", 1)[1]


def test_most_fixture_problems_get_a_clean_twin() -> None:
    problems = gsm8k_problems()
    twins = twin_split(problems, seed=1)
    share = kept_share(twins)
    print(f"twins kept: {share:.0%} of {len(problems)} fixture problems")
    assert share >= KEPT_FLOOR
    for original, twin in zip(problems, twins, strict=True):
        if twin is not None:
            assert_clean_twin(original, twin)


def test_a_twin_split_is_the_same_for_a_seed_and_another_for_another_seed() -> None:
    problems = gsm8k_problems()
    first = twin_split(problems, seed=7)
    assert len(first) == len(problems)
    assert twin_split(problems, seed=7) == first
    assert twin_split(problems, seed=8) != first
    # A problem's twin depends on the seed and its place, not on the other problems.
    assert twin_split([NATALIA, *problems[1:]], seed=7)[1:] == first[1:]


def test_a_whole_number_along_the_way_stays_whole() -> None:
    """Half of 17 cookies would give a whole final answer (8.5 * 2) through half a cookie."""
    problem = Problem(
        "Mia bakes 18 cookies and eats half of them. Her brother eats twice as many as Mia ate. "
        "How many cookies does her brother eat?",
        "Mia eats 18/2=<<18/2=9>>9 cookies.\nHer brother eats 9*2=<<9*2=18>>18 cookies.\n#### 18",
    )
    twins = [twin_problem(problem, random.Random(seed)) for seed in range(20)]
    assert all(twins)
    for twin in twins:
        assert twin is not None
        assert_clean_twin(problem, twin)


def test_natalia_keeps_half_of_her_clips_a_whole_number() -> None:
    pattern = re.compile(
        r"Natalia sold (\d+)/2 = <<\1/2=(\d+)>>\2 clips in May\.\n"
        r"Natalia sold \1\+\2 = <<\1\+\2=(\d+)>>\3 clips altogether in April and May\.\n#### \3"
    )
    for seed in range(20):
        twin = twin_problem(NATALIA, random.Random(seed))
        assert twin is not None
        match = pattern.fullmatch(twin.answer)
        assert match is not None, twin.answer
        april, may, total = (int(group) for group in match.groups())
        assert april % 2 == 0 and april != 48
        assert (may, total) == (april // 2, april + april // 2)
        assert twin.question == NATALIA.question.replace("48", str(april))
        assert_clean_twin(NATALIA, twin)


@pytest.mark.parametrize(
    "problem",
    [
        pytest.param(
            Problem(
                "Tom has 5 bags with 6 apples each and 3 loose apples. He eats 4 apples. How many are left?",
                "He has 33 apples.\nAfter eating he has 33-4=<<33-4=29>>29 apples.\n#### 29",
            ),
            id="a number computed outside the annotations",
        ),
        pytest.param(
            Problem(
                "Tom has 5 bags of 6 apples. He eats 4 apples. How many are left?",
                "He has 5*6 = 30 apples.\nHe has 30-4=<<30-4=26>>26 left.\n#### 26",
            ),
            id="a calculation outside the annotations",
        ),
        pytest.param(
            Problem(
                "Ann has 3 bags of 4 apples. How many apples does she have?",
                "She has three bags of 4 apples, so 3*4=<<3*4=12>>12 apples.\n#### 12",
            ),
            id="a number the solution writes as a word",
        ),
        pytest.param(
            Problem(
                "Ann earns $3 an hour and works 4 hours a month. How much does she earn in a year?",
                "She earns 3*4=$<<3*4=12>>12 a month.\n"
                "In a year she earns 12*12=$<<12*12=144>>144.\n#### 144",
            ),
            id="a result that equals a constant the question names (months in a year)",
        ),
        pytest.param(
            Problem(
                "Ben has 9 apples. He packs them in bags of nine apples. How many bags does he fill?",
                "He fills 9/9=<<9/9=1>>1 bag.\n#### 1",
            ),
            id="every new value gives a fraction of a bag",
        ),
        pytest.param(
            Problem(
                "Ann shares 10 cakes among 3 friends. How much cake does each friend get?",
                "Each friend gets 10/3=<<10/3=3.33>>3.33 cakes.\n#### 3.33",
            ),
            id="an annotation that is rounded",
        ),
        pytest.param(
            Problem(
                "A baker makes 7 cakes every day. How many cakes does he make in a week?",
                "In a week he makes 7*7=<<7*7=49>>49 cakes.\n#### 49",
            ),
            id="an input that may be the days of a week",
        ),
        pytest.param(
            Problem(
                "Leo buys 4 packs of 6 cards and gives 5 away. How many cards did he buy?",
                "He buys 4*6=<<4*6=24>>24 cards.\nHe keeps 24-5=<<24-5=19>>19 cards.\n#### 24",
            ),
            id="the final answer is an earlier result",
        ),
        pytest.param(
            next(p for p in gsm8k_problems() if p.question.startswith("A store sells pencils")),
            id="the final answer rounds the last result up",
        ),
    ],
)
def test_no_twin_where_the_rewrite_cannot_be_sure(problem: Problem) -> None:
    assert all(twin_problem(problem, random.Random(seed)) is None for seed in range(20))


def test_arith_twins_follow_the_generator_rules_and_its_scoring() -> None:
    task = ArithTask()
    problems = generate_problems(5, 200)
    twins = twin_split(problems, seed=3, twin=twin_for(task.name))
    share = kept_share(twins)
    print(f"arith twins kept: {share:.0%} of {len(problems)}")
    assert share >= 0.9
    kept = [(problem, twin) for problem, twin in zip(problems, twins, strict=True) if twin is not None]
    for original, twin in kept:
        assert_clean_twin(original, twin)
        [(a, b, c)] = re.findall(r"<<(\d+)[+-](\d+)=(\d+)>>", twin.answer)
        assert 2 <= int(a) <= MAX_OPERAND and 2 <= int(b) <= MAX_OPERAND
        assert int(c) > 0 and c not in twin.question
        assert twin.answer.endswith(f"\n#### {c}")
    # A correct reply to each twin, written as the few-shot exemplars are, scores 100 under the
    # task's own scoring; the original's answers (what a model that learned the test set by heart
    # replies) score nothing on the twins.
    answers = [twin.answer for _, twin in kept]
    worked = [f"{twin.answer.splitlines()[0]}\nThe answer is {twin.answer.split()[-1]}" for _, twin in kept]
    learned = [f"The answer is {original.answer.split()[-1]}" for original, _ in kept]
    assert task.score(worked, answers)["opencompass"] == 100
    assert task.score(worked, answers)["flexible"] == 100
    assert task.score(learned, answers)["opencompass"] == 0


def test_each_task_has_its_twin_function() -> None:
    assert twin_for("arith") is arith_twin
    assert twin_for("gsm8k") is twin_problem


def test_kept_share_counts_the_problems_with_a_twin() -> None:
    assert kept_share([None, NATALIA, NATALIA, None]) == 0.5
    with pytest.raises(ValueError, match="no problems"):
        kept_share([])


def test_the_twin_seed_is_made_once_in_evaluator_storage_and_kept_private(tmp_path: Path) -> None:
    seed = twin_seed(tmp_path / "gsm8k")
    seed_file = tmp_path / "gsm8k" / TWIN_SEED_FILE
    assert int(seed_file.read_text()) == seed
    assert seed_file.stat().st_mode & 0o077 == 0
    assert twin_seed(tmp_path / "gsm8k") == seed
    assert twin_seed(tmp_path / "other") != seed
