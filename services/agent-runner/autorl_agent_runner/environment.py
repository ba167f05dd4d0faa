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

from autorl.errors import AutoRLError
from autorl.experiment import CONTRACT_VARIABLES
from autorl_agent_runner.python_env import PythonEnv

#: Set in every agent process and inherited by its children, so that processes which left the
#: agent's process group can still be found (and killed) at the deadline.
RUN_MARKER_VARIABLE = "AUTORL_RUN_MARKER"
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: Variables the platform itself sets; --env cannot override them (it could point the agent at
#: another experiment's grader or hide it from the deadline sweep).
PLATFORM_VARIABLES = frozenset({*CONTRACT_VARIABLES, RUN_MARKER_VARIABLE, "HOME", "PATH", "HF_HUB_OFFLINE"})
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class AgentEnvError(AutoRLError):
    """A bad ``--env`` item."""


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
        if not sep:
            if name not in parent:
                raise AgentEnvError(
                    f"--env {name}: {name} is not set in this environment; export it or pass {name}=VALUE"
                )
            value = parent[name]
        passed[name] = value
    return passed


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
