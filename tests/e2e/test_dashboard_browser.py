"""The dashboard in a real headless Chromium (Debian's chromium + chromium-driver, driven by Selenium)
against a grader served over HTTP with its data in Postgres: sign in, read the experiments table,
open an experiment, see its chart and a new submission arrive without a reload, and an agent's
token refused on every dashboard route; filter and sort the experiments, the URL keeping both. The
screenshots are test artifacts in the test's folder under pytest's basetemp
(`<basetemp>/test_operator_signs_in_and_wat0/dashboard-*.png`; their paths are printed)."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import httpx
import pytest

from autorl.errors import EVALUATOR_FAULT_PREFIX
from autorl.protocol.statistics import wilson_interval
from autorl.store import Database, Submission, experiments
from autorl_grader.main import create_app
from tests.support.dashboard import dashboard_routes
from tests.support.infra import serve
from tests.support.runs import (
    SeededExperiment,
    add_submission,
    create_experiment,
    finish,
    scores,
    sealed_experiment,
)
from tests.support.settings import DeploymentSettings

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
#: The dashboard polls every 2 s; a change must show within a few polls.
WAIT_S = 20.0
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--window-size=1400,1600",
)
SCORE_CELLS_JS = (
    "return Array.from(document.querySelectorAll('#submissions tr[data-id]'),"
    " tr => [tr.cells[2].innerText.trim(), tr.cells[2].title, tr.cells[2].className])"
)
POINTS_JS = "return Chart.getChart(document.getElementById('chart')).data.datasets[0].data"
BASELINE_JS = "return Chart.getChart(document.getElementById('chart')).data.datasets[1].data"
#: A sealed experiment's final evaluation on test and the baseline on test, apart from the rest.
FINAL_JS = "return Chart.getChart(document.getElementById('chart')).data.datasets.slice(2).map(d => d.data)"
#: The fill each point is drawn with (resolved by Chart.js): hollow where not distinguishable.
FILLS_JS = (
    "return Chart.getChart(document.getElementById('chart')).getDatasetMeta(0).data"
    ".map(e => e.options.backgroundColor)"
)
POINT_FILL, HOLLOW_FILL = "#1f77b4", "#ffffff"


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
        pytest.fail("Debian's chromium and chromium-driver are missing: run `make setup`")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'chromium-profile'}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # to find script errors
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(tmp_path / "chromium-profile", ignore_errors=True)


@pytest.fixture
def settings(make_settings: Callable[..., DeploymentSettings], pg_url: str) -> DeploymentSettings:
    return make_settings(database_url=pg_url, baseline_unavailable_s=0.0)


@pytest.fixture
def run(db: Database, tmp_path: Path) -> SeededExperiment:
    """Baseline 10; 12 (no strict score), 30, a failure; the agent's log has a few lines. The
    baseline and 30 keep their per-problem correctness (10 problems)."""
    run = create_experiment(db, tmp_path / "workspace", started_minutes_ago=6)
    add_submission(db, run.name, scores=scores(10.0), baseline=True, correctness="1" + "0" * 9)
    add_submission(db, run.name, scores={"opencompass": 12.0, "flexible": 13.0}, minutes=1)
    add_submission(db, run.name, scores=scores(30.0, strict=28.0), minutes=3, correctness="111" + "0" * 7)
    add_submission(db, run.name, error="config.json: hidden_size differs from the base model", minutes=4)
    (run.workspace / "agent.log").write_text("phase sft: loss 1.25\nphase grpo: reward 0.40\n")
    return run


def at_url(driver: Any, url: str) -> None:
    """A click that submits a form or follows a link navigates on its own time: wait for it."""
    wait_for(driver, lambda d: d.current_url == url, f"the browser at {url}")


def wait_for(driver: Any, condition: Callable[[Any], Any], what: str) -> Any:
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, WAIT_S, poll_frequency=0.2).until(condition, message=what)


def sign_in(driver: Any, url: str, settings: DeploymentSettings) -> None:
    """Through the form, with the admin token: the browser ends on the experiments page."""
    from selenium.webdriver.common.by import By

    assert settings.admin_token is not None
    driver.get(f"{url}/ui/login")
    driver.find_element(By.ID, "token").send_keys(settings.admin_token.get_secret_value())
    driver.find_element(By.ID, "sign-in").click()
    at_url(driver, f"{url}/ui")


#: Read in one script call: the page redraws its tables every poll, so cells fetched one by one
#: through the driver can be replaced between finding them and reading them.
TEXTS_JS = "return Array.from(document.querySelectorAll(arguments[0]), e => e.innerText.trim())"


def texts(driver: Any, selector: str) -> list[str]:
    return list(driver.execute_script(TEXTS_JS, selector))


def cells(driver: Any, row_selector: str) -> list[str]:
    return texts(driver, f"{row_selector} td")


def test_operator_signs_in_and_watches_an_experiment_live(
    browser: Any, settings: DeploymentSettings, db: Database, run: SeededExperiment, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    other = create_experiment(db, tmp_path / "other-workspace", started_minutes_ago=None)
    ended = create_experiment(db, tmp_path / "ended-workspace", started_minutes_ago=2)
    finish(db, ended.name, "timed_out")
    # A baseline no evaluator takes (none runs here; the settings report it as unavailable at once).
    stuck = create_experiment(db, tmp_path / "stuck-workspace", started_minutes_ago=None)
    add_submission(db, stuck.name, baseline=True)
    with db.session() as session:  # two submits refused after their weights were read: counted
        experiments.get_experiment(session, run.name).costly_refusals = 2
    assert settings.admin_token is not None
    app = create_app(settings, reconcile=False)
    with serve(app) as grader:
        # Signing in: the dashboard sends a stranger to the form first.
        browser.get(f"{grader.url}/ui")
        assert browser.current_url == f"{grader.url}/ui/login"
        browser.find_element(By.ID, "token").send_keys(run.token)  # an agent's token does not open it
        browser.find_element(By.ID, "sign-in").click()
        wait_for(browser, lambda d: "not the admin token" in "".join(texts(d, ".error")), "the refusal")
        browser.find_element(By.ID, "token").send_keys(settings.admin_token.get_secret_value())
        browser.find_element(By.ID, "sign-in").click()
        at_url(browser, f"{grader.url}/ui")
        assert not any(c["name"].endswith("session") and not c["httpOnly"] for c in browser.get_cookies())

        # The experiments table.
        row = f'tr[data-name="{run.name}"]'
        wait_for(browser, lambda d: len(cells(d, row)) == 12, "the experiment's row")
        name, phase, task, model, agent, baseline, best, improvement, subs, left, queue, waits = cells(
            browser, row
        )
        assert (name, phase, task, model, agent) == (
            run.name,
            "running",
            "gsm8k",
            "builtin:tiny-qwen2",
            "example_grpo",
        )
        assert (baseline, best, improvement, subs) == ("10.00", "30.00", "+20.00", "2/3, 1 failed, 2 refused")
        assert left.startswith("5") and queue == "–" and waits == "–"  # about 54 minutes of the hour left
        assert cells(browser, f'tr[data-name="{other.name}"]')[1::8] == ["pending", "not started"]
        assert cells(browser, f'tr[data-name="{ended.name}"]')[1::8] == ["timed_out", "ended"]
        # Each experiment's wait reason, as kubectl and autorl run name it, with what to do on hover.
        stuck_row = f'tr[data-name="{stuck.name}"]'
        assert cells(browser, stuck_row)[1:2] + cells(browser, stuck_row)[10:] == [
            "baseline",
            "1 queued (next #1)",
            "EvaluatorsUnavailable",
        ]
        (hint,) = browser.execute_script(
            f"return [document.querySelector('{stuck_row} td:last-child').title]"
        )
        assert "the base model waits for an evaluator (queue position 1" in hint
        assert "no evaluator takes hf work" in hint and "autorl worker" in hint
        assert browser.save_screenshot(str(tmp_path / "dashboard-experiments.png"))

        # One experiment: the chart has one point per scored submission, the best marked.
        # Polls leave unchanged rows in place: a link found before two refreshes is still the link.
        link = browser.find_element(By.LINK_TEXT, run.name)
        polls = browser.execute_script("return window.autorlPolls")
        wait_for(browser, lambda d: d.execute_script("return window.autorlPolls") >= polls + 2, "two polls")
        link.click()
        at_url(browser, f"{grader.url}/ui/experiments/{run.name}")
        wait_for(browser, lambda d: len(d.execute_script(POINTS_JS)) == 2, "two points on the chart")
        points = browser.execute_script(POINTS_JS)
        assert [p["y"] for p in points] == [12.0, 30.0] and [p["best"] for p in points] == [False, True]
        # Each point's 95 % interval drawn as a bar; 30 (2 gains, no loss on 10 problems) cannot be
        # told from the baseline: its point is hollow, and the legend says what that means.
        assert [points[1]["low"], points[1]["high"]] == pytest.approx(list(wilson_interval(3, 10)))
        assert [p["distinguishable"] for p in points] == [None, False]
        assert browser.execute_script(FILLS_JS) == [POINT_FILL, HOLLOW_FILL]
        assert "Hollow points: not distinguishable" in "".join(texts(browser, "#chart-legend"))
        assert not browser.find_element(By.ID, "chart-sealed").is_displayed()
        assert {p["y"] for p in browser.execute_script(BASELINE_JS)} == {10.0}
        Select(browser.find_element(By.ID, "protocol")).select_by_value("strict")
        assert [p["y"] for p in browser.execute_script(POINTS_JS)] == [28.0]  # #1 has no strict score
        Select(browser.find_element(By.ID, "protocol")).select_by_value("opencompass")
        wait_for(browser, lambda d: "grpo: reward 0.40" in "".join(texts(d, "#log")), "the log tail")
        ids = browser.execute_script(
            "return Array.from(document.querySelectorAll('#submissions tr[data-id]'), tr => tr.dataset.id)"
        )
        assert len(ids) == 4  # the baseline and three submissions
        assert [e for e in texts(browser, "#submissions td.error") if e] == [
            "config.json: hidden_size differs from the base model"
        ]
        # A score's tooltip: its 95 % interval and, but for the baseline, its paired comparison;
        # a gain the interval cannot tell from 0 is marked as such.
        score_cells = {text: (title, kind) for text, title, kind in browser.execute_script(SCORE_CELLS_JS)}
        low, high = wilson_interval(3, 10)
        title, kind = score_cells["30.00"]
        assert title.startswith(f"95 % interval {low:.2f}–{high:.2f}\nvs baseline +20.00 points")
        assert "discordant 2/0" in title and title.endswith("not distinguishable from the baseline")
        assert "indistinct" in kind
        assert score_cells["10.00"][0] == "95 % interval {:.2f}–{:.2f}".format(*wilson_interval(1, 10))

        # A new submission is queued, then scored: the page follows without a reload.
        browser.execute_script("window.autorlNoReload = true")
        queued = add_submission(db, run.name, minutes=5)
        wait_for(
            browser, lambda d: cells(d, f'#submissions tr[data-id="{queued}"]')[1:2] == ["queued"], "queued"
        )
        new = add_submission(db, run.name, scores=scores(41.5), minutes=5.5)
        wait_for(browser, lambda d: len(d.execute_script(POINTS_JS)) == 3, "the new point on the chart")
        assert [p["y"] for p in browser.execute_script(POINTS_JS) if p["best"]] == [41.5]
        assert cells(browser, f'#submissions tr[data-id="{new}"]')[1:3] == ["scored", "41.50"]
        # A failure of the evaluator's own is shown, but not counted against the agent's limit: six
        # submissions of which five count, and the two submits refused after their weights were read.
        add_submission(db, run.name, error=f"{EVALUATOR_FAULT_PREFIX}: the engine died", minutes=5.6)
        wait_for(browser, lambda d: "3/6, 2 failed" in "\n".join(texts(d, "#summary div")), "the failure")
        summary = "\n".join(texts(browser, "#summary div"))
        assert "submissions (scored/all)\n3/6, 2 failed, 2 refused\nlimit used\n7 of 100" in summary
        assert browser.execute_script("return window.autorlNoReload") is True
        # No script error and nothing the Content-Security-Policy had to block on either page.
        console = [entry["message"] for entry in browser.get_log("browser")]
        assert not [m for m in console if "Uncaught" in m or "Content Security Policy" in m], console
        screenshot = tmp_path / "dashboard-experiment.png"
        assert browser.save_screenshot(str(screenshot))
        print(f"dashboard screenshots: {tmp_path / 'dashboard-experiments.png'} {screenshot}")

        # A sealed experiment: its points and baseline on validation, its final on test apart.
        sealed = sealed_experiment(db, tmp_path / "sealed-workspace")
        browser.get(f"{grader.url}/ui/experiments/{sealed.run.name}")
        wait_for(browser, lambda d: d.execute_script(FINAL_JS)[0], "the final on the chart")
        assert [p["y"] for p in browser.execute_script(POINTS_JS)] == [30.0, 60.0]
        assert {p["y"] for p in browser.execute_script(BASELINE_JS)} == {20.0}
        ((final,), test_baseline) = browser.execute_script(FINAL_JS)
        assert (final["y"], final["of"]) == (50.0, sealed.nominated) and {p["y"] for p in test_baseline} == {
            10.0
        }
        assert [final["low"], final["high"]] == pytest.approx(list(wilson_interval(5, 10)))
        assert browser.find_element(By.ID, "chart-sealed").is_displayed()
        low, high = wilson_interval(5, 10)
        assert f"final (test)\n50.00 [{low:.2f}–{high:.2f}] (of #{sealed.nominated}, nominated)" in "\n".join(
            texts(browser, "#summary div")
        )
        # What the agent brought in, flagged; the lineage (an operator's path or hub id) as text.
        with db.session() as session:
            row = experiments.get_experiment(session, sealed.run.name)
            row.test_overlap, row.twin_score, row.twin_p_value = 3, 12.5, 0.004
            nominated = session.get(Submission, sealed.nominated)
            assert nominated is not None
            nominated.details = {"lineage": {"nearest": "<b>hub/instruct</b>", "distances": {"base": 0.1}}}
        wait_for(browser, lambda d: "test overlap" in "\n".join(texts(d, "#summary div")), "the findings")
        summary = "\n".join(texts(browser, "#summary div"))
        assert "test overlap\n3 ⚠ test problems in the agent's files" in summary
        assert "twin split\n12.50 (p=0.00400) ⚠ learned by heart?" in summary
        assert "lineage\n⚠ nearer <b>hub/instruct</b> than the base" in summary
        # A check that could not be made whole: unverified with its reason, never a clean 0.
        with db.session() as session:
            row = experiments.get_experiment(session, sealed.run.name)
            row.test_overlap, row.twin_score, row.twin_p_value = None, None, None
            row.message = (
                "done; test questions unverified: the copy stopped early (its 20-second time budget ran out)"
                "; twin split unverified: the final's folder no longer holds the files that were scored"
            )
        wait_for(
            browser, lambda d: "unverified" in "\n".join(texts(d, "#summary div")), "the unverified checks"
        )
        summary = "\n".join(texts(browser, "#summary div"))
        assert (
            "test overlap\n⚠ unverified: the copy stopped early (its 20-second time budget ran out)"
            in summary
        )
        assert (
            "twin split\n⚠ unverified: the final's folder no longer holds the files that were scored"
            in summary
        )
        sealed_screenshot = tmp_path / "dashboard-sealed.png"
        assert browser.save_screenshot(str(sealed_screenshot))
        print(f"dashboard screenshot of a sealed experiment: {sealed_screenshot}")

        # The agent's capability URL leads to no dashboard, and its bearer token is refused.
        browser.get(f"{grader.url}/a/{run.token}/ui")
        assert "Experiments" not in browser.page_source and "Not Found" in browser.page_source
        routes = dashboard_routes(app)  # every route the app serves under /ui, as enumerated there
        assert {("GET", "/ui"), ("GET", "/ui/api/experiments")} <= set(routes)
        for method, path in routes:
            refused = httpx.request(
                method, f"{grader.url}{path}", headers={"Authorization": f"Bearer {run.token}"}
            )
            assert refused.status_code == 403, (method, path, refused.status_code)

        # Signing out ends the session.
        browser.get(f"{grader.url}/ui")
        browser.find_element(By.CSS_SELECTOR, "header form button").click()
        at_url(browser, f"{grader.url}/ui/login")
        browser.get(f"{grader.url}/ui/api/experiments")
        assert "not signed in" in browser.page_source


#: Where each character of the submissions' path cell that reads ``arguments[0]`` starts, left to right.
CHARACTER_LEFTS_JS = """
const cells = [...document.querySelectorAll('#submissions td.path')];
const cell = cells.find(td => td.textContent === arguments[0]);
const text = cell.firstChild, lefts = [];
for (let i = 0; i < text.length; i++) {
  const range = document.createRange();
  range.setStart(text, i);
  range.setEnd(text, i + 1);
  lefts.push(range.getBoundingClientRect().left);
}
return lefts;
"""


def test_agent_strings_show_as_text_with_hidden_characters_escaped(
    browser: Any, settings: DeploymentSettings, db: Database, tmp_path: Path
) -> None:
    run = create_experiment(db, tmp_path / "workspace")
    folder = "<img src=x onerror=window.pwned=1>[/bold]\x1b[2J\u202egnp.exe"
    add_submission(db, run.name, error="<b>loud</b>\r\nsubmission 99 score=100.00", folder=folder)
    add_submission(db, run.name, folder="\u05d0/1/2/3")  # a right-to-left letter before digits and slashes
    (run.workspace / "agent.log").write_text("<script>window.pwned=2</script>\n\x1b[31mred\u200b\x1b[0m\n")
    with serve(create_app(settings, reconcile=False)) as grader:
        sign_in(browser, grader.url, settings)
        browser.get(f"{grader.url}/ui/experiments/{run.name}")
        wait_for(browser, lambda d: "red" in "".join(texts(d, "#log")), "the log tail")
        path, error = texts(browser, "#submissions td.path")[0], texts(browser, "#submissions td.error")[0]
        log = texts(browser, "#log")[0]
        # Markup is shown as written; what would not show as itself is spelled out.
        assert path == "output/<img src=x onerror=window.pwned=1>[/bold]\\x1b[2J\\u202egnp.exe"
        assert error == "<b>loud</b>\\r\\nsubmission 99 score=100.00"
        assert log.splitlines() == ["<script>window.pwned=2</script>", "\\x1b[31mred\\u200b\\x1b[0m"]
        assert browser.execute_script(
            "return window.pwned === undefined && !document.querySelector('main img, main b')"
        )
        # Each character of a path stands left of the next, as the path is stored.
        lefts = browser.execute_script(CHARACTER_LEFTS_JS, "output/\u05d0/1/2/3")
        assert len(lefts) == len("output/\u05d0/1/2/3") and lefts == sorted(set(lefts)), lefts


SORTED_JS = (
    "return Array.from(document.querySelectorAll('#experiments th[aria-sort]'),"
    " th => [th.dataset.sort, th.getAttribute('aria-sort')])"
)
ROW_NAMES_JS = "return Array.from(document.querySelectorAll('#experiments tbody tr'), tr => tr.dataset.name)"


def row_names(driver: Any) -> list[str]:
    return list(driver.execute_script(ROW_NAMES_JS))


def query(driver: Any) -> dict[str, list[str]]:
    return parse_qs(urlsplit(driver.current_url).query)


def test_operator_filters_and_sorts_experiments_and_the_url_keeps_them(
    browser: Any, settings: DeploymentSettings, db: Database, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    agent, other_agent = f"agent-{uuid.uuid4().hex[:6]}", f"agent-{uuid.uuid4().hex[:6]}"

    def seeded(folder: str, who: str, best: float | None, **fields: str) -> str:
        run = create_experiment(db, tmp_path / folder)
        add_submission(db, run.name, scores=scores(10.0), baseline=True)
        if best is not None:
            add_submission(db, run.name, scores=scores(best), minutes=1)
        with db.session() as session:
            experiment = experiments.get_experiment(session, run.name)
            experiment.agent = who
            for field, value in fields.items():
                setattr(experiment, field, value)
        return run.name

    done = seeded("done", agent, 30.0)
    finish(db, done, "completed")
    arith = seeded("arith", agent, 12.0, task="arith")
    unscored = seeded("unscored", agent, None, model="Qwen/Qwen2.5-1.5B")
    seeded("other", other_agent, 45.0)
    sealed = sealed_experiment(db, tmp_path / "sealed").run.name  # 60 on validation
    with db.session() as session:
        experiments.get_experiment(session, sealed).agent = agent
    with serve(create_app(settings, reconcile=False)) as grader:
        sign_in(browser, grader.url, settings)

        # A shared link: one agent's experiments, the best first, the unscored one last.
        browser.get(f"{grader.url}/ui?agent={agent}&sort=best&order=desc")
        wait_for(browser, lambda d: row_names(d) == [sealed, done, arith, unscored], "sorted by best")
        assert Select(browser.find_element(By.NAME, "agent")).first_selected_option.text == agent
        assert browser.execute_script(SORTED_JS) == [["best", "descending"]]

        def choose(name: str, value: str, rows: list[str]) -> None:
            Select(browser.find_element(By.NAME, name)).select_by_value(value)
            wait_for(browser, lambda d: row_names(d) == rows, f"{name}={value!r}: {rows}")

        choose("task", "gsm8k", [sealed, done, unscored])
        choose("model", "builtin:tiny-qwen2", [sealed, done])
        choose("feedback", "sealed", [sealed])
        choose("feedback", "", [sealed, done])
        choose("phase", "completed", [done])
        choose("phase", "", [sealed, done])
        browser.find_element(By.CSS_SELECTOR, "th[data-sort=best] button").click()  # again: ascending
        wait_for(browser, lambda d: row_names(d) == [done, sealed], "ascending")
        expected = {
            "agent": [agent],
            "task": ["gsm8k"],
            "model": ["builtin:tiny-qwen2"],
            "sort": ["best"],
            "order": ["asc"],
        }
        assert query(browser) == expected
        assert texts(browser, "#shown")[0].startswith("2 of ")  # of all the grader's experiments

        screenshot = tmp_path / "dashboard-filtered.png"
        assert browser.save_screenshot(str(screenshot))
        print(f"dashboard screenshot, filtered and sorted: {screenshot}")

        # A reload keeps the filters and the sort.
        browser.refresh()
        wait_for(browser, lambda d: row_names(d) == [done, sealed], "the same rows after a reload")
        assert query(browser) == expected
        chosen = {
            name: Select(browser.find_element(By.NAME, name)).first_selected_option.text
            for name in ("task", "agent", "model", "phase", "feedback")
        }
        assert chosen == {
            "task": "gsm8k",
            "agent": agent,
            "model": "builtin:tiny-qwen2",
            "phase": "all",
            "feedback": "all",
        }

        # A hostile link: its values are data, shown as text and matching nothing; no markup runs.
        hostile = "<img src=x onerror=window.pwned=1>"
        browser.get(f"{grader.url}/ui?{urlencode({'agent': hostile, 'sort': '<script>'})}")
        wait_for(browser, lambda d: d.execute_script("return window.autorlPolls"), "a poll")
        assert row_names(browser) == []
        assert Select(browser.find_element(By.NAME, "agent")).first_selected_option.text == hostile
        assert texts(browser, "#empty") == ["No experiment matches these filters."]
        assert browser.execute_script(SORTED_JS) == []  # an unknown column sorts nothing
        assert browser.execute_script(
            "return window.pwned === undefined && !document.querySelector('main img')"
        )
        console = [entry["message"] for entry in browser.get_log("browser")]
        assert not [m for m in console if "Uncaught" in m or "Content Security Policy" in m], console
