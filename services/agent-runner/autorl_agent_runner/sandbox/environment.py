"""The agent's environment: the contract's variables and what the experiment passes on, nothing else.

The parent's environment holds the platform's secrets (the admin token, database and Redis
URLs, API keys of whoever started the run); an agent sees one of them only when ``--env NAME``
names it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from autorl.agent_env import CONTRACT_VARIABLES, DECLARED_ENV_PREFIX
from autorl.errors import AutoRLError
from autorl_agent_runner.sandbox.python_env import PythonEnv

#: Set in every agent process and inherited by its children, so that processes which left the
#: agent's process group can still be found (and killed) at the deadline.
RUN_MARKER_VARIABLE = "AUTORL_RUN_MARKER"
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: Variables the platform itself sets; --env cannot override them (it could point the agent at
#: another experiment's grader or hide it from the deadline sweep).
PLATFORM_VARIABLES = frozenset({*CONTRACT_VARIABLES, RUN_MARKER_VARIABLE, "HOME", "PATH", "HF_HUB_OFFLINE"})
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: The platform's own names (its settings, credentials among them: the admin token, database and
#: Redis URLs): never passed to an agent, even when an Experiment declares one.
PLATFORM_PREFIX = "AUTORL_"
#: What GPU containers need from the runtime (the NVIDIA container toolkit, the device plugin) and the
#: image (where the driver's libraries are mounted): passed on from the runner's own environment.
GPU_DRIVER_VARIABLES = frozenset(
    {
        "CUDA_VISIBLE_DEVICES",
        "CUDA_DEVICE_ORDER",
        "LD_LIBRARY_PATH",
        "NVIDIA_VISIBLE_DEVICES",
        "NVIDIA_DRIVER_CAPABILITIES",
        "NVIDIA_REQUIRE_CUDA",
        "NVIDIA_DISABLE_REQUIRE",
        "NVIDIA_MIG_CONFIG_DEVICES",
        "NVIDIA_MIG_MONITOR_DEVICES",
    }
)


class AgentEnvError(AutoRLError):
    """A bad ``--env`` item."""


#: A NUL ends a C string: no environment variable or argument of a process can hold one.
NUL = "\x00"


def check_no_nul(text: str, where: str) -> None:
    """Refuse, where it is read, a string that is to become an environment entry or an argument."""
    if NUL in text:
        raise AgentEnvError(
            f"{where}: holds a NUL byte (\\x00), which no environment variable or argument can carry; "
            "remove it"
        )


@dataclass(frozen=True)
class ContractValues:
    """The values of the contract's variables for one run."""

    grading_server_url: str
    token: str
    task: str
    base_model: str
    model_path: Path
    data_path: Path
    output_dir: Path
    workspace: Path
    #: The run's seed (``autorl run --repeat``); 0 for a run without repeats.
    seed: int = 0

    def as_env(self) -> dict[str, str]:
        return {
            "GRADING_SERVER_URL": self.grading_server_url,
            "AUTORL_TOKEN": self.token,
            "TASK": self.task,
            "BASE_MODEL": self.base_model,
            "MODEL_PATH": str(self.model_path),
            "DATA_PATH": str(self.data_path),
            "OUTPUT_DIR": str(self.output_dir),
            "WORKSPACE": str(self.workspace),
            "AUTORL_SEED": str(self.seed),
        }


def parse_env_items(items: Iterable[str], parent: Mapping[str, str]) -> dict[str, str]:
    """``NAME=VALUE`` sets a value; ``NAME`` copies it from ``parent`` (an error if unset there)."""
    passed: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not _NAME.fullmatch(name):
            raise AgentEnvError(f"--env {item!r}: expected NAME or NAME=VALUE with a variable name")
        if name in PLATFORM_VARIABLES:
            raise AgentEnvError(f"--env {name}: the platform sets {name} itself; drop it from --env")
        check_no_nul(value, f"--env {name}")
        if not sep:
            if name not in parent:
                raise AgentEnvError(
                    f"--env {name}: {name} is not set in this environment; export it or pass {name}=VALUE"
                )
            value = parent[name]
        passed[name] = value
    return passed


def declared_env(parent: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """The variables an Experiment declares for a built-in agent in a pod (``agent.env``, ``envFrom``).

    The controller hands them to the runner under ``DECLARED_ENV_PREFIX``; they reach the agent under
    their own names. Returns (passed, refused): names the platform sets itself or keeps to itself
    (``AUTORL_…``) are refused, so a Secret with such a key can neither override the contract nor
    carry a platform credential into the agent.
    """
    passed: dict[str, str] = {}
    refused: list[str] = []
    for key, value in sorted(parent.items()):
        if not key.startswith(DECLARED_ENV_PREFIX):
            continue
        name = key[len(DECLARED_ENV_PREFIX) :]
        if not _NAME.fullmatch(name) or name in PLATFORM_VARIABLES or name.startswith(PLATFORM_PREFIX):
            refused.append(name)
        else:
            passed[name] = value
    return passed, refused


def gpu_driver_env(parent: Mapping[str, str]) -> dict[str, str]:
    """The GPU runtime's variables of the runner's own environment (``GPU_DRIVER_VARIABLES``)."""
    return {name: value for name, value in parent.items() if name in GPU_DRIVER_VARIABLES}


def build_agent_env(
    contract: ContractValues,
    passed: Mapping[str, str],
    *,
    run_marker: str,
    extra_platform: Mapping[str, str] | None = None,
    python_env: PythonEnv | None = None,
) -> dict[str, str]:
    """The whole environment of the agent: built from nothing, never copied from the parent.

    ``extra_platform`` holds settings the platform adds for this run (the GPUs the agent may use);
    ``python_env`` is the Python the agent runs with (first on its PATH; default the platform's).
    """
    env = contract.as_env()
    env.update(
        {
            "HOME": str(contract.workspace),
            "PATH": f"{(python_env or PythonEnv.current()).bin_dir}:{SYSTEM_PATH}",
            "HF_HUB_OFFLINE": "1",
            RUN_MARKER_VARIABLE: run_marker,
        }
    )
    env.update(extra_platform or {})
    env.update(passed)
    return env
