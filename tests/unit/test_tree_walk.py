"""What the agent leaves in its workspace never breaks the hand-back: folder chains deeper than
Python's recursion limit, links out of the workspace, folders and FIFOs in place of the mirrors
and of agent.log. Real files on this machine's file system; nothing is mocked."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from autorl_agent_runner.sandbox.agent_user import reclaim
from autorl_agent_runner.workspace.layout import Workspace, open_platform_log, write_run_meta
from autorl_agent_runner.workspace.mirrors import write_mirror
from autorl_agent_runner.workspace.tree_walk import chown_tree, remove_entry

NEEDS_ROOT = pytest.mark.requires(os.geteuid() == 0, reason="giving files to another user needs root")
#: Deeper than Python's recursion limit (1,000) and than a path can name (PATH_MAX, 4,096 bytes).
DEEP = 5_000
AGENT_UID = 61999


def make_chain(root: Path, depth: int) -> None:
    """``root/d/d/.../d``, ``depth`` folders, each made relative to its parent (no path names it)."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            child = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = child
        (Path(f"/proc/self/fd/{fd}") / "bottom.txt").write_text("deep")
    finally:
        os.close(fd)


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A platform file outside the agent's tree that links in the tree point to."""
    secret = tmp_path / "platform-secret.txt"
    secret.write_text("the platform's\n")
    secret.chmod(0o600)
    return secret


@pytest.fixture
def tree(tmp_path: Path, outside: Path) -> Iterator[Path]:
    root = tmp_path / "workspace"
    (root / "code").mkdir(parents=True)
    make_chain(root / "code", DEEP)
    (root / "code" / "link-out").symlink_to(outside)
    (root / "code" / "link-up").symlink_to(tmp_path)
    yield root
    if root.exists():
        remove_entry(tmp_path, "workspace")  # pytest's own clean-up recurses


@NEEDS_ROOT
def test_a_deep_chain_is_given_back_entirely_without_following_links(tree: Path, outside: Path) -> None:
    assert chown_tree(tree, AGENT_UID, AGENT_UID) == 0
    assert outside.stat().st_uid == 0 and tree.parent.stat().st_uid == 0
    assert (tree / "code" / "link-out").lstat().st_uid == AGENT_UID
    assert reclaim(tree) == 0
    owners = set()
    fd = os.open(tree / "code", os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(DEEP):
        owners.add(os.stat("d", dir_fd=fd, follow_symlinks=False).st_uid)
        child = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = child
    owners.add(os.stat("bottom.txt", dir_fd=fd).st_uid)
    os.close(fd)
    assert owners == {os.geteuid()}
    assert (tree / "code" / "link-out").lstat().st_uid == os.geteuid()


def test_a_deep_chain_is_removed_and_what_links_name_is_kept(tree: Path, outside: Path) -> None:
    remove_entry(tree, "code")
    assert not (tree / "code").exists()
    assert outside.read_text() == "the platform's\n" and tree.parent.is_dir()


def test_a_folder_of_the_users_own_that_it_locked_is_removed(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    (locked / "inner").mkdir(parents=True)
    (locked / "inner" / "file").write_text("x")
    (locked / "inner").chmod(0)
    locked.chmod(0o500)
    remove_entry(tmp_path, "locked")
    assert not locked.exists()


@pytest.fixture
def workspace(tmp_path: Path) -> Workspace:
    root = tmp_path / "ws"
    root.mkdir()
    return Workspace(root, "tiny")


def write_meta(workspace: Workspace) -> None:
    write_run_meta(workspace, start_time=1.0, timeout_s=2, last_submit_time=None, deadline=3.0)


def test_a_folder_in_place_of_a_mirror_is_removed_and_the_mirror_written(
    workspace: Workspace, outside: Path
) -> None:
    make_chain(workspace.root, 1500)
    os.rename(workspace.root / "d", workspace.run_meta)
    (workspace.run_meta / "link-out").symlink_to(outside)
    lines: list[str] = []
    assert write_mirror(workspace.run_meta, lambda: write_meta(workspace), lines.append)
    assert (
        stat.S_ISREG(workspace.run_meta.lstat().st_mode)
        and '"deadline": 3.0' in workspace.run_meta.read_text()
    )
    assert outside.read_text() == "the platform's\n"
    assert lines == ["event=mirror_replaced file=run_meta.json was=folder"]


def test_a_fifo_or_link_in_place_of_a_mirror_is_replaced_without_opening_it(
    workspace: Workspace, outside: Path
) -> None:
    os.mkfifo(workspace.run_meta)  # opening it to write would wait for a reader for ever
    lines: list[str] = []
    assert write_mirror(workspace.run_meta, lambda: write_meta(workspace), lines.append)
    assert stat.S_ISREG(workspace.run_meta.lstat().st_mode) and not lines
    workspace.run_meta.unlink()
    workspace.run_meta.symlink_to(outside)
    assert write_mirror(workspace.run_meta, lambda: write_meta(workspace), lines.append)
    assert not workspace.run_meta.is_symlink() and outside.read_text() == "the platform's\n"


def test_a_mirror_that_cannot_be_written_is_logged_not_raised(tmp_path: Path) -> None:
    gone = Workspace(tmp_path / "removed-workspace", "tiny")
    lines: list[str] = []
    assert not write_mirror(gone.run_meta, lambda: write_meta(gone), lines.append)
    assert lines == ["event=mirror_not_written file=run_meta.json error=No such file or directory"]


@pytest.mark.parametrize("planted", ["symlink", "hardlink", "fifo", "folder"])
def test_agent_log_is_a_new_plain_file_whatever_was_put_in_its_place(
    workspace: Workspace, outside: Path, planted: str
) -> None:
    log = workspace.agent_log
    if planted == "symlink":
        log.symlink_to(outside)
    elif planted == "hardlink":
        os.link(outside, log)
    elif planted == "fifo":
        os.mkfifo(log)
    else:
        (log / "inner").mkdir(parents=True)
    with open_platform_log(log) as out:
        out.write(b"agent output\n")
    info = log.lstat()
    assert stat.S_ISREG(info.st_mode) and info.st_nlink == 1 and log.read_bytes() == b"agent output\n"
    assert outside.read_text() == "the platform's\n"
