"""Status patches and Events: every phase transition is written to status and posted as an Event."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, cast

import kopf

from autorl.experiment import ExperimentResourceStatus, Phase, status_text
from autorl.wait_reasons import Reason
from autorl_controller.operator.context import OperatorContext
from autorl_controller.operator.kube import EXPERIMENTS
from autorl_controller.operator.lifecycle import changed, merged, status_patch


def as_body(body: Mapping[str, Any]) -> kopf.Body:
    """kopf's view of a raw object (a fresh GET rather than the watch's copy)."""
    return body if isinstance(body, kopf.Body) else kopf.Body(cast(kopf.RawBody, dict(body)))


async def patch_status(
    context: OperatorContext,
    body: Mapping[str, Any],
    current: dict[str, Any],
    update: ExperimentResourceStatus,
) -> None:
    """Merge-patch the status subresource with the fields ``update`` sets, serialised by the model,
    where they differ from ``current`` (nothing: no call)."""
    diff = changed(current, status_patch(update))
    if diff:
        meta = body["metadata"]
        await context.kube.patch(
            EXPERIMENTS, meta["namespace"], meta["name"], {"status": diff}, subresource="status"
        )
        current.update(diff)


async def transition(
    context: OperatorContext,
    body: Mapping[str, Any],
    current: dict[str, Any],
    phase: Phase,
    message: str,
    *,
    reason: Reason,
    extra: ExperimentResourceStatus | None = None,
) -> None:
    """Move to ``phase`` with ``reason`` (status and an Event), unless the experiment is there already.

    The message can quote what the agent controls (its Job's failure message, an error the grader
    recorded): it is escaped and bounded here as the status model writes it (``status_text``, which
    every status message and condition passes) and so in the Event too, so that neither ``kubectl
    describe`` nor ``kubectl get`` shows a control character or a line it did not write.
    """
    message = status_text(message)
    same = current.get("phase") == phase.value and current.get("reason") == reason.value
    if same and current.get("message") == message and not (extra and extra.model_fields_set):
        return
    update = merged(
        ExperimentResourceStatus(phase=phase, reason=reason.value, message=message),
        extra or ExperimentResourceStatus(),
    )
    if phase.terminal:
        ended = datetime.now(UTC).replace(microsecond=0)
        update = merged(update, ExperimentResourceStatus(completionTime=ended))
    entered = current.get("phase") != phase.value
    await patch_status(context, body, current, update)
    if entered:
        post = kopf.warn if phase in (Phase.FAILED, Phase.TIMED_OUT) else kopf.info
        post(as_body(body), reason=phase.value, message=message)
