"""The small common base of every service's settings (environment prefix ``AUTORL_``, or files in
the mounted secrets folder ``AUTORL_SECRETS_DIR``).

Each service holds its own settings class, with only what it reads, where the service lives
(``autorl_grader.settings``, ``autorl_evaluator.settings``, ``autorl_agent_runner.settings``,
``autorl_controller.operator.settings``, ``autorl_local.settings``); this module keeps
what two or more of them share. Defaults that derive from other settings (the database in the
home, the snapshots in the evaluator's folder) are resolved while the settings are validated, so
every field has its final value once a settings object exists. Settings are built once by each
entry point and passed in, never at import time, so that tests construct their own.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, Self
from urllib.parse import parse_qs, urlsplit

from pydantic import BeforeValidator, Field, SecretStr, ValidationInfo, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SecretsSettingsSource,
    SettingsConfigDict,
)

from autorl.errors import ConfigurationError

DEFAULT_HOME = Path("~/.autorl")
#: Where Kubernetes mounts the platform's Secrets, one file per setting (``AUTORL_ADMIN_TOKEN``...).
DEFAULT_SECRETS_DIR = "/run/secrets/autorl"
#: Tokens that are refused outside local mode: the chart and docs examples, and obvious placeholders.
UNSAFE_ADMIN_TOKENS = frozenset({"", "admin", "changeme", "change-me", "secret", "token", "autorl"})
ADMIN_TOKEN_MIN_LENGTH = 16
EVAL_TIMEOUT_S = 7200
#: GPU batch of plain ``generate`` (architectures the hf backend's engine does not know). Measured on
#: one H200 (docs/PERFORMANCE.md): at batch 64 a decode step costs about what it costs at 256, so a
#: small GPU batch leaves the device idle; 256 fits an 80 GB card with GSM8K's long prompts.
GPU_EVAL_BATCH_SIZE = 256
CPU_EVAL_BATCH_SIZE = 64
#: One waiting job per experiment in Redis: another experiment's next job queues right behind it.
QUEUE_DEPTH_PER_EXPERIMENT = 1


def secrets_dir() -> Path | None:
    """The mounted secrets folder (``AUTORL_SECRETS_DIR``), read when settings are built; None
    when there is no such folder."""
    path = Path(os.environ.get("AUTORL_SECRETS_DIR", DEFAULT_SECRETS_DIR))
    return path if path.is_dir() else None


def comma_separated(value: object) -> object:
    """A list setting's variable: its comma-separated items, blanks left out; a value that is not
    text (a list given to the constructor) as it is."""
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


#: A list setting whose variable holds comma-separated items (rather than pydantic-settings' JSON).
CommaSeparated = Annotated[list[str], NoDecode, BeforeValidator(comma_separated)]


class AutoRLSettings(BaseSettings):
    """The root of every settings class: variables ``AUTORL_<FIELD>``, else a file ``AUTORL_<FIELD>``
    in the secrets folder; variables of other services are ignored."""

    model_config = SettingsConfigDict(env_prefix="AUTORL_", extra="ignore")

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The folder is looked up at construction, not at import: a process (or a test) that sets
        # AUTORL_SECRETS_DIR before building its settings reads that folder.
        secrets = SecretsSettingsSource(settings_cls, secrets_dir=secrets_dir())
        return init_settings, env_settings, dotenv_settings, secrets


class HomeSettings(AutoRLSettings):
    """The platform's home and the folders and database it holds by default."""

    home: Path = Field(
        default=DEFAULT_HOME, description="Platform home: database, caches, results.csv, runs."
    )
    database_url: str = Field(
        default=None,
        validate_default=True,
        description="SQLAlchemy URL: postgresql+psycopg://... or sqlite:///... (default SQLite in HOME).",
    )
    cache_dir: Path = Field(
        default=None, validate_default=True, description="Models and datasets cache (default HOME/cache)."
    )
    eval_dir: Path = Field(
        default=None,
        validate_default=True,
        description="Evaluator-only storage: test split, per-sample outputs (default HOME/eval).",
    )
    data_source_dir: Path | None = Field(
        default=None,
        description="Air-gapped data: a folder with <task>/train.jsonl and <task>/test.jsonl "
        "(or train.jsonl/test.jsonl) used instead of the Hugging Face hub.",
    )

    @field_validator("home")
    @classmethod
    def _expand_home(cls, home: Path) -> Path:
        home = home.expanduser()
        if home.exists() and not home.is_dir():
            raise ValueError(f"is a file, not a folder; {HOME_FIX}")
        return home

    @field_validator("database_url", mode="before")
    @classmethod
    def _database_in_home(cls, url: Any, info: ValidationInfo) -> Any:
        return url or f"sqlite:///{_home(info) / 'autorl.db'}"

    @field_validator("database_url")
    @classmethod
    def _supported_database(cls, url: str) -> str:
        return supported_database_url(url)

    @field_validator("data_source_dir")
    @classmethod
    def _data_source_folder(cls, folder: Path | None) -> Path | None:
        if folder is not None and folder.expanduser().exists() and not folder.expanduser().is_dir():
            raise ValueError(
                "is a file, not a folder; point it at a folder holding <task>/train.jsonl and "
                "<task>/test.jsonl, or unset it to download the data from the Hugging Face hub"
            )
        return folder

    @field_validator("cache_dir", mode="before")
    @classmethod
    def _cache_in_home(cls, folder: Any, info: ValidationInfo) -> Any:
        return _home(info) / "cache" if folder is None else folder

    @field_validator("eval_dir", mode="before")
    @classmethod
    def _eval_in_home(cls, folder: Any, info: ValidationInfo) -> Any:
        return _home(info) / "eval" if folder is None else folder

    @property
    def models_dir(self) -> Path:
        return self.cache_dir / "models"

    @property
    def data_dir(self) -> Path:
        return self.cache_dir / "data"


