"""A run's lock: a live `autorl run` is left alone, a killed one is recorded once, as interrupted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

from autorl.runs.results import read_rows
from autorl.runs.run_lock import LOCK_NAME, RunInfo, RunLock, recover_orphaned_runs


def info(run_id: str, workspace: Path) -> RunInfo:
    return RunInfo(
        run_id=run_id,
        task="arith",
        agent="example",
        driver_model=None,
        base_model="builtin:tiny-qwen2",
        workspace=str(workspace),
        started=time.time() - 5,
    )


def test_a_held_lock_is_a_live_run_and_is_left_alone(tmp_path: Path) -> None:
    lock = RunLock(tmp_path / "runs" / "r1", info("r1", tmp_path))
    lock.acquire()
    try:
        assert recover_orphaned_runs(tmp_path, None) == []
        assert (tmp_path / "runs" / "r1" / LOCK_NAME).exists()
    finally:
        lock.release()
    assert not (tmp_path / "runs" / "r1" / LOCK_NAME).exists()
    assert recover_orphaned_runs(tmp_path, None) == []  # released: it recorded its own row


def test_a_lock_whose_holder_was_killed_is_recorded_once_as_interrupted(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; from autorl.runs.run_lock import RunInfo, RunLock; "
            f"RunLock(Path({str(tmp_path / 'runs' / 'r2')!r}), RunInfo('r2', 'arith', 'example', None, "
            f"'builtin:tiny-qwen2', {str(tmp_path)!r}, time.time())).acquire(); print('held', flush=True); "
            "time.sleep(600)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    assert recover_orphaned_runs(tmp_path, None) == []  # alive
    os.kill(holder.pid, 9)
    holder.wait()
    (row,) = recover_orphaned_runs(tmp_path, None)
    assert (row.run_id, row.status, row.success, row.submissions) == ("r2", "interrupted", False, 0)
    assert row.baseline is None and row.workspace == str(tmp_path)
    assert [r.run_id for r in read_rows(tmp_path)] == ["r2"]
    assert recover_orphaned_runs(tmp_path, None) == []  # once
    assert not (tmp_path / "runs" / "r2" / LOCK_NAME).exists()


def test_a_run_killed_before_it_registered_keeps_the_feedback_mode_it_asked_for(tmp_path: Path) -> None:
    # A lock no process holds: its `autorl run` was killed while its services started.
    (tmp_path / "runs" / "r3").mkdir(parents=True)
    sealed = replace(info("r3", tmp_path), feedback="sealed")
    (tmp_path / "runs" / "r3" / LOCK_NAME).write_text(json.dumps(asdict(sealed)))
    # A lock an earlier version wrote, without the field: its run asked for no mode, test.
    (tmp_path / "runs" / "r4").mkdir()
    legacy = {key: value for key, value in asdict(info("r4", tmp_path)).items() if key != "feedback"}
    (tmp_path / "runs" / "r4" / LOCK_NAME).write_text(json.dumps(legacy))
    rows = {row.run_id: row for row in recover_orphaned_runs(tmp_path, None)}
    assert (rows["r3"].status, rows["r3"].feedback, rows["r3"].final_score) == ("interrupted", "sealed", None)
    assert (rows["r4"].status, rows["r4"].feedback) == ("interrupted", "test")
