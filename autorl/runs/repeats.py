"""Repeated runs (``autorl run --repeat N``, seeds 0..N-1) taken together: ``autorl results --compare``
groups the compared runs by task, agent, base model, feedback mode and evaluation key, and shows
for each group the mean ± SEM of the final score and of the improvement; for two agents run on the
same seeds it adds the paired t-test of their final scores across seeds (docs/PROTOCOL.md, "Repeats").

A run's final score is its one result on the test split: in ``test`` mode its best (``best_score``),
in ``sealed`` mode its final evaluation (``final_score``). The means are taken over the group's runs
that have a final score and were not interrupted (a run stopped by Ctrl-C or killed had its budget
cut short: it is no repeat of the others); a run's seed is read from its run folder
(:mod:`autorl.runs.seeds`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import fmean
from typing import Any

from autorl.protocol.feedback import Feedback
from autorl.protocol.statistics import PairedTest, paired_t_test, standard_error
from autorl.runs.results import ResultRow
from autorl.runs.seeds import RunSeed


def final_score(row: ResultRow) -> float | None:
    """The run's one result on the test split: sealed, its final evaluation; test, its best."""
    return row.final_score if row.feedback == Feedback.SEALED else row.best_score


@dataclass(frozen=True)
class RepeatRun:
    """One run as a repeat: its seed (None: not recorded) and its numbers on the test split."""

    run_id: str
    seed: int | None
    status: str
    score: float | None
    improvement: float | None

    @property
    def counted(self) -> bool:
        """Whether the run enters its group's means: scored, and not cut short."""
        return self.score is not None and self.status != "interrupted"

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "seed": self.seed,
            "status": self.status,
            "final_score": self.score,
            "improvement": self.improvement,
            "counted": self.counted,
        }


@dataclass(frozen=True)
class MeanSem:
    """A mean with its standard error (None: undefined, fewer than two values) over ``n`` values."""

    n: int
    mean: float | None
    sem: float | None

    @classmethod
    def of(cls, values: Sequence[float]) -> MeanSem:
        return cls(len(values), fmean(values) if values else None, standard_error(values))

    def to_json(self) -> dict[str, Any]:
        return {"n": self.n, "mean": self.mean, "sem": self.sem}


@dataclass(frozen=True)
class RepeatGroup:
    """The compared runs of one task, agent, base model, feedback mode and evaluation key."""

    task: str
    agent: str
    base_model: str
    feedback: str
    eval_key: str | None  # None: a run this home's store does not know
    runs: tuple[RepeatRun, ...]

    @property
    def identity(self) -> tuple[str, str, str, str, str | None]:
        return (self.task, self.agent, self.base_model, self.feedback, self.eval_key)

    @property
    def counted(self) -> list[RepeatRun]:
        return [run for run in self.runs if run.counted]

    @property
    def final_score(self) -> MeanSem:
        return MeanSem.of([run.score for run in self.counted if run.score is not None])

    @property
    def improvement(self) -> MeanSem:
        return MeanSem.of([run.improvement for run in self.counted if run.improvement is not None])

    def scores_by_seed(self) -> tuple[dict[int, float], list[int]]:
        """The counted runs' final scores by seed, and the seeds left out because more than one
        counted run of this group has them (which one would pair is not clear)."""
        by_seed: dict[int, list[float]] = {}
        for run in self.counted:
            if run.seed is not None and run.score is not None:
                by_seed.setdefault(run.seed, []).append(run.score)
        single = {seed: scores[0] for seed, scores in by_seed.items() if len(scores) == 1}
        return single, sorted(seed for seed, scores in by_seed.items() if len(scores) > 1)

    def to_json(self) -> dict[str, Any]:
        return {
            "task": self.task,
            "agent": self.agent,
            "base_model": self.base_model,
            "feedback": self.feedback,
            "eval_key": self.eval_key,
            "runs": len(self.runs),
            "counted_runs": len(self.counted),
            "seeds": sorted({run.seed for run in self.counted if run.seed is not None}),
            "final_score": self.final_score.to_json(),
            "improvement": self.improvement.to_json(),
            "members": [run.to_json() for run in self.runs],
        }


