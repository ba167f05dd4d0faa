"""Agent workspaces made as the runner makes them, for tests of what an agent finds in one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from autorl.tasks import get_task
from autorl_agent_runner.workspace.layout import Workspace, create_workspace


def arith_workspace(root: Path, base_model_dir: Path, train_data_dir: Path, **fields: Any) -> Workspace:
    """The workspace at ``root`` of an arith experiment of the tiny model in ``base_model_dir`` (its
    files copied in, not linked), with ``train_data_dir``'s training data; ``fields`` (``run_id``,
    ``timeout_s``, ...) as :func:`create_workspace` takes them."""
    task = get_task("arith")
    return create_workspace(
        root,
        task_name=task.name,
        description=task.description(),
        base_model_dir=base_model_dir,
        base_model_name="tiny-qwen2",
        train_data_dir=train_data_dir,
        link_model=False,
        **fields,
    )
