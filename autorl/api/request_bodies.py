"""The bodies the grader's routes accept, as typed models: the routes validate requests with
them and the clients build requests from them, so both sides agree on every field."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from autorl.errors import CheckpointError
from autorl.experiment import MAX_BUDGET_S, MAX_INT32, MAX_KNOWN_CHECKPOINTS
from autorl.layout import OUTPUT_DIR
from autorl.protocol.feedback import Feedback, FeedbackField
from autorl.untrusted_text import unprintable_characters

#: Lowercase DNS-1123, as a Kubernetes name (the operator names experiments after their objects).
EXPERIMENT_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")

#: The longest ``model_path`` accepted, in bytes of UTF-8 (Linux's PATH_MAX), and the most folders in
#: it: the path is stored with the submission and repeated in answers, the dashboard and logs, so
#: its size is bounded where it arrives (a 1 MiB path would be copied into every ``/scores`` entry).
MAX_MODEL_PATH_BYTES = 4096
MAX_MODEL_PATH_PARTS = 64

#: The latest ``start_time`` a date can hold (9999-12-31T23:59:59Z); a later time counts as now anyway.
MAX_EPOCH_S = 253_402_300_799

FinishStatus = Literal["completed", "interrupted", "failed", "timed_out"]
Protocol = Literal["opencompass", "flexible", "strict"]


class SubmitRequest(BaseModel):
    """``POST /submit``; unknown fields are ignored, as reference clients send some."""

    model_config = ConfigDict(extra="ignore")

    model_path: str = Field(
        min_length=1, description="Checkpoint folder inside your workspace's output/ (relative or absolute)."
    )
    gpu: Any = Field(
        default=None, description="Accepted for compatibility with reference clients and ignored."
    )

    @field_validator("model_path")
    @classmethod
    def _printable(cls, value: str) -> str:
        # A CheckpointError, not a ValueError: it leaves validation as it is, and the API edge answers
        # it 400 as any other refused checkpoint. Operators see this path in their terminal and logs.
        size, parts = len(value.encode("utf-8", errors="surrogatepass")), len(Path(value).parts)
        if size > MAX_MODEL_PATH_BYTES or parts > MAX_MODEL_PATH_PARTS:
            raise CheckpointError(
                f"model_path is {size} bytes and {parts} folders long; the limit is "
                f"{MAX_MODEL_PATH_BYTES} bytes and {MAX_MODEL_PATH_PARTS} folders: save the checkpoint "
                "to a short path under output/, such as output/step-100"
            )
        hidden = unprintable_characters(value)
        if hidden:
            raise CheckpointError(
                f"model_path holds characters that do not print ({', '.join(hidden[:8])}); "
                "rename the checkpoint folder to a name of visible characters, such as output/step-100"
            )
        # A name operators compare with others: outside ASCII a letter can be drawn as another
        # (Cyrillic К as K, a fullwidth Ｋ, a division slash as a folder's), whatever the escaping.
        # An absolute path's part up to its output folder must be the platform's own path (the
        # snapshot checks it), which may be any operator's; what the agent named follows it.
        named = _below_output(value)
        foreign = list(dict.fromkeys(f"\\u{ord(char):04x}" for char in named if not char.isascii()))
        if foreign:
            raise CheckpointError(
                f"model_path holds characters outside ASCII ({', '.join(foreign[:8])}), which can look like "
                "others; rename the checkpoint folder with ASCII letters, digits, '.', '-' and '_', such "
                "as output/step-100"
            )
        return value


def _below_output(model_path: str) -> str:
    """What an absolute ``model_path`` names below its first ``output`` folder; a relative one whole."""
    parts = Path(model_path).parts
    if model_path.startswith("/") and OUTPUT_DIR in parts:
        return "/".join(parts[parts.index(OUTPUT_DIR) + 1 :])
    return model_path


class RegisterExperiment(BaseModel):
    """``POST /v1/experiments``."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(max_length=253, description="Unique name (lowercase DNS-1123, as a Kubernetes name).")
    task: str
    model: str = Field(min_length=1, description="Model source: hub id, local folder or builtin:NAME.")
    timeout_s: int = Field(
        gt=0, le=MAX_BUDGET_S, description="The agent's time budget in seconds (at most 30 days)."
    )
    workspace: str = Field(description="The experiment's workspace as the grader sees it.")
    base_model_dir: str = Field(description="The prepared base model folder as the grader sees it.")
    output_dir: str | None = Field(default=None, description="Default: WORKSPACE/output.")
    agent_workspace: str | None = Field(
        default=None, description="The workspace as the agent sees it (pod mount)."
    )
    max_submissions: int | None = Field(default=None, gt=0, le=MAX_INT32)
    protocol: Protocol = Field(
        default="opencompass",
        description="Scoring protocol of the headline score; the others are stored beside it.",
    )
    feedback: FeedbackField = Field(
        default=Feedback.TEST,
        description="test: every submission scored on the test split; sealed: on a validation split "
        "carved from the train split, and one final test evaluation at the end (docs/PROTOCOL.md).",
    )
    agent: str | None = None
    driver_model: str | None = None
    known_checkpoints: list[Annotated[str, Field(min_length=1, max_length=512)]] = Field(
        default_factory=list,
        max_length=MAX_KNOWN_CHECKPOINTS,
        description="Public checkpoints of the base's family (folders or hub ids, as the evaluators "
        "see them): a scored submission nearer one than the base is named in `lineage`.",
    )

    @field_validator("name")
    @classmethod
    def _dns_name(cls, value: str) -> str:
        if not EXPERIMENT_NAME_RE.match(value):
            raise ValueError("use lowercase letters, digits, '-' and '.', starting and ending alphanumeric")
        return value

    @field_validator("workspace", "base_model_dir")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not Path(value).is_absolute():
            raise ValueError("must be an absolute path")
        return value


class RecordProvenance(BaseModel):
    """``POST /v1/experiments/{name}/provenance``: what was found, after the agent ended, of what it
    may have brought in (autorl.provenance): the test problems its files hold, the final's score on
    the twin split and the paired test of its gap against the base model's. Fields left out are kept."""

    model_config = ConfigDict(extra="forbid")

    test_overlap: int | None = Field(default=None, ge=0, le=MAX_INT32)
    twin_score: float | None = Field(default=None, ge=0, le=100)
    twin_p_value: float | None = Field(default=None, ge=0, le=1)


class NominateRequest(BaseModel):
    """``POST /final`` (sealed mode): the submission to evaluate on the test split at the end."""

    model_config = ConfigDict(extra="forbid")

    # 0 (the baseline's number) and unknown numbers are the grader's to refuse (400), as any id that
    # is not one of the agent's scored submissions.
    submission_id: int = Field(
        ge=0, le=MAX_INT32, description="One of your scored submissions (an id from GET /scores)."
    )


class StartBudget(BaseModel):
    """``POST /v1/experiments/{name}/start``."""

    model_config = ConfigDict(extra="forbid")

    timeout_s: int | None = Field(default=None, gt=0, le=MAX_BUDGET_S, description="At most 30 days.")
    start_time: float | None = Field(
        default=None,
        gt=0,
        le=MAX_EPOCH_S,
        description="When the budget started, in epoch seconds (the agent container's start); default "
        "now. A time in the future counts as now, one before the registration as the registration.",
    )


class FinishExperiment(BaseModel):
    """``POST /v1/experiments/{name}/finish``."""

    model_config = ConfigDict(extra="forbid")

    status: FinishStatus
    message: str | None = None
