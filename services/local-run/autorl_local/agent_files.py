"""After the agent has ended: which of its files are read for the problems it is scored on.

The agent's workspace ``code/`` and ``output/`` and its own folder are read for the test split's
questions (and, in sealed mode, the validation split's) by
:func:`autorl_evaluator.provenance.read_agent_files`, the rule a cluster's evaluators apply too.
The counts go to the grader (results.csv ``test_overlap``); the files and counts, never a question,
to a record in evaluator storage for the operator.
"""

from __future__ import annotations

from pathlib import Path


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