#: What to do about a home that cannot be one.
HOME_FIX = "point it at a folder (made if missing), such as ~/.autorl"
#: The message of a setting refused only because one it derives from is (AUTORL_HOME...).
NEEDS_VALID = "needs a valid AUTORL_"
#: The database URLs the platform can open (scheme → the scheme of the driver it installs):
#: ``postgresql://`` and ``postgres://`` are read as psycopg's, the one Postgres driver it installs.
DATABASE_SCHEMES = {
    "postgresql+psycopg": "postgresql+psycopg",
    "postgresql": "postgresql+psycopg",
    "postgres": "postgresql+psycopg",
    "sqlite": "sqlite",
    "sqlite+pysqlite": "sqlite",
}
DATABASE_EXAMPLE = "postgresql+psycopg://USER:PASSWORD@HOST:5432/DB or sqlite:////PATH/autorl.db"
REDIS_SCHEMES = ("redis", "rediss", "unix")


def supported_database_url(url: str) -> str:
    """``url`` with the scheme of the driver the platform installs; a ValueError naming what is
    expected for any other URL."""
    scheme, sep, rest = url.partition("://")
    own = DATABASE_SCHEMES.get(scheme.lower()) if sep else None
    if own is None:
        what = f"the scheme {scheme}:// is not supported" if sep else "not a database URL"
        raise ValueError(f"{what}; use {DATABASE_EXAMPLE}")
    return f"{own}://{rest}"


def _home(info: ValidationInfo) -> Path:
    """The home validated before the field at hand (fields validate in order; the home is first)."""
    home = info.data.get("home")
    if not isinstance(home, Path):
        raise ValueError(f"{NEEDS_VALID}HOME")
    return home


class EvaluationSettings(HomeSettings):
    """How submissions are evaluated. The grader records these with each experiment and workers
    obey the recorded values (:mod:`autorl.eval_config`), so both read the same variables."""

    snapshot_dir: Path = Field(
        default=None,
        validate_default=True,
        description="Where the grader copies each submission's model files for evaluation; agents must "
        "not be able to write here, grader and evaluator must both see it (default EVAL_DIR/snapshots).",
    )
    eval_backend: Literal["hf", "opencompass"] = Field(default="hf", description="Evaluation backend.")
    eval_timeout_s: int = Field(default=EVAL_TIMEOUT_S, gt=0, description="Hard limit of one evaluation.")
    eval_limit: int | None = Field(
        default=None,
        gt=0,
        description="Evaluate only the first N test problems (smoke tests; recorded in the key).",
    )
    eval_max_new_tokens: int | None = Field(
        default=None,
        gt=0,
        description="Override the task's generation limit (recorded in the evaluation key).",
    )
    eval_batch_size: int | None = Field(
        default=None,
        gt=0,
        description="Prompts per generation batch (hf backend; OpenCompass on CPU). Default: "
        f"{CPU_EVAL_BATCH_SIZE} on CPU; on a GPU as many as free memory holds ({GPU_EVAL_BATCH_SIZE} for "
        "architectures the hf engine does not know). Halved after out-of-memory.",
    )

    @field_validator("snapshot_dir", mode="before")
    @classmethod
    def _snapshots_in_eval_dir(cls, folder: Any, info: ValidationInfo) -> Any:
        if folder is not None:
            return folder
        eval_dir = info.data.get("eval_dir")
        if not isinstance(eval_dir, Path):
            raise ValueError(f"{NEEDS_VALID}EVAL_DIR")
        return eval_dir / "snapshots"


