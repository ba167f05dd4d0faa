"""The agents' Python: the interpreter every agent starts with, apart from the platform's own.

``make setup`` builds it as ``.venv-agent`` from ``requirements-agent.txt``: what reference
agents and TRL scripts import, plus copies (not editable links) of the ``autorl`` core and the
built-in agents (``autorl-agents``). No supervisor (sandbox, relay, egress), grader, evaluator,
controller or database driver is in it, and
no path into the repository (which holds test fixtures) is on its ``sys.path``, so a sandbox that
shows an agent only this environment shows it nothing of the platform's.

Where it is: the ``AUTORL_AGENT_PYTHON`` setting (an interpreter, or an environment's folder);
else a ``.venv-agent`` beside the platform's own environment; else the platform's interpreter
(an image that holds one environment for everything).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from autorl.errors import ConfigurationError
from autorl_agent_runner.sandbox.python_env import PythonEnv

#: Folder name of the agents' environment that ``make setup`` creates beside ``.venv``.
AGENT_VENV_NAME = ".venv-agent"
#: What an agent can import, in the order instructions.md lists it (import name: what it is for).
AGENT_PACKAGES: dict[str, str] = {
    "torch": "tensors and training (the build this machine runs)",
    "transformers": "models, tokenizers, `Trainer`",
    "trl": "`GRPOTrainer`, `SFTTrainer`, `DPOTrainer`, `RLOOTrainer`",
    "peft": "LoRA adapters (merge them before you submit)",
    "datasets": "`Dataset.from_list`, `load_dataset('json', ...)`",
    "accelerate": "device placement for transformers and TRL",
    "safetensors": "the weight format the grader accepts",
    "requests": "HTTP, as the reference clients use it",
    "httpx": "HTTP (what `autorl.client` uses)",
    "autorl": "`autorl.client.GradingClient`, `autorl.tasks` (prompts, answer checking)",
}


def find_agent_python(setting: Path | None) -> PythonEnv:
    """The setting, else ``.venv-agent`` beside the platform's environment, else this interpreter."""
    if setting is not None:
        candidate = setting.expanduser().absolute()
        if candidate.is_dir():
            candidate = candidate / "bin" / "python"
        if not (candidate.is_file() and os.access(candidate, os.X_OK)):
            raise ConfigurationError(
                f"AUTORL_AGENT_PYTHON={setting}: no Python interpreter there; point it at an "
                "environment's bin/python (or its folder), or unset it to use .venv-agent"
            )
        return PythonEnv.of_interpreter(candidate)
    platform_env = Path(sys.prefix).absolute()
    beside = platform_env.parent / AGENT_VENV_NAME / "bin" / "python"
    if platform_env.name != AGENT_VENV_NAME and beside.is_file() and os.access(beside, os.X_OK):
        return PythonEnv.of_interpreter(beside)
    return current_python()


def current_python() -> PythonEnv:
    """The platform's own environment (one environment for everything, as in an agent image)."""
    return PythonEnv.current()
