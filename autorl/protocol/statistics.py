"""How sure a score is: the Wilson interval of an accuracy and the paired comparison of two
evaluations of the same problems.

An evaluation's per-problem correctness is kept as a *correctness string*: one character per
problem of the evaluated split, in the split's fixed order, ``"1"`` where the answer was judged
correct under the headline protocol and ``"0"`` where not. Two such strings of equal length taken
on the same problems (the same evaluation key and problem digest) pair problem by problem.

- :func:`wilson_interval`: the 95 % Wilson score interval of an accuracy, in percent.
- :func:`paired_difference_interval`: Newcombe's square-and-add interval for the difference of two
  paired proportions (Newcombe 1998, method 10), in points.
- :func:`mcnemar_exact_p`: the exact (binomial) two-sided McNemar p-value from the discordant pairs.
- :func:`twin_gap_p_value`: whether a checkpoint's test-minus-twin gap exceeds the base model's, by
  an exact one-sided paired sign-flip (permutation) test.

Across repeated runs (``autorl run --repeat``, one score per seed):

- :func:`standard_error`: the standard error of a mean (sample standard deviation / sqrt(n)).
- :func:`paired_t_test`: the paired t-test of two agents' scores on the same seeds, with the 95 %
  t interval of the mean paired difference (Student's t distribution through the regularized
  incomplete beta function).

Pure Python on purpose: every service that shows a score (the grader has no scipy) computes these.
The tests check each against statsmodels, scipy or a published worked example on fixed data.
"""

from __future__ import annotations

import functools
import hashlib
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from statistics import NormalDist
from typing import Protocol

#: Confidence of every interval the platform shows.
CONFIDENCE = 0.95


def _z(confidence: float) -> float:
    return NormalDist().inv_cdf(0.5 + confidence / 2)


def encode_correctness(judgements: Sequence[bool]) -> str:
    """The correctness string of per-problem judgements (in problem order)."""
    return "".join("1" if correct else "0" for correct in judgements)


def problems_digest(texts: Sequence[str]) -> str:
    """A sha256 hex digest naming an ordered list of problems (e.g. each question and its answer),
    so that two correctness strings are paired only when they were taken on the same problems."""
    digest = hashlib.sha256()
    for text in texts:
        encoded = text.encode("utf-8")
        digest.update(len(encoded).to_bytes(8, "big") + encoded)
    return digest.hexdigest()


def _check_correctness(correctness: str) -> None:
    if not correctness:
        raise ValueError("no problems: a correctness string holds one character per problem")
    if set(correctness) - {"0", "1"}:
        raise ValueError("a correctness string holds only '0' and '1'")


