"""At most one server of a kind per process (the resident engine, the warm OpenCompass), kept
between evaluations and replaced when another is asked for or it has died."""

from __future__ import annotations

import contextlib
import logging
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Generic, Protocol, TypeVar

from autorl.process_group import kill_group
from autorl_evaluator import json_lines
from autorl_evaluator.failures import EvaluatorFaultError
from autorl_evaluator.subprocess_group import set_parent_death_signal

log = logging.getLogger("autorl.evaluator.opencompass")
#: How long a server gets to answer a ping.
PING_TIMEOUT_S = 10.0


@dataclass(frozen=True, kw_only=True)
class ServerSpec:
    """Which server: the Python it runs in, and more that each kind adds."""

    python: Path
    #: The server's environment's package versions when it was asked for (the evaluation key's): an
    #: environment upgraded in place gets a new server, so the key never names what is not running.
    packages: tuple[tuple[str, str], ...] = ()


ServerSpecT = TypeVar("ServerSpecT", bound=ServerSpec)


class ServerProcess(Generic[ServerSpecT]):
    """A server program started in its spec's Python: its socket in a 0700 folder of its own (the
    socket is ours only), its own session (its group is the server and everything it starts), and
    SIGTERM when the process that started it dies."""

    #: ``engine`` or ``compass``: the socket's, the folder's and the log events' name.
    kind = "server"
    #: How the error messages call it.
    title = "the server"
    #: How long the server program gets to start and listen.
    start_timeout_s = 120.0

    def __init__(
        self,
        spec: ServerSpecT,
        arguments: Sequence[str],
        env: Mapping[str, str],
        log_path: Path,
        *,
        stop_grace_s: float,
    ) -> None:
        """Start ``arguments`` (the server's script and its options) in ``spec.python``."""
        self.spec = spec
        command = [str(spec.python), *arguments]
        self.folder = Path(tempfile.mkdtemp(prefix=f"autorl-{self.kind}-"))
        self.socket_path = self.folder / f"{self.kind}.sock"
        self.command = [*command, "--socket", str(self.socket_path)]
        self.log_path = log_path
        self.stop_grace_s = stop_grace_s
        self._log: IO[bytes] = log_path.open("ab")
        self.process = subprocess.Popen(
            self.command,
            env=self.server_environment(env),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=self.folder,
            start_new_session=True,
            preexec_fn=lambda: set_parent_death_signal(signal.SIGTERM),
        )
        log.info("event=%s_started pid=%d command=%s", self.kind, self.process.pid, " ".join(command))

    def server_environment(self, env: Mapping[str, str]) -> dict[str, str]:
        """The server's environment (its folder exists by now)."""
        return dict(env)

    def alive(self) -> bool:
        return self.process.poll() is None

    def ping(self) -> bool:
        """Whether the server answers ``{"op": "ping"}`` on its socket with ``ok``."""
        with contextlib.suppress(OSError, ValueError):
            answer = json_lines.request(self.socket_path, {"op": "ping"}, timeout_s=PING_TIMEOUT_S)
            return bool(answer and answer.get("ok"))
        return False

    def wait_until_listening(self) -> None:
        timeout_s = self.start_timeout_s
        deadline = time.monotonic() + timeout_s
        while True:
            if not self.alive():
                raise EvaluatorFaultError(
                    f"{self.title} exited with code {self.process.returncode} before listening",
                    detail=f"{' '.join(self.command)}; its log: {self.log_path}",
                )
            if self.socket_path.exists() and self.ping():
                return
            if time.monotonic() > deadline:
                raise EvaluatorFaultError(f"{self.title} did not listen within {timeout_s:.0f} s")
            time.sleep(0.1)

    def stop(self) -> None:
        kill_group(self.process.pid, self.process, grace_s=self.stop_grace_s)
        self._log.close()
        shutil.rmtree(self.folder, ignore_errors=True)
        log.info(
            "event=%s_stopped pid=%d returncode=%s", self.kind, self.process.pid, self.process.returncode
        )


class Server(Protocol):
    @property
    def spec(self) -> Hashable: ...

    def alive(self) -> bool: ...

    def wait_until_listening(self) -> None: ...

    def stop(self) -> None: ...


ServerT = TypeVar("ServerT", bound=Server)
SpecT = TypeVar("SpecT", bound=Hashable)


class KeptServer(Generic[SpecT, ServerT]):
    """The server of this kind this process keeps (``current``), started by ``start``."""

    def __init__(self, start: Callable[[SpecT, Mapping[str, str], Path], ServerT]) -> None:
        self._start = start
        self.current: ServerT | None = None

    def get(self, spec: SpecT, env: Mapping[str, str], log_path: Path) -> ServerT:
        """The kept server if it is ``spec``'s and alive, else a new one, listening."""
        server = self.current
        if server is not None and (server.spec != spec or not server.alive()):
            self.stop()
            server = None
        if server is None:
            server = self._start(spec, env, log_path)
            self.current = server
            try:
                server.wait_until_listening()
            except BaseException:
                self.stop()
                raise
        return server

    def stop(self) -> None:
        if self.current is not None:
            self.current.stop()
            self.current = None
