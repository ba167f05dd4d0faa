"""An evaluation's time budget: what the base model's architecture needs, times a margin.

A submission has the base model's tensors (names and shapes, checked at submit) and runs in the
base model's code, so it cannot need more work than the base model writing every answer to its
token limit. The budget is measured once per base model and evaluation key: the baseline's own
evaluation (every row of the same split, the same backend and settings), scaled up to every row at
its token limit where the baseline recorded how many tokens it wrote, times
``AUTORL_EVAL_BUDGET_FACTOR``, and never under ``AUTORL_EVAL_BUDGET_FLOOR_S``. An evaluation past
it (weights that make every step slow, such as denormal values on a CPU that does not flush them)
is stopped and fails as the checkpoint's failure: it counts against the submission limit and the
agent reads the budget. Otherwise it would hold a shared evaluator, and every experiment queued
behind it, up to the hard timeout.

A budget holds for a machine that gives the evaluation its CPU: an evaluation past it whose threads
(the worker's and every process it started for the evaluation: OpenCompass, its engine) waited for
a CPU (runnable, not running: the kernel's run delay) over :data:`STARVED_WAIT_RATIO` times as long
as they ran, on under :data:`STARVED_SHARE` of its CPUs, while other work kept the rest of them
busy, was slowed by the machine, whoever slowed it (on one machine, another experiment's agent
starting busy processes, each in a session of its own), and fails as the evaluator's fault, not
counted.

A baseline evaluation has no budget (it is the measure; the hard timeout bounds it), nor has an
evaluation whose baseline was measured on another kind of device or batch size, or not yet: the
hard timeout (``AUTORL_EVAL_TIMEOUT_S``) bounds those.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.orm import Session

from autorl.store import Split, Submission, SubmissionStatus, eval_keys
from autorl_evaluator.failures import EvaluatorFaultError, PublicEvaluationError
from autorl_evaluator.settings import WorkerSettings

log = logging.getLogger("autorl.evaluator.budget")
#: How many ``reused_from`` links lead from an experiment's baseline to the evaluation it reused.
MAX_REUSE_HOPS = 8
#: An evaluation past its budget whose threads waited for a CPU over this many times as long as they
#: ran (and a second at least), while they ran on under :data:`STARVED_SHARE` of the CPUs it may use,
#: was starved by other work: the evaluator's failure, not the checkpoint's. (Its own threads, more
#: than its CPUs, make it wait as long, but keep every CPU busy.)
STARVED_WAIT_RATIO = 2.0
STARVED_WAIT_MIN_S = 1.0
STARVED_SHARE = 0.25  # a budget is several times what the base model needs: a quarter of it passes one


def usable_cpus() -> float:
    """The CPUs this process may run on: its affinity, less its cgroup's CPU quota where it has one."""
    cpus = float(len(os.sched_getaffinity(0)))
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        if quota != "max":
            cpus = min(cpus, int(quota) / int(period))
    except (OSError, ValueError):
        pass
    return cpus


@dataclass(frozen=True)
class CpuTime:
    """How long an evaluation's threads ran on a CPU and waited for one, and the time, in seconds."""

    ran: float
    waited: float
    wall: float
    #: What other work ran on its CPUs meanwhile (the CPUs' busy time less ``ran``).
    others: float = 0.0

    @property
    def starved(self) -> bool:
        """Kept waiting, while it ran on little of its CPUs and other work on the rest. (Its own
        processes, more than its CPUs and waking together, wait as long and run as little, but
        leave the CPUs idle between.)"""
        kept_waiting = self.waited >= max(STARVED_WAIT_RATIO * self.ran, STARVED_WAIT_MIN_S)
        cpu_seconds = usable_cpus() * self.wall
        crowded = self.others >= (1 - STARVED_SHARE) * cpu_seconds
        return kept_waiting and self.ran <= STARVED_SHARE * cpu_seconds and crowded


#: How often :class:`CpuMeter` reads the threads while an evaluation runs (at least): a thread or
#: process that ends between two reads loses what it did since the last.
CPU_READ_INTERVAL_S = 0.5


