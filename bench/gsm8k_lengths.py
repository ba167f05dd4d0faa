"""Token lengths of the real GSM8K prompts and answers under Qwen2.5's tokenizer, for the GPU benchmarks.

The GPU benchmark has no hub access, so it cannot tokenize the real split with the real tokenizer
there. This script does it once, wherever the inputs are at hand, and writes the lengths to a
small committed file, ``bench/data/gsm8k_qwen25_lengths.json``:

- ``prefix_ids``: the ids every 4-shot evaluation prompt shares (system turn, the four exemplars,
  the opening of the last user turn), and ``suffix_ids``: each of the 1,319 test prompts' own ids
  after that prefix. Prompts are rendered as the evaluator renders them (``Task.render_prompt``)
  with Qwen2.5's chat template, which adds its default system turn when none is given.
- ``answer_ids``: each of the 7,473 train answers (the reference solution, ``#### N`` line
  included) plus one id for the end-of-turn token: the stopping distribution of a model that
  writes answers as long as GSM8K's own.

Inputs: ``train.jsonl`` and ``test.jsonl`` of github.com/openai/grade-school-math
(``grade_school_math/data/``), and Qwen's BPE ranks ``qwen.tiktoken`` (shipped in the
``dashscope`` wheel as ``dashscope/resources/qwen.tiktoken``; Qwen2.5's ``tokenizer.json`` holds
the same 151,643 merges with the same pre-tokenizer), read with ``tiktoken``:

    python3 -m pip install --target /tmp/tk tiktoken
    PYTHONPATH=/tmp/tk:.:services/evaluator-worker python3 bench/gsm8k_lengths.py \\
        --data DIR --ranks qwen.tiktoken
"""

from __future__ import annotations

import argparse
import base64
import json
import statistics
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
OUTPUT = REPO_ROOT / "bench" / "data" / "gsm8k_qwen25_lengths.json"
#: Qwen2's pre-tokenizer (tokenizer.json's ``Split`` pattern).
QWEN_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"""
    r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
SPECIAL = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645}
DEFAULT_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."


class QwenChatML:
    """Qwen2.5's chat template for plain user/assistant turns (what ``render_prompt`` needs)."""

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> str:
        turns = list(conversation)
        if not turns or turns[0]["role"] != "system":
            turns.insert(0, {"role": "system", "content": DEFAULT_SYSTEM})
        text = "".join(f"<|im_start|>{t['role']}\n{t['content']}<|im_end|>\n" for t in turns)
        return text + "<|im_start|>assistant\n" if kwargs.get("add_generation_prompt") else text


def encoding(ranks_path: Path) -> Any:
    import tiktoken

    ranks = {
        base64.b64decode(token): int(rank)
        for token, rank in (line.split() for line in ranks_path.read_text().splitlines() if line)
    }
    return tiktoken.Encoding("qwen2.5", pat_str=QWEN_PATTERN, mergeable_ranks=ranks, special_tokens=SPECIAL)


def summary(values: list[int]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "min": ordered[0],
        "p50": ordered[len(ordered) // 2],
        "p90": ordered[int(len(ordered) * 0.9)],
        "p99": ordered[int(len(ordered) * 0.99)],
        "max": ordered[-1],
        "mean": round(statistics.fmean(ordered), 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True, help="folder with train.jsonl and test.jsonl")
    parser.add_argument("--ranks", type=Path, required=True, help="qwen.tiktoken")
    parser.add_argument("--output", type=Path, default=OUTPUT)
    args = parser.parse_args()
    from autorl.decoding.greedy_engine import shared_prefix_length
    from autorl.tasks import get_task

    enc = encoding(args.ranks)
    task = get_task("gsm8k")
    chat = QwenChatML()

    def ids(text: str) -> list[int]:
        return list(enc.encode(text, allowed_special="all"))

    def read(name: str) -> list[dict[str, str]]:
        lines = (args.data / name).read_text(encoding="utf-8").splitlines()
        return [json.loads(line) for line in lines if line.strip()]

    prompts = [ids(task.render_prompt(chat, row["question"])) for row in read("test.jsonl")]
    prefix = shared_prefix_length(prompts)
    suffixes = [len(prompt) - prefix for prompt in prompts]
    answers = [len(ids(row["answer"])) + 1 for row in read("train.jsonl")]
    report = {
        "tokenizer": "Qwen2.5 (qwen.tiktoken ranks, Qwen2 pre-tokenizer)",
        "source": "github.com/openai/grade-school-math grade_school_math/data/{test,train}.jsonl",
        "prefix_ids": prefix,
        "prompt_ids": summary([len(p) for p in prompts]),
        "answer_ids_summary": summary(answers),
        "suffix_ids": suffixes,
        "answer_ids": answers,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report) + "\n")
    print(json.dumps({k: v for k, v in report.items() if k not in ("suffix_ids", "answer_ids")}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
