"""The evaluation config the grader records with each experiment, and its key.

The grader owns every evaluation setting: it records them when an experiment is registered
(from its own ``AUTORL_EVAL_*`` settings; on a cluster the chart's ``evaluator.*`` values) and the
worker validates the recorded config back and obeys it, whatever its own environment says. The
key is what makes two scores comparable: identical weights reuse a score, and the baseline cache
hits, only under the same key. How long an evaluation may run and how prompts are batched are
recorded too, but they do not change a score, so they stay out of the key.

The key is the first 32 hex digits of the SHA-256 of a canonical JSON object of named fields
(:meth:`EvalConfig.key_fields`; docs/EVALUATION.md, "Evaluation key"): the task and the SHA-256 of
its evaluated split, the prompt version, the backend and the versions of the packages it runs
with, the decoding settings, the headline protocol and the scoring protocol version. The fields are
stored beside the key (the experiment's ``eval_config``), so two keys that differ name what differs
(:func:`differing_fields`). The split's hash and the package versions are facts of the evaluator:
the grader records them as the evaluators last measured them, and every evaluation records the key
it was really computed under (a first evaluation completes a key recorded without them).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from autorl.settings import EvaluationSettings

#: The scoring protocol version: bump when scoring or prompting changes in a way that changes
#: numbers. Every key then changes, so no score and no cached baseline of the old protocol is reused:
#: baselines are evaluated again. 2: the key covers the split's hash, the prompt version, the
#: backend's package versions and the decoding.
EVAL_PROTOCOL_VERSION = 2
#: How every engine turns generated ids into an answer's text: special tokens dropped (a non-eos
#: ``<|im_start|>`` between two digits too), as vLLM does by default and so as the reference
#: (OpenCompass with vLLM) scores. Every engine is given it explicitly, never left to its default.
SKIP_SPECIAL_TOKENS = True
#: How every backend decodes: greedy (no sampling), one answer per problem, special tokens dropped
#: (:data:`SKIP_SPECIAL_TOKENS`); plain ``greedy`` was recorded before that rule was one for every
#: backend (the ``hf`` backend kept them).
DECODING = "greedy, special tokens skipped" if SKIP_SPECIAL_TOKENS else "greedy, special tokens kept"
#: Fields the evaluator measures (the grader records them as last measured, or leaves them unset).
MEASURED_FIELDS = ("data_sha256", "backend_versions")
#: Fields of the key added with protocol 2: left out of the hash while unset, so that configs
#: recorded before them keep their keys.
LATER_KEY_FIELDS = frozenset({"prompt_version", "decoding", "split", *MEASURED_FIELDS})
#: Recorded settings that bound or batch the work but never change a score.
RUN_ONLY_FIELDS = frozenset({"timeout_s", "batch_size"})


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
    prompt_version: str | None = Field(default=None, description="the task's prompt template version")
    decoding: str | None = Field(default=None, description="how answers are decoded (DECODING)")
    data_sha256: str | None = Field(
        default=None, description="SHA-256 of the whole evaluated split as JSON lines (before any limit)"
    )
    backend_versions: dict[str, str] | None = Field(
        default=None, description="the versions of the packages the backend evaluates with"
    )
    split: Literal["validation"] | None = Field(
        default=None,
        description="the split evaluated: None the test split (keys of test evaluations stay as they "
        "were), validation the split carved from the train split in sealed mode",
    )

    @classmethod
    def record(
        cls,
        task_name: str,
        settings: EvaluationSettings,
        *,
        protocol: str = "opencompass",
        measured: dict[str, Any] | None = None,
        split: Literal["validation"] | None = None,
    ) -> EvalConfig:
        """What the grader records for a new experiment of task ``task_name`` on its test split
        (or ``split``); ``measured``: that split's hash and package versions the evaluators last
        measured (:data:`MEASURED_FIELDS`)."""
        from autorl.tasks import get_task

        task = get_task(task_name)
        facts = {name: value for name, value in (measured or {}).items() if name in MEASURED_FIELDS}
        return cls(
            task=task.name,
            backend=settings.eval_backend,
            protocol=protocol,
            protocol_version=EVAL_PROTOCOL_VERSION,
            max_new_tokens=settings.eval_max_new_tokens or task.max_new_tokens,
            limit=settings.eval_limit,
            timeout_s=settings.eval_timeout_s,
            batch_size=settings.eval_batch_size,
            prompt_version=task.prompt_version,
            decoding=DECODING,
            split=split,
            **facts,
        )

    def key_fields(self) -> dict[str, Any]:
        """The named fields the key hashes: everything that changes a score (the run-only fields
        left out, and the fields added later left out while unset)."""
        scored = self.model_dump(mode="json", exclude=set(RUN_ONLY_FIELDS))
        return {
            name: value for name, value in scored.items() if value is not None or name not in LATER_KEY_FIELDS
        }

    @property
    def key(self) -> str:
        """The hash of :meth:`key_fields` as canonical JSON (sorted keys, no whitespace choice left)."""
        return key_of(self.key_fields())

    def measured(self) -> dict[str, Any]:
        """The evaluator's facts in this config (unset ones left out)."""
        facts = self.model_dump(mode="json", include=set(MEASURED_FIELDS))
        return {name: value for name, value in facts.items() if value is not None}

    def with_measured(self, data_sha256: str, backend_versions: dict[str, str]) -> EvalConfig:
        """This config as evaluated: with the split's hash and the package versions measured now,
        and the decoding every backend applies now (:data:`DECODING`: a config recorded under an
        earlier rule is scored under its own key, never the old one's)."""
        return self.model_copy(
            update={
                "data_sha256": data_sha256,
                "backend_versions": dict(backend_versions),
                "decoding": DECODING,
            }
        )

    def stored(self) -> dict[str, Any]:
        """The JSON the store keeps."""
        return self.model_dump(mode="json")

    def timeout_in_force_s(self, own_timeout_s: int) -> int:
        """The evaluation's hard limit in seconds: the recorded one; for a config recorded before
        it was, the worker's own (``eval_timeout_s``)."""
        return self.timeout_s or own_timeout_s

    def batch_size_in_force(self, own_batch_size: int | None) -> int | None:
        """Prompts per batch: the recorded size (None: sized by the backend); for a config recorded
        before it was, the worker's own (``eval_batch_size``)."""
        return self.batch_size if "batch_size" in self.model_fields_set else own_batch_size


