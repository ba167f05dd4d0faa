"""Which command starts an agent: a built-in one by name (``--agent example_grpo``), a custom one by
path (an agent folder in the reference's shape, ``config.yaml`` + start script, or an executable).

Agents run with the agents' Python (:mod:`autorl_agent_runner.agent_python`): the built-in agents
(the ``autorl-agents`` distribution, ``services/agents``) run as ``python -m autorl_agents.NAME``
in that environment, which holds the core and the agents and none of the platform's services.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from autorl.builtin_agents import AGENT_ALIASES, BUILTIN_AGENTS
from autorl.errors import AutoRLError
from autorl_agent_runner.agent_python import current_python
from autorl_agent_runner.sandbox.python_env import PythonEnv

__all__ = ["AGENT_ALIASES", "BUILTIN_AGENTS", "AgentCommand", "AgentNotFoundError", "resolve_agent"]


class AgentNotFoundError(AutoRLError):
    """``--agent`` names neither a built-in agent, an agent folder, nor an executable file."""


@dataclass(frozen=True)
class AgentCommand:
    """How to start an agent.

    ``folder`` is where a custom agent lives (the sandbox lets it read that folder), ``script``
    the file its user must be able to read, ``env`` its own defaults (a folder's ``env_vars``),
    and ``python`` the environment whose ``bin`` comes first on its PATH.
    """

    name: str
    argv: tuple[str, ...]
    python: PythonEnv = field(default_factory=current_python)
    folder: Path | None = None
    script: Path | None = None
    env: Mapping[str, str] = field(default_factory=dict)

    @property
    def executes_script(self) -> bool:
        """Whether ``script`` is executed itself (its shebang counts), not read by an interpreter."""
        return self.script is not None and self.argv[0] == str(self.script)


def resolve_agent(agent: str, python: PythonEnv | None = None) -> AgentCommand:
    """A built-in name, an agent folder, or the path of an executable (run as is: its shebang counts)."""
    from autorl_agent_runner.reference_folder import is_agent_folder, load_agent_folder

    python = python or current_python()
    agent = AGENT_ALIASES.get(agent, agent)
    if agent in BUILTIN_AGENTS:
        # -u: the agent's output reaches agent.log as it happens, not when a buffer fills.
        return AgentCommand(agent, (str(python.interpreter), "-u", "-m", BUILTIN_AGENTS[agent]), python)
    path = Path(agent).expanduser()
    if not path.exists():
        known = ", ".join(
            [*sorted(BUILTIN_AGENTS), *(f"{a} = {n}" for a, n in sorted(AGENT_ALIASES.items()))]
        )
        raise AgentNotFoundError(
            f"unknown agent {agent!r}: not a built-in agent ({known}), an agent folder nor an existing "
            "file; pass a built-in name, a folder with config.yaml, or the path of an executable"
        )
    if is_agent_folder(path):
        folder = load_agent_folder(path)
        return AgentCommand(
            str(path), folder.argv(), python, folder=folder.folder, script=folder.start, env=folder.env_vars
        )
    if path.is_dir():
        raise AgentNotFoundError(
            f"agent {agent} is a folder without config.yaml; add one (name, start, env_vars) as in "
            "examples/agents/, or pass the path of an executable"
        )
    if not os.access(path, os.X_OK):
        raise AgentNotFoundError(
            f"agent {agent} is not executable; run `chmod +x {agent}` (and give it a shebang)"
        )
    resolved = path.resolve()
    return AgentCommand(str(path), (str(resolved),), python, folder=resolved.parent, script=resolved)
