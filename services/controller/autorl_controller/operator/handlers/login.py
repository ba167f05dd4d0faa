"""``@kopf.on.login``: one set of credentials for kopf and for the handlers' own client."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import kopf

from autorl.errors import UsageError
from autorl_controller.operator.context import context_of

if TYPE_CHECKING:
    from autorl_controller.operator.settings import ControllerSettings


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


#: Where a pod finds its service account's token (kopf's in-cluster login reads it).
SERVICE_ACCOUNT_TOKEN = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")
_KUBECONFIG_FIX = (
    "set KUBECONFIG to your cluster's kubeconfig file (`kubectl config view --minify` shows what it "
    "must hold), run in a pod with a service account, or set AUTORL_KUBE_API_URL"
)


def check_credentials(settings: ControllerSettings) -> None:
    """Before the operator starts, what :func:`login` will find: the API URL, the pod's service account
    or a kubeconfig that kopf can log in with (read here by kopf's own reader). Without this kopf
    retries a login that cannot succeed every minute, forever; a :class:`UsageError` instead names
    KUBECONFIG and the fix."""
    if settings.kube_api_url or SERVICE_ACCOUNT_TOKEN.exists():
        return
    named = os.environ.get("KUBECONFIG", "").strip()
    where = f"KUBECONFIG={named}" if named else "~/.kube/config"
    try:
        info = kopf.login_with_kubeconfig(settings=kopf.OperatorSettings())
    except OSError as exc:
        raise UsageError(
            f"KUBECONFIG names {exc.filename or named}, which cannot be read ({exc.strerror or exc}); "
            f"{_KUBECONFIG_FIX}"
        ) from exc
    except Exception as exc:  # what kopf's reader raises on a file it cannot log in with
        raise UsageError(f"the kubeconfig ({where}) {_unusable(exc)}; {_KUBECONFIG_FIX}") from exc
    if info is None:
        raise UsageError(
            "no Kubernetes credentials (KUBECONFIG is not set and ~/.kube/config does not exist); "
            f"{_KUBECONFIG_FIX}"
        )


def _unusable(exc: Exception) -> str:
    """Why kopf cannot log in with a kubeconfig, from what its reader raised."""
    if any(kind.__name__ == "YAMLError" for kind in type(exc).__mro__):  # PyYAML's, as kopf reads it
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        return f"is not YAML ({where}{getattr(exc, 'problem', None) or exc})"
    if isinstance(exc, kopf.LoginError):  # its only one: no current-context
        return "sets no current-context"
    if isinstance(exc, KeyError):
        return f"names {exc.args[0]!r} (a context, cluster or user, or its field) but does not define it"
    return f"is not a kubeconfig ({type(exc).__name__}: {exc})"
