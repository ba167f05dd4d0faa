"""The evaluation config the grader records with each experiment, and its key.

The grader owns every evaluation setting: it records them when an experiment is registered
(from its own ``AUTORL_EVAL_*`` settings; on a cluster the chart's ``evaluator.*`` values) and the
worker validates the recorded config back and obeys it, whatever its own environment says. The
key is what makes two scores comparable: identical weights reuse a score, and the baseline cache
hits, only under the same key. How long an evaluation may run and how prompts are batched are
recorded too, but they do not change a score, so they stay out of the key.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from autorl.settings import EvaluationSettings

#: Bump when scoring or prompting changes in a way that changes numbers.
EVAL_PROTOCOL_VERSION = 1
#: Recorded settings that bound or batch the work but never change a score.
RUN_ONLY_FIELDS = frozenset({"timeout_s", "batch_size"})

SettingsT = TypeVar("SettingsT", bound=EvaluationSettings)


class EvalConfig(BaseModel):
    """One experiment's evaluation, as recorded. A config recorded by a newer grader (a field this
    worker does not know) is refused rather than evaluated differently."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    task: str
    backend: Literal["hf", "opencompass"]
    protocol: str = "opencompass"
    protocol_version: int = EVAL_PROTOCOL_VERSION
    max_new_tokens: int | None = Field(description="new tokens per answer (the task's default when unset)")
    limit: int | None = Field(description="the first N test problems only (None: all)")
    #: Recorded since the grader owns them; configs recorded before have neither (the worker's own apply).
    timeout_s: int | None = None
    batch_size: int | None = None

    @classmethod
    def record(
        cls, task_name: str, settings: EvaluationSettings, *, protocol: str = "opencompass"
    ) -> EvalConfig:
        """What the grader records for a new experiment of task ``task_name``."""
        from autorl.tasks import get_task

        task = get_task(task_name)
        return cls(
            task=task.name,
            backend=settings.eval_backend,
            protocol=protocol,
            max_new_tokens=settings.eval_max_new_tokens or task.max_new_tokens,
            limit=settings.eval_limit,
            timeout_s=settings.eval_timeout_s,
            batch_size=settings.eval_batch_size,
        )

    @property
    def key(self) -> str:
        """The hash of everything that changes a score (the run-only fields left out)."""
        scored = self.model_dump(mode="json", exclude=set(RUN_ONLY_FIELDS))
        return hashlib.sha256(json.dumps(scored, sort_keys=True).encode()).hexdigest()[:32]

    def stored(self) -> dict[str, Any]:
        """The JSON the store keeps."""
        return self.model_dump(mode="json")

    def apply_to(self, settings: SettingsT) -> SettingsT:
        """The worker's settings with the recorded evaluation settings in force."""
        return settings.model_copy(
            update={
                "eval_backend": self.backend,
                "eval_max_new_tokens": self.max_new_tokens,
                "eval_limit": self.limit,
                "eval_timeout_s": self.timeout_s or settings.eval_timeout_s,
                "eval_batch_size": (
                    self.batch_size if "batch_size" in self.model_fields_set else settings.eval_batch_size
                ),
            }
        )
