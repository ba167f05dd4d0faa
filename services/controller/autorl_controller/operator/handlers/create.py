"""``@kopf.on.create``: validate the spec; a bad one ends Failed at once, with the reason, never retried."""

from __future__ import annotations

from typing import Any

import kopf
from pydantic import ValidationError

from autorl.experiment import ExperimentSpec, Phase, validate_name
from autorl.wait_reasons import Reason
from autorl_controller.operator.context import context_of
from autorl_controller.operator.kube import EXPERIMENTS
from autorl_controller.operator.manifests import AGENT_TOKEN_SUFFIX, check_egress
from autorl_controller.operator.reporting import transition
from autorl_controller.operator.settings import ControllerSettings


def describe(exc: ValidationError) -> str:
    """One line naming each bad field, as a person would fix it in the manifest."""
    parts = []
    for error in exc.errors():
        where = ".".join(str(part) for part in error["loc"])
        message = str(error["msg"]).removeprefix("Value error, ")
        if error["type"] == "extra_forbidden":
            message = "unknown field (remove it, or check its spelling)"
        parts.append(f"spec.{where}: {message}" if where else f"spec: {message}")
    return "invalid spec: " + "; ".join(parts)


def validation_error(name: str, spec: Any, settings: ControllerSettings) -> str | None:
    """Why an Experiment cannot run, or None when it can."""
    try:
        validate_name(name)
    except ValueError as exc:
        return str(exc)
    try:
        parsed = ExperimentSpec.model_validate(dict(spec))
    except ValidationError as exc:
        return describe(exc)
    try:
        check_egress(parsed, settings)
    except ValueError as exc:
        return f"invalid spec: {exc}"
    return platform_secret_error(parsed, settings)


def platform_secret_error(spec: ExperimentSpec, settings: ControllerSettings) -> str | None:
    """Why ``spec`` may not run: it passes its agent a Secret of the platform's (its stores'
    passwords, the admin token, ...) or an experiment's agent token, which whoever may create an
    Experiment would otherwise read through its agent without the right to read Secrets."""
    platform = set(settings.platform_secrets) | {settings.prepare_env_secret} - {None}
    for index, source in enumerate(spec.agent.envFrom or []):
        name = source.secretRef.name if source.secretRef is not None else None
        if name is not None and (name in platform or name.endswith(AGENT_TOKEN_SUFFIX)):
            return (
                f"invalid spec: spec.agent.envFrom[{index}].secretRef: {name} is a Secret of the platform "
                f"or another experiment's agent token (names ending in {AGENT_TOKEN_SUFFIX} are theirs); "
                "pass the agent only credentials of its own, in a Secret of their own"
            )
    return None


async def validate(
    *, body: kopf.Body, name: str, namespace: str | None, spec: Any, memo: Any, **_: Any
) -> None:
    assert namespace is not None  # Experiments are namespaced
    context = context_of(memo)
    # The status kopf hands over can lag behind our own patches (kopf may call again on their echo).
    fresh = await context.kube.get(EXPERIMENTS, namespace, name) or dict(body)
    current = dict(fresh.get("status") or {})
    error = validation_error(name, spec, context.settings)
    if error is not None:
        await transition(context, fresh, current, Phase.FAILED, error, reason=Reason.INVALID_SPEC)
        raise kopf.PermanentError(error)
    if not current.get("phase"):
        await transition(
            context,
            fresh,
            current,
            Phase.PENDING,
            "accepted; preparing the model and data",
            reason=Reason.ACCEPTED,
        )
