"""``run_meta.json`` and ``scores.json``: the grader's view, copied into the workspace.

Written beside a built-in agent by the agent runner, and beside a custom image's agent by the
``mirror`` sidecar of its pod (``autorl agent-runner mirror``): the same files, the same code.
"""

from __future__ import annotations

import sys
import threading

from autorl.client import GradingClient, TimeInfo
from autorl.errors import AutoRLError
from autorl_agent_runner.workspace import Workspace, write_run_meta, write_scores

#: How often the mirrors are refreshed from the grader.
MIRROR_INTERVAL_S = 10.0


def refresh_mirrors(
    workspace: Workspace,
    client: GradingClient,
    *,
    start_time: float | None = None,
    end_time: float | None = None,
) -> TimeInfo:
    """Copy the grader's budget and scores into the mirrors; returns the budget as the grader has it.

    ``start_time`` and ``end_time`` stand in while the grader reports no budget yet. Raises
    ``AutoRLError`` when the grader does not answer (the files are left as they were).
    """
    info = client.time()
    scores = client.scores()
    write_run_meta(
        workspace,
        start_time=info.start_time if info.start_time is not None else start_time,
        timeout_s=info.timeout_s,
        last_submit_time=info.last_submit_time,
        end_time=info.end_time if info.end_time is not None else end_time,
    )
    write_scores(workspace, scores.submissions)
    return info


def keep_mirrors_fresh(
    workspace: Workspace,
    client: GradingClient,
    stop: threading.Event,
    *,
    interval_s: float = MIRROR_INTERVAL_S,
) -> None:
    """Refresh the mirrors every ``interval_s`` until ``stop`` is set, then once more."""
    while True:
        stopping = stop.is_set()
        try:
            refresh_mirrors(workspace, client)
        except AutoRLError as exc:
            print(f"[autorl] event=mirror_skipped reason={type(exc).__name__}", file=sys.stderr, flush=True)
        if stopping:
            return
        stop.wait(interval_s)
