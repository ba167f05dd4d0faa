"""Launching one agent in its workspace: the assembly that ``autorl agent-runner`` (an agent pod)
and ``autorl run`` (one machine) share.

:func:`resolve_launch_agent` turns the command line's agent and ``--env`` items into the agent's
command and the variables passed to it, refusing an agent the sandbox could not read;
:func:`launch_agent` builds the contract's values and the runner's configuration for a workspace
and returns the :class:`AgentRunner` that runs it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from autorl.client import GradingClient
from autorl_agent_runner.agent_command import AgentCommand, resolve_agent
from autorl_agent_runner.agent_python import find_agent_python
from autorl_agent_runner.runner import GRACE_PERIOD_S, AgentRunner, RunnerConfig
from autorl_agent_runner.sandbox.egress import Network
from autorl_agent_runner.sandbox.environment import ContractValues, check_no_nul, parse_env_items
from autorl_agent_runner.sandbox.plan import (
    SandboxMode,
    can_share_base_model,
    check_agent_readable,
    resolve_mode,
)
from autorl_agent_runner.settings import AgentRunnerSettings
from autorl_agent_runner.workspace.layout import Workspace


@dataclass(frozen=True)
class ResolvedAgent:
    agent: AgentCommand
    #: The variables the command line passes to the agent (``--env``), by name.
    passed_env: dict[str, str]


def resolve_launch_agent(
    spec: str,
    env_items: Iterable[str],
    parent_env: Mapping[str, str],
    sandbox: SandboxMode,
    settings: AgentRunnerSettings,
    extra_args: Sequence[str] = (),
) -> ResolvedAgent:
    """The agent named by ``spec`` (a built-in name, a folder or an executable) started with the
    agents' Python of ``settings``, with ``extra_args`` appended to its command. Raises
    :class:`autorl.errors.AutoRLError` (or ``ValueError``) for an unknown agent, a malformed
    ``--env`` item, or a script the sandbox's user could not read."""
    agent = resolve_agent(spec, find_agent_python(settings.agent_python))
    passed = parse_env_items(env_items, parent_env)
    for arg in extra_args:
        check_no_nul(arg, "--agent-arg")
    if extra_args:
        agent = dataclasses.replace(agent, argv=(*agent.argv, *extra_args))
    if agent.script is not None:
        check_agent_readable(resolve_mode(sandbox), agent.script, executed=agent.executes_script)
    return ResolvedAgent(agent=agent, passed_env=passed)


def links_base_model(sandbox: SandboxMode) -> bool:
    """Whether a new workspace may link the cached base model rather than copy it: only where the
    agent's user can read the cache through the link."""
    return can_share_base_model(resolve_mode(sandbox))


@dataclass(frozen=True)
class AgentLaunch:
    """What the runner needs besides the workspace and the grader's answer."""

    agent: AgentCommand
    task: str
    #: The base model's source as given (the contract's ``BASE_MODEL``).
    base_model: str
    sandbox: SandboxMode
    passed_env: Mapping[str, str] = field(default_factory=dict)
    #: Variables the platform itself sets for the agent (``CUDA_VISIBLE_DEVICES``, GPU driver's).
    platform_env: Mapping[str, str] = field(default_factory=dict)
    egress: bool = False
    #: Non-public destinations the operator lets the agent reach through ``egress``.
    egress_allow: tuple[Network, ...] = ()
    grace_period_s: float = GRACE_PERIOD_S
    #: Used only when the grader reports no budget (a runner started on its own).
    timeout_s: float | None = None
    echo_output: bool = False
    #: The runner's own log, out of the agent's reach; None: the runner's stderr (a pod's stream).
    runner_log: Path | None = None
    #: The run's seed, the agent's ``AUTORL_SEED`` (``autorl run --repeat`` gives each repeat its own).
    seed: int = 0


def launch_agent(
    launch: AgentLaunch,
    workspace: Workspace,
    *,
    grading_server_url: str,
    token: str,
    client: GradingClient,
    settings: AgentRunnerSettings,
) -> AgentRunner:
    """The runner of ``launch``'s agent in ``workspace``, with the contract's environment pointing
    at ``grading_server_url``; the caller runs it (:meth:`AgentRunner.run`) and may stop it."""
    contract = ContractValues(
        grading_server_url=grading_server_url,
        token=token,
        task=launch.task,
        base_model=launch.base_model,
        model_path=workspace.model,
        data_path=workspace.data,
        output_dir=workspace.output,
        workspace=workspace.root,
        seed=launch.seed,
    )
    config = RunnerConfig(
        workspace=workspace,
        contract=contract,
        agent=launch.agent,
        passed_env=launch.passed_env,
        platform_env=launch.platform_env,
        sandbox=launch.sandbox,
        hidden=settings.hidden_paths(),
        egress=launch.egress,
        egress_allow=launch.egress_allow,
        grace_period_s=launch.grace_period_s,
        timeout_s=launch.timeout_s,
        echo_output=launch.echo_output,
        runner_log=launch.runner_log,
    )
    return AgentRunner(config, client)