def _threads_under(root: int) -> dict[tuple[int, int], tuple[int, int]]:
    """The run and wait nanoseconds of every thread of process ``root`` and of its descendants, by
    thread id and start time (a thread id can be reused)."""
    found: dict[tuple[int, int], tuple[int, int]] = {}
    pids = [root]
    while pids:
        pid = pids.pop()
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:  # ended meanwhile
            continue
        for tid in tids:
            task = Path(f"/proc/{pid}/task/{tid}")
            try:
                ran, waited = (int(field) for field in (task / "schedstat").read_text().split()[:2])
                start = int((task / "stat").read_text().rsplit(")", 1)[1].split()[19])
                pids.extend(int(child) for child in (task / "children").read_text().split())
            except (OSError, ValueError, IndexError):  # ended meanwhile, or no scheduler statistics
                continue
            found[(int(tid), start)] = (ran, waited)
    return found


def _busy_seconds() -> float:
    """How long the CPUs this process may run on have been busy since boot (``/proc/stat``: user,
    nice, system, irq, softirq and steal time), in seconds; 0 where it cannot be read."""
    cpus = {f"cpu{cpu}" for cpu in os.sched_getaffinity(0)}
    ticks = 0
    try:
        for line in Path("/proc/stat").read_text().splitlines():
            fields = line.split()
            if fields and fields[0] in cpus:
                user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields[1:9])
                ticks += user + nice + system + irq + softirq + steal
    except (OSError, ValueError):
        return 0.0
    return ticks / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """What an evaluation's threads ran and waited (:class:`CpuTime`): this process's and every
    descendant's (OpenCompass's processes, a kept server's, which end or were started before the
    evaluation), read when made and every :data:`CPU_READ_INTERVAL_S` while used as a context."""

    def __init__(self) -> None:
        self._root = os.getpid()
        self._first = _threads_under(self._root)
        self._last = dict(self._first)
        self._started = time.monotonic()
        self._busy = _busy_seconds()
        self._interval = CPU_READ_INTERVAL_S
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._reader = threading.Thread(target=self._keep_reading, name="cpu-meter", daemon=True)

    def __enter__(self) -> CpuMeter:
        self._reader.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._reader.join()
        self._read()

    def _keep_reading(self) -> None:
        while not self._stop.wait(self._interval):
            self._read()

    def _read(self) -> None:
        began = time.thread_time()
        threads = _threads_under(self._root)
        with self._lock:
            self._last.update(threads)
        # A tree of many threads costs more to read: the reads then take at most a tenth of a CPU.
        self._interval = max(CPU_READ_INTERVAL_S, 10 * (time.thread_time() - began))

    def used(self) -> CpuTime:
        """Since it was made: a thread that was there then counts from what it had run and waited."""
        self._read()
        ran = waited = 0
        with self._lock:
            for key, (last_ran, last_waited) in self._last.items():
                first_ran, first_waited = self._first.get(key, (0, 0))
                ran, waited = ran + last_ran - first_ran, waited + last_waited - first_waited
        others = max(0.0, _busy_seconds() - self._busy - ran / 1e9)
        return CpuTime(ran / 1e9, waited / 1e9, time.monotonic() - self._started, others)


class BudgetExceededError(PublicEvaluationError):
    """The evaluation passed its time budget: the checkpoint's failure (it counts against the
    submission limit), with a message that names the budget."""