@dataclass(frozen=True)
class PairedComparison:
    """Two agents' final scores on the seeds both ran: ``second - first``, seed by seed."""

    first: RepeatGroup
    second: RepeatGroup
    seeds: tuple[int, ...]
    #: Seeds left out because one group has more than one counted run of that seed.
    ambiguous_seeds: tuple[int, ...]
    test: PairedTest | None  # None: no seed in common

    @property
    def testable(self) -> bool:
        return self.test is not None and self.test.p_value is not None

    @property
    def reason(self) -> str | None:
        """Why there is no p-value (None when there is one)."""
        if self.test is None or self.test.n < 2:
            shown = ", ".join(map(str, self.seeds)) or "none"
            return f"fewer than 2 paired seeds (seeds both agents ran: {shown}); cannot be tested"
        if self.test.p_value is None:
            return "every paired difference is 0: no evidence either way"
        return None

    def to_json(self) -> dict[str, Any]:
        return {
            "first": self.first.agent,
            "second": self.second.agent,
            "difference": "second - first",
            "seeds": list(self.seeds),
            "ambiguous_seeds": list(self.ambiguous_seeds),
            **(self.test.as_dict() if self.test is not None else {"n": 0}),
            "testable": self.testable,
            "reason": self.reason,
        }


def group_runs(
    rows: Sequence[ResultRow], seeds: Mapping[str, RunSeed], keys: Mapping[str, str]
) -> list[RepeatGroup]:
    """The rows grouped by task, agent, base model, feedback and evaluation key, in the order of
    each group's first run; ``seeds`` and ``keys`` by run id (a run missing from either has None)."""
    groups: dict[tuple[str, str, str, str, str | None], list[RepeatRun]] = {}
    for row in rows:
        seed = seeds.get(row.run_id)
        identity = (row.task, row.agent, row.base_model, row.feedback, keys.get(row.run_id))
        groups.setdefault(identity, []).append(
            RepeatRun(
                run_id=row.run_id,
                seed=None if seed is None else seed.seed,
                status=row.status,
                score=final_score(row),
                improvement=row.improvement,
            )
        )
    return [
        RepeatGroup(task, agent, model, feedback, key, tuple(runs))
        for (task, agent, model, feedback, key), runs in groups.items()
    ]


def paired_comparison(groups: Sequence[RepeatGroup]) -> PairedComparison | None:
    """The paired test of two agents on the same task, base model, feedback mode and evaluation
    key; None unless the groups are exactly two such."""
    if len(groups) != 2:
        return None
    first, second = groups
    if first.identity[:1] + first.identity[2:] != second.identity[:1] + second.identity[2:]:
        return None  # they differ in more than the agent: not two agents on the same footing
    first_scores, first_ambiguous = first.scores_by_seed()
    second_scores, second_ambiguous = second.scores_by_seed()
    common = tuple(sorted(set(first_scores) & set(second_scores)))
    first_values = [first_scores[seed] for seed in common]
    test = paired_t_test(first_values, [second_scores[seed] for seed in common]) if common else None
    ambiguous = tuple(sorted(set(first_ambiguous) | set(second_ambiguous)))
    return PairedComparison(first, second, common, ambiguous, test)


def why_not_paired(groups: Sequence[RepeatGroup]) -> str:
    """Why :func:`paired_comparison` made no test of these groups."""
    agents = sorted({group.agent for group in groups})
    if len(agents) != 2:
        return f"a paired test needs exactly two agents; these runs are of {len(agents)}"
    return (
        "a paired test needs the two agents' runs on one task, base model, feedback mode and "
        "evaluation key each; these runs form more groups"
    )


def aggregate_json(groups: Sequence[RepeatGroup], paired: PairedComparison | None) -> dict[str, Any]:
    """The ``groups`` and ``paired`` entries of ``autorl results --compare --json``."""
    return {
        "groups": [group.to_json() for group in groups],
        "paired": paired.to_json() if paired is not None else None,
        "paired_reason": None if paired is not None else why_not_paired(groups),
    }
