"""Evaluator storage of submission snapshots: pruning, and a full storage refusing for now with the
free bytes, the checkpoint's size and who can grow it.
"""

from __future__ import annotations

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


def test_storage_left_with_exactly_its_reserve_after_the_copy_takes_the_checkpoint(
    workspace: Path, tiny_base_model: Path, checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reserve is what must be left, no more: the refusal names the free bytes and the size, and
    with the reserve set to exactly their difference the checkpoint is taken. The storage is a
    tmpfs (/dev/shm), whose free space only moves with what is written to it."""
    from autorl.checkpoints import snapshot as snapshot_module
    from autorl.errors import ServiceUnavailableError

    storage = Path(tempfile.mkdtemp(prefix="autorl-snapshots-", dir="/dev/shm"))
    try:
        take = taker(workspace, tiny_base_model, storage)
        counts = re.compile(r"has (\d+) bytes free, too few to take this (\d+)-byte checkpoint")
        monkeypatch.setattr(snapshot_module, "MIN_FREE_BYTES", shutil.disk_usage(storage).total)
        with pytest.raises(ServiceUnavailableError) as caught:
            take()
        for _ in range(20):
            found = counts.search(str(caught.value))
            assert found is not None, caught.value
            free, needed = map(int, found.groups())
            monkeypatch.setattr(snapshot_module, "MIN_FREE_BYTES", free - needed)
            try:
                take()
            except ServiceUnavailableError as refused:
                now = counts.search(str(refused))
                assert now is not None and int(now.group(1)) != free, (
                    f"refused with the reserve left: {refused}"
                )
                caught.value = refused  # someone else wrote to /dev/shm meanwhile: again
                continue
            return
        pytest.fail("the free space of /dev/shm never held still")
    finally:
        shutil.rmtree(storage)


def test_a_full_snapshot_storage_says_who_can_grow_it(
    take: Callable[..., Snapshot], checkpoint: Path, snapshots: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from autorl.checkpoints import snapshot as snapshot_module
    from autorl.errors import ServiceUnavailableError

    monkeypatch.setattr(snapshot_module, "MIN_FREE_BYTES", shutil.disk_usage(snapshots.parent).total)
    with pytest.raises(ServiceUnavailableError) as caught:
        take()
    assert re.fullmatch(
        rf"the evaluator storage \({re.escape(str(snapshots))}\) has \d+ bytes free, too few to take "
        r"this \d+-byte checkpoint; retry once queued evaluations have finished \(operators: grow "
        r"AUTORL_SNAPSHOT_DIR's volume\)",
        str(caught.value),
    ), caught.value
