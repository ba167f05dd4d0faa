"""Agent folders in the reference AutoRL-Bench's shape: ``config.yaml`` beside a start script.

    my_agent/
      config.yaml     name: "My Agent"       # shown in logs (default: the folder's name)
                      start: "start.sh"      # relative to the folder (default start.sh)
                      env_vars: {KEY: "v"}   # the agent's defaults; --env-file and --env override them
      start.sh        run as `bash start.sh`, so "$(dirname "$0")" is the folder
      train.py ...

As the reference runs it: ``bash <folder>/<start>``, in the workspace, with the contract's
variables. Unlike the reference, the rest of the caller's environment is not inherited: what an
agent needs besides ``env_vars`` (API keys) comes through ``--env-file`` or ``--env``.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from autorl.errors import AutoRLError
from autorl_agent_runner.sandbox.environment import NUL, PLATFORM_VARIABLES

CONFIG_FILE = "config.yaml"
DEFAULT_START = "start.sh"


class AgentFolderError(AutoRLError):
    """An agent folder's config.yaml or start script is missing or malformed."""


@dataclass(frozen=True)
class AgentFolder:
    folder: Path
    name: str
    start: Path
    env_vars: dict[str, str]

    def argv(self) -> tuple[str, ...]:
        bash = shutil.which("bash")
        if bash is None:
            raise AgentFolderError(f"agent {self.folder}: its start script needs bash; install bash")
        return (bash, str(self.start))


def is_agent_folder(path: Path) -> bool:
    return path.is_dir() and (path / CONFIG_FILE).is_file()


def _env_value(name: str, value: Any, config: Path) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int | float):
        text = str(value)
        if NUL in text:
            raise AgentFolderError(
                f"{config}: env_vars.{name} holds a NUL byte (\\x00), which no environment variable can "
                "carry; remove it"
            )
        return text
    if value is None:
        return ""
    raise AgentFolderError(
        f'{config}: env_vars.{name} is a {type(value).__name__}; give it a single value, e.g. {name}: "1"'
    )


def _env_vars(raw: Any, config: Path) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise AgentFolderError(
            f"{config}: env_vars must be a mapping of NAME: value, not a {type(raw).__name__}"
        )
    env: dict[str, str] = {}
    for name, value in raw.items():
        if not isinstance(name, str) or not name.isidentifier() or not name.isascii():
            raise AgentFolderError(
                f"{config}: env_vars key {name!r} is not a variable name (YAML reads an unquoted ON, "
                'OFF, YES or NO as a boolean: quote it, e.g. "ON": "1")'
            )
        if name in PLATFORM_VARIABLES:
            raise AgentFolderError(f"{config}: the platform sets {name} itself; remove it from env_vars")
        env[name] = _env_value(name, value, config)
    return env


def load_agent_folder(folder: Path) -> AgentFolder:
    """Read and check ``folder/config.yaml``; the start script must be a file inside the folder."""
    folder = folder.resolve()
    config = folder / CONFIG_FILE
    try:
        data = yaml.safe_load(config.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise AgentFolderError(f"{config} cannot be read as YAML ({exc}); fix the file") from exc
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise AgentFolderError(f"{config} must be a mapping with name, start and env_vars")
    start_name = data.get("start", DEFAULT_START)
    if not isinstance(start_name, str) or not start_name or NUL in start_name:
        raise AgentFolderError(f"{config}: start must be the start script's file name, e.g. start: start.sh")
    start = (folder / start_name).resolve()
    if not start.is_relative_to(folder):
        raise AgentFolderError(
            f"{config}: start {start_name!r} is outside the agent folder; move the script into {folder}"
        )
    if not start.is_file():
        raise AgentFolderError(f"{config}: start script {start_name!r} is not a file in {folder}; add it")
    name = data.get("name", folder.name)
    return AgentFolder(
        folder=folder,
        name=str(name) if name else folder.name,
        start=start,
        env_vars=_env_vars(data.get("env_vars"), config),
    )
