"""When a training phase must stop: before a step that would end past the phase's stop time.

A phase that only checks the clock before each step starts its last step just before the stop and
ends it one step late, eating the reserve meant for saving and submitting: on a loaded machine a
step takes seconds, and the checkpoint of the phase's last stretch then missed the deadline. The
clock keeps the durations of the recent steps and refuses a step that the slowest of them says
would not end in time.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable


class StepClock:
    """The durations of a phase's recent steps, and whether another one fits before a stop time.

    ``now`` reads the wall clock (``time.time``), the clock the stop times are given in.
    """

    def __init__(self, *, now: Callable[[], float] | None = None, window: int = 5) -> None:
        if window < 1:
            raise ValueError(f"window must be at least 1, got {window}")
        self._now = now or time.time
        self._durations: deque[float] = deque(maxlen=window)
        self._began: float | None = None

    def now(self) -> float:
        """The clock's time (the wall clock unless the clock was given another)."""
        return self._now()

    def begin(self) -> None:
        """A step starts now."""
        self._began = self._now()

    def end(self) -> None:
        """The step begun last ends now."""
        if self._began is None:
            raise RuntimeError("end() without begin()")
        self._durations.append(max(0.0, self._now() - self._began))
        self._began = None

    def step_estimate(self) -> float:
        """Seconds the next step may take: the slowest of the recent ones (0 before the first)."""
        return max(self._durations, default=0.0)

    def ends_after(self, steps: int, stop_at: float) -> bool:
        """Whether ``steps`` more steps, started now, would end past ``stop_at``."""
        return self._now() + steps * self.step_estimate() > stop_at

    def has_room_before(self, stop_at: float) -> bool:
        """Whether a step started now would end before ``stop_at``, by the recent steps."""
        return self._now() + self.step_estimate() < stop_at
