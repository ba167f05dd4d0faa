"""Twin splits: each test problem asked again with other numbers, its answer recomputed.

A model that learned the public test set by heart answers the test problems and not their twins;
one that learned to solve them answers both. A twin keeps the problem's words and changes the
question numbers its solution computes with (the *inputs*): each gets a nearby value of its kind,
the same new value wherever it occurs. The solution's calculator annotations (``<<48/2=24>>``) are
evaluated again in order, exactly (rational arithmetic on a parsed expression, never ``eval``), an
annotation that uses an earlier result using its new value; the text follows them (an annotation's
echo ``48/2 = ``, the result written after it, every other number of the solution, ``#### N``).

Correctness comes before the share kept: a problem has no twin (None) whenever the rewrite cannot
be sure of it, that is when

* a number the solution computes with or writes is neither a question number, an earlier result
  nor a constant (:data:`CONSTANTS`, or a number word of the question such as "half" or "dozen");
* a number may stand for several of those and they do not give the same new value (an input that
  equals a constant, "7 cakes a week", is never changed);
* an annotation is not exact (``<<10/3=3.33>>``), the solution computes outside its annotations
  (an ``=`` not followed by one), or the final answer is not the last annotation's result;
* in the twin a result that was an integer is not, a result changes sign or cannot be written as
  a short decimal, or the final answer is not a non-negative integer other than the original's.

Numbers that are not a plain count or amount keep their value: 0 and 1 (whose wording differs,
"1 apple"), fractions (``1/5``), years, times (``3:00``, ``6 pm``), ordinals, ranges, decimals below 1, and
percentages other than multiples of 5 up to 95. Each problem tries :data:`ATTEMPTS` draws from the
``random.Random`` it is given, so :func:`twin_split` gives the same twins for the same seed.
"""

from __future__ import annotations

import ast
import random
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

from autorl.tasks.arith import ArithTask, follows_generator_rules
from autorl.tasks.base import Problem
from autorl.tasks.seeds import secret_seed

#: A twin function: a problem and the random source of its draws → its twin, or None.
Twin = Callable[[Problem, random.Random], Problem | None]

#: The file in a task's evaluator data folder that holds the seed of its twin split.
TWIN_SEED_FILE = "twin-seed"
#: Draws of new numbers tried per problem before it is left without a twin.
ATTEMPTS = 32
#: The chance that a draw keeps an input's value: some twins need one input kept (``4*12.25``
#: stays a whole number of dollars only with a multiple of 4 pies).
KEEP_SHARE = 0.25
#: Numbers a solution may bring in from outside its question: a pair, days a week, ten, months a
#: year, hours a day, days a month, weeks a year, minutes an hour, percent, days a year, kilo-.
#: One the question names (:data:`_NAMED_BY`: "week" names 7) is never an input and may stand for
#: itself wherever it occurs; another only where nothing else (an input, a result) fits.
CONSTANTS = frozenset(Fraction(n) for n in (1, 2, 7, 10, 12, 24, 30, 52, 60, 100, 365, 1000))
#: Largest magnitude of any value in a recomputed chain.
LIMIT = 10**12
#: Most decimal places a recomputed number may need to be written.
MAX_PLACES = 6

