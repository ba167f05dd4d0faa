"""The operator's wiring: handler registrations and kopf settings, nothing else.

``build_registry`` registers into a fresh registry (no import-time side effects), so that the
command and tests run the same operator with their own settings (e.g. a short sync interval).
"""

from __future__ import annotations

import asyncio
import logging

import kopf

from autorl.crd import GROUP, PLURAL, VERSION
from autorl_controller.operator.context import OperatorContext
from autorl_controller.operator.handlers import cleanup, create, delete, login, reconcile
from autorl_controller.operator.settings import ControllerSettings

FINALIZER = f"{GROUP}/controller"
#: Seconds between checks that a deleted Experiment's reconcile pass has ended.
DELETION_RECHECK_S = 1.0


def build_registry(settings: ControllerSettings) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    kopf.on.login(registry=registry)(login.login)
    kopf.on.cleanup(registry=registry)(cleanup.close_clients)
    kopf.on.create(GROUP, VERSION, PLURAL, registry=registry, id="validate")(create.validate)
    kopf.timer(
        GROUP,
        VERSION,
        PLURAL,
        registry=registry,
        id="reconcile",
        interval=settings.sync_interval_s,
        when=reconcile.is_active,
    )(reconcile.reconcile)
    kopf.on.delete(GROUP, VERSION, PLURAL, registry=registry, id="cleanup")(delete.cleanup)
    return registry


def operator_settings() -> kopf.OperatorSettings:
    settings = kopf.OperatorSettings()
    settings.persistence.finalizer = FINALIZER
    # Annotations, not status: the CRD's status schema is structural and would prune kopf's fields.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=GROUP)
    settings.posting.level = logging.INFO
    # Least privilege: no cluster-wide list/watch of namespaces and CRDs (the chart installs the CRD
    # before the controller starts). One replica with a Recreate rollout: no peering needed.
    settings.scanning.disabled = True
    settings.peering.standalone = True
    # A deletion that lands while a reconcile pass runs waits for the pass to end; kopf checks
    # again after this many seconds (its default, 60, held a deleted Experiment for a minute).
    settings.background.cancellation_polling = DELETION_RECHECK_S
    return settings


async def run_operator(
    settings: ControllerSettings,
    *,
    stop_flag: asyncio.Event | None = None,
    ready_flag: asyncio.Event | None = None,
    liveness: bool = True,
) -> None:
    """Run until ``stop_flag`` is set (or a signal arrives); the whole cluster unless namespaces are set."""
    context = OperatorContext.build(settings)
    await kopf.operator(
        registry=build_registry(settings),
        settings=operator_settings(),
        memo=kopf.Memo(context=context),
        standalone=True,
        clusterwide=not settings.watch_namespaces,
        namespaces=settings.watch_namespaces,
        liveness_endpoint=settings.liveness_endpoint if liveness else None,
        stop_flag=stop_flag,
        ready_flag=ready_flag,
    )
