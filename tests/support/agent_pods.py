"""An experiment's agent pod as the operator tests read and run it: the pod template of its agent Job,
its token Secret as the kubelet reads it, and a container's command line and environment on this
machine (tests/e2e/test_operator.py, tests/e2e/test_operator_budget.py)."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from autorl_controller.operator.manifests import ExperimentRef
from tests.support.kube_emulator import JOBS, SECRETS, Platform
from tests.support.kubelet import kubelet_environment

#: This environment's ``autorl``: a pod's entry point runs here in place of its image's.
AUTORL = str(Path(sys.executable).parent / "autorl")


async def agent_pod_spec(platform: Platform, ref: ExperimentRef) -> dict[str, Any]:
    """The pod template of the experiment's agent Job."""
    job = await platform.get(f"{JOBS}/{ref.agent_job_name}")
    assert job is not None
    spec: dict[str, Any] = job["spec"]["template"]["spec"]
    return spec


async def token_secret_data(platform: Platform, ref: ExperimentRef) -> dict[str, dict[str, str]]:
    """The experiment's token Secret as the kubelet reads it: its values decoded, under its name."""
    secret = await platform.get(f"{SECRETS}/{ref.secret_name}")
    assert secret is not None
    return {ref.secret_name: {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}}


def environment_here(
    container: dict[str, Any],
    secrets_by_name: dict[str, dict[str, str]],
    configmaps: dict[str, dict[str, str]],
    home: Path,
) -> dict[str, str]:
    """The environment the kubelet gives ``container``, with this machine's PATH and ``home`` as
    the platform home."""
    env = kubelet_environment(container, secrets_by_name, configmaps)
    env.update({"PATH": os.environ["PATH"], "AUTORL_HOME": str(home)})
    return env


def command_here(
    container: dict[str, Any], workspace: Path, *extra: str, agent: Path | None = None
) -> list[str]:
    """``container``'s command line run here: with this environment's ``autorl``, the workspace (and
    the agent, if given) at their paths on this machine, and ``extra`` arguments last."""
    args = list(container["args"])
    if agent is not None:
        args[args.index("--agent") + 1] = str(agent)
    args[args.index("--workspace") + 1] = str(workspace)
    return [AUTORL, *container["command"][1:], *args, *extra]


def start_here(command: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    """``command`` started in the background, its output kept for the test to read."""
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
