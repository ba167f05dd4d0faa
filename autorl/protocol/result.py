"""A score against the baseline, and the experiment's one result on the test split, as every
surface carries them: the grader's answers, results.csv's columns and the Experiment's status all
render the same frozen :class:`FinalResult` (built from the store by :mod:`autorl.protocol.final`)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from autorl.protocol import statistics

#: How the final was chosen: test mode, the best submission; sealed, the agent's nomination, else
#: the best on validation.
Selection = Literal["best_on_test", "best_on_validation", "nominated"]
#: A submission's status as an answer carries it (the store's SubmissionStatus values).
SubmissionStatusName = Literal["queued", "running", "scored", "failed"]
#: ``[low, high]`` of an interval; ``[b, c]`` of discordant problems.
Pair = Annotated[list[float], Field(min_length=2, max_length=2)]
CountPair = Annotated[list[int], Field(min_length=2, max_length=2)]


class Comparison(BaseModel):
    """A score against the baseline on the same split and the same problems (autorl.protocol.statistics)."""

    model_config = ConfigDict(extra="forbid")

    difference: float = Field(description="accuracy minus the baseline's, in points")
    interval: Pair = Field(
        description="95 % interval of the difference in points, [low, high] (Newcombe's paired method 10)"
    )
    p_value: float = Field(description="exact (binomial) McNemar p-value of the paired difference")
    discordant: CountPair = Field(
        description="[b, c]: problems only this submission got right, problems only the baseline got right"
    )
    distinguishable: bool = Field(description="false when the interval contains 0 or p_value is 0.05 or more")

    @classmethod
    def of(cls, comparison: statistics.Comparison) -> Comparison:
        return cls(
            difference=comparison.difference,
            interval=list(comparison.interval),
            p_value=comparison.p_value,
            discordant=list(comparison.discordant),
            distinguishable=comparison.distinguishable,
        )


class FinalResult(BaseModel):
    """The experiment's one result on the test split: sealed, the final evaluation of the
    nominated (or best on validation) submission; test, the best submission."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    submission_id: int | None = Field(description="the evaluation that produced the score")
    of: int | None = Field(description="the agent's submission whose files it evaluated")
    selection: Selection
    status: SubmissionStatusName | None = Field(description="null before it is created")
    score: float | None
    interval: Pair | None = None
    comparison: Comparison | None = None
    error: str | None = None

    @property
    def scored(self) -> bool:
        return self.status == "scored"

    @property
    def final_score(self) -> float | None:
        """The score on the test split, once scored."""
        return self.score if self.scored else None

    @property
    def final_interval(self) -> tuple[float, float] | None:
        """Its 95 % interval, once scored."""
        return (self.interval[0], self.interval[1]) if self.scored and self.interval else None

    @property
    def final_p_value(self) -> float | None:
        """Its McNemar p-value against the baseline on test, once scored."""
        return self.comparison.p_value if self.scored and self.comparison is not None else None

    @property
    def made_selection(self) -> Selection | None:
        """How it was selected, once it exists (test mode: always; sealed: once its final
        evaluation is made)."""
        return self.selection if self.status is not None else None
