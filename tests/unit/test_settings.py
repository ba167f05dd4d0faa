"""Each service's settings: built from AUTORL_* variables or the mounted secrets folder, defaults
resolved from the home, an unsafe admin token refused at start-up, other services' variables
left alone."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from autorl.errors import ConfigurationError
from autorl.settings import AutoRLSettings, HomeSettings
from autorl_agent_runner.settings import AgentRunnerSettings
from autorl_controller.operator.settings import ControllerSettings
from autorl_evaluator.settings import WorkerSettings
from autorl_grader.settings import GraderSettings
from autorl_local.settings import RunSettings

SAFE_TOKEN = "0123456789abcdef0123"
#: Settings that hold the admin token, and what their refusal tells the operator to do.
TOKEN_HOLDERS: list[tuple[type[AutoRLSettings], str]] = [
    (GraderSettings, "openssl rand -hex 32"),
    (ControllerSettings, "give the controller the grader's admin token"),
]
HOMED: list[type[HomeSettings]] = [
    HomeSettings,
    GraderSettings,
    WorkerSettings,
    AgentRunnerSettings,
    RunSettings,
]


@pytest.fixture(autouse=True)
def bare_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No AUTORL_* variable of the machine running the tests, and no secrets folder."""
    for name in list(os.environ):
        if name.startswith("AUTORL_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AUTORL_SECRETS_DIR", str(tmp_path / "no-secrets"))


@pytest.mark.parametrize(("settings_class", "fix"), TOKEN_HOLDERS)
@pytest.mark.parametrize("token", ["", "admin", "changeme", "CHANGEME ", "secret", "autorl", "x" * 15])
def test_an_unsafe_admin_token_is_refused_at_start_up(
    monkeypatch: pytest.MonkeyPatch, settings_class: type[AutoRLSettings], fix: str, token: str
) -> None:
    monkeypatch.setenv("AUTORL_ADMIN_TOKEN", token)
    with pytest.raises(ConfigurationError, match="AUTORL_ADMIN_TOKEN is empty, a placeholder") as refused:
        settings_class()
    assert fix in str(refused.value)


@pytest.mark.parametrize(("settings_class", "fix"), TOKEN_HOLDERS)
def test_a_random_admin_token_is_accepted(
    monkeypatch: pytest.MonkeyPatch, settings_class: type[AutoRLSettings], fix: str
) -> None:
    monkeypatch.setenv("AUTORL_ADMIN_TOKEN", SAFE_TOKEN)
    assert settings_class().admin_token_value == SAFE_TOKEN  # type: ignore[attr-defined]


def test_local_mode_lets_the_grader_take_any_token_but_not_the_controller(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AUTORL_LOCAL_MODE", "1")
    assert GraderSettings().admin_token_value == ""
    with pytest.raises(ConfigurationError, match="give the controller the grader's admin token"):
        ControllerSettings()


@pytest.mark.parametrize("settings_class", [WorkerSettings, AgentRunnerSettings, RunSettings, HomeSettings])
def test_services_that_do_not_call_the_admin_api_hold_no_admin_token(
    monkeypatch: pytest.MonkeyPatch, settings_class: type[HomeSettings]
) -> None:
    monkeypatch.setenv("AUTORL_ADMIN_TOKEN", SAFE_TOKEN)
    settings = settings_class()  # and start without one
    assert SAFE_TOKEN not in repr(settings.model_dump())


@pytest.mark.parametrize("settings_class", HOMED)
def test_folders_and_database_default_to_the_home(
    monkeypatch: pytest.MonkeyPatch, settings_class: type[HomeSettings]
) -> None:
    monkeypatch.setenv("HOME", "/users/ada")
    monkeypatch.setenv("AUTORL_HOME", "~/platform")
    monkeypatch.setenv("AUTORL_ADMIN_TOKEN", SAFE_TOKEN)
    settings = settings_class()
    home = Path("/users/ada/platform")
    assert settings.home == home
    assert settings.database_url == f"sqlite:///{home}/autorl.db"
    assert (settings.cache_dir, settings.eval_dir) == (home / "cache", home / "eval")
    assert (settings.models_dir, settings.data_dir) == (home / "cache" / "models", home / "cache" / "data")
    if "snapshot_dir" in settings_class.model_fields:
        assert settings.snapshot_dir == home / "eval" / "snapshots"  # type: ignore[attr-defined]


def test_the_default_home_is_in_the_users_home(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", "/users/ada")
    assert HomeSettings().database_url == "sqlite:////users/ada/.autorl/autorl.db"


@pytest.mark.parametrize("settings_class", [GraderSettings, WorkerSettings])
def test_grader_and_workers_agree_on_the_snapshots_under_a_moved_eval_dir(
    monkeypatch: pytest.MonkeyPatch, settings_class: type[GraderSettings | WorkerSettings]
) -> None:
    monkeypatch.setenv("AUTORL_ADMIN_TOKEN", SAFE_TOKEN)
    monkeypatch.setenv("AUTORL_EVAL_DIR", "/srv/eval")
    assert settings_class().snapshot_dir == Path("/srv/eval/snapshots")
    monkeypatch.setenv("AUTORL_SNAPSHOT_DIR", "/srv/snapshots")
    assert settings_class().snapshot_dir == Path("/srv/snapshots")


def test_explicit_values_win_over_the_home_defaults(tmp_path: Path) -> None:
    settings = WorkerSettings(
        home=tmp_path, database_url="postgresql+psycopg://u:p@db/autorl", cache_dir=tmp_path / "c"
    )
    assert (settings.database_url, settings.cache_dir) == (
        "postgresql+psycopg://u:p@db/autorl",
        tmp_path / "c",
    )


def test_a_mounted_secrets_folder_is_read_and_a_variable_wins_over_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "AUTORL_ADMIN_TOKEN").write_text(SAFE_TOKEN)
    (secrets / "AUTORL_DATABASE_URL").write_text("postgresql+psycopg://autorl:s3cret@db:5432/autorl")
    (secrets / "AUTORL_REDIS_URL").write_text("redis://:s3cret@redis:6379/0")
    monkeypatch.setenv("AUTORL_SECRETS_DIR", str(secrets))  # read when settings are built
    grader = GraderSettings()
    assert grader.admin_token_value == SAFE_TOKEN
    assert grader.database_url == "postgresql+psycopg://autorl:s3cret@db:5432/autorl"
    grader.require_store_credentials()
    worker = WorkerSettings()
    assert worker.redis_url == "redis://:s3cret@redis:6379/0"
    assert ControllerSettings().admin_token_value == SAFE_TOKEN
    monkeypatch.setenv("AUTORL_ADMIN_TOKEN", "f" * 32)
    assert GraderSettings().admin_token_value == "f" * 32


def test_a_placeholder_in_the_secrets_folder_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "AUTORL_ADMIN_TOKEN").write_text("changeme")
    monkeypatch.setenv("AUTORL_SECRETS_DIR", str(tmp_path))
    with pytest.raises(ConfigurationError, match="AUTORL_ADMIN_TOKEN"):
        GraderSettings()


