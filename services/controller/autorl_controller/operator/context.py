"""What every handler shares: settings and the two API clients, carried in kopf's memo."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autorl.api.admin_client import AsyncAdminClient
from autorl_controller.operator.kube import KubeClient
from autorl_controller.operator.settings import ControllerSettings


@dataclass
class OperatorContext:
    settings: ControllerSettings
    kube: KubeClient
    grader: AsyncAdminClient

    @classmethod
    def build(cls, settings: ControllerSettings) -> OperatorContext:
        return cls(
            settings=settings,
            kube=KubeClient(timeout_s=settings.request_timeout_s),
            grader=AsyncAdminClient(
                settings.grader_url, settings.admin_token_value, timeout_s=settings.request_timeout_s
            ),
        )

    async def aclose(self) -> None:
        await self.kube.aclose()
        await self.grader.aclose()


def context_of(memo: Any) -> OperatorContext:
    """The context put into kopf's memo at start-up (kopf hands each handler a shallow copy)."""
    context = getattr(memo, "context", None)
    if not isinstance(context, OperatorContext):
        raise RuntimeError("the operator was started without an OperatorContext in its memo")
    return context
