"""Child processes that die with the process that started them.

A platform process (the grader, an evaluator worker and its evaluation, the agent's sandbox) runs
in a session of its own, so that a terminal's Ctrl-C reaches only its parent, which then stops
them in order. A parent that is killed outright (SIGKILL) stops nothing: without this, its
children would run on, unowned. ``setpriv --pdeathsig KILL`` sets the kernel's parent-death
signal before it executes the command, so the command is killed when its parent dies.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence


def dying_with_parent(argv: Sequence[str]) -> list[str]:
    """``argv`` so that it gets SIGKILL when the process (thread) that starts it dies; unchanged
    where util-linux's ``setpriv`` is missing."""
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return list(argv)
    return [setpriv, "--pdeathsig", "KILL", "--", *argv]
