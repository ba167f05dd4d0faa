"""The warm worker: evaluations one after another in one long-lived child process, so the model
of an architecture stays resident between them (:mod:`autorl_evaluator.backends.hf.warm_models`).

The parent (:class:`WarmChild`, owned by the local worker, or by the RQ worker's main process,
when ``AUTORL_EVAL_WARM_WORKER`` is set) writes one submission id per line to the child's stdin
and reads ``done ID STATUS`` back.
The child runs in a process group of its own; an evaluation that passes its hard timeout, or that
another thread stops (:meth:`WarmChild.interrupt`, RQ's stop-job command), gets the whole group
killed, and the next evaluation starts a fresh child (a cold load), so a hung or poisoned process
never serves another submission.

    python -m autorl_evaluator.warm_child   # the child side; reads ids on stdin
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence

from autorl.parent_death import dying_with_parent
from autorl.process_group import kill_group
from autorl.untrusted_text import log_printable_lines

log = logging.getLogger("autorl.evaluator.warm")
#: After SIGTERM, how long the child's group gets before SIGKILL (as the local worker's children).
STOP_GRACE_S = 10.0


class EvaluationStoppedError(ChildProcessError):
    """The evaluation was stopped from another thread (:meth:`WarmChild.interrupt`) or before the
    child was handed it."""


class WarmChild:
    """The parent's handle on the child; ``command`` runs the child (default: this module)."""

    def __init__(self, command: Sequence[str] | None = None) -> None:
        own = dying_with_parent([sys.executable, "-m", "autorl_evaluator.warm_child"])
        self.command = list(command or own)
        self.process: subprocess.Popen[bytes] | None = None
        self.started = 0
        # run() and interrupt() (another thread) agree under this lock on whether the child is
        # evaluating, so that a stop is never lost between the two.
        self._lock = threading.Lock()
        self._evaluating = False
        self._interrupted = False

    def run(
        self, submission_id: int, timeout_s: float, *, stop_requested: Callable[[], bool] | None = None
    ) -> str:
        """Evaluate ``submission_id`` in the child; its status line. Raises ``TimeoutError`` after
        ``timeout_s`` (the child is killed, the next call starts another), ``EvaluationStoppedError``
        when :meth:`interrupt` killed it or ``stop_requested()`` was true before the child was
        handed the id, and ``ChildProcessError`` when the child ends without answering."""
        with self._lock:
            if stop_requested is not None and stop_requested():
                raise EvaluationStoppedError(f"evaluation {submission_id} was stopped before it began")
            process = self._ensure_started()
            self._evaluating, self._interrupted = True, False
        try:
            return self._evaluate(process, submission_id, timeout_s)
        finally:
            with self._lock:
                self._evaluating = False
                interrupted = self._interrupted
            if interrupted:  # also when signalled just after it answered: it serves nothing more
                self.stop()

    def interrupt(self, signum: int = signal.SIGKILL) -> int | None:
        """From another thread: end the evaluation in progress by sending ``signum`` to the child's
        whole process group (:meth:`run` then raises ``EvaluationStoppedError``). The pid of the
        child it signalled; None when no evaluation was in progress (nothing is signalled)."""
        with self._lock:
            process = self.process
            if not self._evaluating or process is None:
                return None
            self._interrupted = True
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signum)
        log.info("event=warm_worker_interrupted pid=%d signal=%d", process.pid, signum)
        return process.pid

    def _evaluate(self, process: subprocess.Popen[bytes], submission_id: int, timeout_s: float) -> str:
        assert process.stdin is not None and process.stdout is not None
        try:
            process.stdin.write(f"{submission_id}\n".encode())
            process.stdin.flush()
        except BrokenPipeError:
            self.stop()
            raise self._ended(process, submission_id, "before taking the evaluation") from None
        try:
            line = _read_line(process.stdout, time.monotonic() + timeout_s)
        except BaseException:
            # Interrupted while the child works (an RQ job timeout, a worker's cold shutdown): the
            # child must not go on evaluating, nor serve the next evaluation, unowned.
            self.stop()
            raise
        if line is None:
            self.stop()
            raise TimeoutError(f"evaluation {submission_id} passed {timeout_s:.0f} s")
        if not line.endswith(b"\n"):  # its end, maybe mid-line: the child is gone
            self.stop()
            raise self._ended(process, submission_id, "during the evaluation")
        words = line.decode(errors="replace").split()
        if len(words) != 3 or words[:2] != ["done", str(submission_id)]:
            self.stop()
            raise ChildProcessError(f"unexpected answer from the warm worker: {line[:200]!r}")
        return words[2]

    def _ended(self, process: subprocess.Popen[bytes], submission_id: int, when: str) -> ChildProcessError:
        """Why the (reaped) child ended without answering for ``submission_id``."""
        code = process.returncode
        if code is not None and code < 0:
            how = f"was killed by {_signal_name(-code)}"
            if code == -signal.SIGKILL and not self._interrupted:
                how += " (the kernel's out-of-memory killer sends it, as does kill -9)"
        else:
            how = f"exited with code {code}"
        if self._interrupted:
            return EvaluationStoppedError(
                f"evaluation {submission_id} was stopped: the warm worker's child (pid {process.pid}) {how}"
            )
        return ChildProcessError(
            f"the warm worker's child (pid {process.pid}) {how} {when} of submission {submission_id}"
        )

    def _ensure_started(self) -> subprocess.Popen[bytes]:
        if self.process is None or self.process.poll() is not None:
            self.process = subprocess.Popen(
                self.command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True
            )
            self.started += 1
            log.info("event=warm_worker_started pid=%d starts=%d", self.process.pid, self.started)
        return self.process

    def stop(self) -> None:
        """Kill the child's whole process group (no-op when none runs)."""
        with self._lock:  # interrupt() no longer signals this child's group, which may be reaped
            process, self.process = self.process, None
        if process is not None:
            kill_group(process.pid, process, grace_s=STOP_GRACE_S)
            log.info("event=warm_worker_stopped pid=%d", process.pid)


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _read_line(stream: object, deadline: float) -> bytes | None:
    """One line from a pipe, ``b""`` at its end, ``None`` at ``deadline``."""
    fd = stream.fileno()  # type: ignore[attr-defined]
    buffer = b""
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while not buffer.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not selector.select(left):
                return None
            chunk = os.read(fd, 4096)
            if not chunk:
                return buffer
            buffer += chunk
    return buffer


def main() -> int:
    """The child: ids on stdin, ``done ID STATUS`` on the original stdout, logs on stderr."""
    from autorl_evaluator.jobs import evaluate

    log_printable_lines(logging.INFO)
    # Only the answers go to the parent's pipe: anything a library prints lands on stderr.
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    for line in sys.stdin:
        submission_id = int(line)
        try:
            status = str(evaluate(submission_id).get("status", "skipped"))
        except Exception:
            log.exception("event=warm_evaluation_crashed submission=%d", submission_id)
            status = "crashed"
        answers.write(f"done {submission_id} {status}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
