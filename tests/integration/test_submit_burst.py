"""A refusal costs the platform nothing: a burst of submits past an experiment's limit, against a
real `autorl grader` process, measured in snapshot storage and in the grader's memory.

Each checkpoint of the burst carries tokenizer files at sizes a model could ship (the submission's
tokenizer is never read: the base model's is evaluated), and the experiment has ``k`` submissions
left. Submits take the experiment's turn one at a time and are checked against the limit before
any file is read, so the burst leaves at most ``k + 1`` snapshots behind it at any moment (in fact
``k``: no refused submit creates one), and the grader's peak memory grows by far less than the
700 MiB the platform allows it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.support.grading import copy_model, make_workspace, register, submit_accepted, submit_no_wait
from tests.support.inotify import watch
from tests.support.service_processes import serving_grader
from tests.support.settings import DeploymentSettings

IN_CREATE = 0x100
IN_ISDIR = 0x40000000
MIB = 1024 * 1024
#: What a refused burst may add to the grader's peak resident memory.
MEMORY_ALLOWANCE_BYTES = 700 * MIB
#: Large tokenizer files, as big as the earlier size caps allowed (64 + 32 + 32 MiB).
TOKENIZER_SIZES = {"tokenizer.json": 64 * MIB, "vocab.json": 32 * MIB, "merges.txt": 32 * MIB}


def peak_memory_bytes(pid: int) -> int:
    """The process's peak resident set (VmHWM), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmHWM for process {pid}")


def large_tokenizer_files(folder: Path) -> dict[str, Path]:
    """Real (not sparse) files of the sizes above, each one a JSON object (text for merges.txt) as a
    tokenizer library would parse it, made once and hard-linked into each checkpoint."""
    folder.mkdir()
    files = {}
    for name, size in TOKENIZER_SIZES.items():
        head = b'{"model": {"type": "BPE"}, "padding": "' if name == "tokenizer.json" else b'{"padding": "'
        if name == "merges.txt":
            head = b"#version: 0.2\n"
        tail = b"" if name == "merges.txt" else b'"}'
        path = folder / name
        with path.open("wb") as handle:
            handle.write(head)
            remaining = size - len(head) - len(tail)
            while remaining:
                chunk = min(remaining, MIB)
                handle.write(b"x" * chunk)
                remaining -= chunk
            handle.write(tail)
        files[name] = path
    return files


def test_a_burst_past_the_limit_costs_no_snapshot_and_little_memory(
    make_settings: Callable[..., DeploymentSettings], pg_url: str, tiny_base_model: Path, tmp_path: Path
) -> None:
    left, burst = 1, 8  # k submissions left, k + 7 submits at once
    settings = make_settings(database_url=pg_url, submit_wait_s=0.0)
    assert settings.snapshot_dir is not None
    with serving_grader(settings, tmp_path / "grader.log", timeout_s=120) as (grader, client):
        experiment = register(
            client, settings, tiny_base_model, make_workspace(tmp_path / "ws"), max_submissions=left + 1
        )
        copy_model(tiny_base_model, experiment.output_dir / "first", unique=True)
        submit_accepted(client, experiment, "output/first")
        large = large_tokenizer_files(tmp_path / "large")
        for index in range(burst):
            checkpoint = copy_model(tiny_base_model, experiment.output_dir / f"c{index}", unique=True)
            for name, path in large.items():
                (checkpoint / name).unlink(missing_ok=True)
                os.link(path, checkpoint / name)
        memory_before = peak_memory_bytes(grader.pid)
        answers: dict[int, Any] = {}

        def send(index: int) -> None:
            answers[index] = submit_no_wait(client, experiment, f"output/c{index}")

        created: list[str] = []
        with watch(settings.snapshot_dir, IN_CREATE) as snapshots:
            threads = [threading.Thread(target=send, args=(index,)) for index in range(burst)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=300)
            created = [name for name, mask in snapshots.events(timeout_s=0.5) if mask & IN_ISDIR]
        memory_growth = peak_memory_bytes(grader.pid) - memory_before

    statuses = sorted(answer.status_code for answer in answers.values())
    assert statuses == [202] * left + [429] * (burst - left), [a.text for a in answers.values()]
    accepted = [answer.json() for answer in answers.values() if answer.status_code == 202]
    # The checkpoint's own tokenizer files are not evaluated, and the answer says so.
    assert set(TOKENIZER_SIZES) <= set(accepted[0]["ignored_files"])
    # Storage: the accepted submissions' snapshots only (at most k + 1 at any moment).
    assert len(created) == left, created
    assert len(list(settings.snapshot_dir.iterdir())) == 1 + left  # the first submission's and the burst's
    # Memory: the grader's peak grew by less than the allowance (the refused files were never read).
    assert memory_growth < MEMORY_ALLOWANCE_BYTES, (
        f"the grader's peak memory grew {memory_growth / MIB:.0f} MiB"
    )