class AdminTokenSettings(AutoRLSettings):
    """The admin API's bearer token, for the services that hold it (the grader serves the admin
    API, the controller calls it); refused at start-up when it is a placeholder. Other services'
    settings leave it out: an agent's pod, above all, must never hold it."""

    #: What the refusal of an unsafe token tells the operator to do.
    ADMIN_TOKEN_FIX: ClassVar[str] = "set it to a random secret (e.g. `openssl rand -hex 32`)"

    admin_token: SecretStr = Field(default=SecretStr(""), description="Bearer token of the admin API.")

    def accepts_any_admin_token(self) -> bool:
        """Whether these settings take an unsafe token (the grader does in local mode)."""
        return False

    @model_validator(mode="after")
    def _refuse_unsafe_admin_token(self) -> Self:
        """Fail fast at start-up: an admin token must be set and not a placeholder.

        Raised as a ConfigurationError (not a validation error) so that the command prints it as is."""
        if self.accepts_any_admin_token():
            return self
        token = self.admin_token_value
        if token.strip().lower() in UNSAFE_ADMIN_TOKENS or len(token) < ADMIN_TOKEN_MIN_LENGTH:
            raise ConfigurationError(
                "AUTORL_ADMIN_TOKEN is empty, a placeholder or shorter than 16 characters; "
                + self.ADMIN_TOKEN_FIX
            )
        return self

    @property
    def admin_token_value(self) -> str:
        return self.admin_token.get_secret_value()


class PlatformSettings(EvaluationSettings):
    """What the grader and the evaluator workers share: the stores, the queue and the evaluation."""

    local_mode: bool = Field(
        default=False,
        description="Single-machine mode (`autorl run`): allows any admin token (`autorl grader` makes "
        "one where none is set) and Redis or Postgres URLs without a password.",
    )

    redis_url: str | None = Field(
        default=None, description="Redis URL for the RQ queue; absent → local dispatch."
    )
    redis_key_prefix: str = Field(
        default="autorl", description="Prefix of the RQ queue name (one per deployment)."
    )
    queue_depth_per_experiment: int = Field(
        default=QUEUE_DEPTH_PER_EXPERIMENT,
        gt=0,
        description="Jobs of one experiment waiting in Redis at a time; the rest wait in the database and "
        "are fed in fair order (baselines first, then the experiment served longest ago).",
    )

    evaluator_heartbeat_s: float = Field(
        default=10.0,
        gt=0,
        description="How often an evaluator worker reports itself alive (queue, backends) in the database; "
        "the grader counts a worker as available while its last report is under three of these old.",
    )

    @field_validator("redis_url")
    @classmethod
    def _redis_url(cls, url: str | None) -> str | None:
        if url and urlsplit(url).scheme.lower() not in REDIS_SCHEMES:
            raise ValueError(
                "not a redis:// URL; use redis://:PASSWORD@HOST:6379/0 (rediss:// with TLS), "
                "or unset it for local dispatch"
            )
        return url

    @property
    def queue_name(self) -> str:
        return f"{self.redis_key_prefix}-eval"

    @property
    def work_queue(self) -> str:
        """Where evaluators take work from: the RQ queue's name, or ``local`` (the database itself)."""
        return self.queue_name if self.redis_url else "local"

    @property
    def evaluator_alive_s(self) -> float:
        return 3 * self.evaluator_heartbeat_s

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
        if self.database_url.startswith("postgres") and not _has_password(self.database_url):
            raise ConfigurationError(
                "AUTORL_DATABASE_URL has no password; use postgresql+psycopg://USER:PASSWORD@HOST:5432/DB "
                "with a role that needs one (the chart sets it), or set AUTORL_LOCAL_MODE=1 on a single "
                "machine"
            )


def _has_password(url: str) -> bool:
    """A password in the URL's credentials or in its `password` query parameter."""
    parts = urlsplit(url)
    return bool(parts.password) or any(parse_qs(parts.query).get("password", []))
