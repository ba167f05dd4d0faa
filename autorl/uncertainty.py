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

Pure Python on purpose: every service that shows a score (the grader has no scipy) computes these.
The tests check each against statsmodels or a published worked example on fixed data.
"""

from __future__ import annotations

import functools
import hashlib
import math
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
        """Whether the interval excludes 0: the difference is unlikely to be noise."""
        low, high = self.interval
        return not low <= 0 <= high

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
