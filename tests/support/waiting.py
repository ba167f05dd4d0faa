"""Waiting for a condition that real processes bring about, with a bound and a message."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path


def wait_for(
    condition: Callable[[], bool],
    what: str,
    timeout_s: float,
    interval_s: float = 0.2,
    *,
    log: Path | None = None,
    alive: Callable[[], bool] | None = None,
) -> None:
    """Poll ``condition`` every ``interval_s`` until it holds; past ``timeout_s`` fail, naming
    ``what`` and ending with the last lines of ``log`` (the process's output) when given. With
    ``alive`` (is the process that brings it about still running?), fail at once when it is not."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if alive is not None and not alive():
            failure = "the process ended while waiting for"
        elif time.monotonic() > deadline:
            failure = f"timed out after {timeout_s:.0f} s waiting for"
        else:
            time.sleep(interval_s)
            continue
        tail = f":\n{log.read_text(errors='replace')[-3000:]}" if log is not None else ""
        raise AssertionError(f"{failure} {what}{tail}")
