"""``@kopf.on.delete``: remove the experiment's children; its results stay in the grader's database.

Owner references let a real cluster's garbage collector do this too; deleting explicitly makes the
cleanup immediate and independent of a collector (an emulated API server has none).
"""

from __future__ import annotations

from typing import Any

import kopf

from autorl.api.admin_client import GradingError
from autorl.experiment import Phase
from autorl_controller.operator.context import context_of
from autorl_controller.operator.kube import JOBS, NETWORK_POLICIES, SECRETS
from autorl_controller.operator.manifests import ExperimentRef


async def cleanup(
    *,
    name: str,
    namespace: str | None,
    uid: str | None,
    status: kopf.Status,
    memo: Any,
    logger: Any,
    **_: Any,
) -> None:
    assert namespace is not None and uid  # Experiments are namespaced; every object has a uid
    context = context_of(memo)
    ref = ExperimentRef(name, namespace, uid)
    phase = status.get("phase")
    if phase and not Phase(str(phase)).terminal:
        try:
            view = await context.grader.experiment(ref.grader_name)
            if view.status in ("pending", "running"):
                await context.grader.finish(ref.grader_name, "interrupted", "the Experiment was deleted")
        except GradingError as exc:  # a 404 (never registered) included: nothing to close
            if exc.retryable:
                raise kopf.TemporaryError(
                    f"cannot close the experiment in the grader: {exc}", delay=10
                ) from exc
    removed = []
    for resource, child in (
        (JOBS, ref.agent_job_name),
        (JOBS, ref.prepare_job_name),
        (NETWORK_POLICIES, ref.policy_name),
        (SECRETS, ref.secret_name),
    ):
        if await context.kube.delete(resource, namespace, child):
            removed.append(child)
    logger.info(f"removed {', '.join(removed) or 'nothing'}; the results stay in the grader's database")
