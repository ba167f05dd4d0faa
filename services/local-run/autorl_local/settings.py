"""The settings `autorl run` reads itself (environment prefix ``AUTORL_``). The grader and workers it
starts read their own from the environment it gives them (:mod:`autorl_local.experiment`)."""

from __future__ import annotations

from autorl.settings import EvaluationSettings
from autorl_agent_runner.settings import AgentRunnerSettings


class RunSettings(AgentRunnerSettings, EvaluationSettings):
    """The home, caches and agents' Python of the agent runner, and the evaluation's timeout, which
    bounds how long the run waits for its baseline."""
