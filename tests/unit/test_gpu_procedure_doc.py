"""bench/README.md's GPU calls, one per line, give every argument each committed GPU figure was
measured with (the commands its results file records), for every GPU benchmark `make bench` names."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1].parent
SECTION = "## The GPU figures, call by call"
#: Where a call writes or reads its files: the machine's folders, not how it measured.
PLACES = {"--output", "--out", "--gpu-result", "--gpu", "--merge"}
SCRIPT = re.compile(r"^bench/(\w+)\.py$")


def calls(text: str) -> list[tuple[str, str, dict[str, list[str]]]]:
    """Each ``bench/NAME.py`` invocation in ``text``: its name, its subcommand (or ``--phase``), and
    its flags with their values."""
    found = []
    for line in text.splitlines():
        for part in re.split(r"&&|;", line.removeprefix("here:")):
            try:
                words = shlex.split(part)
            except ValueError:
                continue
            names = [i for i, word in enumerate(words) if SCRIPT.match(word)]
            if not names:
                continue
            rest = words[names[0] + 1 :]
            flags: dict[str, list[str]] = {}
            positional = []
            current: str | None = None
            for word in rest:
                if word.startswith("--"):
                    current = word
                    flags[current] = []
                elif current is None:
                    positional.append(word)
                else:
                    flags[current].append(word)
            mode = positional[0] if positional else (flags.get("--phase") or [""])[0]
            found.append((SCRIPT.match(words[names[0]]).group(1), mode, flags))  # type: ignore[union-attr]
    return found


def recorded_commands(value: Any) -> list[str]:
    if isinstance(value, dict):
        return [
            found
            for key, item in value.items()
            for found in ([item] if "command" in key and isinstance(item, str) else recorded_commands(item))
        ]
    if isinstance(value, list):
        return [found for item in value for found in recorded_commands(item)]
    return []


def documented() -> list[tuple[str, str, dict[str, list[str]]]]:
    text = (REPO / "bench" / "README.md").read_text(encoding="utf-8")
    section = text[text.index(SECTION) :]
    return calls("\n".join(re.findall(r"```\n(.*?)```", section, flags=re.DOTALL)))


def test_every_recorded_gpu_command_is_a_documented_call_with_the_same_arguments() -> None:
    doc = documented()
    checked = 0
    for path in sorted((REPO / "bench" / "results").glob("*_gpu.json")):
        for command in recorded_commands(json.loads(path.read_text(encoding="utf-8"))):
            for name, mode, flags in calls(command):
                wanted = {flag: values for flag, values in flags.items() if flag not in PLACES}
                matches = [
                    given
                    for doc_name, doc_mode, given in doc
                    if (doc_name, doc_mode) == (name, mode)
                    and all(given.get(flag) == values for flag, values in wanted.items())
                ]
                assert matches, f"{path.name}: no documented call gives {command!r} its arguments"
                checked += 1
    assert checked >= 20


def test_every_gpu_benchmark_has_its_calls_and_each_writes_its_own_file() -> None:
    from bench.run_all import GPU_BENCHMARKS, NOT_YET_MEASURED

    doc = documented()
    assert {name for name in GPU_BENCHMARKS if name not in NOT_YET_MEASURED} <= {name for name, _, _ in doc}
    # No two calls that write under $OUT write the same file, but the worker's phases, which join
    # the files each phase keeps outside it.
    outputs = [
        (name, flags["--output"][0])
        for name, _, flags in doc
        if flags.get("--output", [""])[0].startswith("$OUT/") and name != "opencompass_worker_gpu"
    ]
    assert len({output for _, output in outputs}) == len(outputs)
