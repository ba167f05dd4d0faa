"""Evaluator storage of submission snapshots: pruning, and a full storage refusing for now, its free
bytes and the checkpoint's size in the platform's log.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from autorl.checkpoints.snapshot import (
    Snapshot,
    prune_snapshots,
)
from tests.support.snapshots import (
    taker,
)

GIB = 1024**3


def test_prune_removes_only_old_unreferenced_snapshots(
    take: Callable[..., Snapshot], checkpoint: Path, snapshots: Path
) -> None:
    kept, orphan, young = take(), take(), take()
    old = time.time() - 7200
    for snapshot in (kept, orphan):
        for path in [snapshot.path, *snapshot.path.iterdir()]:
            os.utime(path, (old, old))
    assert prune_snapshots(snapshots, {kept.name}) == [orphan.name]
    assert kept.path.is_dir() and young.path.is_dir() and not orphan.path.exists()


def test_a_full_snapshot_storage_refuses_for_now_not_for_good(
    take: Callable[..., Snapshot], checkpoint: Path, snapshots: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from autorl.checkpoints import snapshot as snapshot_module
    from autorl.errors import ServiceUnavailableError

    free = shutil.disk_usage(snapshots.parent).free
    monkeypatch.setattr(snapshot_module, "MIN_FREE_BYTES", free + 1)
    with pytest.raises(ServiceUnavailableError, match="retry once queued evaluations have finished"):
        take()
    assert list(snapshots.iterdir()) == []


def _storage_full(caplog: pytest.LogCaptureFixture) -> tuple[int, int]:
    """The free bytes and the checkpoint's size the latest refusal logged."""
    logged = [r.getMessage() for r in caplog.records if "event=snapshot_storage_full" in r.getMessage()]
    found = re.search(r"free_bytes=(\d+) needed_bytes=(\d+)", logged[-1]) if logged else None
    assert found is not None, logged
    free, needed = map(int, found.groups())
    return free, needed


def test_storage_left_with_exactly_its_reserve_after_the_copy_takes_the_checkpoint(
    workspace: Path,
    tiny_base_model: Path,
    checkpoint: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The reserve is what must be left, no more: the refusal logs the free bytes and the size, and
    with the reserve set to exactly their difference the checkpoint is taken. The storage is a
    tmpfs (/dev/shm), whose free space only moves with what is written to it."""
    from autorl.checkpoints import snapshot as snapshot_module
    from autorl.errors import ServiceUnavailableError

    storage = Path(tempfile.mkdtemp(prefix="autorl-snapshots-", dir="/dev/shm"))
    caplog.set_level(logging.WARNING, logger="autorl.checkpoints")
    try:
        take = taker(workspace, tiny_base_model, storage)
        monkeypatch.setattr(snapshot_module, "MIN_FREE_BYTES", shutil.disk_usage(storage).total)
        with pytest.raises(ServiceUnavailableError):
            take()
        for _ in range(20):
            free, needed = _storage_full(caplog)
            monkeypatch.setattr(snapshot_module, "MIN_FREE_BYTES", free - needed)
            try:
                take()
            except ServiceUnavailableError:
                assert _storage_full(caplog)[0] != free, "refused with the reserve left"
                continue  # someone else wrote to /dev/shm meanwhile: again
            return
        pytest.fail("the free space of /dev/shm never held still")
    finally:
        shutil.rmtree(storage)


def test_a_full_snapshot_storage_tells_the_agent_nothing_of_it_and_the_operator_who_can_grow_it(
    take: Callable[..., Snapshot],
    checkpoint: Path,
    snapshots: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The storage is every experiment's: its path and free bytes would tell an agent of the others'
    checkpoints. The refusal is the same text whatever they are; the platform's log has them."""
    from autorl.checkpoints import snapshot as snapshot_module
    from autorl.errors import ServiceUnavailableError

    monkeypatch.setattr(snapshot_module, "MIN_FREE_BYTES", shutil.disk_usage(snapshots.parent).total)
    with (
        caplog.at_level(logging.WARNING, logger="autorl.checkpoints"),
        pytest.raises(ServiceUnavailableError) as caught,
    ):
        take()
    assert str(caught.value) == (
        "the evaluator storage has too little room to take this checkpoint now; retry once queued "
        "evaluations have finished (operators: grow AUTORL_SNAPSHOT_DIR's volume; the platform's log "
        "says by how much)"
    )
    assert not re.search(r"\d", str(caught.value)) and str(snapshots) not in str(caught.value)
    free, needed = _storage_full(caplog)
    assert free < needed + snapshot_module.MIN_FREE_BYTES
    assert f"path={snapshots}" in caplog.records[-1].getMessage()
