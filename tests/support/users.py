"""Real, distinct users for the permission tests (this machine runs the suite as root).

Two ways to act as another user: :func:`as_user` runs a command under ``setpriv``, and
:func:`call_as` runs a Python function in a forked child that has dropped to the user (every
capability gone), for code that must run with exactly that user's rights: a new Python process of
another user cannot even start here, since the interpreter lives under /root (mode 0700).
"""

from __future__ import annotations

import contextlib
import os
import pickle
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: The platform's user and group (the grader's), and two experiments' agents (as the operator's ids).
PLATFORM = 10001
AGENT_A, AGENT_B = 1_234_567, 1_765_432


def setpriv(
    uid: int, *, gid: int | None = None, groups: Sequence[int] = (), read_anything: bool = False
) -> list[str]:
    """The ``setpriv`` prefix that runs a command as ``uid`` and group ``gid`` (default: the user's
    own id) with exactly ``groups`` as supplementary ones.

    ``read_anything`` keeps one capability, reading past permissions (never writing, never changing
    a mode), for a Python program: this machine's Python lives under /root (0700). Every check of
    who may read what runs without it.
    """
    who = [f"--reuid={uid}", f"--regid={uid if gid is None else gid}"]
    who.append(f"--groups={','.join(map(str, groups))}" if groups else "--clear-groups")
    if read_anything:
        who += ["--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search"]
    return ["setpriv", *who]


def as_user(
    uid: int, *command: str, groups: tuple[int, ...] = (), read_anything: bool = False
) -> subprocess.CompletedProcess[str]:
    """Run ``command`` as ``uid`` (see :func:`setpriv`)."""
    return subprocess.run(
        [*setpriv(uid, groups=groups, read_anything=read_anything), *command],
        capture_output=True,
        text=True,
        env=os.environ | {"HOME": "/tmp"},
    )


@dataclass(frozen=True)
class Outcome:
    """What a function returned in the child, or the exception it raised (as ``Type: message``)."""

    ok: bool
    value: Any


def call_as(
    uid: int,
    function: Callable[..., Any],
    *args: Any,
    gid: int | None = None,
    groups: Sequence[int] = (),
) -> Outcome:
    """Call ``function(*args)`` in a forked child as ``uid`` (group ``gid``, default the user's own
    id, and exactly ``groups`` besides, no capability, umask 022 as in a container). Everything it
    uses must already be imported here: the child cannot read the interpreter's own files under
    /root."""
    group = uid if gid is None else gid
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into the test
        try:
            os.close(read_end)
            os.setgroups(list(groups))
            os.setresgid(group, group, group)
            os.setresuid(uid, uid, uid)
            os.umask(0o022)
            try:
                outcome = Outcome(True, function(*args))
            except BaseException as exc:
                outcome = Outcome(False, f"{type(exc).__name__}: {exc}")
            with os.fdopen(write_end, "wb") as out:
                pickle.dump(outcome, out)
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as answer:
        data = answer.read()
    os.waitpid(pid, 0)
    if not data:
        raise AssertionError(f"the child acting as user {uid} died before answering")
    result = pickle.loads(data)
    assert isinstance(result, Outcome)
    return result


@contextlib.contextmanager
def shared_volume() -> Iterator[Path]:
    """A fresh shared volume as the kubelet leaves it for the prepare pod's fsGroup: root-owned,
    group = the platform's, setgid and group-writable (in a folder anyone may traverse)."""
    base = Path(tempfile.mkdtemp(prefix="autorl-shared-", dir="/tmp"))
    base.chmod(0o755)
    volume = base / "shared"
    volume.mkdir()
    os.chown(volume, 0, PLATFORM)
    volume.chmod(0o2775)
    try:
        yield volume
    finally:
        shutil.rmtree(base)
