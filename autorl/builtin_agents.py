"""The built-in agents' names: what ``--agent NAME`` and an Experiment's ``agent.builtin`` may say.

One table for every service that names them: the agent runner starts them; the controller and the
Experiment CRD (an enum generated from these tables) refuse any other name before anything runs.
"""

from __future__ import annotations

#: name → module the agent runner runs with ``python -m`` in the agents' environment (``main(argv)``).
BUILTIN_AGENTS: dict[str, str] = {
    "example_grpo": "autorl_agents.example_grpo",
    "example_sft": "autorl_agents.example_sft",
}
#: The reference AutoRL-Bench's agent ids that name one of ours: its ``example_agent`` (a TRL
#: GRPO script) runs as ``example_grpo``, so a command line written for the reference works here.
AGENT_ALIASES: dict[str, str] = {"example_agent": "example_grpo"}


def builtin_agent_names() -> list[str]:
    """Every name a built-in agent may be started by (aliases included), sorted."""
    return sorted({*BUILTIN_AGENTS, *AGENT_ALIASES})
