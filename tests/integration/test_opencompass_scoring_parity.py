"""Differential test: our OpenCompass protocol against OpenCompass itself, in `.venv-opencompass`.

Hundreds of seeded, generated completions (commas, decimals, negatives, `$`, `####`, `Question:`
continuations, `<think>` blocks, trailing dots, no numbers, ...) go through the real
`gsm8k_gen_1d7fe4` evaluation config (`extract_non_reasoning_content` first, as a model-level
postprocessor does, then `gsm8k_postprocess`, `gsm8k_dataset_postprocess` and `Gsm8kEvaluator`)
and through `autorl.tasks.gsm8k`; every postprocessed string and every verdict must agree.
"""

from __future__ import annotations

import json
import random
import subprocess
from typing import Any

import pytest

from autorl.tasks import get_task
from autorl.tasks.gsm8k import accuracy, opencompass_postprocess, strip_reasoning
from tests.support.opencompass_models import OC_PYTHON

pytestmark = pytest.mark.opencompass

SAMPLES = 400
SEED = 20241129

# Runs inside .venv-opencompass: applies the dataset config's own postprocessors and evaluator.
OC_SCRIPT = """
import json, sys
from opencompass.configs.datasets.gsm8k.gsm8k_gen_1d7fe4 import gsm8k_datasets
from opencompass.utils.text_postprocessors import extract_non_reasoning_content

with open(sys.argv[1], encoding="utf-8") as f:
    data = json.load(f)
dataset = gsm8k_datasets[0]
eval_cfg = dataset["eval_cfg"]
pred_post = eval_cfg["pred_postprocessor"]["type"]
ref_post = eval_cfg["dataset_postprocessor"]["type"]
predictions = [pred_post(extract_non_reasoning_content(c)) for c in data["completions"]]
references = [ref_post(r) for r in data["references"]]
result = eval_cfg["evaluator"]["type"]().score(predictions, references)
out = {
    "postprocess": [pred_post(c) for c in data["completions"]],
    "stripped": [extract_non_reasoning_content(c) for c in data["completions"]],
    "predictions": predictions,
    "correct": [detail["correct"] for detail in result["details"]],
    "accuracy": result["accuracy"],
    "rounds": [[t["role"], t["prompt"]] for t in
        dataset["infer_cfg"]["prompt_template"]["template"]["round"]],
    "max_out_len": dataset["infer_cfg"]["inferencer"]["max_out_len"],
}
with open(sys.argv[2], "w", encoding="utf-8") as f:
    json.dump(out, f)
"""

_WORDS = ["apples", "dollars", "pens", "miles", "hours", "cookies", "the total", "she", "so", "then"]
_ENDINGS = ["", ".", "\n", " "]
_SEPARATORS = ["", " ", "\n", "\n\n"]
_ARABIC_INDIC = str.maketrans("0123456789", "٠١٢٣٤٥٦٧٨٩")


def _with_commas(digits: str) -> str:
    return f"{int(digits):,}"


def _number(rng: random.Random, value: int | None = None) -> str:
    """A number as a model might write it."""
    if value is None:
        value = rng.choice([rng.randint(0, 9), rng.randint(10, 999), rng.randint(1000, 10**7)])
    text = _with_commas(str(abs(value))) if abs(value) >= 1000 and rng.random() < 0.4 else str(abs(value))
    if value < 0 or rng.random() < 0.08:
        text = "-" + text
    style = rng.random()
    if style < 0.12:
        text += rng.choice([".0", ".00", ".5", ".50", ".25"])
    elif style < 0.22:
        text = "$" + text
    elif style < 0.3:
        text += "."
    elif style < 0.34:
        text += "%"
    elif style < 0.36:
        text = text.translate(_ARABIC_INDIC)
    return text


def _filler(rng: random.Random) -> str:
    parts = [rng.choice(_WORDS) for _ in range(rng.randint(1, 5))]
    for _ in range(rng.randint(0, 3)):
        parts.insert(rng.randint(0, len(parts)), _number(rng))
    return " ".join(parts)


def _reference(rng: random.Random) -> tuple[str, int, str]:
    """A GSM8K answer field, its integer value and its final answer as written, without commas."""
    value = rng.choice([rng.randint(0, 100), rng.randint(100, 5000), rng.randint(5000, 10**6)])
    if rng.random() < 0.1:
        value = -value
    final = _with_commas(str(abs(value))) if abs(value) >= 1000 and rng.random() < 0.5 else str(abs(value))
    final = ("-" if value < 0 else "") + final
    if rng.random() < 0.1:
        final += ".5"
    a = rng.randint(2, 60)
    reasoning = f"{_filler(rng)} {a}*2=<<{a}*2={a * 2}>>{a * 2} {rng.choice(_WORDS)}.\n"
    answer = f"{reasoning if rng.random() < 0.8 else ''}#### {final}"
    if rng.random() < 0.03:
        answer += f"\n#### {_number(rng)}"
    return answer, value, final.replace(",", "")


