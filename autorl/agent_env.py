"""The environment every agent is given (docs/AGENTS.md, "The workspace and the environment").

The agent runner sets these variables, an Experiment may not override them, and the operator
passes an Experiment's own variables to a built-in agent's runner under :data:`DECLARED_ENV_PREFIX`.
"""

from __future__ import annotations

#: The variables every agent is given; the platform sets them.
CONTRACT_VARIABLES = (
    "GRADING_SERVER_URL",
    "AUTORL_TOKEN",
    "TASK",
    "BASE_MODEL",
    "MODEL_PATH",
    "DATA_PATH",
    "OUTPUT_DIR",
    "WORKSPACE",
    #: The run's seed (``autorl run --repeat N`` gives 0..N-1; 0 otherwise): seed training with it.
    "AUTORL_SEED",
)
#: The names an Experiment may not declare.
RESERVED_ENV = frozenset(CONTRACT_VARIABLES)
#: In a built-in agent's pod every variable the Experiment declares (``agent.env``, ``agent.envFrom``)
#: reaches the agent runner under this prefix; the runner passes exactly those on to the agent, under
#: their own names, and nothing else of its own environment.
DECLARED_ENV_PREFIX = "AUTORL_AGENT_ENV_"
