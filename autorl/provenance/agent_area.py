"""What an agent could write, in one place: read for test questions once it has ended, by
``autorl run`` (:mod:`autorl_local.agent_files`) and by a cluster's copy
(:mod:`autorl.provenance.agent_copy`) alike.

An agent writes its whole workspace but its read-only ``data/`` (the platform's train split): its
``code/`` and ``output/``, and anywhere else in it, such as ``~/.cache`` (``HOME`` is the
workspace). So the area is the workspace less ``data/``, labelled ``code``, ``output`` and
:data:`WORKSPACE` for the rest, each file read once, under its own label.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

from autorl.layout import CODE_DIR, DATA_DIR, OUTPUT_DIR

#: The label of the rest of the workspace (what is neither ``code/`` nor ``output/``).
WORKSPACE = "workspace"
#: The labels of the area's roots, in the order they are read.
LABELS = (CODE_DIR, OUTPUT_DIR, WORKSPACE)


@dataclass(frozen=True)
class AgentArea:
    """Folders by label (one may lie inside another) and what under them is not the agent's."""

    roots: dict[str, Path]
    leave_out: tuple[Path, ...]


def agent_area(workspace: Path) -> AgentArea:
    """The writable area of the agent whose workspace is ``workspace``."""
    return AgentArea(
        roots={CODE_DIR: workspace / CODE_DIR, OUTPUT_DIR: workspace / OUTPUT_DIR, WORKSPACE: workspace},
        leave_out=(workspace / DATA_DIR,),
    )


def left_out(roots: Mapping[str, Path], label: str, leave_out: Collection[Path] = ()) -> set[str]:
    """The paths (``<label>/...``) under root ``label`` not read under it: another root inside it
    (read under its own label) and what ``leave_out`` names."""
    root = roots[label]
    inner = [other for other in roots.values() if other != root and other.is_relative_to(root)]
    inner += [path for path in leave_out if path.is_relative_to(root)]
    return {f"{label}/{path.relative_to(root)}" for path in inner}