@dataclass(frozen=True)
class TimeBudget:
    """How long an agent's evaluation may take, and what that was measured from."""

    seconds: float
    #: The baseline evaluation's own duration and the share of its token limit it wrote.
    baseline_seconds: float
    baseline_fill: float
    factor: float
    floor_s: float
    #: The kind of device the baseline ran on (``cpu``, ``cuda``): the budget holds only there.
    device: str

    def deadline(self, started: float, device: str) -> float | None:
        """The ``time.monotonic()`` past which an evaluation that began at ``started`` on a device
        of kind ``device`` is stopped; None where the baseline ran on another kind of device."""
        if device_kind(device) != self.device:
            log.info("event=budget_not_applied device=%s baseline_device=%s", device, self.device)
            return None
        return started + self.seconds

    def exceeded(self) -> BudgetExceededError:
        """The failure of an evaluation stopped at its budget, as the agent reads it: without its
        seconds, which derive from a baseline that another split's or another experiment's evaluation
        may have measured (the agent reads no number timed on work not its own); the evaluator's log
        has them."""
        log.info(
            "event=budget_exceeded budget_s=%.1f baseline_s=%.1f fill=%.3f factor=%g floor_s=%.0f",
            self.seconds,
            self.baseline_seconds,
            self.baseline_fill,
            self.factor,
            self.floor_s,
        )
        return BudgetExceededError(
            "the evaluation passed its time budget and was stopped: a checkpoint of the base model's "
            "shapes needs no more work than the base model writing every answer to its token limit, "
            f"which the budget allows {self.factor:g} times over (AUTORL_EVAL_BUDGET_FACTOR, at least "
            "AUTORL_EVAL_BUDGET_FLOOR_S). This is the checkpoint's failure and counts against your "
            "submission limit; check its weights for values that make arithmetic slow (denormal, "
            "NaN or infinite values)"
        )

    def failure(self, exceeded: BudgetExceededError, cpu: CpuTime) -> PublicEvaluationError:
        """What an evaluation stopped at this budget fails as: ``exceeded`` (the checkpoint's), or the
        evaluator's fault where its threads were kept waiting for a CPU (:attr:`CpuTime.starved`)."""
        if not cpu.starved:
            return exceeded
        log.warning(
            "event=budget_exceeded_starved ran_s=%.1f waited_s=%.1f wall_s=%.1f",
            cpu.ran,
            cpu.waited,
            cpu.wall,
        )
        return EvaluatorFaultError(
            "the evaluation passed its time budget while other work on the machine kept it waiting for "
            "a CPU, so this says nothing of the checkpoint; submit it again",
            detail=f"cpu ran {cpu.ran:.1f} s, waited {cpu.waited:.1f} s, in {cpu.wall:.1f} s",
        )


def device_kind(device: str) -> str:
    """``cuda:1`` → ``cuda``."""
    return device.split(":", 1)[0]


def evaluation_budget(
    session: Session, submission: Submission, settings: WorkerSettings
) -> TimeBudget | None:
    """``submission``'s budget from its experiment's baseline on the same split (the evaluation
    it reused, if it reused one), or None: a baseline itself, or no baseline measured under the same
    evaluation key and batch size yet."""
    if submission.is_baseline:
        return None
    experiment = submission.experiment
    baseline_id = (
        experiment.validation_baseline_submission_id
        if submission.split == Split.VALIDATION
        else experiment.baseline_submission_id
    )
    measured = _measured_evaluation(session, baseline_id)
    if measured is None or measured.eval_key != submission.eval_key:
        return None
    details = measured.details or {}
    # The batch size is no part of the key (it changes no score) but changes the time.
    measured_config = details.get("eval_config")
    own_config = eval_keys.recorded_config(submission)
    if not isinstance(measured_config, dict) or measured_config.get("batch_size") != own_config.get(
        "batch_size"
    ):
        return None
    seconds = float(measured.eval_seconds or 0.0)
    device = details.get("device")
    if seconds <= 0 or not isinstance(device, str):
        return None
    fill = _fill(details, measured.n_samples)
    budget = max(settings.eval_budget_floor_s, settings.eval_budget_factor * seconds / fill)
    return TimeBudget(
        seconds=budget,
        baseline_seconds=seconds,
        baseline_fill=fill,
        factor=settings.eval_budget_factor,
        floor_s=settings.eval_budget_floor_s,
        device=device_kind(device),
    )


def _measured_evaluation(session: Session, submission_id: int | None) -> Submission | None:
    """The scored evaluation ``submission_id`` is, or reused (through ``reused_from``)."""
    for _ in range(MAX_REUSE_HOPS):
        row = session.get(Submission, submission_id) if submission_id is not None else None
        if row is None or row.status != SubmissionStatus.SCORED:
            return None
        if row.reused_from is None:
            return row
        submission_id = row.reused_from
    return None


def _fill(details: dict[str, object], n_samples: int | None) -> float:
    """The share of every row's token limit the baseline wrote (1 where it did not record its new
    tokens): its duration over this is what the base model writing every row to the limit takes,
    taken as proportional to the tokens written (an overestimate: a row's prompt costs the same
    either way)."""
    tokens, limit = details.get("new_tokens"), details.get("max_new_tokens")
    if not isinstance(tokens, int) or not isinstance(limit, int) or not n_samples or tokens <= 0:
        return 1.0
    return min(1.0, tokens / (n_samples * limit))


def remaining_s(deadline: float | None) -> float | None:
    """Seconds left until ``deadline`` (never below zero); None without one."""
    return None if deadline is None else max(deadline - time.monotonic(), 0.0)
