"""The admin token of a local grader started without one (``AUTORL_LOCAL_MODE=1 autorl grader``).

On a shared machine an admin API without a token is every user's: anyone could register experiments,
finish them or read ``/metrics``. So a local grader with no ``AUTORL_ADMIN_TOKEN`` makes a token,
stores it owner-only (0600) in its home, and prints it once, when it is made; later starts read it
from there. A stored token that other users could read, or a home the grader cannot write, stops
the start-up with the fix. ``autorl run`` gives its grader a token of its own and never comes here.
"""

from __future__ import annotations

import os
import secrets
import stat
import sys
from pathlib import Path
from typing import TextIO

from pydantic import SecretStr

from autorl.errors import ConfigurationError
from autorl_grader.settings import GraderSettings

#: Under the platform home (AUTORL_HOME).
ADMIN_TOKEN_FILE = "grader-admin-token"
OWNER_ONLY = 0o600


def with_local_admin_token(settings: GraderSettings, out: TextIO | None = None) -> GraderSettings:
    """``settings`` with an admin token: its own, else (local mode) the one stored in the home,
    made and printed to ``out`` (stderr as it is at the call) the first time."""
    if settings.admin_token_value or not settings.local_mode:
        return settings
    out = out or sys.stderr
    path = settings.home / ADMIN_TOKEN_FILE
    fix = f"set AUTORL_ADMIN_TOKEN, or let the grader keep its token in {path}"
    try:
        token = _read(path) if path.exists() else None
        if token is None:
            token = _make(path)
            print(
                f"autorl grader: made an admin token for the admin API, /metrics and the dashboard; "
                f"it is stored owner-only in {path} and shown only now:\n{token}",
                file=out,
                flush=True,
            )
        else:
            print(f"autorl grader: the admin token is the one stored in {path}", file=out, flush=True)
    except OSError as exc:
        raise ConfigurationError(f"cannot keep the admin token ({exc}); {fix}") from exc
    return settings.model_copy(update={"admin_token": SecretStr(token)})


def _read(path: Path) -> str | None:
    """The stored token; None where the file is empty (a start that stopped while making it)."""
    info = path.stat()
    mode = stat.S_IMODE(info.st_mode)
    if info.st_uid != os.getuid() or mode & 0o077:
        raise ConfigurationError(
            f"the admin token file {path} is readable by others (mode {mode:o}) or not yours; "
            f"remove it (a new token is made) or make it yours alone: chmod 600 {path}"
        )
    return path.read_text(encoding="utf-8").strip() or None


def _make(path: Path) -> str:
    token = secrets.token_urlsafe(32)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)  # an empty file left by an interrupted start
    # Created owner-only from the start: no moment where another user could open it.
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, OWNER_ONLY)
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        handle.write(token + "\n")
    return token
