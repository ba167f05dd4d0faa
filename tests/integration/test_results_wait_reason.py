"""A run that ends while its baseline waits for an evaluator says what it waited for: `autorl run`
records the wait reason and what to do as the run's end (in the grader's store), and `autorl results`
shows it beside the row, as text. Real processes: `autorl grader` (no worker runs), Postgres."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from autorl.api.admin_client import AdminClient
from autorl.cli import main
from autorl.runs.results import append_row
from autorl_local.experiment import baseline_not_scored
from tests.support.grading import admin_headers, make_workspace, register
from tests.support.result_rows import unscored_row
from tests.support.service_processes import serving_grader
from tests.support.settings import DeploymentSettings


def note_column(table: str, run_id: str) -> str:
    """The last cell of ``run_id``'s row in a printed table, its wrapped lines joined."""
    lines = table.splitlines()
    start = next(i for i, line in enumerate(lines) if run_id[:12] in line)
    cells = []
    for line in lines[start:]:
        if not line.startswith("│"):
            break
        cells.append(line.split("│")[-2].strip())
    return " ".join(cell for cell in cells if cell)


def test_a_run_that_ends_while_its_baseline_waits_shows_the_reason_in_results(
    make_settings: Callable[..., DeploymentSettings],
    fresh_pg_url: str,
    tiny_base_model: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # A database of its own: no evaluator reports itself there; unavailable as soon as it waits.
    settings = make_settings(database_url=fresh_pg_url, baseline_unavailable_s=0.0)
    with serving_grader(settings, tmp_path / "grader.log") as (_, client):
        experiment = register(client, settings, tiny_base_model, make_workspace(tmp_path), start=False)
        hostile = register(client, settings, tiny_base_model, make_workspace(tmp_path), start=False)
        with AdminClient(str(client.base_url), settings.admin_token_value) as admin:
            waited = admin.wait_for_baseline(experiment.name, max_wait_s=0.5, poll_s=0.1)
            assert waited.baseline_status == "queued"
            message = baseline_not_scored(waited, tmp_path / "logs")
            assert message.startswith(
                "the baseline evaluation queued: EvaluatorsUnavailable: the base model waits for an "
                "evaluator (queue position 1"
            ), message
            assert "no evaluator takes hf work" in message and "autorl worker" in message
            admin.finish(experiment.name, "failed", message)
            path = f"/v1/experiments/{hostile.name}/finish"
            forged = {"status": "failed", "message": "[bold]x\x1b]0;title\x07\nsubmission 9 score=100"}
            assert client.post(path, json=forged, headers=admin_headers(settings)).status_code == 200

    home = tmp_path / "home"
    for name in (experiment.name, hostile.name):
        append_row(
            unscored_row(
                name,
                "failed",
                timestamp="2026-12-04T03:00:00+00:00",
                task="gsm8k",
                duration_s=12.0,
                workspace=str(tmp_path / "ws"),
            ),
            home,
        )
    monkeypatch.setenv("AUTORL_DATABASE_URL", fresh_pg_url)
    assert main(["results", "--home", str(home), "--wide"]) == 0
    table = capsys.readouterr().out
    note = note_column(table, experiment.name)
    assert note.startswith("the baseline evaluation queued: EvaluatorsUnavailable: the base model waits")
    assert "start an evaluator" in note
    assert "[bold]x\\x1b]0;title\\x07\\nsubmission 9 score=100" in note_column(table, hostile.name)
    assert "\x1b" not in table
