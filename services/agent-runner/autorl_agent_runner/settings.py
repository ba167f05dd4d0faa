"""The agent runner's settings (environment prefix ``AUTORL_``). It holds no admin token and no
store: an agent's pod must never see either."""

from __future__ import annotations

import os
from collections.abc import Mapping
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
        """The platform's folders, and the Hugging Face caches (where the test split is downloaded to
        when no data source is set), which an agent's filesystem view leaves out."""
        candidates = (self.home, self.cache_dir, self.eval_dir, self.data_source_dir, *huggingface_caches())
        return [path.expanduser().absolute() for path in candidates if path is not None]


def huggingface_caches(env: Mapping[str, str] = os.environ) -> list[Path]:
    """Where the ``datasets`` and ``huggingface_hub`` libraries keep what they download, as ``env``
    sets them (their defaults under ``~/.cache/huggingface`` otherwise)."""
    cache = Path(env.get("XDG_CACHE_HOME") or "~/.cache") / "huggingface"
    named = ("HF_HOME", "HF_DATASETS_CACHE", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE")
    return [cache, *(Path(env[name]) for name in named if env.get(name))]
