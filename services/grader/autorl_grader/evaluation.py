"""The evaluation config the grader records with each experiment, and its key.

The grader owns every evaluation setting: it records them when an experiment is registered
(from its own ``AUTORL_EVAL_*`` settings; on a cluster the chart's ``evaluator.*`` values) and the
worker obeys the recorded config, whatever its own environment says. The key is what makes two
scores comparable: identical weights reuse a score, and the baseline cache hits, only under the
same key. How long an evaluation may run and how prompts are batched are recorded too, but they
do not change a score, so they stay out of the key.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from autorl.settings import Settings
from autorl.tasks import get_task

#: Bump when scoring or prompting changes in a way that changes numbers.
EVAL_PROTOCOL_VERSION = 1
#: Recorded settings that bound or batch the work but never change a score.
RUN_ONLY_FIELDS = frozenset({"timeout_s", "batch_size"})


def eval_config(task_name: str, settings: Settings, *, protocol: str = "opencompass") -> dict[str, Any]:
    task = get_task(task_name)
    return {
        "task": task.name,
        "backend": settings.eval_backend,
        "protocol": protocol,
        "protocol_version": EVAL_PROTOCOL_VERSION,
        "max_new_tokens": settings.eval_max_new_tokens or task.max_new_tokens,
        "limit": settings.eval_limit,
        "timeout_s": settings.eval_timeout_s,
        "batch_size": settings.eval_batch_size,
    }


def eval_key(config: dict[str, Any]) -> str:
    scored = {name: value for name, value in config.items() if name not in RUN_ONLY_FIELDS}
    return hashlib.sha256(json.dumps(scored, sort_keys=True).encode()).hexdigest()[:32]
