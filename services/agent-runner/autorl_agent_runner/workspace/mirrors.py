"""``run_meta.json`` and ``scores.json``: the grader's view, copied into the workspace.

Written beside a built-in agent by the agent runner, and beside a custom image's agent by the
``mirror`` sidecar of its pod (``autorl agent-runner mirror``): the same files, the same code.

They sit in the workspace's root, which the agent may write: it can put a folder, a link or a
FIFO in a mirror's place. A mirror is a convenience, so writing one is best effort: every
``OSError`` is logged and the run goes on. A new file replaces a link or a FIFO by a rename
(which follows neither); a folder in the way is removed, without following anything in it,
and the mirror written again.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from autorl.client import GradingClient, TimeInfo
from autorl.errors import AutoRLError
from autorl_agent_runner.workspace.layout import Workspace, write_run_meta, write_scores
from autorl_agent_runner.workspace.tree_walk import remove_entry

#: How often the mirrors are refreshed from the grader.
MIRROR_INTERVAL_S = 10.0


def refresh_mirrors(
    workspace: Workspace,
    client: GradingClient,
    *,
    start_time: float | None = None,
    deadline: float | None = None,
    ended_at: float | None = None,
    log: Callable[[str], None],
) -> TimeInfo:
    """Copy the grader's budget and scores into the mirrors; returns the budget as the grader has it.

    ``start_time`` and ``deadline`` stand in while the grader reports no budget yet; ``ended_at``
    is when the agent's run ended (None while it runs): run_meta.json's ``end_time``. Raises
    ``AutoRLError`` when the grader does not answer (the files are left as they were); a mirror
    that cannot be written is logged through ``log`` (:func:`write_mirror`).
    """
    info = client.time()
    scores = client.scores()
    write_mirror(
        workspace.run_meta,
        lambda: write_run_meta(
            workspace,
            start_time=info.start_time if info.start_time is not None else start_time,
            timeout_s=info.timeout_s,
            last_submit_time=info.last_submit_time,
            deadline=info.end_time if info.end_time is not None else deadline,
            end_time=ended_at,
        ),
        log,
    )
    write_mirror(workspace.scores, lambda: write_scores(workspace, scores.submissions), log)
    return info


def write_mirror(path: Path, write: Callable[[], None], log: Callable[[str], None]) -> bool:
    """Run ``write`` (which replaces ``path`` by a rename); where a folder is in the way, remove it
    and try once more. Never raises ``OSError``: it is logged. Returns whether the mirror was written."""
    try:
        write()
        return True
    except IsADirectoryError:
        pass
    except OSError as exc:
        log(f"event=mirror_not_written file={path.name} error={exc.strerror or type(exc).__name__}")
        return False
    try:
        remove_entry(path.parent, path.name)
        log(f"event=mirror_replaced file={path.name} was=folder")
        write()
        return True
    except OSError as exc:
        log(f"event=mirror_not_written file={path.name} error={exc.strerror or type(exc).__name__}")
        return False


def _log_to_stderr(line: str) -> None:
    print(f"[autorl] {line}", file=sys.stderr, flush=True)


def keep_mirrors_fresh(
    workspace: Workspace,
    client: GradingClient,
    stop: threading.Event,
    *,
    interval_s: float = MIRROR_INTERVAL_S,
) -> None:
    """Refresh the mirrors every ``interval_s`` until ``stop`` is set (the agent's run has ended),
    then once more, with that end as run_meta.json's ``end_time``."""
    while True:
        stopping = stop.is_set()
        try:
            refresh_mirrors(workspace, client, ended_at=time.time() if stopping else None, log=_log_to_stderr)
        except AutoRLError as exc:
            _log_to_stderr(f"event=mirror_skipped reason={type(exc).__name__}")
        if stopping:
            return
        stop.wait(interval_s)
