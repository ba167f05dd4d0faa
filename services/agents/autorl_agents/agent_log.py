"""The example agent's log: one event per line, key=value, on stdout (the platform keeps it in
agent.log), under the name the agent runs as."""

from __future__ import annotations

import json
import time

#: The name the agent logs under (example_sft runs the example agent with SFT alone).
_agent_name = "example_grpo"


def log_as(name: str) -> None:
    """Log every later event under ``name``."""
    global _agent_name
    _agent_name = name


def log(event: str, **values: object) -> None:
    """One event per line, key=value, on stdout (the platform keeps it in agent.log)."""
    parts = " ".join(f"{key}={_format(value)}" for key, value in values.items())
    print(f"{time.strftime('%H:%M:%S')} {_agent_name} event={event} {parts}".rstrip(), flush=True)


def _format(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    text = str(value)
    return json.dumps(text) if " " in text else text
