"""Run reports from the single-machine store (SQLite, as `autorl run` keeps it): the reference's
metrics with their values worked out by hand, the score-trajectory PNG read back pixel by pixel, and
`autorl report` regenerating both."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autorl.cli import main
from autorl.protocol.statistics import wilson_interval
from autorl.runs.reports import BEST_COLOR, FAILED_COLOR, POINT_COLOR, report_run
from autorl.runs.seeds import RunSeed, write_run_seed
from autorl.settings import HomeSettings
from autorl.store import Database, migrate
from tests.support.png import color_blobs
from tests.support.runs import add_submission, create_experiment, finish, scores, sealed_experiment


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


@pytest.fixture
def db(home: Path) -> Database:
    home.mkdir()
    database = Database(f"sqlite:///{home / 'autorl.db'}")
    migrate(database)
    return database


@pytest.fixture
def run_id(db: Database, tmp_path: Path) -> str:
    """Baseline 10; then 12, a failure, a copy of the base model (reuses 10), 30 (best), 20. The
    baseline and the best keep their per-problem correctness (10 problems)."""
    run = create_experiment(db, tmp_path / "workspace", started_minutes_ago=10)
    add_submission(
        db, run.name, scores=scores(10.0), files="base-model", baseline=True, correctness="1" + "0" * 9
    )
    add_submission(db, run.name, scores=scores(12.0), minutes=1)
    add_submission(db, run.name, error="config.json: not the base architecture", minutes=2)
    add_submission(db, run.name, files="base-model", minutes=3)
    add_submission(db, run.name, scores=scores(30.0, strict=25.0), minutes=5, correctness="111" + "0" * 7)
    add_submission(db, run.name, scores=scores(20.0), minutes=6)
    finish(db, run.name)
    return run.name


def test_metrics_follow_the_reference_names_and_definitions(home: Path, run_id: str) -> None:
    report = report_run(HomeSettings(home=home), run_id, now=0.0)
    metrics = json.loads(report.metrics_path.read_text())
    assert report.metrics_path == home / "runs" / run_id / "reports" / "metrics.json"
    assert metrics["score_trajectory"] == [12.0, None, 10.0, 30.0, 20.0]
    assert metrics["valid_submission_rate"] == 0.8  # 4 of 5 evaluations scored
    assert metrics["first_valid_idx"] == 1
    assert metrics["first_valid_delay"] == pytest.approx(60, abs=1)
    assert metrics["time_to_first_improvement"] == pytest.approx(60, abs=1)
    assert metrics["time_to_best"] == pytest.approx(300, abs=1)
    assert metrics["monotonic_ratio"] == pytest.approx(1 / 3, abs=1e-3)  # 12→10 no, 10→30 yes, 30→20 no
    assert metrics["copy_model_count"] == 1
    # Finished about 10 minutes into a one-hour budget; the last submission was 4 minutes before that.
    assert metrics["time_used_ratio"] == pytest.approx(600 / 3600, abs=0.01)
    assert metrics["last_submit_gap"] == pytest.approx(240, abs=30)
    assert (metrics["baseline"], metrics["best_score"], metrics["improvement"]) == (10.0, 30.0, 20.0)
    assert metrics["status"] == "completed" and metrics["total_submissions"] == 5
    # The best score's 95 % interval and its paired comparison with the baseline (2 gains, no loss).
    assert metrics["best_interval"] == pytest.approx(list(wilson_interval(3, 10)))
    assert metrics["best_discordant"] == [2, 0] and metrics["best_p_value"] == 0.5
    assert metrics["best_difference_interval"][0] < 0 < metrics["best_difference_interval"][1]
    assert metrics["best_distinguishable"] is False
    # Its result on test, as results.csv's columns hold it: a test run's is its best.
    assert metrics["feedback"] == "test" and metrics["selection"] == "best_on_test"
    assert (metrics["final_score"], metrics["final_p_value"]) == (30.0, 0.5)
    assert [metrics["final_low"], metrics["final_high"]] == pytest.approx(list(wilson_interval(3, 10)))
    assert metrics["test_evaluations"] == 4  # the copy of the base model reused the baseline's score


def test_a_sealed_runs_report_carries_its_final_evaluation_on_test(
    home: Path, db: Database, tmp_path: Path
) -> None:
    sealed = sealed_experiment(db, tmp_path / "ws-sealed")
    finish(db, sealed.run.name)
    metrics = report_run(HomeSettings(home=home), sealed.run.name, now=0.0).metrics
    # The agent's submissions on validation, against the baseline there; the final is not one.
    assert (metrics["baseline"], metrics["best_score"], metrics["improvement"]) == (20.0, 60.0, 40.0)
    assert metrics["best_submission"] == sealed.best and metrics["score_trajectory"] == [30.0, 60.0]
    # The final evaluation of the nominated submission on test, against the baseline on test
    # (50 % against 10 %: 4 gains, no loss, exact McNemar p = 2 / 2**4), under results.csv's names.
    low, high = wilson_interval(5, 10)
    assert {k: metrics[k] for k in ("feedback", "final_score", "final_p_value", "selection")} == {
        "feedback": "sealed",
        "final_score": 50.0,
        "final_p_value": 0.125,
        "selection": "nominated",
    }
    assert [metrics["final_low"], metrics["final_high"]] == pytest.approx([low, high])
    assert metrics["test_evaluations"] == 1


def test_trajectory_png_shows_each_scored_submission_where_its_score_is(home: Path, run_id: str) -> None:
    png = report_run(HomeSettings(home=home), run_id, now=0.0).plot_path
    assert png == home / "runs" / run_id / "reports" / "figures" / "score_trajectory.png"
    # Circles for 12 (#1), 10 (#3) and 20 (#5), then the legend's circle, right of the axes.
    *points, legend = color_blobs(png, POINT_COLOR)
    assert len(points) == 3, points
    first, third, fifth = points
    assert fifth.y < first.y < third.y  # higher scores are drawn higher up
    assert abs((third.x - first.x) - (fifth.x - third.x)) < 3  # evenly spaced submission numbers
    assert legend.x > fifth.x + 20
    # The best (30, #4) is a star between #3 and #5, above every other point.
    star, legend_star = color_blobs(png, BEST_COLOR)
    assert third.x < star.x < fifth.x and star.y < fifth.y
    assert legend_star.x > fifth.x + 20
    # The failed #2 is a cross on the axis between #1 and #3.
    crosses = [b for b in color_blobs(png, FAILED_COLOR, min_pixels=3) if first.x < b.x < third.x]
    assert crosses and all(c.y > third.y for c in crosses)


def test_autorl_report_regenerates_both(home: Path, run_id: str, capsys: pytest.CaptureFixture[str]) -> None:
    reports = home / "runs" / run_id / "reports"
    assert main(["report", run_id, "--home", str(home)]) == 0
    out = capsys.readouterr().out
    assert str(reports / "metrics.json") in out and "seed:" not in out  # no seed recorded
    assert json.loads((reports / "metrics.json").read_text())["seed"] is None
    # One of several repeats (autorl run --repeat 3): the report names its seed.
    write_run_seed(home / "runs" / run_id, RunSeed(1, repeat=2, repeats=3))
    assert main(["report", run_id, "--home", str(home)]) == 0
    assert "seed:    1 (repeat 2 of 3)" in capsys.readouterr().out
    metrics = json.loads((reports / "metrics.json").read_text())
    assert (metrics["seed"], metrics["repeat"], metrics["repeats"]) == (1, 2, 3)
    (reports / "metrics.json").unlink()
    (reports / "figures" / "score_trajectory.png").unlink()
    assert main(["report", str(home / "runs" / run_id), "--home", str(home), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads((reports / "metrics.json").read_text())
    assert (reports / "figures" / "score_trajectory.png").stat().st_size > 0


def test_a_report_is_written_whole_or_not_at_all(
    home: Path, run_id: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    reports = home / "runs" / run_id / "reports"
    reports.mkdir(parents=True)
    (reports / "figures").write_text("a file where the figures folder goes\n")
    assert main(["report", run_id, "--home", str(home)]) == 2
    error = capsys.readouterr().err
    assert f"error: cannot make the report folder {reports / 'figures'} (" in error
    assert f"move aside what is in its place (a file of that name) and run `autorl report {run_id}`" in error
    assert "Traceback" not in error and sorted(p.name for p in reports.iterdir()) == ["figures"]
    # A plot that fails once the folders are there leaves the last report as it was.
    (reports / "figures").unlink()
    assert main(["report", run_id, "--home", str(home)]) == 0
    capsys.readouterr()
    before = {p: p.read_bytes() for p in reports.rglob("*") if p.is_file()}
    (reports / "metrics.json").write_text("{}\n")  # a stale report, to be kept whole
    before[reports / "metrics.json"] = b"{}\n"

    def fail(run: object, target: Path, seed: object = None) -> Path:
        target.write_bytes(b"half a png")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("autorl.runs.reports.plot_trajectory", fail)
    assert main(["report", run_id, "--home", str(home)]) == 1
    assert (
        f"cannot write the report in {reports}: [Errno 28] No space left on device" in capsys.readouterr().err
    )
    assert {p: p.read_bytes() for p in reports.rglob("*") if p.is_file()} == before


def test_report_of_an_unknown_run_names_the_fix(
    home: Path, db: Database, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", "20261130-000000-gsm8k-abcdef", "--home", str(home)]) == 2
    assert "autorl results" in capsys.readouterr().err


def test_run_without_submissions_has_empty_metrics_and_a_plot(
    home: Path, db: Database, tmp_path: Path
) -> None:
    run = create_experiment(db, tmp_path / "ws-empty", started_minutes_ago=1)
    finish(db, run.name, "timed_out")
    report = report_run(HomeSettings(home=home), run.name, now=0.0)
    metrics = report.metrics
    assert metrics["score_trajectory"] == [] and metrics["valid_submission_rate"] is None
    assert metrics["first_valid_idx"] is None and metrics["time_to_best"] is None
    assert metrics["copy_model_count"] is None  # no baseline to compare with
    assert report.plot_path.stat().st_size > 0


def test_report_takes_a_unique_prefix_and_prints_the_runs_summary(
    home: Path, run_id: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", run_id[:8], "--home", str(home)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[:5] == [
        f"run          {run_id}, completed",
        "task         gsm8k, base model builtin:tiny-qwen2, agent example_grpo",
        "baseline     10.00",
        "best score   30.00",
        "improvement  +20.00",
    ]
    assert "submissions  5, 4 scored, 1 copy of the base model" in lines
    assert "final        30.00 [10.78, 60.32] (best_on_test, McNemar p=0.5)" in lines
    assert lines[-2:] == [
        f"metrics: {home / 'runs' / run_id / 'reports' / 'metrics.json'}",
        f"plot:    {home / 'runs' / run_id / 'reports' / 'figures' / 'score_trajectory.png'}",
    ]


def test_an_ambiguous_report_prefix_is_refused_as_compare_refuses_it(
    home: Path, db: Database, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    names = [create_experiment(db, tmp_path / f"ws-{i}").name for i in range(7)]
    assert main(["report", "exp-", "--home", str(home)]) == 2
    error = capsys.readouterr().err
    assert f"'exp-' matches 7 runs ({', '.join(names[:5])} and 2 more); give more of the id" in error
    assert main(["report", "nope", "--home", str(home)]) == 2
    assert "no run 'nope' in the database of" in capsys.readouterr().err
