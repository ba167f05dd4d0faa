"""Built-in agents, started by name (``--agent example_grpo``), and custom agents by path."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from autorl.errors import AutoRLError

#: name → module run with ``python -m``; each module has a ``main(argv)``.
BUILTIN_AGENTS: dict[str, str] = {
    "example_grpo": "autorl_agent_runner.agents.example_grpo",
}


class AgentNotFoundError(AutoRLError):
    """``--agent`` names neither a built-in agent nor an executable file."""


@dataclass(frozen=True)
class AgentCommand:
    """How to start an agent: the argv, and the folder a custom agent lives in (it must be readable)."""

    name: str
    argv: tuple[str, ...]
    folder: Path | None = None


def resolve_agent(agent: str) -> AgentCommand:
    """A built-in name, or the path of an executable (run as is, so its shebang is honoured)."""
    if agent in BUILTIN_AGENTS:
        # -u: the agent's output reaches agent.log as it happens, not when a buffer fills.
        return AgentCommand(agent, (sys.executable, "-u", "-m", BUILTIN_AGENTS[agent]))
    path = Path(agent).expanduser()
    if not path.exists():
        known = ", ".join(sorted(BUILTIN_AGENTS))
        raise AgentNotFoundError(
            f"unknown agent {agent!r}: not a built-in agent ({known}) nor an existing file; "
            "pass a built-in name or the path of an executable"
        )
    if not path.is_file():
        raise AgentNotFoundError(f"agent {agent} is not a file; pass the path of an executable script")
    if not os.access(path, os.X_OK):
        raise AgentNotFoundError(
            f"agent {agent} is not executable; run `chmod +x {agent}` (and give it a shebang)"
        )
    resolved = path.resolve()
    return AgentCommand(str(path), (str(resolved),), folder=resolved.parent)
