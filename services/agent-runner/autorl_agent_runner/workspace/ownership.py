"""Who owns an experiment's folder on a volume shared by many experiments (the Kubernetes prepare Job).

Restricted pods cannot chown, so ownership follows from who creates what:

- the platform's user creates the folder that holds a namespace's experiments, mode 1733: any user
  may add an entry, none may list it or remove or rename another's (the sticky bit);
- the experiment's own user creates its folder there and hands its group to the platform (it is in
  that group only while preparing), mode 2750: the agent owns it, the grader (in the platform group)
  reads submissions, every other user — another experiment's agent included — gets nothing. New
  files inherit the group (the setgid bit), so what the agent saves is readable by the grader.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from autorl_agent_runner.workspace.layout import WorkspaceError

EXPERIMENTS_DIR_MODE = 0o1733
WORKSPACE_DIR_MODE = 0o2750


def open_experiments_folder(folder: Path) -> None:
    """Create ``folder`` (idempotent) so that every experiment's user may add its own folder to it."""
    folder.mkdir(parents=True, exist_ok=True)
    info = folder.stat()
    if info.st_uid == os.geteuid():
        folder.chmod(EXPERIMENTS_DIR_MODE)
    elif stat.S_IMODE(info.st_mode) != EXPERIMENTS_DIR_MODE:
        raise WorkspaceError(
            f"{folder} belongs to user {info.st_uid} with mode {stat.S_IMODE(info.st_mode):o}; "
            f"chown it to the platform's user {os.geteuid()} or chmod it {EXPERIMENTS_DIR_MODE:o}"
        )


def claim_workspace(root: Path, group: int) -> None:
    """Create the experiment's folder as the current user, group ``group``, mode 2750 (idempotent)."""
    try:
        root.mkdir(mode=0o700)
    except FileExistsError:
        info = root.lstat()
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
            raise WorkspaceError(
                f"workspace {root} belongs to user {info.st_uid}, not to this experiment's user "
                f"{os.geteuid()}; delete the folder (it holds an earlier experiment of the same name "
                "from before per-experiment users) or give the Experiment another name"
            ) from None
    try:
        os.chown(root, -1, group)
    except PermissionError as exc:
        raise WorkspaceError(
            f"cannot give workspace {root} to group {group}: this user is not in it "
            "(the prepare pod's fsGroup is the platform group)"
        ) from exc
    # After the chown: the kernel keeps the setgid bit only for a group the caller is in.
    root.chmod(WORKSPACE_DIR_MODE)
