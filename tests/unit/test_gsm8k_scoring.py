"""The GSM8K scoring contract: answer extraction, correctness, reward and the three protocols."""

from __future__ import annotations

import pytest

from autorl.tasks import get_task
from autorl.tasks.gsm8k import (
    accuracy,
    extract_answer,
    is_correct,
    opencompass_postprocess,
    reward,
    strip_reasoning,
)

GSM8K_ANSWER = "Natalia sold 48/2=<<48/2=24>>24 clips in May.\nShe sold 48+24=<<48+24=72>>72 in all.\n#### 72"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("#### 1,234", "1234"),
        ("#### -3", "-3"),
        ("The answer is 42.0", "42.0"),
        ("The shirt costs $18.50.", "18.50"),
        ("The answer is 42.", "42"),
        ("no number at all", None),
        ("", None),
        ("#### 72\nThen she bought 5 more and 9 pens.", "72"),
        ("####42", "42"),
        ("first 3, then 1,000,000 in the end", "1000000"),
        (GSM8K_ANSWER, "72"),
    ],
)
def test_extract_answer(text: str, expected: str | None) -> None:
    assert extract_answer(text) == expected


@pytest.mark.parametrize(
    ("completion", "reference", "expected"),
    [
        ("The answer is 42.0", "#### 42", True),
        ("The answer is 42", "42", True),
        ("#### 1,234", "Reasoning.\n#### 1234", True),
        ("#### -3", "#### -3", True),
        ("It costs $18.50.", "18.5", True),
        ("It is 41.9999999", "42", True),
        ("It is 41.99", "42", False),
        ("I do not know.", "#### 5", False),
        ("#### 72 clips, then 3 more", GSM8K_ANSWER, True),
        ("The answer is 7", GSM8K_ANSWER, False),
    ],
)
def test_is_correct(completion: str, reference: str, expected: bool) -> None:
    assert is_correct(completion, reference) is expected


def test_reward_follows_trl_signature() -> None:
    completions = ["So the answer is 72.", "The answer is 70", "no idea"]
    answers = [GSM8K_ANSWER, GSM8K_ANSWER, "#### 1"]
    assert reward(completions, answers, prompts=["p"] * 3, completion_ids=[[1]] * 3) == [1.0, -1.0, -1.0]
    conversational = [[{"role": "assistant", "content": "#### 72"}], [{"role": "assistant", "content": "3"}]]
    assert reward(conversational, answer=[GSM8K_ANSWER, "#### 4"]) == [1.0, -1.0]
    # One reference for every completion.
    assert reward(["72", "71"], GSM8K_ANSWER) == [1.0, -1.0]
    with pytest.raises(ValueError, match="2 completions but 1 answers"):
        reward(["72", "71"], [GSM8K_ANSWER])


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # The comma quirk: a comma ends a number, so only the last group survives.
        ("The answer is 1,234", "234"),
        ("#### 1,234", "234"),
        # Everything from the first "Question:" on is ignored.
        ("The answer is 72.\n\nQuestion: Tom has 5 apples and 9 pears.", "72"),
        ("Question: what is 2+3?", "NULL"),
        ("no number at all", "NULL"),
        ("It costs $18.50.", "18.50"),
        ("The answer is 42.", "42"),
        ("The answer is 42.0", "42.0"),
        ("#### -3", "-3"),
        ("5-3", "-3"),
        ("#### 72 clips, then 3 more", "3"),
    ],
)
def test_opencompass_postprocess(text: str, expected: str) -> None:
    assert opencompass_postprocess(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<think>maybe 7</think> The answer is 12", "The answer is 12"),
        ("Start <think>a</think>middle<think>b</think> end ", "Start middle end"),
        ("only the end 7</think>\nThe answer is 12\n", "The answer is 12"),
        ("<think>never closed 7", "<think>never closed 7"),
        ("  no reasoning 5  ", "no reasoning 5"),
    ],
)
def test_strip_reasoning(text: str, expected: str) -> None:
    assert strip_reasoning(text) == expected


def _all_protocols(completion: str, reference: str) -> dict[str, float]:
    return {p: accuracy([completion], [reference], p) for p in ("opencompass", "flexible", "strict")}


