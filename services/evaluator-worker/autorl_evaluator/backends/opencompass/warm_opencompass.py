"""The worker's side of the warm OpenCompass (``compass_server.py``): start it, run an evaluation
in it, stop it.

In the warm worker (``AUTORL_EVAL_WARM_WORKER``) the ``opencompass`` backend runs each evaluation
in a process forked from a server that has OpenCompass imported already, instead of running the
``opencompass`` command (three processes, each importing OpenCompass). The run is the same
OpenCompass run: the same config, work folder, environment and log, OpenCompass's own command-line
entry, its tasks run in the forked process (``--debug``). The forked process is a process group of
its own: at the hard timeout, or when the wait is interrupted, the worker ends that group as it
ends the command's, and any failure stops the server, so the next evaluation starts a fresh one.
What a run leaves behind outside its group (a process that called ``setsid``) is handed to the
server, a child subreaper, which ends it before it reports the run's end.

The server is kept only where the worker evaluates again (the warm worker), and only for the
runs that do no GPU work in OpenCompass's process (vLLM there would start CUDA, which a forked
process cannot share): the resident engine's (generation crosses to the engine's own environment)
and the CPU's. It runs in the Python of the
``opencompass`` command (the interpreter its script names); a command that is not a Python
script runs the ordinary way.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from autorl.process_group import kill_group
from autorl_evaluator import json_lines
from autorl_evaluator.backends.opencompass.kept_server import KeptServer, ServerProcess, ServerSpec
from autorl_evaluator.failures import EvaluatorFaultError
from autorl_evaluator.subprocess_group import GroupResult

log = logging.getLogger("autorl.evaluator.opencompass")

SERVER = Path(__file__).resolve().parent / "compass_server.py"
#: How long the server gets to import OpenCompass and listen.
START_TIMEOUT_S = 180.0
#: How long a forked run gets to be reported once asked for.
FORK_TIMEOUT_S = 30.0
#: After SIGTERM, how long the server's group gets before SIGKILL.
STOP_GRACE_S = 5.0


@dataclass(frozen=True, kw_only=True)
class CompassSpec(ServerSpec):
    """Which warm OpenCompass: the ``PYTHONPATH`` fixed at its start (the resident engine's ``vllm``
    shim first, or nothing); a server started under other package versions imports what is installed
    now."""

    pythonpath: str


class CompassServer(ServerProcess[CompassSpec]):
    """One warm OpenCompass process and its socket."""

    kind = "compass"
    title = "the warm OpenCompass"
    start_timeout_s = START_TIMEOUT_S

    def __init__(self, spec: CompassSpec, env: Mapping[str, str], log_path: Path) -> None:
        self._home_at_start: list[tuple[str, int, int]] | None = None
        super().__init__(spec, [str(SERVER)], env, log_path, stop_grace_s=STOP_GRACE_S)

    @property
    def home(self) -> Path:
        """The server's own home, in its 0700 folder, removed with it. Libraries that resolve their
        cache folders when they are imported (huggingface_hub, datasets, OpenCompass's data folder)
        resolve them here, in the server, for every run forked from it."""
        return self.folder / "home"

    def server_environment(self, env: Mapping[str, str]) -> dict[str, str]:
        server_env = {name: value for name, value in env.items() if name != "PYTHONPATH"}
        if self.spec.pythonpath:
            server_env["PYTHONPATH"] = self.spec.pythonpath
        (self.home / "huggingface").mkdir(parents=True)
        server_env.update(
            {
                "HOME": str(self.home),
                "HF_HOME": str(self.home / "huggingface"),
                "COMPASS_DATA_CACHE": str(self.home),
            }
        )
        return server_env

    def home_contents(self) -> list[tuple[str, int, int]]:
        """Every file under the server's home: path, size, modification time."""
        found = []
        for folder, _, names in os.walk(self.home):
            for name in names:
                path = Path(folder) / name
                with contextlib.suppress(OSError):
                    stat = path.lstat()
                    found.append((str(path.relative_to(self.home)), stat.st_size, stat.st_mtime_ns))
        return sorted(found)

    def wait_until_listening(self) -> None:
        super().wait_until_listening()
        # What the server wrote there while importing; a run must leave it as it is.
        self._home_at_start = self.home_contents()

    def run(
        self, argv: Sequence[str], *, cwd: Path, env: Mapping[str, str], timeout_s: float, log_path: Path
    ) -> GroupResult:
        """OpenCompass's command on ``argv`` in a process forked from the server, as
        :func:`~autorl_evaluator.subprocess_group.run_in_group` runs the command: its output to
        ``log_path``, its whole group ended at ``timeout_s`` or when the wait is interrupted, and
        what it left outside its group ended by the server when it has ended."""
        started = time.monotonic()
        request = {"op": "run", "argv": list(argv), "cwd": str(cwd), "env": dict(env), "log": str(log_path)}
        pgid: int | None = None
        timed_out = False
        try:
            with json_lines.connect(self.socket_path, timeout_s=FORK_TIMEOUT_S) as connection:
                connection.send(request)
                answer = connection.receive() or {}
                if "pid" not in answer:
                    raise EvaluatorFaultError(
                        "the warm OpenCompass did not start the run", detail=str(answer.get("error"))
                    )
                pgid = int(answer["pid"])
                connection.set_timeout(max(timeout_s - (time.monotonic() - started), 0.001))
                try:
                    ended = connection.receive() or {}
                except TimeoutError:
                    timed_out = True
                    kill_group(pgid)
                    connection.set_timeout(FORK_TIMEOUT_S)
                    ended = connection.receive() or {}
        except (OSError, ValueError) as exc:
            # The server died, its socket went, or it answered nothing readable: the worker's fault.
            if not timed_out:
                raise EvaluatorFaultError(
                    "the warm OpenCompass failed during the run", detail=f"{type(exc).__name__}: {exc}"
                ) from exc
            ended = {"returncode": -signal.SIGKILL}
        finally:
            # Whatever happened, nothing of the run outlives it (the command's group is ended too).
            survivors = kill_group(pgid) if pgid is not None else []
        if "returncode" not in ended:
            raise EvaluatorFaultError("the warm OpenCompass ended without reporting its run's exit")
        # With what the server found still alive after SIGKILL under it (outside the group too).
        survivors = sorted({*survivors, *map(int, ended.get("survivors", []))})
        if self.home_contents() != self._home_at_start:
            # A run wrote where the next run would read: the next gets a fresh server.
            log.warning("event=compass_home_changed pid=%d", self.process.pid)
            self.stop()
        return GroupResult(int(ended["returncode"]), timed_out, time.monotonic() - started, survivors)


#: This process's warm OpenCompass (the warm worker's child keeps it between evaluations).
SERVERS: KeptServer[CompassSpec, CompassServer] = KeptServer(CompassServer)
