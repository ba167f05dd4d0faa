"""Where things are, in one place: the workspace every agent gets and the platform's model cache
(docs/AGENTS.md, "The workspace and the environment"). The agent runner builds the workspace from
these names, the operator mounts by them and the model sources (:mod:`autorl.models.sources`) fill
the cache by them.

    <workspace>/ code/  output/  models/<base>/  data/
                 description.md  instructions.md  run_meta.json  scores.json  agent.log
    <home>/runs/<run id>/logs/runner.log              the runner's own events (out of the agent's reach)
    <home>/runs/<run id>/seed.json                    the run's seed (and repeat i of n)
    <cache>/models/builtin/<name>-v<build version>/   a built-in model, built once
    <cache>/models/hub/<org>--<name>/                 a Hugging Face hub model, downloaded once
"""

from __future__ import annotations

# The workspace: names relative to its root.
CODE_DIR = "code"
OUTPUT_DIR = "output"
MODELS_DIR = "models"
DATA_DIR = "data"
DESCRIPTION_FILE = "description.md"
INSTRUCTIONS_FILE = "instructions.md"
RUN_META_FILE = "run_meta.json"
SCORES_FILE = "scores.json"
AGENT_LOG_FILE = "agent.log"

# A run's own folder on one machine (``autorl run``): names relative to the platform home.
RUNS_DIR = "runs"
RUN_LOGS_DIR = "logs"
#: The agent runner's events (agent start, sandbox, deadline, kills): the platform's record,
#: beside the services' logs, where the agent cannot write.
RUNNER_LOG_FILE = "runner.log"
#: The run's seed and, for ``autorl run --repeat N``, which repeat it was (``autorl.runs.seeds``).
RUN_SEED_FILE = "seed.json"

# The model cache: names relative to the cache's models folder.
BUILTIN_PREFIX = "builtin:"
#: Bumped whenever the built-in tiny model's recipe changes, so a cache of an older build is not reused.
BUILTIN_BUILD_VERSION = 2
BUILTIN_MODELS_DIR = "builtin"
HUB_MODELS_DIR = "hub"


def builtin_model_subpath(name: str) -> str:
    """``builtin/<name>-v<version>``: where the built-in model ``name`` is built in the cache."""
    return f"{BUILTIN_MODELS_DIR}/{name}-v{BUILTIN_BUILD_VERSION}"


def hub_model_subpath(repo_id: str) -> str:
    """``hub/<org>--<name>``: where the hub model ``repo_id`` is downloaded in the cache."""
    return f"{HUB_MODELS_DIR}/{repo_id.replace('/', '--')}"


def runner_log_subpath(run_id: str) -> str:
    """``runs/<run id>/logs/runner.log``: where a run's runner log lies under the platform home."""
    return f"{RUNS_DIR}/{run_id}/{RUN_LOGS_DIR}/{RUNNER_LOG_FILE}"


def cached_model_subpath(model: str) -> str:
    """Where a built-in or hub model source lies under the cache's models folder."""
    if model.startswith(BUILTIN_PREFIX):
        return builtin_model_subpath(model[len(BUILTIN_PREFIX) :])
    return hub_model_subpath(model)
