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
    """Where the ``datasets`` and ``huggingface_hub`` libraries keep what they download, read from
    ``env`` as they read it (their defaults under ``$XDG_CACHE_HOME/huggingface``, and an empty
    ``XDG_CACHE_HOME`` meaning the working folder, as theirs does)."""
    cache = Path(env.get("XDG_CACHE_HOME", "~/.cache")) / "huggingface"
    return [cache, *(Path(env[name]) for name in HUGGINGFACE_CACHE_VARIABLES if env.get(name))]


#: Every variable that moves one of the libraries' download folders (``datasets.config``,
#: ``huggingface_hub.constants``).
HUGGINGFACE_CACHE_VARIABLES = (
    "HF_HOME",
    "HF_DATASETS_CACHE",
    "HF_DATASETS_DOWNLOADED_DATASETS_PATH",
    "HF_DATASETS_EXTRACTED_DATASETS_PATH",
    "HF_MODULES_CACHE",
    "HF_HUB_CACHE",
    "HUGGINGFACE_HUB_CACHE",
    "HF_XET_CACHE",
    "HF_ASSETS_CACHE",
    "HUGGINGFACE_ASSETS_CACHE",
    "TRANSFORMERS_CACHE",
)