_NUMBER = re.compile(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?")
_FRACTION = re.compile(r"(?<![\d.])(\d+)/(\d+)(?![\d.])")
_ANNOTATION = re.compile(r"<<([^<>=]*)=([^<>=]*)>>")
_FINAL = re.compile(r"####\s*(-?\d[\d,]*(?:\.\d+)?)\s*$")
_EXPRESSION = re.compile(r"[\d.+\-*/()% ]{1,200}")
_RESULT = re.compile(r"-?(?:\d+(?:\.\d*)?|\.\d+)")
# Number words split from one string (a list literal would take a line a word).
_UNITS = (  # noqa: SIM905
    "one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen"
).split()
_TENS = "twenty thirty forty fifty sixty seventy eighty ninety".split()  # noqa: SIM905
_WORDS: dict[str, tuple[Fraction, ...]] = {
    **{word: (Fraction(n),) for n, word in enumerate(_UNITS, start=1)},
    **{word: (Fraction(10 * n),) for n, word in enumerate(_TENS, start=2)},
    "hundred": (Fraction(100),),
    "thousand": (Fraction(1000),),
    "half": (Fraction(2), Fraction(1, 2)),
    "halves": (Fraction(2), Fraction(1, 2)),
    "third": (Fraction(3), Fraction(1, 3)),
    "quarter": (Fraction(4), Fraction(1, 4)),
    "fourth": (Fraction(4), Fraction(1, 4)),
    "fifth": (Fraction(5), Fraction(1, 5)),
    "tenth": (Fraction(10), Fraction(1, 10)),
    "twice": (Fraction(2),),
    "double": (Fraction(2),),
    "pair": (Fraction(2),),
    "couple": (Fraction(2),),
    "both": (Fraction(2),),
    "triple": (Fraction(3),),
    "thrice": (Fraction(3),),
    "dozen": (Fraction(12),),
}
_WORD = re.compile(r"\b(" + "|".join(sorted(_WORDS, key=len, reverse=True)) + r")s?\b", re.IGNORECASE)
_COMPOUND = re.compile(rf"\b({'|'.join(_TENS)})-({'|'.join(_UNITS[:9])})\b", re.IGNORECASE)
_ONE = Fraction(1)
_PERCENT = Fraction(1, 100)
_CLOCK = re.compile(r"\s*(?:am|pm|a\.m|p\.m|o'clock)\b")
#: The words that name each constant: only a question with one of them may use it where an input
#: or a result could be meant (a 12 that may be months is never taken for a result of 12).
_NAMED_BY = {
    Fraction(value): re.compile("|".join(rf"\b{re.escape(word)}" for word in words), re.IGNORECASE)
    for value, words in {
        2: ("half", "twice", "double", "pair", "both", "couple", "twin", "round trip", "there and back"),
        7: ("week",),
        10: ("decade", "dime"),
        12: ("dozen", "year", "month", "annual", "foot", "feet", "inch"),
        24: ("day", "daily", "hour"),
        30: ("month",),
        52: ("year", "annual", "week"),
        60: ("hour", "minute", "second"),
        100: ("percent", "%", "cent", "century"),
        365: ("year", "annual"),
        1000: ("kilo", "thousand", "milli"),
    }.items()
}


@dataclass(frozen=True)
class _Source:
    """What a number of the solution may stand for: a question input (times ``scale``: a
    percentage's ``30`` is ``0.3`` in a product), an earlier result, or (neither) itself."""

    input: Fraction | None = None
    scale: Fraction = _ONE
    result: int | None = None

    def new_value(
        self, value: Fraction, inputs: Mapping[Fraction, Fraction], results: Sequence[Fraction]
    ) -> Fraction:
        if self.input is not None:
            return inputs[self.input] * self.scale
        if self.result is not None:
            return results[self.result]
        return value


_ITSELF = _Source()


@dataclass(frozen=True)
class _Span:
    """Where a piece of an answer is: ``answer[start:end]``."""

    start: int
    end: int


@dataclass(frozen=True)
class _Slot(_Span):
    """A number to rewrite: where it is, as written, and what it may stand for."""

    text: str
    sources: tuple[_Source, ...]

    @property
    def value(self) -> Fraction:
        return Fraction(self.text.replace(",", ""))

    def new_value(self, inputs: Mapping[Fraction, Fraction], results: Sequence[Fraction]) -> Fraction | None:
        """The new value, or None where the sources disagree (the number is ambiguous in this twin)."""
        values = {source.new_value(self.value, inputs, results) for source in self.sources}
        return values.pop() if len(values) == 1 else None


@dataclass(frozen=True)
class _Annotation(_Span):
    """One ``<<expression=result>>``: its span in the answer, its operands (spans in the expression)."""

    expression: str
    operands: tuple[_Slot, ...]
    result: Fraction
    result_text: str


@dataclass(frozen=True)
class _Plan:
    """What a problem's twins rewrite, found once; each draw then fills in new values."""

    inputs: tuple[tuple[Fraction, bool], ...]  # each input's value and whether it is a percentage
    question_slots: tuple[_Slot, ...]
    annotations: tuple[_Annotation, ...]
    answer_slots: tuple[_Slot, ...]  # the answer's numbers outside annotations, ``#### N`` last


def twin_problem(
    problem: Problem, rng: random.Random, *, accept: Callable[[Problem], bool] | None = None
) -> Problem | None:
    """A twin of a GSM8K-format ``problem`` with its answer recomputed, or None when no clean one
    is found (see the module's rules); with ``accept``, only a twin it accepts."""
    plan = _plan(problem)
    if plan is None:
        return None
    for _ in range(ATTEMPTS):
        twin = _draw(plan, problem, rng)
        if twin is not None and (accept is None or accept(twin)):
            return twin
    return None


def arith_twin(problem: Problem, rng: random.Random) -> Problem | None:
    """A twin of an arith problem: :func:`twin_problem` kept only where the twin follows the arith
    generator's rules (operands from 2 to its maximum, a positive result not in the question)."""
    return twin_problem(problem, rng, accept=follows_generator_rules)


_TASK_TWINS: dict[str, Twin] = {ArithTask.name: arith_twin}


def twin_for(task_name: str) -> Twin:
    """The twin function of the task registered as ``task_name`` (:func:`twin_problem` unless the
    task has rules of its own)."""
    return _TASK_TWINS.get(task_name, twin_problem)


def twin_split(problems: Sequence[Problem], seed: int, *, twin: Twin = twin_problem) -> list[Problem | None]:
    """One entry per problem, in order: its twin, or None. Each problem draws from a random source
    of its own (``f"{seed}:{index}"``), so a twin depends on its problem, place and seed only."""
    return [twin(problem, random.Random(f"{seed}:{index}")) for index, problem in enumerate(problems)]


def kept_share(twins: Sequence[Problem | None]) -> float:
    """The share (0-1) of problems that have a twin."""
    if not twins:
        raise ValueError("no problems to twin")
    return sum(twin is not None for twin in twins) / len(twins)


def twin_seed(folder: Path) -> int:
    """The twin split's secret seed in a task's evaluator data folder (``folder/twin-seed``)."""
    return secret_seed(folder, TWIN_SEED_FILE)


# --- what a problem's twins rewrite -------------------------------------------------------------


@dataclass(frozen=True)
class _Known:
    """What a number of the solution may stand for besides an earlier result: an input of the
    question, a value that stays (a question number that is not an input, a number word, a constant
    the question names), or, when nothing else fits, a constant the question does not name."""

    inputs: Mapping[Fraction, _Source]
    fixed: frozenset[Fraction]
    fallback: frozenset[Fraction]

    def sources(self, value: Fraction, earlier: Sequence[_Annotation]) -> tuple[_Source, ...]:
        sources = [
            _Source(result=index) for index, annotation in enumerate(earlier) if annotation.result == value
        ]
        if value in self.inputs:
            sources.append(self.inputs[value])
        if value in self.fixed or (not sources and value in self.fallback):
            sources.append(_ITSELF)
        return tuple(sources)


def _plan(problem: Problem) -> _Plan | None:
    final = _FINAL.search(problem.answer)
    if final is None or problem.answer.count("####") != 1:
        return None
    body = problem.answer[: final.start()]
    changeable, fixed = _question_numbers(problem.question)
    inputs = {value: _Source(input=value) for value in changeable}
    inputs |= {
        value * _PERCENT: _Source(input=value, scale=_PERCENT) for value in changeable if changeable[value]
    }
    fallback = CONSTANTS - fixed
    annotations = _annotations(body, _Known(inputs, fixed, fallback))
    if annotations is None or not annotations or annotations[-1].result != _number(final.group(1)):
        return None
    used = {s.input for a in annotations for o in a.operands for s in o.sources if s.input is not None}
    if not used:
        return None
    kept = {value for value in changeable if value not in used}
    kept |= {value * _PERCENT for value in kept if changeable[value]}
    text_inputs = {value: source for value, source in inputs.items() if source.input in used}
    answer_slots = _answer_slots(body, annotations, _Known(text_inputs, fixed | kept, fallback))
    # A number written as a word ("three bags") cannot follow the new numbers.
    if answer_slots is None or _number_words(body) & {*text_inputs, *(a.result for a in annotations)}:
        return None
    final_slot = _Slot(final.start(1), final.end(1), final.group(1), (_Source(result=len(annotations) - 1),))
    question_slots = tuple(
        _Slot(m.start(), m.end(), m.group(), (_Source(input=_number(m.group())),))
        for m in _NUMBER.finditer(problem.question)
        if _number(m.group()) in used
    )
    return _Plan(
        inputs=tuple((value, changeable[value]) for value in sorted(used)),
        question_slots=question_slots,
        annotations=tuple(annotations),
        answer_slots=(*answer_slots, final_slot),
    )


def _question_numbers(question: str) -> tuple[dict[Fraction, bool], frozenset[Fraction]]:
    """The question's changeable values (→ whether a percentage) and the values that stay: its
    other numbers, fractions and number words, and the constants it names (:data:`_NAMED_BY`)."""
    changeable: dict[Fraction, bool] = {}
    fixed = {_ONE}
    for match in _NUMBER.finditer(question):
        value = _number(match.group())
        rest = question[match.end() :].lower()
        percent = rest.startswith(("%", " percent"))
        if (
            _is_plain(question, match)
            and not _CLOCK.match(rest)
            and _is_changeable(match.group(), value, percent)
        ):
            changeable[value] = changeable.get(value, False) or percent
        else:
            fixed.update((value, value * _PERCENT) if percent else (value,))
    for numerator, denominator in _FRACTION.findall(question):
        if int(denominator):
            fixed.add(Fraction(int(numerator), int(denominator)))
    fixed |= _number_words(question)
    fixed.update(value for value, names in _NAMED_BY.items() if names.search(question))
    fixed.update(value * _PERCENT for value, percent in changeable.items() if percent and value in fixed)
    return {value: percent for value, percent in changeable.items() if value not in fixed}, frozenset(fixed)


def _number_words(text: str) -> set[Fraction]:
    """The values of the number words in ``text`` ("half" is both 2 and 1/2, "twenty-five" 25)."""
    values = {value for match in _WORD.finditer(text) for value in _WORDS[match.group(1).lower()]}
    for match in _COMPOUND.finditer(text):
        values.add(_WORDS[match.group(1).lower()][0] + _WORDS[match.group(2).lower()][0])
    return values


def _is_plain(text: str, match: re.Match[str]) -> bool:
    """Whether a number stands alone: not part of a fraction, time, range, ordinal, code or list."""
    before = text[match.start() - 1] if match.start() else " "
    after = text[match.end() : match.end() + 2] + "  "
    return not (
        before.isalnum()
        or before in "/:-._,"
        or after[0].isalnum()
        or after[0] in "/:_"
        or (after[0] in ",.-" and after[1].isdigit())
    )


def _is_changeable(text: str, value: Fraction, percent: bool) -> bool:
    if text.startswith("0"):
        return False
    if percent:
        return value.denominator == 1 and value % 5 == 0 and 5 <= value <= 95
    if value.denominator != 1:
        return value >= 1
    return value >= 2 and not ("," not in text and 1900 <= value <= 2100)


def _annotations(body: str, known: _Known) -> list[_Annotation] | None:
    """The body's annotations with the sources of their operands, or None where one is not exact,
    an operand is untraceable, or the body computes outside its annotations."""
    annotations: list[_Annotation] = []
    for match in _ANNOTATION.finditer(body):
        expression, result_text = match.group(1), match.group(2).strip()
        operands = _operand_spans(expression)
        if operands is None or not _RESULT.fullmatch(result_text):
            return None
        result = Fraction(result_text)
        if _value(expression) != result:
            return None
        slots = []
        for start, end in operands:
            text = expression[start:end]
            sources = known.sources(Fraction(text), annotations)
            if not sources:
                return None
            slots.append(_Slot(start, end, text, sources))
        annotations.append(
            _Annotation(match.start(), match.end(), expression, tuple(slots), result, result_text)
        )
    outside = _ANNOTATION.sub(lambda m: "@" * len(m.group()), body)
    if "<<" in outside or ">>" in outside or re.search(r"=(?![\s$]*@)", outside):
        return None
    return annotations


def _answer_slots(body: str, annotations: Sequence[_Annotation], known: _Known) -> list[_Slot] | None:
    """Every number of the body outside the annotations with what it may stand for: the result an
    annotation is followed by, the echo of an annotation's expression before it (``48/2 = <<``),
    else any input, earlier result or fixed value of its value; None if a number is none of them."""
    slots: list[_Slot] = []
    numbers = [
        m for m in _NUMBER.finditer(body) if not any(a.start <= m.start() < a.end for a in annotations)
    ]
    for index, annotation in enumerate(annotations):
        line_start = body.rfind("\n", 0, annotation.start) + 1
        previous_end = annotations[index - 1].end if index else 0
        echo = [
            m
            for m in numbers
            if max(line_start, previous_end) <= m.start()
            and m.end() <= annotation.start
            and not (index and m.start() == previous_end)
        ]
        operands = annotation.operands
        if len(echo) >= len(operands) and [_number(m.group()) for m in echo[len(echo) - len(operands) :]] == [
            o.value for o in operands
        ]:
            for match, operand in zip(echo[len(echo) - len(operands) :], operands, strict=True):
                slots.append(_Slot(match.start(), match.end(), match.group(), operand.sources))
    placed = {slot.start for slot in slots}
    for match in numbers:
        if match.start() in placed:
            continue
        value = _number(match.group())
        after = [i for i, a in enumerate(annotations) if a.end == match.start() and a.result == value]
        if after:
            sources: tuple[_Source, ...] = (_Source(result=after[0]),)
        else:
            earlier = [a for a in annotations if a.end <= match.start()]
            sources = known.sources(value, earlier)
        if not sources:
            return None
        slots.append(_Slot(match.start(), match.end(), match.group(), sources))
    return sorted(slots, key=lambda slot: slot.start)


# --- one draw --------------------------------------------------------------------------------


def _draw(plan: _Plan, problem: Problem, rng: random.Random) -> Problem | None:
    inputs = {
        value: value if rng.random() < KEEP_SHARE else _nearby(value, percent, rng)
        for value, percent in plan.inputs
    }
    results: list[Fraction] = []
    rewritten: list[tuple[int, int, str]] = []
    for annotation in plan.annotations:
        operands = _rewritten_slots(annotation.operands, inputs, results)
        if operands is None:
            return None
        expression = _spliced(annotation.expression, operands)
        result = _value(expression)
        if result is None or not _keeps_kind(annotation.result, result):
            return None
        written_result = _written(result, annotation.result_text)
        if written_result is None:
            return None
        results.append(result)
        rewritten.append((annotation.start, annotation.end, f"<<{expression}={written_result}>>"))
    final = results[-1]
    if final.denominator != 1 or final < 0 or final == plan.annotations[-1].result:
        return None
    answer_numbers = _rewritten_slots(plan.answer_slots, inputs, results)
    if answer_numbers is None:
        return None
    rewritten.extend(answer_numbers)
    question_numbers = []
    for slot in plan.question_slots:
        written = _written(inputs[slot.value], slot.text)
        if written is None:
            return None
        question_numbers.append((slot.start, slot.end, written))
    question = _spliced(problem.question, question_numbers)
    if question == problem.question:
        return None
    return Problem(question, _spliced(problem.answer, rewritten))


def _rewritten_slots(
    slots: Sequence[_Slot], inputs: Mapping[Fraction, Fraction], results: Sequence[Fraction]
) -> list[tuple[int, int, str]] | None:
    """Each slot's span and its new value as written, or None where one is ambiguous or cannot be
    written as its original is."""
    spans = []
    for slot in slots:
        new = slot.new_value(inputs, results)
        written = None if new is None else _written(new, slot.text)
        if written is None:
            return None
        spans.append((slot.start, slot.end, written))
    return spans


def _nearby(value: Fraction, percent: bool, rng: random.Random) -> Fraction:
    """A new value of the same kind near ``value``: a percentage another multiple of 5 within 20
    points; an integer one with as many digits and trailing zeros, within half of it (at least 2
    either way), never below 2; a decimal the same fractional part on another whole part."""
    if percent:
        return Fraction(
            rng.choice(
                [p for p in range(max(5, int(value) - 20), min(95, int(value) + 20) + 1, 5) if p != value]
            )
        )
    whole = int(value)
    return _nearby_integer(whole, rng, lowest=2 if value.denominator == 1 else 1) + (value - whole)


def _nearby_integer(number: int, rng: random.Random, *, lowest: int) -> int:
    scale = 1
    while number >= 10 and number % 10 == 0:
        number, scale = number // 10, scale * 10
    digits = len(str(number))
    spread = max(2, number // 2)
    low = max(lowest, 10 ** (digits - 1), number - spread)
    high = min(10**digits - 1, number + spread)
    return rng.choice([n for n in range(low, high + 1) if n != number]) * scale


def _keeps_kind(original: Fraction, new: Fraction) -> bool:
    """A recomputed result stays an integer if it was one, keeps its sign and stays in bounds."""
    sign = (original > 0) - (original < 0)
    return (
        (original.denominator != 1 or new.denominator == 1)
        and (new > 0) - (new < 0) == sign
        and abs(new) <= LIMIT
    )


def _written(value: Fraction, like: str) -> str | None:
    """``value`` written as ``like`` is: thousands separators if it has them, its decimal places if
    they end in 0 (``18.50``), else as few places as the value needs; None past :data:`MAX_PLACES`."""
    decimals = like.partition(".")[2]
    places = len(decimals) if decimals.endswith("0") else 0
    while (value * 10**places).denominator != 1:
        places += 1
        if places > MAX_PLACES:
            return None
    whole, part = divmod(abs(int(value * 10**places)), 10**places)
    text = f"{whole:,}" if "," in like else str(whole)
    return ("-" if value < 0 else "") + text + (f".{part:0{places}d}" if places else "")


def _spliced(text: str, replacements: Sequence[tuple[int, int, str]]) -> str:
    parts, position = [], 0
    for start, end, new in sorted(replacements):
        parts += [text[position:start], new]
        position = end
    return "".join([*parts, text[position:]])


def _number(text: str) -> Fraction:
    return Fraction(text.replace(",", ""))


# --- exact arithmetic ------------------------------------------------------------------------

_OPERATORS: dict[type[ast.operator], Callable[[Fraction, Fraction], Fraction | None]] = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b if b else None,
    ast.FloorDiv: lambda a, b: Fraction(a // b) if b else None,
    ast.Mod: lambda a, b: a % b if b else None,
    ast.Pow: lambda a, b: a**b.numerator if b.denominator == 1 and 0 <= b <= 12 and abs(a) <= 10**6 else None,
}


def _parsed(expression: str) -> ast.expr | None:
    if not _EXPRESSION.fullmatch(expression):
        return None
    try:
        return ast.parse(expression.strip(), mode="eval").body
    except SyntaxError:
        return None


def _operand_spans(expression: str) -> list[tuple[int, int]] | None:
    """The spans of an arithmetic expression's numbers, or None if it is not one."""
    tree = _parsed(expression)
    if tree is None:
        return None
    offset = len(expression) - len(expression.lstrip())
    spans = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant):
            if (
                not isinstance(node.value, int | float)
                or isinstance(node.value, bool)
                or node.end_col_offset is None
            ):
                return None
            spans.append((offset + node.col_offset, offset + node.end_col_offset))
        elif not isinstance(node, ast.BinOp | ast.UnaryOp | ast.operator | ast.unaryop):
            return None
    return sorted(spans)


def _value(expression: str) -> Fraction | None:
    """The exact value of an arithmetic expression (numbers, ``+ - * / // % **``, parentheses), or
    None if it is not one, divides by zero or leaves :data:`LIMIT`."""
    tree = _parsed(expression)
    return None if tree is None else _evaluated(tree, expression.strip())


def _evaluated(node: ast.expr, source: str) -> Fraction | None:
    value: Fraction | None = None
    if isinstance(node, ast.Constant) and node.end_col_offset is not None:
        value = Fraction(source[node.col_offset : node.end_col_offset])
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        operand = _evaluated(node.operand, source)
        value = None if operand is None else -operand if isinstance(node.op, ast.USub) else operand
    elif isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _evaluated(node.left, source), _evaluated(node.right, source)
        if left is not None and right is not None:
            value = _OPERATORS[type(node.op)](left, right)
    return value if value is not None and abs(value) <= LIMIT else None
