"""The worker's side of the resident engine (``engine_server.py``): start it, keep it, stop it.

One engine server per (Python, engine, devices) lives as long as the process that evaluates: in the
warm worker (``AUTORL_EVAL_WARM_WORKER``) that is many evaluations, so a submission of the
architecture the engine holds is only a weight load; elsewhere each evaluation's process starts one
and it ends with that process (it gets SIGKILL when its parent dies). An evaluation that fails or
passes its hard timeout stops the engine, so the next one starts a fresh engine: a hung or poisoned
engine never serves another submission.

OpenCompass reaches the engine through ``engine_shim/`` (its ``vllm`` module), put first on its
``PYTHONPATH``, and the socket named by ``AUTORL_ENGINE_SOCKET``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from autorl.process_group import kill_group
from autorl_evaluator.backends.opencompass.engine_shim.vllm import EngineError, exchange
from autorl_evaluator.failures import EvaluatorFaultError
from autorl_evaluator.subprocess_group import set_parent_death_signal

log = logging.getLogger("autorl.evaluator.engine")

HERE = Path(__file__).resolve().parent
SERVER = HERE / "engine_server.py"
SHIM = HERE / "engine_shim"
#: How long the server program gets to import and listen (the engine itself starts at the first load).
START_TIMEOUT_S = 120.0
#: After SIGTERM, how long the server's group gets before SIGKILL.
STOP_GRACE_S = 10.0


@dataclass(frozen=True)
class EngineSpec:
    """Which engine: the Python it runs in, ``vllm`` or ``transformers``, the devices it sees."""

    python: Path
    engine: str
    cuda_visible_devices: str


class ResidentEngine:
    """One engine server process and its socket."""

    def __init__(self, spec: EngineSpec, env: Mapping[str, str], log_path: Path) -> None:
        self.spec = spec
        self.folder = Path(tempfile.mkdtemp(prefix="autorl-engine-"))  # 0700: the socket is ours only
        self.socket_path = self.folder / "engine.sock"
        self.log_path = log_path
        self._log: IO[bytes] = log_path.open("ab")
        self.process = subprocess.Popen(
            [str(spec.python), str(SERVER), "--socket", str(self.socket_path), "--engine", spec.engine],
            env={**env, "CUDA_VISIBLE_DEVICES": spec.cuda_visible_devices},
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=self.folder,
            start_new_session=True,
            # On the evaluating process's death the server gets SIGTERM and kills its whole group.
            preexec_fn=lambda: set_parent_death_signal(signal.SIGTERM),
        )
        log.info(
            "event=engine_started pid=%d engine=%s python=%s", self.process.pid, spec.engine, spec.python
        )

    def alive(self) -> bool:
        return self.process.poll() is None

    def wait_until_listening(self, timeout_s: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            if not self.alive():
                raise EvaluatorFaultError(
                    f"the resident engine exited with code {self.process.returncode} before listening",
                    detail=f"{self.spec.python} {SERVER}; its log: {self.log_path}",
                )
            if self.socket_path.exists():
                with contextlib.suppress(OSError, EngineError, ValueError):
                    exchange(str(self.socket_path), {"op": "ping"}, timeout_s=10)
                    return
            if time.monotonic() > deadline:
                self.stop()
                raise EvaluatorFaultError(f"the resident engine did not listen within {timeout_s:.0f} s")
            time.sleep(0.1)

    def stop(self) -> None:
        # Its own session: the group is the server and every process its engine started.
        kill_group(self.process.pid, self.process, grace_s=STOP_GRACE_S)
        self._log.close()
        shutil.rmtree(self.folder, ignore_errors=True)
        log.info("event=engine_stopped pid=%d returncode=%s", self.process.pid, self.process.returncode)


class ResidentEngines:
    """The engines this process keeps: at most one, replaced when another is needed."""

    def __init__(self) -> None:
        self.current: ResidentEngine | None = None

    def get(self, spec: EngineSpec, env: Mapping[str, str], log_path: Path) -> ResidentEngine:
        engine = self.current
        if engine is not None and (engine.spec != spec or not engine.alive()):
            self.stop()
            engine = None
        if engine is None:
            engine = ResidentEngine(spec, env, log_path)
            self.current = engine
            engine.wait_until_listening()
        return engine

    def stop(self) -> None:
        if self.current is not None:
            self.current.stop()
            self.current = None


#: This process's engines (the warm worker's child keeps them between evaluations).
ENGINES = ResidentEngines()


def shim_environment(engine: ResidentEngine, env: Mapping[str, str]) -> dict[str, str]:
    """OpenCompass's environment with the shim first on its path and the engine's socket named."""
    path = [str(SHIM), *(part for part in env.get("PYTHONPATH", "").split(os.pathsep) if part)]
    return {**env, "PYTHONPATH": os.pathsep.join(path), "AUTORL_ENGINE_SOCKET": str(engine.socket_path)}
