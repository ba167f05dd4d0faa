"""After the agent has ended: which of its files are read for the problems it is scored on.

The agent's writable area of its workspace (:func:`autorl.provenance.agent_area.agent_area`: all of
it but ``data/``, ``~/.cache`` included, as a cluster reads it) and its own folder are read for the
test split's questions (and, in sealed mode, the validation split's) by
:func:`autorl_evaluator.provenance.read_agent_files`, the rule a cluster's evaluators apply too.
The counts go to the grader (results.csv ``test_overlap``); the files and counts, never a question,
to a record in evaluator storage for the operator.
"""

from __future__ import annotations

from pathlib import Path

from autorl.provenance.agent_area import AgentArea, agent_area

#: The label of the agent's own folder among the folders read.
AGENT_FOLDER = "agent"


def agent_roots(
    workspace: Path, folder: Path | None, script: Path | None, platform: list[Path]
) -> tuple[AgentArea, Path | None]:
    """What the agent could bring files in by: its workspace's writable area, and its own folder,
    or, as the sandbox mounts it, only its program where that folder holds platform data
    (``platform``: the home, caches, evaluator storage) or lies in or around the workspace."""
    area = agent_area(workspace)
    inside = workspace.resolve()

    def touches(path: Path) -> bool:
        return any(path.is_relative_to(p) or p.is_relative_to(path) for p in platform) or (
            path.is_relative_to(inside) or inside.is_relative_to(path)
        )

    if folder is not None and not touches(folder.resolve()):
        return AgentArea({**area.roots, AGENT_FOLDER: folder}, area.leave_out), None
    return area, script
