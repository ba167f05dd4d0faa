"""What the snapshot tests share (tests/unit/test_snapshot*.py): taking a snapshot of a submitted
folder the way the grader does, and the refusal a test expects of it."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from autorl.checkpoints.snapshot import Snapshot, snapshot_submission
from autorl.errors import CheckpointError

#: What the tiny base model ships besides its weights and config: a copy of it submitted lists them
#: as ignored, since every evaluation reads the base model's own.
BASE_TOKENIZER_FILES = (
    "generation_config.json",
    "merges.txt",
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.json",
)
#: The refusal of a checkpoint whose files changed while the snapshot read them.
CHANGED = (
    "the checkpoint's files changed while they were being submitted; stop writing a checkpoint before "
    "you submit it: save each checkpoint to a new folder and submit that folder once it is complete"
)


def taker(workspace: Path, base: Path, snapshots: Path) -> Callable[..., Snapshot]:
    """Take a snapshot of ``model_path`` (relative to ``workspace``) into ``snapshots``."""

    def run(model_path: str | Path = "output/ckpt") -> Snapshot:
        return snapshot_submission(
            model_path,
            workspace=workspace,
            output_dir=workspace / "output",
            base_model_dir=base,
            snapshot_root=snapshots,
        )

    return run


def refuser(take: Callable[..., Snapshot], snapshots: Path) -> Callable[..., str]:
    """The refusal of ``model_path``, which must leave nothing in ``snapshots``."""

    def run(model_path: str | Path = "output/ckpt") -> str:
        with pytest.raises(CheckpointError) as caught:
            take(model_path)
        # A refused submission leaves nothing behind in evaluator storage.
        assert not snapshots.exists() or list(snapshots.iterdir()) == []
        return str(caught.value)

    return run


def with_base_files(*names: str) -> tuple[str, ...]:
    """The ignored files of a copy of the base model that holds ``names`` besides."""
    return tuple(sorted((*BASE_TOKENIZER_FILES, *names)))


def snapshot_files(snapshot: Snapshot) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in snapshot.path.iterdir()}


def write_with_a_hole(path: Path, size: int, hole: tuple[int, int]) -> None:
    """``size`` bytes of text at ``path``, with nothing written (a hole, read as NULs) in ``hole``."""
    with path.open("wb") as file:
        file.write(b"x" * hole[0])
        file.seek(hole[1])
        file.write(b"x" * (size - hole[1]))


def output_as_a_link(workspace: Path, base: Path, real: Path) -> None:
    """The workspace's output/ swapped for a link to ``real``, a folder that holds a copy of the base
    model as ckpt."""
    shutil.rmtree(workspace / "output")
    shutil.copytree(base, real / "ckpt")
    (workspace / "output").symlink_to(real, target_is_directory=True)
