"""Platform settings, read from the environment (prefix ``AUTORL_``) or mounted secret files.

Settings are built once by each service's entry point and passed in, never at import time,
so that tests construct their own.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal
from urllib.parse import parse_qs, urlsplit

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from autorl.errors import ConfigurationError

DEFAULT_HOME = Path("~/.autorl")
#: Tokens that are refused outside local mode: the chart and docs examples, and obvious placeholders.
UNSAFE_ADMIN_TOKENS = frozenset({"", "admin", "changeme", "change-me", "secret", "token", "autorl"})
EVAL_TIMEOUT_S = 7200
SUBMIT_WAIT_S = 540.0
#: How long a submit waits for an unreadable checkpoint to become readable (the agent pod's group-read
#: keeper walks the workspace every second) before it is refused.
UNREADABLE_WAIT_S = 10.0
#: GPU batch of plain ``generate`` (architectures the hf backend's engine does not know). Measured on
#: one H200 (docs/PERFORMANCE.md): at batch 64 a decode step costs about what it costs at 256, so a
#: small GPU batch leaves the device idle; 256 fits an 80 GB card with GSM8K's long prompts.
GPU_EVAL_BATCH_SIZE = 256
CPU_EVAL_BATCH_SIZE = 64
#: One waiting job per experiment in Redis: another experiment's next job queues right behind it.
QUEUE_DEPTH_PER_EXPERIMENT = 1
EVAL_LEASE_S = 120.0
RECONCILE_INTERVAL_S = 15.0


def _secrets_dir() -> str | None:
    path = os.environ.get("AUTORL_SECRETS_DIR", "/run/secrets/autorl")
    return path if Path(path).is_dir() else None


class Settings(BaseSettings):
    """Every knob of the platform. Field descriptions double as documentation."""

    model_config = SettingsConfigDict(env_prefix="AUTORL_", secrets_dir=_secrets_dir(), extra="ignore")

    home: Path = Field(DEFAULT_HOME, description="Platform home: database, caches, results.csv, runs.")
    cache_dir: Path | None = Field(None, description="Models and datasets cache (default HOME/cache).")
    database_url: str | None = Field(
        None,
        description="SQLAlchemy URL: postgresql+psycopg://... or sqlite:///... (default SQLite in HOME).",
    )
    redis_url: str | None = Field(None, description="Redis URL for the RQ queue; absent → local dispatch.")
    redis_key_prefix: str = Field("autorl", description="Prefix of the RQ queue name (one per deployment).")
    admin_token: SecretStr | None = Field(None, description="Bearer token of the admin API.")
    local_mode: bool = Field(
        False,
        description="Single-machine mode (`autorl run`): allows an empty admin token and Redis or Postgres "
        "URLs without a password.",
    )
    eval_timeout_s: int = Field(EVAL_TIMEOUT_S, gt=0, description="Hard limit of one evaluation.")
    submit_wait_s: float = Field(
        SUBMIT_WAIT_S, ge=0, description="How long a blocking /submit waits before answering 202."
    )
    unreadable_wait_s: float = Field(
        UNREADABLE_WAIT_S,
        ge=0,
        description="How long /submit waits, re-checking, for a checkpoint the grader may not read yet "
        "(files saved 0600, before the agent pod adds group-read) before refusing it with 400.",
    )
    max_submissions: int = Field(100, gt=0, description="Default per-experiment submission limit.")
    queue_depth_per_experiment: int = Field(
        QUEUE_DEPTH_PER_EXPERIMENT,
        gt=0,
        description="Jobs of one experiment waiting in Redis at a time; the rest wait in the database and "
        "are fed in fair order (baselines first, then the experiment served longest ago).",
    )
    max_eval_attempts: int = Field(3, gt=0, description="Evaluation attempts before a submission fails.")
    eval_lease_s: float = Field(
        EVAL_LEASE_S,
        gt=0,
        description="An evaluating worker renews its claim every quarter of this; a claim not renewed for "
        "this long is a dead worker's, and the grader's reconciler hands the submission to another.",
    )
    reconcile_interval_s: float = Field(
        RECONCILE_INTERVAL_S,
        gt=0,
        description="How often the grader requeues dead workers' submissions and feeds the queue from "
        "the database (what Redis lost).",
    )
    data_source_dir: Path | None = Field(
        None,
        description="Air-gapped data: a folder with <task>/train.jsonl and <task>/test.jsonl "
        "(or train.jsonl/test.jsonl) used instead of the Hugging Face hub.",
    )
    eval_dir: Path | None = Field(
        None, description="Evaluator-only storage: test split, per-sample outputs (default HOME/eval)."
    )
    snapshot_dir: Path | None = Field(
        None,
        description="Where the grader copies each submission's model files for evaluation; agents must "
        "not be able to write here, grader and evaluator must both see it (default EVAL_DIR/snapshots).",
    )
    eval_backend: Literal["hf", "opencompass"] = Field("hf", description="Evaluation backend.")
    eval_limit: int | None = Field(
        None, gt=0, description="Evaluate only the first N test problems (smoke tests; recorded in the key)."
    )
    eval_max_new_tokens: int | None = Field(
        None, gt=0, description="Override the task's generation limit (recorded in the evaluation key)."
    )
    eval_batch_size: int | None = Field(
        None,
        gt=0,
        description="Prompts per generation batch (hf backend; OpenCompass on CPU). Default: "
        f"{CPU_EVAL_BATCH_SIZE} on CPU; on a GPU as many as free memory holds ({GPU_EVAL_BATCH_SIZE} for "
        "architectures the hf engine does not know). Halved after out-of-memory.",
    )
    eval_warm_worker: bool = Field(
        False,
        description="Local worker: evaluate in one long-lived child process that keeps the model of an "
        "architecture resident and swaps each checkpoint's weights in (hf backend); the child is "
        "replaced after an evaluation passes its hard timeout.",
    )
    eval_device: str | None = Field(
        None, description="torch device for the hf backend (default: cuda if any)."
    )
    eval_gpu_min_free_fraction: float | None = Field(
        None,
        gt=0,
        le=1,
        description="Local workers start an evaluation only once every visible GPU has at least this "
        "fraction of its memory free (GPUs shared with a training agent), and the hf backend's batch "
        "then keeps within it; unset: start at once, batch from all free memory.",
    )
    opencompass_bin: Path = Field(
        Path(".venv-opencompass/bin/opencompass"), description="The opencompass command of its own venv."
    )
    opencompass_keep_runs: bool = Field(
        False,
        description="Keep each OpenCompass evaluation folder (config, logs, predictions) after a success "
        "too; failed ones are always kept. Evaluator storage only: the folders hold test questions.",
    )
    public_url: str = Field("http://127.0.0.1:8000", description="Base URL agents use to reach the grader.")
    agent_python: Path | None = Field(
        None,
        description="The agents' Python (an interpreter or an environment's folder) that agents start "
        "with; default: .venv-agent beside the platform's environment, else the platform's interpreter.",
    )

    @model_validator(mode="after")
    def _fill_paths(self) -> Settings:
        self.home = self.home.expanduser()
        if self.cache_dir is None:
            self.cache_dir = self.home / "cache"
        if self.eval_dir is None:
            self.eval_dir = self.home / "eval"
        if self.snapshot_dir is None:
            self.snapshot_dir = self.eval_dir / "snapshots"
        if self.database_url is None:
            self.database_url = f"sqlite:///{self.home / 'autorl.db'}"
        return self

    @property
    def models_dir(self) -> Path:
        assert self.cache_dir is not None
        return self.cache_dir / "models"

    @property
    def data_dir(self) -> Path:
        assert self.cache_dir is not None
        return self.cache_dir / "data"

    @property
    def queue_name(self) -> str:
        return f"{self.redis_key_prefix}-eval"

    def require_safe_admin_token(self) -> None:
        """Fail fast at start-up: outside local mode an admin token must be set and not a placeholder."""
        if self.local_mode:
            return
        token = self.admin_token.get_secret_value() if self.admin_token else ""
        if token.strip().lower() in UNSAFE_ADMIN_TOKENS or len(token) < 16:
            raise ConfigurationError(
                "AUTORL_ADMIN_TOKEN is empty, a placeholder or shorter than 16 characters; "
                "set it to a random secret (e.g. `openssl rand -hex 32`) or set AUTORL_LOCAL_MODE=1 "
                "on a single machine"
            )

    def require_store_credentials(self) -> None:
        """Fail fast at start-up: outside local mode, Redis and Postgres must ask for a password.

        Anything that reaches an open Redis can push jobs to the evaluators, and an open Postgres can
        rewrite scores; a password (with the chart's NetworkPolicies) keeps both to the platform."""
        if self.local_mode:
            return
        if self.redis_url and not _has_password(self.redis_url):
            raise ConfigurationError(
                "AUTORL_REDIS_URL has no password; use redis://:PASSWORD@HOST:6379/0 with a Redis started "
                "with --requirepass (the chart sets both), or set AUTORL_LOCAL_MODE=1 on a single machine"
            )
        database = self.database_url or ""
        if database.startswith("postgres") and not _has_password(database):
            raise ConfigurationError(
                "AUTORL_DATABASE_URL has no password; use postgresql+psycopg://USER:PASSWORD@HOST:5432/DB "
                "with a role that needs one (the chart sets it), or set AUTORL_LOCAL_MODE=1 on a single "
                "machine"
            )


def _has_password(url: str) -> bool:
    """A password in the URL's credentials or in its `password` query parameter."""
    parts = urlsplit(url)
    return bool(parts.password) or any(parse_qs(parts.query).get("password", []))


def load_settings(**overrides: object) -> Settings:
    """Build settings from the environment, with explicit overrides (used by CLIs and tests)."""
    return Settings(**overrides)  # type: ignore[arg-type]
