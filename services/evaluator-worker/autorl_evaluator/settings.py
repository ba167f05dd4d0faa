"""The evaluator worker's settings (environment prefix ``AUTORL_``). Field descriptions double as
documentation."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Annotated

from pydantic import Field, field_validator
from pydantic_settings import NoDecode

from autorl.settings import PlatformSettings, comma_separated

EVAL_LEASE_S = 120.0
#: An agent's evaluation may take this many times what the base model writing every answer to its
#: token limit takes (autorl_evaluator.time_budget): room for a slower device of the same kind and
#: for a checkpoint that writes longer answers than the base model.
EVAL_BUDGET_FACTOR = 4.0
#: The least time budget of an evaluation, in seconds: a model's load and a process's start, which a
#: short baseline (a few problems) hardly measures.
EVAL_BUDGET_FLOOR_S = 120.0


def absolute_command(command: Path) -> Path:
    """``command`` as the worker means it wherever it is run from: a bare name through ``PATH``, a
    relative path from the worker's own folder. Not resolved: a venv's ``bin/python`` is a link to
    its base interpreter, and only the link's path makes it the venv's."""
    found = shutil.which(str(command)) if os.sep not in str(command) else None
    return Path(os.path.abspath(found or command))


def installed_opencompass_command() -> Path:
    """The default ``opencompass`` command: the one ``make setup`` installs in the repository this
    package is installed from (``.venv-opencompass`` beside ``services/``), whatever folder the
    worker runs in. An installation outside the repository (an image) sets AUTORL_OPENCOMPASS_BIN."""
    repository = Path(__file__).resolve().parents[3]
    return repository / ".venv-opencompass" / "bin" / "opencompass"


class WorkerSettings(PlatformSettings):
    """How this worker evaluates: its device, backend command and claims. The evaluation config an
    experiment recorded (backend, limit, tokens, timeout, batch) takes precedence per job."""

    eval_lease_s: float = Field(
        default=EVAL_LEASE_S,
        gt=0,
        description="An evaluating worker renews its claim every quarter of this; a claim not renewed for "
        "this long is a dead worker's, and the grader's reconciler hands the submission to another.",
    )
    eval_budget_factor: float = Field(
        default=EVAL_BUDGET_FACTOR,
        gt=0,
        description="An agent's evaluation is stopped, as its checkpoint's failure (counted against the "
        "submission limit), past this many times the base model's own evaluation under the same evaluation "
        "key and batch size on the same kind of device, scaled to every answer at its token limit "
        '(docs/EVALUATION.md, "Time budget"); baselines have the hard timeout only.',
    )
    eval_budget_floor_s: float = Field(
        default=EVAL_BUDGET_FLOOR_S,
        ge=0,
        description="The least time budget of an agent's evaluation in seconds (AUTORL_EVAL_BUDGET_FACTOR).",
    )
    eval_warm_worker: bool = Field(
        default=False,
        description="Evaluate in one long-lived child process of the worker (local or RQ) that keeps the "
        "model of an architecture resident and swaps each checkpoint's weights in (hf backend; the "
        "opencompass backend's resident engine with AUTORL_VLLM_PYTHON, and its runs forked from one "
        "process that has imported OpenCompass); the child is replaced after an "
        "evaluation passes its hard timeout or fails it by dying.",
    )
    eval_device: str | None = Field(
        default=None, description="torch device for the hf backend (default: cuda if any)."
    )
    eval_gpu_min_free_fraction: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="Local workers start an evaluation only once every visible GPU has at least this "
        "fraction of its memory free (GPUs shared with a training agent), and the hf backend's batch "
        "then keeps within it; unset: start at once, batch from all free memory.",
    )
    opencompass_bin: Path = Field(
        default_factory=installed_opencompass_command,
        description="The opencompass command of its own venv; by default the repository's "
        "`.venv-opencompass` (found from this package's location, never the working folder); a relative "
        "path set here is the worker's folder's.",
    )
    vllm_python: Path | None = Field(
        default=None,
        description="The Python of an environment with vLLM. When set, the opencompass backend hands "
        "generation to a resident engine running there (OpenCompass still renders every prompt and scores "
        "every answer): vLLM on GPUs, transformers on the CPU. In the warm worker the engine stays between "
        "evaluations and takes each checkpoint of its architecture by loading its weights in place.",
    )
    opencompass_keep_runs: bool = Field(
        default=False,
        description="Keep each OpenCompass evaluation folder (config, logs, predictions) after a success "
        "too; failed ones are always kept. Evaluator storage only: the folders hold test questions.",
    )

    known_checkpoints: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Public checkpoints of the base models' families (folders or hub ids, comma-separated "
        "or a JSON list): each agent's scored checkpoint nearer one of them than its base is named in "
        "the admin API and results.csv `lineage` (docs/PROTOCOL.md). An experiment adds its own "
        "(spec.evaluation.knownCheckpoints, `autorl run --known-checkpoint`).",
    )

    @field_validator("known_checkpoints", mode="before")
    @classmethod
    def _listed(cls, value: object) -> object:
        if isinstance(value, str) and value.strip().startswith("["):
            return json.loads(value)
        return comma_separated(value)

    @field_validator("opencompass_bin", "vllm_python")
    @classmethod
    def _absolute(cls, value: Path | None) -> Path | None:
        # Engines, OpenCompass and the version question run in folders of their own.
        return None if value is None else absolute_command(value)
