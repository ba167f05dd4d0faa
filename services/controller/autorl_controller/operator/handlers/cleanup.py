"""``@kopf.on.cleanup``: close the API clients when the operator stops."""

from __future__ import annotations

from typing import Any

from autorl_controller.operator.context import context_of


async def close_clients(*, memo: Any, **_: Any) -> None:
    await context_of(memo).aclose()