@pytest.mark.parametrize(
    ("completion", "reference", "expected"),
    [
        # OpenCompass's comma quirk costs the sample; the flexible protocol keeps it.
        ("The answer is 1,234", "#### 1,234", {"opencompass": 0, "flexible": 100, "strict": 0}),
        ("#### 1,234", "#### 1,234", {"opencompass": 0, "flexible": 100, "strict": 100}),
        # A float prediction equals an integer reference.
        ("The answer is 42.0", "#### 42", {"opencompass": 100, "flexible": 100, "strict": 0}),
        # OpenCompass compares with int(reference): a decimal reference only matches character for character.
        ("It costs $18.50.", "#### 18.5", {"opencompass": 0, "flexible": 100, "strict": 0}),
        ("It costs $18.5.", "#### 18.5", {"opencompass": 100, "flexible": 100, "strict": 0}),
        ("#### -3", "#### -3", {"opencompass": 100, "flexible": 100, "strict": 100}),
        ("I cannot tell.", "#### 5", {"opencompass": 0, "flexible": 0, "strict": 0}),
        # The #### answer followed by more numbers: only OpenCompass takes the last one.
        ("#### 72 clips, then 3 more", GSM8K_ANSWER, {"opencompass": 0, "flexible": 100, "strict": 100}),
        # A model that goes on to invent the next question is judged on what came before it.
        (
            "The answer is 5\n\nQuestion: Sam has 9 pens. How many?\nAnswer: 9",
            "#### 5",
            {"opencompass": 100, "flexible": 0, "strict": 0},
        ),
        # Reasoning content is removed before the OpenCompass protocol only.
        (
            "<think>It might be 12.</think>The answer is 7",
            "#### 12",
            {"opencompass": 0, "flexible": 0, "strict": 0},
        ),
        ("<think>It is 12.</think>", "#### 12", {"opencompass": 0, "flexible": 100, "strict": 0}),
        (
            "<think>Not 3.</think>So the answer is 3.",
            "#### 3",
            {"opencompass": 100, "flexible": 100, "strict": 0},
        ),
        # A bare-number reference works for every protocol.
        ("The answer is 1234", "1,234", {"opencompass": 100, "flexible": 100, "strict": 0}),
    ],
)
def test_protocols(completion: str, reference: str, expected: dict[str, float]) -> None:
    assert _all_protocols(completion, reference) == expected


def test_accuracy_is_unrounded_percentage() -> None:
    completions = ["The answer is 72", "The answer is 1", "The answer is 72.0"]
    assert accuracy(completions, [GSM8K_ANSWER] * 3) == 200 / 3
    assert accuracy(completions, ["72"] * 3, "flexible") == 200 / 3


@pytest.mark.parametrize(
    ("completions", "references", "protocol", "message"),
    [
        ([], [], "opencompass", "no completions"),
        (["1"], ["1", "2"], "flexible", "1 completions but 2 references"),
        (["1"], ["1"], "exact", "unknown protocol 'exact'"),
    ],
)
def test_accuracy_refuses_bad_input(
    completions: list[str], references: list[str], protocol: str, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        accuracy(completions, references, protocol)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["gsm8k", "arith"])
def test_task_score_and_reward(name: str) -> None:
    task = get_task(name)
    completions = ["The answer is 1,234", "#### 72 then 3", "The answer is 9"]
    answers = ["#### 1,234", GSM8K_ANSWER, "#### 9"]
    assert task.score(completions, answers) == {
        "opencompass": pytest.approx(100 / 3),
        "flexible": 100.0,
        "strict": pytest.approx(100 / 3),
    }
    assert task.reward(completions, answer=answers) == [1.0, 1.0, 1.0]


def test_reward_reads_the_last_message_of_chat_completions() -> None:
    said = [{"role": "user", "content": "#### 41"}, {"role": "assistant", "content": "The answer is 42"}]
    parts = [
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "The answer "},
                {"type": "image"},
                "not a part",
                {"type": "text", "text": "is 42"},
            ],
        }
    ]
    assert reward([said, parts, [{"role": "assistant"}]], "#### 42") == [1.0, 1.0, -1.0]
    # The text parts are read as one text, as written: nothing is put between them (an image
    # between two parts of a number leaves the number whole).
    split = [{"type": "text", "text": "#### 4"}, {"type": "image"}, {"type": "text", "text": "2"}]
    assert reward([[{"role": "assistant", "content": split}]], ["#### 42"]) == [1.0]
    assert reward([[{"role": "assistant", "content": split[::2]}]], ["#### 42"]) == [1.0]


@pytest.mark.parametrize("completion", [42, [], ["The answer is 42"]])
def test_reward_refuses_a_completion_that_is_neither_text_nor_messages(completion: object) -> None:
    kind = type(completion).__name__
    with pytest.raises(TypeError, match=f"a string or a list of chat messages, got {kind}"):
        reward([completion], "#### 42")


def test_a_different_number_is_wrong_under_every_protocol() -> None:
    assert not is_correct("The answer is 41", "#### 42")
    for protocol in ("opencompass", "flexible", "strict"):
        assert accuracy(["The answer is 41"], ["#### 42"], protocol) == 0.0


def test_accuracy_refuses_bad_input_with_the_reason() -> None:
    unknown = r"^unknown protocol 'exact'; use one of opencompass, flexible, strict$"
    with pytest.raises(ValueError, match=unknown):
        accuracy(["1"], ["1"], "exact")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^no completions to score$"):
        accuracy([], [])
    with pytest.raises(ValueError, match=r"^2 completions but 1 references$"):
        accuracy(["1", "2"], ["1"])


def test_only_the_text_after_the_last_closing_think_counts() -> None:
    assert strip_reasoning("a </think> 6 </think> 7 ") == "7"


def test_an_answer_exactly_the_tolerance_away_is_wrong_under_every_protocol() -> None:
    # |0.000001 - 0| is 1e-6 exactly: "within 1e-6" is strict, as in OpenCompass's is_equal.
    assert not is_correct("The answer is 0.000001", "#### 0")
    for protocol in ("opencompass", "flexible", "strict"):
        assert accuracy(["#### 0.000001"], ["#### 0"], protocol) == 0.0
    assert accuracy(["#### 0.0000001"], ["#### 0"], "opencompass") == 100.0
