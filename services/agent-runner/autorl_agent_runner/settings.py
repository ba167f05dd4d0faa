"""The agent runner's settings (environment prefix ``AUTORL_``). It holds no admin token and no
store: an agent's pod must never see either."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from autorl.settings import HomeSettings


class AgentRunnerSettings(HomeSettings):
    """Where the model and train split are cached, what the agent must not see, and its Python."""

    agent_python: Path | None = Field(
        default=None,
        description="The agents' Python (an interpreter or an environment's folder) that agents start "
        "with; default: .venv-agent beside the platform's environment, else the platform's interpreter.",
    )

    def hidden_paths(self) -> list[Path]:
        """The platform's folders, which an agent's filesystem view leaves out."""
        candidates = (self.home, self.cache_dir, self.eval_dir, self.data_source_dir)
        return [path.expanduser().absolute() for path in candidates if path is not None]
