"""Each statistic of autorl.protocol.statistics against a reference on fixed data: statsmodels for the
Wilson interval and the exact McNemar test, a published worked example for Newcombe's paired
interval (Fagerland, Lydersen and Laake, *Statistical Analysis of Contingency Tables*, 2017, ch. 8:
Cavo et al. 2012, whose value the R package contingencytables reproduces in its tests)."""

from __future__ import annotations

import pytest
from statsmodels.stats.contingency_tables import mcnemar
from statsmodels.stats.proportion import proportion_confint

from autorl.protocol.statistics import (
    accuracy_interval,
    compare,
    encode_correctness,
    mcnemar_exact_p,
    paired_difference_interval,
    problems_digest,
    twin_gap_p_value,
    wilson_interval,
)

# correct, n: ordinary scores, 0 % and 100 %, one problem, a GSM8K-size split.
WILSON_CASES = [(0, 1), (1, 1), (0, 1319), (1319, 1319), (1, 1319), (822, 1319), (7, 20), (50, 100)]


@pytest.mark.parametrize(("correct", "n"), WILSON_CASES)
def test_wilson_interval_equals_statsmodels(correct: int, n: int) -> None:
    low, high = proportion_confint(correct, n, alpha=0.05, method="wilson")
    assert wilson_interval(correct, n) == pytest.approx((100 * low, 100 * high), abs=1e-9)


def test_wilson_interval_of_a_gsm8k_score_is_about_five_points_wide() -> None:
    low, high = wilson_interval(822, 1319)  # 62.32 %
    assert low < 100 * 822 / 1319 < high
    assert 4.5 < high - low < 5.5


def test_wilson_interval_refuses_impossible_counts() -> None:
    for correct, n in [(0, 0), (2, 1), (-1, 3)]:
        with pytest.raises(ValueError, match="correct"):
            wilson_interval(correct, n)


# gains (right only in the new evaluation), losses (right only in the baseline)
MCNEMAR_CASES = [(0, 0), (1, 0), (0, 1), (3, 9), (9, 3), (10, 10), (0, 25), (40, 61), (130, 95)]


@pytest.mark.parametrize(("gains", "losses"), MCNEMAR_CASES)
def test_mcnemar_exact_p_equals_statsmodels(gains: int, losses: int) -> None:
    expected = mcnemar([[100, gains], [losses, 100]], exact=True).pvalue
    assert mcnemar_exact_p(gains, losses) == pytest.approx(expected, rel=1e-12)


def test_mcnemar_without_discordant_pairs_is_one() -> None:
    assert mcnemar_exact_p(0, 0) == 1.0


def test_newcombe_interval_equals_the_published_example() -> None:
    # Cavo et al. (2012): 59 both, 6 first only, 16 second only, 80 neither:
    # estimate -0.0621 (95 % CI -0.1186 to -0.0046).
    low, high = paired_difference_interval(59, 6, 16, 80)
    assert (round(low / 100, 4), round(high / 100, 4)) == (-0.1186, -0.0046)


@pytest.mark.parametrize(
    ("both", "gains", "losses", "neither"),
    [
        (0, 0, 0, 1),
        (1, 0, 0, 0),
        (0, 1, 0, 0),
        (0, 0, 1, 0),
        (0, 0, 0, 1319),
        (1319, 0, 0, 0),
        (0, 1319, 0, 0),
    ],
)
def test_newcombe_interval_at_the_edges_is_inside_its_range_and_holds_the_estimate(
    both: int, gains: int, losses: int, neither: int
) -> None:
    low, high = paired_difference_interval(both, gains, losses, neither)
    estimate = 100 * (gains - losses) / (both + gains + losses + neither)
    assert -100 <= low <= estimate <= high <= 100


def test_comparison_of_correctness_strings() -> None:
    baseline = encode_correctness([True, True, False, False, True, False])
    submission = encode_correctness([True, False, True, True, True, True])
    comparison = compare(submission, baseline)
    assert comparison.discordant == (3, 1)
    assert comparison.difference == pytest.approx(100 * 2 / 6)
    assert comparison.p_value == pytest.approx(mcnemar([[2, 3], [1, 0]], exact=True).pvalue)
    assert comparison.interval == pytest.approx(paired_difference_interval(2, 3, 1, 0))
    assert comparison.distinguishable is False  # six problems say little
    assert comparison.as_dict()["discordant"] == [3, 1]


def test_a_large_paired_gain_is_distinguishable_and_a_small_one_is_not() -> None:
    baseline = "1" * 600 + "0" * 719
    big = "1" * 600 + "1" * 100 + "0" * 619  # +100 problems, no losses
    small = "1" * 590 + "0" * 10 + "1" * 20 + "0" * 699  # +20, -10
    assert compare(big, baseline).distinguishable is True
    assert compare(big, baseline).p_value < 1e-20
    assert compare(small, baseline).distinguishable is False
    assert compare(small, baseline).interval[0] < 0 < compare(small, baseline).interval[1]


