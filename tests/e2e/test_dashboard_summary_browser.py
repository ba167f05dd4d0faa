"""The dashboard's agent summary in a real headless Chromium against a grader served over HTTP with
its data in Postgres: from the experiments page to the summary, its groups with counts and best and
mean scores, a new score showing without a reload, and an agent's name shown as text."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from autorl.store import Database, experiments
from autorl_grader.main import create_app
from tests.e2e.test_dashboard_browser import at_url, browser, cells, settings, texts, wait_for
from tests.support.infra import serve
from tests.support.runs import add_submission, create_experiment, finish, scores
from tests.support.settings import DeploymentSettings

__all__ = ["browser", "settings"]  # the fixtures, shared with the dashboard's other browser test

ROW = "#summary tbody tr"


def seed(db: Database, workspace: Path, agent: str, *best: float, status: str = "completed") -> str:
    run = create_experiment(db, workspace)
    with db.session() as session:
        experiments.get_experiment(session, run.name).agent = agent
    add_submission(db, run.name, scores=scores(10.0), baseline=True)
    for minute, value in enumerate(best, start=1):
        add_submission(db, run.name, scores=scores(value), minutes=minute)
    if status:
        finish(db, run.name, status)
    return run.name


def rows(driver: Any) -> list[list[str]]:
    flat = cells(driver, ROW)
    return [flat[i : i + 12] for i in range(0, len(flat), 12)]


def test_operator_reads_the_agent_summary_live(
    browser: Any, settings: DeploymentSettings, db: Database, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By

    seed(db, tmp_path / "a", "example_grpo", 12.0, 30.0)
    seed(db, tmp_path / "b", "example_grpo", 20.0)
    running = seed(db, tmp_path / "c", "example_grpo", status="")
    seed(db, tmp_path / "d", "<img src=x onerror=window.pwned=1>\u202eagent", 45.0)
    assert settings.admin_token is not None
    with serve(create_app(settings, reconcile=False)) as grader:
        browser.get(f"{grader.url}/ui/summary")
        at_url(browser, f"{grader.url}/ui/login")
        browser.find_element(By.ID, "token").send_keys(settings.admin_token.get_secret_value())
        browser.find_element(By.ID, "sign-in").click()
        at_url(browser, f"{grader.url}/ui")
        browser.find_element(By.LINK_TEXT, "Agent summary").click()
        at_url(browser, f"{grader.url}/ui/summary")
        wait_for(browser, lambda d: len(rows(d)) == 2, "two groups")
        hostile, grpo = rows(browser)
        assert grpo == [
            "gsm8k",
            "example_grpo",
            "builtin:tiny-qwen2",
            "test",
            "3",
            "2",
            "10.00",
            "30.00",
            "25.00",
            "+20.00",
            "+15.00",
            "3",
        ]
        # The agent's name is text: markup shown as written, a direction override spelled out.
        assert hostile[1] == "<img src=x onerror=window.pwned=1>\\u202eagent" and hostile[7] == "45.00"
        assert browser.execute_script(
            "return window.pwned === undefined && !document.querySelector('main img')"
        )

        # The running experiment's first score joins the group's numbers without a reload.
        browser.execute_script("window.autorlNoReload = true")
        add_submission(db, running, scores=scores(35.0), minutes=1)
        wait_for(browser, lambda d: rows(d)[1][7:9] == ["35.00", "28.33"], "the new best and mean")
        assert browser.execute_script("return window.autorlNoReload") is True
        console = [entry["message"] for entry in browser.get_log("browser")]
        assert not [m for m in console if "Uncaught" in m or "Content Security Policy" in m], console
        assert "updated" in texts(browser, "#updated")[0]
        screenshot = tmp_path / "dashboard-summary.png"
        assert browser.save_screenshot(str(screenshot))
        print(f"dashboard screenshot: {screenshot}")
