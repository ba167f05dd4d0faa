"""A local run's lock, and what recovers a run whose `autorl run` was killed.

`autorl run` holds an exclusive ``flock`` on ``HOME/runs/<run id>/run.lock`` for its whole life;
the file says what the run is. The kernel drops the lock when the process dies, however it dies
(SIGKILL, a lost terminal, a crash), so a lock file that nobody holds is a run that never wrote its
results row. :func:`recover_orphaned_runs` (called by `autorl run` and `autorl results`) finishes
such a run's experiment in the database as interrupted (what was not evaluated is cancelled) and
appends its row with the database's numbers. The processes a run starts die with it on their own
(:mod:`autorl.parent_death`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from autorl.protocol.feedback import Feedback
from autorl.runs.results import ResultRow, append_row, read_rows, utc_timestamp

log = logging.getLogger("autorl.runs")
LOCK_NAME = "run.lock"
INTERRUPTED_MESSAGE = "autorl run was killed; its processes died with it"


@dataclass(frozen=True)
class RunInfo:
    run_id: str
    task: str
    agent: str
    driver_model: str | None
    base_model: str
    workspace: str
    #: When `autorl run` began, epoch seconds.
    started: float
    #: The feedback mode asked for: the row's where the run was killed before the grader recorded
    #: its own (a lock written before this field: test).
    feedback: str = Feedback.TEST.value


class RunLock:
    """Held by `autorl run` from before anything starts until its results row is written."""

    def __init__(self, run_dir: Path, info: RunInfo) -> None:
        self.path = run_dir / LOCK_NAME
        self.info = info
        self._fd: int | None = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps(asdict(self.info)).encode())
        os.fsync(fd)
        self._fd = fd

    def release(self) -> None:
        """The run recorded its row: the lock file goes, then the lock."""
        if self._fd is None:
            return
        self.path.unlink(missing_ok=True)
        os.close(self._fd)
        self._fd = None


@contextlib.contextmanager
def _unheld(path: Path) -> Iterator[RunInfo | None]:
    """The run of a lock file nobody holds (the lock is ours while the block runs), else None."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        yield None
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield None  # its `autorl run` is alive, or another process recovers it right now
            return
        if not path.exists():  # released between our open and our lock
            yield None
            return
        try:
            yield RunInfo(**json.loads(path.read_text(encoding="utf-8")))
        except (ValueError, TypeError) as exc:
            log.warning("event=run_lock_unreadable path=%s reason=%s", path, exc)
            yield None
    finally:
        os.close(fd)


def recover_orphaned_runs(home: Path, database_url: str | None) -> list[ResultRow]:
    """Record every killed run of this home as interrupted; returns the rows appended."""
    recorded = {row.run_id for row in read_rows(home)}
    rows = []
    for path in sorted((home / "runs").glob(f"*/{LOCK_NAME}")):
        with _unheld(path) as info:
            if info is None:
                continue
            if info.run_id not in recorded:
                row = _interrupted_row(info, database_url)
                append_row(row, home)
                rows.append(row)
                log.info("event=run_recovered run=%s status=interrupted", info.run_id)
            path.unlink()
    return rows


def _interrupted_row(info: RunInfo, database_url: str | None) -> ResultRow:
    baseline = best = improvement = None
    scored = 0
    final: dict[str, Any] = {"feedback": info.feedback}
    if database_url:
        from autorl.errors import NotFoundError
        from autorl.protocol.final import results_columns
        from autorl.store import Database, Submission, SubmissionStatus, experiments, submissions
        from autorl.store.models import ExperimentStatus

        db = Database(database_url)
        try:
            with db.session() as session:
                experiment = experiments.get_experiment(session, info.run_id, for_update=True)
                experiments.finish_experiment(
                    session, experiment, ExperimentStatus.INTERRUPTED, INTERRUPTED_MESSAGE
                )
                baseline_row = submissions.baseline_submission(session, experiment)
                best_row = submissions.best_submission(session, experiment)
                baseline = baseline_row.score if baseline_row else None
                final = results_columns(session, experiment)
                # A sealed experiment's best on the test split is its final score (none when
                # killed before its final evaluation); its best on validation is not a test score.
                sealed = final["feedback"] == Feedback.SEALED
                best = final["final_score"] if sealed else (best_row.score if best_row else None)
                scored = submissions.agent_submissions_count(
                    session, experiment, Submission.status == SubmissionStatus.SCORED
                )
        except NotFoundError:
            pass  # killed before it registered its experiment: nothing was submitted
        finally:
            db.dispose()
    if best is not None and baseline is not None:
        improvement = best - baseline
    return ResultRow(
        run_id=info.run_id,
        timestamp=utc_timestamp(),
        task=info.task,
        agent=info.agent,
        driver_model=info.driver_model,
        base_model=info.base_model,
        baseline=baseline,
        best_score=best,
        improvement=improvement,
        submissions=scored,
        duration_s=round(time.time() - info.started, 1),
        success=False,
        status="interrupted",
        workspace=info.workspace,
        **final,
    )