def _completion(rng: random.Random, target: int, written: str) -> str:
    def answer_value() -> int:
        return target if rng.random() < 0.6 else target + rng.choice([-1, 1, 10, 1000])

    pieces = {
        "filler": lambda: _filler(rng),
        "statement": lambda: f"The answer is {_number(rng, answer_value())}{rng.choice(_ENDINGS)}",
        "marked": lambda: f"#### {_number(rng, answer_value())}{rng.choice(['', ' ' + _filler(rng)])}",
        "next_question": lambda: (
            f"\n\nQuestion: {_filler(rng)}\nLet's think step by step\nAnswer: {_number(rng)}"
        ),
        # The reference's own text, or a numerically equal spelling that OpenCompass may reject.
        "echo": lambda: (
            f"The answer is {written}{rng.choice(['', '0', '00'] if '.' in written else ['', '.0'])}"
        ),
        "think": lambda: f"<think>{_filler(rng)} {_number(rng, answer_value())}</think>",
        "think_end": lambda: f"{_filler(rng)}</think>",
        "think_open": lambda: f"<think>{_filler(rng)}",
        "operators": lambda: rng.choice(
            [f"{_number(rng)}-{_number(rng)}", f"{_number(rng)}/{_number(rng)}", f"1e{rng.randint(1, 9)}"]
        ),
        "plain": lambda: rng.choice(["I am not sure.", "", "   ", "no numbers here", "Answer:"]),
        "huge": lambda: "9" * rng.choice([20, 400]),
    }
    weights: dict[str, float] = {"filler": 4, "statement": 4, "marked": 2, "next_question": 1, "echo": 1}
    weights |= {"think": 2, "think_end": 1, "think_open": 1, "operators": 1, "plain": 1, "huge": 0.3}
    names = rng.choices(list(weights), weights=list(weights.values()), k=rng.randint(0, 4))
    text = "".join(pieces[name]() + rng.choice(_SEPARATORS) for name in names)
    # Often a closing statement, as a model that learned the format writes it.
    return text + pieces[rng.choice(["statement", "echo"])]() if rng.random() < 0.35 else text


def _cases() -> tuple[list[str], list[str]]:
    rng = random.Random(SEED)
    completions, references = [], []
    for _ in range(SAMPLES):
        reference, value, written = _reference(rng)
        completions.append(_completion(rng, value, written))
        references.append(reference)
    return completions, references


@pytest.fixture(scope="module")
def opencompass_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    if not OC_PYTHON.is_file():
        pytest.fail(f"{OC_PYTHON} is missing: run `make setup` to build the OpenCompass environment")
    work = tmp_path_factory.mktemp("opencompass")
    completions, references = _cases()
    (work / "in.json").write_text(
        json.dumps({"completions": completions, "references": references}, ensure_ascii=False),
        encoding="utf-8",
    )
    (work / "run.py").write_text(OC_SCRIPT, encoding="utf-8")
    proc = subprocess.run(
        [str(OC_PYTHON), "run.py", "in.json", "out.json"],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    result: dict[str, Any] = json.loads((work / "out.json").read_text(encoding="utf-8"))
    result["completions"], result["references"] = completions, references
    return result


def test_postprocess_and_verdicts_match_opencompass(opencompass_run: dict[str, Any]) -> None:
    completions, references = opencompass_run["completions"], opencompass_run["references"]
    assert len(completions) >= 200
    for index, text in enumerate(completions):
        assert opencompass_postprocess(text) == opencompass_run["postprocess"][index], repr(text)
        assert strip_reasoning(text) == opencompass_run["stripped"][index], repr(text)
        assert opencompass_postprocess(strip_reasoning(text)) == opencompass_run["predictions"][index], repr(
            text
        )
    pairs = list(zip(completions, references, strict=True))
    ours = [accuracy([c], [r], "opencompass") == 100 for c, r in pairs]
    mismatches = [
        (c, r)
        for c, r, a, b in zip(completions, references, ours, opencompass_run["correct"], strict=True)
        if a != b
    ]
    assert not mismatches, mismatches[:5]
    assert accuracy(completions, references, "opencompass") == opencompass_run["accuracy"]
    # The generated mix exercises both verdicts and the quirks, or the agreement above proves little.
    assert 0.15 * SAMPLES < sum(ours) < 0.85 * SAMPLES
    assert opencompass_run["predictions"].count("NULL") >= 10
    flexible = [accuracy([c], [r], "flexible") == 100 for c, r in pairs]
    assert sum(a != b for a, b in zip(ours, flexible, strict=True)) >= 20


def test_prompt_matches_the_opencompass_config(opencompass_run: dict[str, Any]) -> None:
    roles = {"HUMAN": "user", "BOT": "assistant"}
    # The config's last round is the question template; ask for its placeholder to get it back.
    expected = [{"role": roles[role], "content": prompt} for role, prompt in opencompass_run["rounds"]]
    task = get_task("gsm8k")
    assert task.build_messages("{question}") == expected
    assert task.max_new_tokens == opencompass_run["max_out_len"]
