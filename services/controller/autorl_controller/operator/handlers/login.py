"""``@kopf.on.login``: one set of credentials for kopf and for the handlers' own client."""

from __future__ import annotations

from typing import Any

import kopf

from autorl_controller.operator.context import context_of


def login(*, settings: kopf.OperatorSettings, memo: Any, logger: Any, **_: Any) -> kopf.ConnectionInfo:
    context = context_of(memo)
    info: kopf.ConnectionInfo | None
    if context.settings.kube_api_url:
        info = kopf.ConnectionInfo(server=context.settings.kube_api_url, default_namespace="default")
    else:
        # In a pod: its service account; on a workstation: the kubeconfig.
        info = kopf.login_with_service_account(settings=settings) or kopf.login_with_kubeconfig(
            settings=settings
        )
    if info is None:
        raise kopf.LoginError(
            "no Kubernetes credentials: run in a pod with a service account, set KUBECONFIG, "
            "or set AUTORL_KUBE_API_URL"
        )
    context.kube.use(info)
    logger.info("event=kube_login server=%s", info.server)
    return info
