"""The evaluation key: what makes two scores comparable. Identical weights reuse a score, and the
baseline cache hits, only under the same key."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from autorl.settings import Settings
from autorl.tasks import get_task

#: Bump when scoring or prompting changes in a way that changes numbers.
EVAL_PROTOCOL_VERSION = 1


def eval_config(task_name: str, settings: Settings, *, protocol: str = "opencompass") -> dict[str, Any]:
    task = get_task(task_name)
    return {
        "task": task.name,
        "backend": settings.eval_backend,
        "protocol": protocol,
        "protocol_version": EVAL_PROTOCOL_VERSION,
        "max_new_tokens": settings.eval_max_new_tokens or task.max_new_tokens,
        "limit": settings.eval_limit,
    }


def eval_key(config: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:32]
