"""After the agent has ended: its text files read for the problems it is scored on.

The agent's workspace ``code/`` and ``output/`` and its own folder are read for the test split's
questions (and, in sealed mode, the validation split's) with :mod:`autorl.provenance.overlap`. The
counts go to the grader (results.csv ``test_overlap``); the files and counts, never a question,
to a record in evaluator storage for the operator.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from autorl.provenance.overlap import MAX_FILE_BYTES, OverlapIndex, normalize, scan_files
from autorl.settings import EvaluationSettings
from autorl.tasks.base import Task

#: Evaluator storage's folder of the records, one ``<run id>.json`` a run.
RECORDS_DIR = "provenance"


def agent_roots(
    workspace_folders: list[Path], folder: Path | None, script: Path | None, platform: list[Path]
) -> tuple[list[Path], Path | None]:
    """What the agent could bring files in by: the workspace's folders, and its own folder, or, as
    the sandbox mounts it, only its program where that folder holds platform data (``platform``:
    the home, caches, evaluator storage) or the workspace."""

    def touches(path: Path) -> bool:
        return any(path.is_relative_to(p) or p.is_relative_to(path) for p in platform) or any(
            w.is_relative_to(path) for w in workspace_folders
        )

    if folder is not None and not touches(folder.resolve()):
        names = {root.name for root in workspace_folders}
        return [*workspace_folders, *([folder] if folder.name not in names else [])], None
    return workspace_folders, script


def read_agent_files(
    task: Task,
    settings: EvaluationSettings,
    *,
    run_id: str,
    roots: list[Path],
    sealed: bool,
    program: Path | None = None,
) -> tuple[dict[str, int], Path]:
    """The problems of each split found in the files under ``roots`` and in ``program`` (by split
    name), and the operator's record of which files hold how many."""
    data_dir, source_dir = settings.eval_dir / "data", settings.data_source_dir
    splits = {"test": task.load_test_problems(data_dir, source_dir=source_dir)}
    if sealed:
        splits["validation"] = task.load_validation_problems(data_dir, source_dir=source_dir)
    record: dict[str, object] = {"run_id": run_id, "roots": [str(root) for root in roots]}
    text = _program_text(program)
    counts: dict[str, int] = {}
    for split, problems in splits.items():
        index = OverlapIndex([problem.question for problem in problems])
        report = scan_files(roots, index)
        in_program = index.find(normalize(text)) if text else set()
        counts[split] = len(report.found | in_program)
        record[split] = {**report.to_json(), "program": {"path": str(program), "problems": len(in_program)}}
    path = settings.eval_dir / RECORDS_DIR / f"{run_id}.json"
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        json.dump(record, handle, indent=1)
    return counts, path


def _program_text(program: Path | None) -> str:
    if program is None:
        return ""
    try:
        descriptor = os.open(program, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return ""
    with os.fdopen(descriptor, "rb") as handle:
        return handle.read(MAX_FILE_BYTES).decode("utf-8", errors="replace")
