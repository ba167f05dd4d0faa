"""What the documents say the code does or measured, read from the documents and checked against the
code's own values and the committed results: a change on either side that the other does not follow
fails here, not in a reader's hands."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from autorl_evaluator.backends.opencompass.parallel import fits_one_gpu
from autorl_evaluator.model_settings import ModelSettings

REPO = Path(__file__).resolve().parents[2]

#: Parameters of the Qwen2.5 base models, in order of size, as their model cards on the Hugging Face
#: hub state them (huggingface.co/Qwen/Qwen2.5-<size>).
QWEN25_PARAMETERS = {
    "0.5B": 0.49e9,
    "1.5B": 1.54e9,
    "3B": 3.09e9,
    "7B": 7.61e9,
    "14B": 14.7e9,
    "32B": 32.5e9,
    "72B": 72.7e9,
}


def document(name: str) -> str:
    """A document's text with its line breaks and runs of spaces as single spaces."""
    return " ".join((REPO / name).read_text(encoding="utf-8").split())


def results(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((REPO / "bench" / "results" / f"{name}.json").read_text("utf-8"))
    return data


def claim(pattern: str, name: str) -> re.Match[str]:
    found = re.search(pattern, document(name))
    assert found is not None, f"{name} no longer states what this test checks: /{pattern}/"
    return found


def test_the_qwen_sizes_said_to_fit_one_h200_are_those_the_rule_admits() -> None:
    """EVALUATION.md names the H200's memory (as the GPU benchmarks read it) and the largest Qwen2.5
    that runs as one replica per GPU there: the rule's own answer for bf16 weights."""
    found = claim(
        r"On one H200 \(([\d.]+) GiB\) that admits every Qwen2\.5 up to (\w+); (\w+) is sharded",
        "docs/EVALUATION.md",
    )
    memory_gib, largest, sharded = float(found[1]), found[2], found[3]
    assert memory_gib == results("hf_generation_gpu")["environment"]["gpu_memory_gib"]
    utilization = ModelSettings().gpu_memory_utilization
    fit = [
        size
        for size, parameters in QWEN25_PARAMETERS.items()
        if fits_one_gpu(int(2 * parameters), int(memory_gib * 2**30), utilization)
    ]
    sizes = list(QWEN25_PARAMETERS)
    assert fit == sizes[: len(fit)], "the rule admits every size up to a largest one"
    assert largest == fit[-1]
    assert sharded == sizes[len(fit)]
