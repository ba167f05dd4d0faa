"""The agents' Python: the interpreter every agent starts with, apart from the platform's own.

``make setup`` builds it as ``.venv-agent`` from ``requirements-agent.txt``: what reference
agents and TRL scripts import, plus copies (not editable links) of the ``autorl`` core and this
runner for the built-in agents. No grader, evaluator, controller or database driver is in it, and
no path into the repository (which holds test fixtures) is on its ``sys.path``, so a sandbox that
shows an agent only this environment shows it nothing of the platform's.

Where it is: the ``AUTORL_AGENT_PYTHON`` setting (an interpreter, or an environment's folder);
else a ``.venv-agent`` beside the platform's own environment; else the platform's interpreter
(an image that holds one environment for everything).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from autorl.errors import ConfigurationError

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
_PROBE_TIMEOUT_S = 30.0
#: Prints what the sandbox must let the interpreter read: its prefixes and its import path.
_PROBE = "import json, sys; print(json.dumps([sys.prefix, sys.base_prefix, *sys.path]))"


@dataclass(frozen=True)
class AgentPython:
    """An interpreter (a venv's ``bin/python``, not resolved: the link is what makes it a venv)."""

    executable: Path

    @property
    def bin_dir(self) -> Path:
        """First on the agent's PATH, so ``python3``, ``pip`` and ``accelerate`` are this env's."""
        return self.executable.parent

    def readable_paths(self) -> list[Path]:
        """Folders the agent must be able to read for this interpreter to start and import."""
        try:
            done = subprocess.run(
                [str(self.executable), "-I", "-c", _PROBE],
                capture_output=True,
                text=True,
                timeout=_PROBE_TIMEOUT_S,
                check=True,
                env={"PATH": os.defpath},
            )
            entries = json.loads(done.stdout)
        except (OSError, subprocess.SubprocessError, ValueError) as exc:
            raise ConfigurationError(
                f"the agents' Python {self.executable} does not start ({exc}); rebuild it with "
                "`make setup` or point AUTORL_AGENT_PYTHON at a working interpreter"
            ) from exc
        paths = {Path(os.path.realpath(self.executable)).parent, self.bin_dir}
        paths.update(Path(entry) for entry in entries if entry)
        return sorted(p for p in paths if p.is_dir() and p != Path("/"))


def find_agent_python(setting: Path | None) -> AgentPython:
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
        return AgentPython(candidate)
    platform_env = Path(sys.prefix).absolute()
    beside = platform_env.parent / AGENT_VENV_NAME / "bin" / "python"
    if platform_env.name != AGENT_VENV_NAME and beside.is_file() and os.access(beside, os.X_OK):
        return AgentPython(beside)
    return current_python()


def current_python() -> AgentPython:
    """The platform's own interpreter (one environment for everything, as in an agent image)."""
    return AgentPython(Path(sys.executable).absolute())