def key_of(fields: dict[str, Any]) -> str:
    """The key of a set of key fields: SHA-256 of their canonical JSON, first 32 hex digits."""
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:32]


def recorded_key(recorded: dict[str, Any]) -> str:
    """The key of a recorded config (an experiment's ``eval_config`` as the admin API shows it)."""
    return key_of(_scored(recorded))


def differing_fields(first: dict[str, Any], second: dict[str, Any]) -> list[str]:
    """The names of the key fields in which two recorded configs differ (a field one of them lacks
    counts as differing); package versions are named one by one (``backend_versions.vllm``)."""
    a, b = _scored(first), _scored(second)
    names: list[str] = []
    for name in sorted(set(a) | set(b)):
        left, right = a.get(name), b.get(name)
        if left == right:
            continue
        if name == "backend_versions" and isinstance(left, dict) and isinstance(right, dict):
            names += [
                f"{name}.{package}"
                for package in sorted(set(left) | set(right))
                if left.get(package) != right.get(package)
            ]
        else:
            names.append(name)
    return names


def _scored(recorded: dict[str, Any]) -> dict[str, Any]:
    """The key fields of a recorded config; a config this code cannot read is compared as stored."""
    try:
        return EvalConfig.model_validate(recorded).key_fields()
    except ValueError:
        return {name: value for name, value in recorded.items() if name not in RUN_ONLY_FIELDS}