#: A variable of each service, set to a value its own settings would refuse.
FOREIGN_VARIABLES = {
    "AUTORL_SUBMIT_WAIT_S": "soon",  # grader
    "AUTORL_MAX_SUBMISSIONS": "-1",  # grader
    "AUTORL_EVAL_LEASE_S": "0",  # worker
    "AUTORL_EVAL_GPU_MIN_FREE_FRACTION": "7",  # worker
    "AUTORL_AGENT_ID_START": "-5",  # controller
    "AUTORL_CLUSTER_CIDRS": "not-a-network",  # controller
    "AUTORL_AGENT_PYTHON": "",  # agent runner
}
OWNERS: dict[type[AutoRLSettings], set[str]] = {
    GraderSettings: {"AUTORL_SUBMIT_WAIT_S", "AUTORL_MAX_SUBMISSIONS"},
    WorkerSettings: {"AUTORL_EVAL_LEASE_S", "AUTORL_EVAL_GPU_MIN_FREE_FRACTION"},
    ControllerSettings: {"AUTORL_AGENT_ID_START", "AUTORL_CLUSTER_CIDRS"},
    AgentRunnerSettings: {"AUTORL_AGENT_PYTHON"},
}


@pytest.mark.parametrize("settings_class", list(OWNERS))
def test_a_service_ignores_other_services_variables(
    monkeypatch: pytest.MonkeyPatch, settings_class: type[AutoRLSettings]
) -> None:
    monkeypatch.setenv("AUTORL_ADMIN_TOKEN", SAFE_TOKEN)
    for name, value in FOREIGN_VARIABLES.items():
        if name not in OWNERS[settings_class]:
            monkeypatch.setenv(name, value)
    settings = settings_class()
    for name in FOREIGN_VARIABLES.keys() - OWNERS[settings_class]:
        assert name.removeprefix("AUTORL_").lower() not in type(settings).model_fields


def test_each_service_reads_its_own_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTORL_ADMIN_TOKEN", SAFE_TOKEN)
    monkeypatch.setenv("AUTORL_SUBMIT_WAIT_S", "12.5")
    monkeypatch.setenv("AUTORL_EVAL_LEASE_S", "30")
    monkeypatch.setenv("AUTORL_AGENT_ID_START", "2000000")
    monkeypatch.setenv("AUTORL_AGENT_PYTHON", "/opt/agents/bin/python")
    monkeypatch.setenv("AUTORL_EVAL_TIMEOUT_S", "900")
    assert GraderSettings().submit_wait_s == 12.5
    assert WorkerSettings().eval_lease_s == 30.0
    assert ControllerSettings().agent_id_start == 2_000_000
    assert AgentRunnerSettings().agent_python == Path("/opt/agents/bin/python")
    # The evaluation's settings are the grader's and the workers' alike; `autorl run` waits as long.
    assert (
        GraderSettings().eval_timeout_s
        == WorkerSettings().eval_timeout_s
        == RunSettings().eval_timeout_s
        == 900
    )
