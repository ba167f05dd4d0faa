"""Repeats: the statistics across seeds against scipy on fixed data (the standard error of the mean,
the paired t-test with its interval, Student's t itself), the runs grouped and paired by seed, and
`autorl results --compare` showing both as a table and in its JSON."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import pytest
from scipy import stats

from autorl.cli import main
from autorl.protocol.statistics import (
    paired_t_test,
    standard_error,
    student_t_quantile,
    student_t_two_sided_p,
)
from autorl.runs.repeats import group_runs, paired_comparison
from autorl.runs.results import ResultRow, append_row
from autorl.runs.seeds import RunSeed, read_run_seed, write_run_seed
from tests.support.result_rows import result_row

# Fixed scores of two agents on the same seeds: ordinary, one seed, identical, a constant shift.
PAIRED_CASES = [
    ([50.0, 52.5, 48.0, 55.0], [53.0, 52.0, 51.5, 60.0]),
    ([61.2, 63.9, 60.4], [64.0, 62.1, 66.3]),
    ([12.0, 14.0], [13.5, 12.5]),
    ([40.0, 41.0, 42.0], [41.5, 42.5, 43.5]),  # every difference +1.5: t infinite, p 0
]


def scipy_quietly(function, *args):  # type: ignore[no-untyped-def]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scipy warns where a statistic is undefined (nan)
        return function(*args)


@pytest.mark.parametrize(
    "values", [[3.0], [2.0, 2.0, 2.0], [50.0, 52.5], [61.2, 63.9, 60.4, 58.0, 66.1], [0.0, 100.0]]
)
def test_standard_error_equals_scipy(values: list[float]) -> None:
    expected = float(scipy_quietly(stats.sem, values))
    got = standard_error(values)
    if math.isnan(expected):  # one value: undefined
        assert got is None
    else:
        assert got == pytest.approx(expected, rel=1e-12, abs=1e-12)
    assert standard_error([2.0, 2.0, 2.0]) == 0.0


@pytest.mark.parametrize("df", [1, 2, 3, 4, 9, 29, 200])
def test_student_t_equals_scipy(df: int) -> None:
    assert student_t_quantile(0.975, df) == pytest.approx(stats.t.ppf(0.975, df), rel=1e-10)
    for t in (0.0, 0.3, 1.96, 4.0, 25.0):
        assert student_t_two_sided_p(t, df) == pytest.approx(2 * stats.t.sf(t, df), rel=1e-9, abs=1e-300)
    assert student_t_two_sided_p(math.inf, df) == 0.0


@pytest.mark.parametrize(("first", "second"), PAIRED_CASES)
def test_paired_t_test_equals_scipy_ttest_rel(first: list[float], second: list[float]) -> None:
    expected = scipy_quietly(stats.ttest_rel, second, first)
    low, high = expected.confidence_interval(0.95)
    test = paired_t_test(first, second)
    assert test.n == len(first) and test.mean_difference == pytest.approx(
        sum(second) / len(second) - sum(first) / len(first)
    )
    assert test.interval == pytest.approx((low, high), rel=1e-9)
    assert test.p_value == pytest.approx(float(expected.pvalue), rel=1e-9, abs=1e-300)
    if math.isinf(expected.statistic):
        assert test.statistic is None and test.p_value == 0.0
    else:
        assert test.statistic == pytest.approx(float(expected.statistic), rel=1e-9)


def test_paired_t_test_of_identical_scores_and_of_one_seed_has_no_p_value() -> None:
    same = scipy_quietly(stats.ttest_rel, [40.0, 41.0], [40.0, 41.0])
    assert math.isnan(same.pvalue) and math.isnan(same.statistic)
    test = paired_t_test([40.0, 41.0], [40.0, 41.0])
    assert (test.mean_difference, test.interval, test.statistic, test.p_value) == (
        0.0,
        (0.0, 0.0),
        None,
        None,
    )
    one = scipy_quietly(stats.ttest_rel, [41.0], [40.0])
    assert math.isnan(one.pvalue)
    test = paired_t_test([40.0], [41.0])
    assert (test.n, test.mean_difference, test.interval, test.p_value) == (1, 1.0, None, None)
    with pytest.raises(ValueError, match="equally long"):
        paired_t_test([1.0], [1.0, 2.0])


def row(run_id: str, agent: str, best: float | None, **overrides: object) -> ResultRow:
    values: dict[str, object] = {
        "timestamp": "2026-12-04T08:00:00+00:00",
        "agent": agent,
        "baseline": 10.0,
        "best_score": best,
        "improvement": None if best is None else best - 10.0,
        "submissions": 1,
        "duration_s": 300.0,
        "success": best is not None,
    }
    return result_row(run_id, **{**values, **overrides})


def test_seed_file_round_trip_and_unreadable(tmp_path: Path) -> None:
    write_run_seed(tmp_path / "runs" / "r1", RunSeed(1, repeat=2, repeats=5))
    assert read_run_seed(tmp_path, "r1") == RunSeed(1, 2, 5)
    assert RunSeed(1, 2, 5).describe() == "seed 1 (repeat 2 of 5)" and RunSeed(0).describe() == "seed 0"
    assert read_run_seed(tmp_path, "missing") is None
    (tmp_path / "runs" / "r1" / "seed.json").write_text("[1]")
    assert read_run_seed(tmp_path, "r1") is None


def test_runs_are_grouped_and_paired_by_seed() -> None:
    rows = [
        row("a0", "grpo", 50.0),
        row("a1", "grpo", 52.5),
        row("a2", "grpo", 48.0),
        row("a3", "grpo", None),  # no score: counted in runs, not in the means
        row("a4", "grpo", 99.0, status="interrupted"),  # cut short: not a repeat of the others
        row("b0", "sft", 53.0),
        row("b1", "sft", 52.0),
        row("b2", "sft", 51.5),
    ]
    seeds = {r.run_id: RunSeed(int(r.run_id[1])) for r in rows}
    groups = group_runs(rows, seeds, {})
    assert [(g.agent, len(g.runs), len(g.counted)) for g in groups] == [("grpo", 5, 3), ("sft", 3, 3)]
    grpo = groups[0]
    assert grpo.final_score.mean == pytest.approx(50.166666666666664)
    assert grpo.final_score.sem == pytest.approx(float(stats.sem([50.0, 52.5, 48.0])))
    assert grpo.improvement.mean == pytest.approx(40.166666666666664)
    assert grpo.improvement.sem == pytest.approx(float(stats.sem([40.0, 42.5, 38.0])))
    paired = paired_comparison(groups)
    assert paired is not None and paired.seeds == (0, 1, 2) and paired.testable
    expected = stats.ttest_rel([53.0, 52.0, 51.5], [50.0, 52.5, 48.0])
    assert paired.test is not None and paired.test.p_value == pytest.approx(float(expected.pvalue))
    # A sealed run's final score is its final evaluation, whatever its best says.
    sealed = row("s0", "grpo", 60.0, feedback="sealed", final_score=58.0)
    assert group_runs([sealed], {}, {})[0].final_score.mean == 58.0


def test_no_paired_test_without_two_seeds_in_common_or_across_models() -> None:
    rows = [row("a0", "grpo", 50.0), row("a1", "grpo", 52.0), row("b0", "sft", 51.0), row("b5", "sft", 49.0)]
    seeds = {"a0": RunSeed(0), "a1": RunSeed(1), "b0": RunSeed(0), "b5": RunSeed(5)}
    paired = paired_comparison(group_runs(rows, seeds, {}))
    assert paired is not None and not paired.testable and paired.seeds == (0,)
    assert paired.reason is not None and "cannot be tested" in paired.reason
    other_model = [row("a0", "grpo", 50.0), row("b0", "sft", 51.0, base_model="Qwen/Qwen2.5-1.5B")]
    assert paired_comparison(group_runs(other_model, {"a0": RunSeed(0), "b0": RunSeed(0)}, {})) is None
    # Two runs of one agent with the same seed: which one pairs is not clear, so neither does.
    twice = [
        row("a0", "grpo", 50.0),
        row("a0b", "grpo", 51.0),
        row("a1", "grpo", 52.0),
        row("b0", "sft", 51.0),
    ]
    twice += [row("b1", "sft", 50.0)]
    seeds = {"a0": RunSeed(0), "a0b": RunSeed(0), "a1": RunSeed(1), "b0": RunSeed(0), "b1": RunSeed(1)}
    paired = paired_comparison(group_runs(twice, seeds, {}))
    assert paired is not None and paired.ambiguous_seeds == (0,) and paired.seeds == (1,)


def record(home: Path, rows: list[ResultRow], seeds: dict[str, int]) -> None:
    for result in rows:
        append_row(result, home)
        if result.run_id in seeds:
            write_run_seed(home / "runs" / result.run_id, RunSeed(seeds[result.run_id], repeat=1, repeats=3))


def test_results_compare_shows_mean_sem_and_the_paired_test(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first, second = [50.0, 52.5, 48.0], [53.0, 52.0, 51.5]
    rows = [row(f"g{i}", "grpo", score) for i, score in enumerate(first)]
    rows += [row(f"s{i}", "sft", score) for i, score in enumerate(second)]
    record(tmp_path, rows, {r.run_id: int(r.run_id[1]) for r in rows})
    ids = [r.run_id for r in rows]
    assert main(["results", "--home", str(tmp_path), "--compare", *ids]) == 0
    out = capsys.readouterr().out
    expected = stats.ttest_rel(second, first)
    low, high = expected.confidence_interval(0.95)
    sem = float(stats.sem(first))
    grpo_line = next(line for line in out.splitlines() if "grpo" in line and "0, 1, 2" in line)
    assert [cell.strip() for cell in grpo_line.split("│")[6:8]] == ["3", "0, 1, 2"]
    assert "50.17" in grpo_line and f"{sem:.2f}" in grpo_line and "+40.17" in grpo_line
    assert f"sft - grpo, over seeds 0, 1, 2 (n=3): {sum(second) / 3 - sum(first) / 3:+.2f} points" in out
    assert f"95 % t interval {low:+.2f} to {high:+.2f}" in out
    assert f"t = {expected.statistic:.3f}, df = 2, p = {expected.pvalue:.3g}" in out
    lines = {line.split()[1]: line for line in out.splitlines() if line.count("│") >= 3}
    assert "0 (1/3)" in lines["seed"]

    assert main(["results", "--json", "--home", str(tmp_path), "--compare", *ids]) == 0
    document = json.loads(capsys.readouterr().out)
    assert [r["run_id"] for r in document["runs"]] == ids  # the rows, as --json prints them
    grpo, sft = document["groups"]
    assert (grpo["agent"], grpo["runs"], grpo["seeds"]) == ("grpo", 3, [0, 1, 2])
    assert grpo["final_score"]["mean"] == pytest.approx(sum(first) / 3)
    assert grpo["final_score"]["sem"] == pytest.approx(sem)
    assert sft["improvement"]["sem"] == pytest.approx(float(stats.sem([s - 10 for s in second])))
    paired = document["paired"]
    assert (paired["first"], paired["second"], paired["seeds"], paired["testable"]) == (
        "grpo",
        "sft",
        [0, 1, 2],
        True,
    )
    assert paired["p_value"] == pytest.approx(float(expected.pvalue))
    assert paired["interval"] == pytest.approx([low, high])


def test_results_compare_of_one_run_each_says_it_cannot_be_tested(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    record(
        tmp_path,
        [row("g0", "grpo", 50.0), row("s0", "sft", 51.0), row("x", "grpo", 40.0)],
        {"g0": 0, "s0": 0},
    )
    assert main(["results", "--home", str(tmp_path), "--compare", "g0", "s0"]) == 0
    out = capsys.readouterr().out
    assert "fewer than 2 paired seeds (seeds both agents ran: 0); cannot be tested" in out
    grpo_line = next(line for line in out.splitlines() if "grpo" in line and "50.00" in line)
    cells = [cell.strip() for cell in grpo_line.split("│")[-5:-1]]
    assert cells == ["50.00", "-", "+40.00", "-"]  # the SEM of one run: undefined
    assert main(["results", "--json", "--home", str(tmp_path), "--compare", "g0", "s0"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["groups"][0]["final_score"] == {"n": 1, "mean": 50.0, "sem": None}
    assert document["paired"]["testable"] is False and document["paired"]["p_value"] is None
    # A run without a recorded seed (x) pairs with nothing; three runs of one agent: no paired test.
    assert main(["results", "--json", "--home", str(tmp_path), "--compare", "g0", "x"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["paired"] is None and "exactly two agents" in document["paired_reason"]
    assert document["groups"][0]["members"][1]["seed"] is None