@pytest.mark.parametrize("n", [20, 1319])
def test_distinguishable_never_contradicts_the_exact_mcnemar_p_value_shown_beside_it(n: int) -> None:
    """Few discordant problems, all on one side: Newcombe's interval excludes 0 where the exact
    test does not reject (5 gains, no loss: p = 0.0625); such a difference is not distinguishable."""
    baseline = "1" * (n // 2) + "0" * (n - n // 2)
    for gains in range(min(n - n // 2, 60) + 1):
        for losses in range(min(n // 2, 60) + 1):
            submission = "1" * (n // 2 - losses) + "0" * losses + "1" * gains + "0" * (n - n // 2 - gains)
            comparison = compare(submission, baseline)
            exact = mcnemar([[n // 2 - losses, losses], [gains, n - n // 2 - gains]], exact=True).pvalue
            low, high = comparison.interval
            assert comparison.distinguishable == (exact < 0.05 and not low <= 0 <= high), (gains, losses)
    five_gains = compare("1" * (n // 2) + "1" * 5 + "0" * (n - n // 2 - 5), baseline)
    assert five_gains.interval[0] > 0 and five_gains.p_value == pytest.approx(0.0625)
    assert not five_gains.distinguishable


def test_identical_evaluations_have_no_discordant_pairs_and_no_difference() -> None:
    for correctness in ["1", "0", "1" * 1319, "0" * 1319, "10" * 50]:
        comparison = compare(correctness, correctness)
        assert comparison.discordant == (0, 0)
        assert comparison.difference == 0
        assert comparison.p_value == 1.0
        assert comparison.distinguishable is False


def test_accuracy_interval_reads_the_correctness_string() -> None:
    assert accuracy_interval("1101") == wilson_interval(3, 4)
    assert accuracy_interval("0") == pytest.approx((0.0, wilson_interval(0, 1)[1]))


@pytest.mark.parametrize(("correctness", "baseline"), [("", "1"), ("1", "10"), ("1x", "10")])
def test_comparison_refuses_strings_of_different_problems(correctness: str, baseline: str) -> None:
    with pytest.raises(ValueError, match=r"problem|only '0' and '1'"):
        compare(correctness, baseline)


def test_problems_digest_depends_on_order_and_boundaries() -> None:
    assert problems_digest(["a", "b"]) != problems_digest(["b", "a"])
    assert problems_digest(["ab", "c"]) != problems_digest(["a", "bc"])
    assert problems_digest(["a", "b"]) == problems_digest(["a", "b"])


def test_the_exact_p_value_of_a_pair_of_counts_is_computed_once() -> None:
    """Every read of every answer shows each submission's p-value: copies of one checkpoint (same
    discordant counts) cost one exact computation, not one per copy per read."""
    mcnemar_exact_p.cache_clear()
    first = mcnemar_exact_p(650, 600)
    for _ in range(100):
        assert mcnemar_exact_p(650, 600) == first
    info = mcnemar_exact_p.cache_info()
    assert (info.misses, info.hits) == (1, 100)


@pytest.mark.parametrize(
    ("final_test", "final_twin", "base_test", "base_twin"),
    [
        ("1111111011", "0001000011", "0100010010", "0100000010"),  # learned the test by heart
        ("1011001101", "1011001101", "0010001000", "0010001000"),  # no gap on either side
        ("1100110011", "1110110111", "0101010101", "0001010100"),  # the base's gap is the larger
        ("11110000111", "0011", "00110000011", "0011"),  # twins for the first four problems only
    ],
)
def test_the_twin_gap_p_value_is_scipys_exact_paired_permutation_test(
    final_test: str, final_twin: str, base_test: str, base_twin: str
) -> None:
    import numpy as np
    from scipy.stats import permutation_test

    n = len(final_twin)
    gaps = np.array(
        [
            (int(final_test[i]) - int(final_twin[i])) - (int(base_test[i]) - int(base_twin[i]))
            for i in range(n)
        ],
        dtype=float,
    )
    # Paired samples (the gaps, and zeros): permuting within pairs flips each gap's sign, all 2^n ways.
    expected = permutation_test(
        (gaps, np.zeros(n)),
        lambda x, y, axis: np.sum(x - y, axis=axis),
        permutation_type="samples",
        alternative="greater",
        n_resamples=np.inf,
    ).pvalue
    assert twin_gap_p_value(final_test, final_twin, base_test, base_twin) == pytest.approx(expected)


def test_the_twin_gap_p_value_is_small_for_a_test_learned_by_heart_and_refuses_bad_strings() -> None:
    memorised = "1" * 40
    assert twin_gap_p_value(memorised, "0" * 40, "0" * 40, "0" * 40) == 0.5**40
    assert twin_gap_p_value("1010", "1010", "1010", "1010") == 1.0
    with pytest.raises(ValueError, match="only '0' and '1'"):
        twin_gap_p_value("1x", "10", "10", "10")