def _wilson(correct: int, n: int, z: float) -> tuple[float, float]:
    """Wilson score interval of ``correct / n`` as proportions (0-1)."""
    p = correct / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def wilson_interval(correct: int, n: int, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The Wilson score interval of the accuracy ``correct / n``, in percent ``(low, high)``."""
    if n <= 0 or not 0 <= correct <= n:
        raise ValueError(f"need 0 <= correct <= n and n > 0, got correct={correct}, n={n}")
    low, high = _wilson(correct, n, _z(confidence))
    return 100 * low, 100 * high


@functools.lru_cache(maxsize=4096)
def mcnemar_exact_p(gains: int, losses: int) -> float:
    """Exact two-sided McNemar p-value: twice the binomial(gains + losses, 1/2) probability of a
    split at least as uneven as the one observed, at most 1 (1 when there is no discordant pair).

    Exact in integers (about 13 ms at 1,250 discordant pairs), so remembered per pair of counts:
    every read of every answer shows it, and an agent's copies of one checkpoint share their counts."""
    if gains < 0 or losses < 0:
        raise ValueError("discordant counts are never negative")
    n = gains + losses
    tail = sum(math.comb(n, k) for k in range(min(gains, losses) + 1))
    return float(min(Fraction(1), Fraction(2 * tail, 2**n)))


#: A twin gap with a p-value below this is flagged (docs/PROTOCOL.md).
TWIN_FLAG_P = 0.01


def twin_gap_p_value(final_test: str, final_twin: str, base_test: str, base_twin: str) -> float:
    """One-sided p-value that a checkpoint's gap between the test problems and their twins (the
    same problems with other numbers) exceeds the base model's, over the problems of equal index
    in the four correctness strings (the twins' strings may be shorter: only problems with a twin).

    Per problem ``d = (final_test - final_twin) - (base_test - base_twin)``, in -2..2; under the
    null hypothesis each ``d`` is as likely negative as positive, so the exact distribution of
    their sum is that of random signs on their magnitudes: with ``n1`` of magnitude 1 and ``n2`` of
    magnitude 2, ``(2 k1 - n1) + 2 (2 k2 - n2)`` for independent binomial(n, 1/2) ``k1``, ``k2``.
    Returns ``P(sum >= observed)``: 1 when no problem differs."""
    strings = (final_test, final_twin, base_test, base_twin)
    for correctness in strings:
        _check_correctness(correctness)
    n = min(len(text) for text in strings)
    gaps = [
        (int(final_test[i]) - int(final_twin[i])) - (int(base_test[i]) - int(base_twin[i])) for i in range(n)
    ]
    observed = sum(gaps)
    n1 = sum(1 for gap in gaps if abs(gap) == 1)
    n2 = sum(1 for gap in gaps if abs(gap) == 2)
    hits = sum(
        math.comb(n1, k1) * math.comb(n2, k2)
        for k1 in range(n1 + 1)
        for k2 in range(n2 + 1)
        if (2 * k1 - n1) + 2 * (2 * k2 - n2) >= observed
    )
    return float(Fraction(hits, 2 ** (n1 + n2)))


def paired_difference_interval(
    both: int, gains: int, losses: int, neither: int, confidence: float = CONFIDENCE
) -> tuple[float, float]:
    """Newcombe's square-and-add interval (method 10) for ``p_new - p_old`` on paired data, in
    points ``(low, high)``. ``both``: correct in both evaluations; ``gains``: correct only in the
    new one; ``losses``: only in the old one; ``neither``: in neither."""
    counts = (both, gains, losses, neither)
    if min(counts) < 0 or sum(counts) == 0:
        raise ValueError(f"need non-negative counts of at least one problem, got {counts}")
    n = sum(counts)
    z = _z(confidence)
    new_right, old_right = both + gains, both + losses
    p_new, p_old = new_right / n, old_right / n
    low_new, high_new = _wilson(new_right, n, z)
    low_old, high_old = _wilson(old_right, n, z)
    margins = (new_right, n - new_right, old_right, n - old_right)
    phi = 0.0
    if all(margins):
        cross = both * neither - gains * losses
        # Newcombe's continuity adjustment of the correlation: positive values shrink by n/2.
        adjusted = cross - n / 2 if cross > n / 2 else (0.0 if cross >= 0 else cross)
        phi = adjusted / math.sqrt(math.prod(margins))
    estimate = p_new - p_old
    below_new, above_old = p_new - low_new, high_old - p_old
    above_new, below_old = high_new - p_new, p_old - low_old
    low = estimate - math.sqrt(max(0.0, below_new**2 + above_old**2 - 2 * phi * below_new * above_old))
    high = estimate + math.sqrt(max(0.0, below_old**2 + above_new**2 - 2 * phi * below_old * above_new))
    return 100 * max(-1.0, low), 100 * min(1.0, high)


#: The level below which a paired difference's exact McNemar p-value counts (1 - the intervals' 95 %).
SIGNIFICANCE = 0.05


@dataclass(frozen=True)
class Comparison:
    """A score against the baseline on the same problems."""

    #: Accuracy minus the baseline's, in points.
    difference: float
    #: 95 % interval of the difference (Newcombe's method 10), in points.
    interval: tuple[float, float]
    #: Exact McNemar p-value.
    p_value: float
    #: Problems only this evaluation got right, and problems only the baseline got right.
    discordant: tuple[int, int]

    @property
    def distinguishable(self) -> bool:
        """Whether the difference is unlikely to be noise by both of what is shown: the interval
        excludes 0 and the exact McNemar p-value is under 0.05. (With few discordant problems, all
        on one side, Newcombe's interval excludes 0 while the exact test does not reject: 5 gains
        and no loss give p = 0.0625.)"""
        low, high = self.interval
        return self.p_value < SIGNIFICANCE and not low <= 0 <= high

    def as_dict(self) -> dict[str, object]:
        return {
            "difference": self.difference,
            "interval": list(self.interval),
            "p_value": self.p_value,
            "discordant": list(self.discordant),
            "distinguishable": self.distinguishable,
        }


def accuracy_interval(correctness: str) -> tuple[float, float]:
    """The Wilson interval of the accuracy a correctness string records, in percent."""
    _check_correctness(correctness)
    return wilson_interval(correctness.count("1"), len(correctness))


def compare(correctness: str, baseline: str) -> Comparison:
    """``correctness`` against ``baseline``, problem by problem (both of the same problems)."""
    _check_correctness(correctness)
    _check_correctness(baseline)
    if len(correctness) != len(baseline):
        raise ValueError(f"{len(correctness)} problems against {len(baseline)}: not the same problems")
    pairs = list(zip(correctness, baseline, strict=True))
    both, gains = pairs.count(("1", "1")), pairs.count(("1", "0"))
    losses, neither = pairs.count(("0", "1")), pairs.count(("0", "0"))
    return Comparison(
        difference=100 * (gains - losses) / len(pairs),
        interval=paired_difference_interval(both, gains, losses, neither),
        p_value=mcnemar_exact_p(gains, losses),
        discordant=(gains, losses),
    )


class EvaluationRecord(Protocol):
    """The fields of a stored evaluation (a submission row) that the statistics read."""

    @property
    def score(self) -> float | None: ...
    @property
    def n_samples(self) -> int | None: ...
    @property
    def correctness(self) -> str | None: ...
    @property
    def problems_digest(self) -> str | None: ...


@dataclass(frozen=True)
class Evaluated:
    """What an evaluation recorded that the statistics need (a store row's fields)."""

    score: float | None
    n_samples: int | None
    correctness: str | None
    problems_digest: str | None

    @classmethod
    def of(cls, record: EvaluationRecord) -> Evaluated:
        return cls(record.score, record.n_samples, record.correctness, record.problems_digest)


def interval_of(evaluated: Evaluated) -> tuple[float, float] | None:
    """The Wilson interval of a score: from its correctness string, else (a score recorded before
    those were kept) from the score and its number of problems; None when it is not scored."""
    if evaluated.correctness:
        return accuracy_interval(evaluated.correctness)
    if evaluated.score is None or not evaluated.n_samples:
        return None
    return wilson_interval(round(evaluated.score * evaluated.n_samples / 100), evaluated.n_samples)


def comparison_of(evaluated: Evaluated, baseline: Evaluated | None) -> Comparison | None:
    """``evaluated`` against the baseline on the same problems; None when either has no
    correctness string or they were taken on different problems."""
    if (
        baseline is None
        or not evaluated.correctness
        or not baseline.correctness
        or evaluated.problems_digest != baseline.problems_digest
        or len(evaluated.correctness) != len(baseline.correctness)
    ):
        return None
    return compare(evaluated.correctness, baseline.correctness)


# --- across repeated runs ----------------------------------------------------------------------


def standard_error(values: Sequence[float]) -> float | None:
    """The standard error of the mean of ``values``: the sample standard deviation (n - 1) over
    sqrt(n), as ``scipy.stats.sem``; None for fewer than two values (undefined)."""
    if len(values) < 2:
        return None
    return statistics.stdev(values) / math.sqrt(len(values))


def _incomplete_beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz's method)."""
    tiny, epsilon = 1e-300, 1e-16
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    result = d
    for m in range(1, 1000):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            result *= c * d
        if abs(c * d - 1.0) < epsilon:
            break
    return result


def _regularized_incomplete_beta(a: float, b: float, x: float) -> float:
    """I_x(a, b) for 0 <= x <= 1."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    front = math.exp(log_front)
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _incomplete_beta_fraction(a, b, x) / a
    return 1.0 - front * _incomplete_beta_fraction(b, a, 1.0 - x) / b


def student_t_two_sided_p(t: float, df: int) -> float:
    """P(|T| >= |t|) for Student's t with ``df`` degrees of freedom."""
    if math.isinf(t):
        return 0.0
    return _regularized_incomplete_beta(df / 2.0, 0.5, df / (df + t * t))


def student_t_quantile(probability: float, df: int) -> float:
    """The ``probability`` quantile (0.5 < probability < 1) of Student's t with ``df`` degrees of
    freedom, by bisection on its distribution function."""
    if not 0.5 < probability < 1.0 or df < 1:
        raise ValueError(f"need 0.5 < probability < 1 and df >= 1, got {probability}, {df}")
    tail = 2.0 * (1.0 - probability)
    low, high = 0.0, 1.0
    while student_t_two_sided_p(high, df) > tail:
        low, high = high, 2.0 * high
    for _ in range(200):
        middle = (low + high) / 2.0
        if student_t_two_sided_p(middle, df) > tail:
            low = middle
        else:
            high = middle
    return (low + high) / 2.0


@dataclass(frozen=True)
class PairedTest:
    """Two agents' scores on the same seeds: ``second - first``, seed by seed."""

    #: How many seeds were paired.
    n: int
    #: Mean of the paired differences, in points.
    mean_difference: float
    #: Its 95 % t interval, in points; None for fewer than two seeds.
    interval: tuple[float, float] | None
    #: The paired t statistic; None where it is undefined (fewer than two seeds, or every
    #: difference 0) or infinite (every difference the same, not 0: the p-value is then 0).
    statistic: float | None
    #: Two-sided p-value of the paired t-test (as ``scipy.stats.ttest_rel``); None where undefined.
    p_value: float | None

    def as_dict(self) -> dict[str, object]:
        return {
            "n": self.n,
            "mean_difference": self.mean_difference,
            "interval": None if self.interval is None else list(self.interval),
            "t": self.statistic,
            "df": self.n - 1,
            "p_value": self.p_value,
        }


def paired_t_test(
    first: Sequence[float], second: Sequence[float], confidence: float = CONFIDENCE
) -> PairedTest:
    """The paired t-test of ``second`` against ``first`` (the same seeds, in the same order), as
    ``scipy.stats.ttest_rel(second, first)``, with the t interval of the mean difference."""
    if len(first) != len(second) or not first:
        raise ValueError(
            f"need two equally long, non-empty lists of paired scores, got {len(first)} and {len(second)}"
        )
    differences = [b - a for a, b in zip(first, second, strict=True)]
    n = len(differences)
    mean = statistics.fmean(differences)
    if n < 2:
        return PairedTest(n, mean, None, None, None)
    error = statistics.stdev(differences) / math.sqrt(n)
    margin = student_t_quantile(0.5 + confidence / 2, n - 1) * error
    interval = (mean - margin, mean + margin)
    if error == 0.0:
        # Every difference the same: 0 is no evidence at all; any other value, no doubt left.
        return PairedTest(n, mean, interval, None, None if mean == 0.0 else 0.0)
    statistic = mean / error
    return PairedTest(n, mean, interval, statistic, student_t_two_sided_p(statistic, n - 1))
