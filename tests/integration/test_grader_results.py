"""`autorl results --grader URL` and `autorl report NAME --grader URL` against a real grader over
HTTP (real Postgres): a cluster's finished experiments as the rows, table, comparison and summary a
home's runs get, each report the one `autorl report` computes from the store, and every missing or
wrong piece (token, URL, name) refused with its fix, exit 2."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator

import pytest
from rich.cells import cell_len

from autorl.cli import main
from autorl.runs.reports import compute_metrics, read_run, seed_metrics
from autorl.store import Database, experiments
from autorl.store.models import ExperimentStatus
from autorl_grader.main import create_app
from tests.support.infra import serve
from tests.support.runs import add_submission, create_experiment, finish, scores, sealed_experiment
from tests.support.settings import DeploymentSettings

UNREACHABLE = "http://127.0.0.1:9"


@pytest.fixture(scope="module")
def settings(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> DeploymentSettings:
    """The module's own database: the grader lists every experiment there is (those below)."""
    home = tmp_path_factory.mktemp("grader") / "home"
    return DeploymentSettings(home=home, admin_token=secrets.token_hex(16), database_url=pg_url)


@pytest.fixture(scope="module")
def cluster(settings: DeploymentSettings, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A test-mode experiment (baseline 10; 12, a failure, a copy of the base model, 30, 20), a
    sealed one (final 50 % on test against 10 %), one that failed with a message, one whose budget
    ran out, and one still running: by role, their names."""
    root = tmp_path_factory.mktemp("workspaces")
    db = Database(settings.database_url)
    run = create_experiment(db, root / "ws-test", started_minutes_ago=10)
    add_submission(db, run.name, scores=scores(10.0), files="base", baseline=True, correctness="1" + "0" * 9)
    add_submission(db, run.name, scores=scores(12.0), minutes=1)
    add_submission(db, run.name, error="config.json: not the base architecture", minutes=2)
    add_submission(db, run.name, files="base", minutes=3)
    add_submission(db, run.name, scores=scores(30.0), minutes=5, correctness="111" + "0" * 7)
    add_submission(db, run.name, scores=scores(20.0), minutes=6)
    finish(db, run.name)
    sealed = sealed_experiment(db, root / "ws-sealed").run.name
    finish(db, sealed)
    failed = create_experiment(db, root / "ws-failed").name
    with db.session() as session:
        experiment = experiments.get_experiment(session, failed)
        experiments.finish_experiment(
            session, experiment, ExperimentStatus.FAILED, "[bold]agent\x1b]0;x\x07 exited 1"
        )
    timed_out = create_experiment(db, root / "ws-timed-out").name
    add_submission(db, timed_out, scores=scores(10.0), baseline=True)
    add_submission(db, timed_out, scores=scores(15.0), minutes=1)
    finish(db, timed_out, "timed_out")
    running = create_experiment(db, root / "ws-running").name
    db.dispose()
    return {"test": run.name, "sealed": sealed, "failed": failed, "timed_out": timed_out, "running": running}


@pytest.fixture(scope="module")
def served(settings: DeploymentSettings) -> Iterator[str]:
    with serve(create_app(settings, reconcile=False)) as app:
        yield app.url


@pytest.fixture
def grader(served: str, settings: DeploymentSettings, monkeypatch: pytest.MonkeyPatch) -> str:
    """The grader's URL; the commands' admin token is its own."""
    monkeypatch.setenv("AUTORL_ADMIN_TOKEN", settings.admin_token_value)
    return served


def results(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["results", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_results_lists_the_graders_finished_experiments_as_rows(
    grader: str, cluster: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = results(capsys, "--grader", grader, "--json")
    assert code == 0
    rows = {row["run_id"]: row for row in json.loads(out)}
    assert list(rows) == [cluster[k] for k in ("test", "sealed", "failed", "timed_out")]  # oldest first
    assert "1 of the grader's experiments has not finished and no row yet" in err and f"{grader}/ui" in err
    test = rows[cluster["test"]]
    assert {k: test[k] for k in ("task", "agent", "base_model", "baseline", "best_score", "improvement")} == {
        "task": "gsm8k",
        "agent": "example_grpo",
        "base_model": "builtin:tiny-qwen2",
        "baseline": 10.0,
        "best_score": 30.0,
        "improvement": 20.0,
    }
    assert (test["submissions"], test["status"], test["success"], test["feedback"]) == (
        4,
        "completed",
        True,
        "test",
    )
    assert (test["final_score"], test["selection"], test["test_evaluations"]) == (30.0, "best_on_test", 4)
    assert test["duration_s"] > 0 and test["timestamp"].endswith("+00:00")
    # Every number on the test split: a sealed experiment's best there is its final score.
    sealed = rows[cluster["sealed"]]
    assert (sealed["baseline"], sealed["best_score"], sealed["improvement"]) == (10.0, 50.0, 40.0)
    assert (sealed["feedback"], sealed["selection"], sealed["final_p_value"]) == (
        "sealed",
        "nominated",
        0.125,
    )
    assert (rows[cluster["failed"]]["status"], rows[cluster["failed"]]["success"]) == ("failed", False)
    assert rows[cluster["timed_out"]]["status"] == "completed"  # as `autorl run` records a run out of time
    # The rows are results.csv's, column for column.
    code, out, _ = results(capsys, "--grader", grader, "--csv", "--task", "gsm8k")
    assert out.splitlines()[0].startswith("run_id,timestamp,task,agent,") and len(out.splitlines()) == 5


def test_the_graders_table_fits_100_columns_with_each_note_below(
    grader: str, cluster: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = results(capsys, "--grader", grader)
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith(f"Experiments of the grader at {grader}")
    assert max(cell_len(line.rstrip()) for line in lines) <= 100
    test_row = next(line for line in lines if line.startswith(cluster["test"] + " "))
    assert "10.00 → 30.00" in test_row and "+20.00" in test_row
    # How the failed one ended, as recorded, as text.
    assert f"{cluster['failed']}: [bold]agent\\x1b]0;x\\x07 exited 1" in out and "\x1b" not in out
    code, out, _ = results(capsys, "--grader", grader, "--wide")
    assert "[bold]agent\\x1b]0;x\\x07 exited 1" in out and "best_on_test" in out


def test_compare_and_summary_of_the_graders_experiments(
    grader: str, cluster: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    first, second = cluster["test"], cluster["timed_out"]
    code, out, _ = results(capsys, "--grader", grader, "--compare", first[:12], second, "--json")
    assert code == 0
    compared = json.loads(out)
    assert [row["run_id"] for row in compared["runs"]] == [first, second]
    (group,) = compared["groups"]  # one agent, one evaluation key: one group of two runs
    assert group["final_score"] == {"n": 2, "mean": 22.5, "sem": 7.5}
    code, out, _ = results(capsys, "--grader", grader, "--compare", first, second)
    assert code == 0 and "time_to_best" in out and "300.0" in out  # the reports' metrics beside the rows
    # A sealed experiment's result is not comparable with a test one's.
    code, _, err = results(capsys, "--grader", grader, "--compare", first, cluster["sealed"])
    assert code == 2 and "one feedback mode" in err
    code, out, _ = results(capsys, "--grader", grader, "--summary", "--json")
    groups = {(g["feedback"], g["runs"]) for g in json.loads(out)}
    assert groups == {("test", 3), ("sealed", 1)}


def test_report_of_a_graders_experiment_is_the_report_of_the_store(
    grader: str, cluster: dict[str, str], settings: DeploymentSettings, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in (cluster["test"], cluster["sealed"]):
        assert main(["report", name, "--grader", grader, "--json"]) == 0
        from_grader = json.loads(capsys.readouterr().out)
        from_store = {**compute_metrics(read_run(settings.database_url, name), 0.0), **seed_metrics(None)}
        assert from_grader == json.loads(json.dumps(from_store))
    assert from_grader["copy_model_count"] == 0 and from_grader["final_score"] == 50.0
    # By a unique prefix, as a person reads it; nothing is written.
    assert main(["report", cluster["test"][:11], "--grader", grader]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"run          {cluster['test']}, completed\n")
    assert "submissions  5, 4 scored, 1 copy of the base model" in out and "metrics:" not in out


def test_every_missing_or_wrong_piece_is_refused_with_its_fix(
    grader: str, cluster: dict[str, str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, _, err = results(capsys, "--grader", UNREACHABLE)
    assert code == 2 and f"cannot read the experiments of the grader at {UNREACHABLE}" in err
    code, _, err = results(capsys, "--grader", "127.0.0.1:8000")
    assert code == 2 and "as http://HOST:PORT" in err
    assert main(["report", "exp-", "--grader", grader]) == 2
    assert "'exp-' matches 5 runs (" in capsys.readouterr().err
    assert main(["report", "nope", "--grader", grader]) == 2
    assert f"no run 'nope' in the grader at {grader}; list the runs with `autorl results --grader" in (
        capsys.readouterr().err
    )
    monkeypatch.setenv("AUTORL_ADMIN_TOKEN", "not-the-admin-token")
    code, _, err = results(capsys, "--grader", grader)
    assert code == 2 and "refused the admin token" in err and "set AUTORL_ADMIN_TOKEN" in err
    monkeypatch.delenv("AUTORL_ADMIN_TOKEN")
    assert main(["report", cluster["test"], "--grader", grader]) == 2
    assert "no admin token to read the grader" in capsys.readouterr().err
