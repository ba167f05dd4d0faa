"""The example agent's step clock: a phase starts no step that would end past its stop time."""

from __future__ import annotations

import pytest

from autorl_agents.step_clock import StepClock


class _Wall:
    """A wall clock the test moves by hand."""

    def __init__(self) -> None:
        self.t = 1_000.0

    def __call__(self) -> float:
        return self.t


def _steps(clock: StepClock, wall: _Wall, *durations: float) -> None:
    for duration in durations:
        clock.begin()
        wall.t += duration
        clock.end()


def test_before_any_step_only_the_stop_time_itself_counts() -> None:
    wall = _Wall()
    clock = StepClock(now=wall)
    assert clock.step_estimate() == 0.0
    assert clock.has_room_before(wall.t + 0.001)
    assert not clock.has_room_before(wall.t)
    assert not clock.has_room_before(wall.t - 5)


def test_a_step_that_would_end_past_the_stop_is_not_started() -> None:
    wall = _Wall()
    clock = StepClock(now=wall)
    _steps(clock, wall, 6.0)
    stop_at = wall.t + 10.0
    assert clock.has_room_before(stop_at)  # 6 s fits in 10
    wall.t += 3.9
    assert clock.has_room_before(stop_at)  # 6 s fits in 6.1
    wall.t += 0.1
    assert not clock.has_room_before(stop_at)  # a step ending exactly at the stop is refused
    wall.t += 1.0
    assert not clock.has_room_before(stop_at)


def test_the_slowest_recent_step_is_the_estimate_and_old_ones_age_out() -> None:
    wall = _Wall()
    clock = StepClock(now=wall, window=3)
    _steps(clock, wall, 2.0, 9.0, 1.0)
    assert clock.step_estimate() == 9.0  # a loaded moment counts, not the mean
    _steps(clock, wall, 1.0)
    assert clock.step_estimate() == 9.0
    _steps(clock, wall, 1.5)
    assert clock.step_estimate() == 1.5  # the 9 s step is four steps back, out of the window of 3


def test_the_default_clock_is_the_wall_clock_the_stop_times_are_given_in() -> None:
    import time

    clock = StepClock()
    clock.begin()
    clock.end()
    assert 0.0 <= clock.step_estimate() < 1.0
    assert clock.has_room_before(time.time() + 60)
    assert not clock.has_room_before(time.time() - 1)


def test_misuse_is_refused_with_the_reason() -> None:
    with pytest.raises(ValueError, match="window must be at least 1, got 0"):
        StepClock(window=0)
    clock = StepClock()
    with pytest.raises(RuntimeError, match=r"end\(\) without begin\(\)"):
        clock.end()
    clock.begin()
    clock.end()
    with pytest.raises(RuntimeError, match=r"end\(\) without begin\(\)"):
        clock.end()  # one end per begin
