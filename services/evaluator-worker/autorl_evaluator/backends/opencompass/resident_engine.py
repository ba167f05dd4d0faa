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

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from autorl_evaluator.backends.opencompass.kept_server import KeptServer, ServerProcess, ServerSpec

log = logging.getLogger("autorl.evaluator.engine")

HERE = Path(__file__).resolve().parent
SERVER = HERE / "engine_server.py"
SHIM = HERE / "engine_shim"
#: How long the server program gets to import and listen (the engine itself starts at the first load).
START_TIMEOUT_S = 120.0
#: After SIGTERM, how long the server's group gets before SIGKILL.
STOP_GRACE_S = 10.0


@dataclass(frozen=True, kw_only=True)
class EngineSpec(ServerSpec):
    """Which engine: ``vllm`` or ``transformers``, and the devices it sees."""

    engine: str
    cuda_visible_devices: str


class ResidentEngine(ServerProcess[EngineSpec]):
    """One engine server process and its socket."""

    kind = "engine"
    title = "the resident engine"
    start_timeout_s = START_TIMEOUT_S

    def __init__(self, spec: EngineSpec, env: Mapping[str, str], log_path: Path) -> None:
        super().__init__(
            spec,
            [str(SERVER), "--engine", spec.engine],
            {**env, "CUDA_VISIBLE_DEVICES": spec.cuda_visible_devices},
            log_path,
            stop_grace_s=STOP_GRACE_S,
        )


#: This process's engines (the warm worker's child keeps them between evaluations).
ENGINES: KeptServer[EngineSpec, ResidentEngine] = KeptServer(ResidentEngine)


def shim_environment(engine: ResidentEngine, env: Mapping[str, str]) -> dict[str, str]:
    """OpenCompass's environment with the shim first on its path and the engine's socket named."""
    path = [str(SHIM), *(part for part in env.get("PYTHONPATH", "").split(os.pathsep) if part)]
    return {**env, "PYTHONPATH": os.pathsep.join(path), "AUTORL_ENGINE_SOCKET": str(engine.socket_path)}
