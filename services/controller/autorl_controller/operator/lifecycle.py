"""Pure rules of the lifecycle: what a Job's status means, what the grader's view becomes in status.

    Pending → Preparing → Baseline → Running → Finishing → Succeeded | Failed | TimedOut

Kept apart from the handlers so that each rule is tested without a server.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from autorl.api.answers import ExperimentAnswer
from autorl.api.request_bodies import FinishStatus
from autorl.experiment import ExperimentResourceStatus, Phase
from autorl.protocol.feedback import Feedback
from autorl.protocol.statistics import TWIN_FLAG_P
from autorl.provenance.unverified import TEST_UNVERIFIED, note, notes_in
from autorl.wait_reasons import EVALUATORS_UNAVAILABLE_CONDITION, Reason, format_duration

#: The condition that remembers, through Finishing, how the agent's Job ended.
AGENT_FINISHED = "AgentFinished"
#: The condition that says whether the checks after the agent were made whole (docs/PROTOCOL.md).
PROVENANCE_VERIFIED = "ProvenanceVerified"


class JobState(enum.Enum):
    MISSING = "missing"
    WAITING = "waiting"  # created, no pod running yet (scheduling, image pull, queued by Kueue)
    ACTIVE = "active"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    DEADLINE_EXCEEDED = "deadline_exceeded"

    @property
    def ended(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.DEADLINE_EXCEEDED)


@dataclass(frozen=True)
class JobStatus:
    state: JobState
    reason: str = ""
    message: str = ""


def job_status(job: dict[str, Any] | None) -> JobStatus:
    """Read a Job's outcome from its conditions (the Job controller's verdict), else its counters."""
    if job is None:
        return JobStatus(JobState.MISSING)
    status = job.get("status") or {}
    for condition in status.get("conditions") or []:
        if condition.get("status") != "True":
            continue
        kind, reason, message = (
            condition.get("type"),
            condition.get("reason", ""),
            condition.get("message", ""),
        )
        if kind in ("Complete", "SuccessCriteriaMet"):
            return JobStatus(JobState.SUCCEEDED, reason or "Completed", message)
        if kind in ("Failed", "FailureTarget"):
            if reason == "DeadlineExceeded":
                return JobStatus(JobState.DEADLINE_EXCEEDED, reason, message)
            return JobStatus(JobState.FAILED, reason or "Failed", message)
    if status.get("succeeded"):
        return JobStatus(JobState.SUCCEEDED, "Completed")
    if status.get("failed") and not status.get("active"):
        return JobStatus(JobState.FAILED, "PodFailed")
    if status.get("active") or status.get("ready"):
        return JobStatus(JobState.ACTIVE)
    return JobStatus(JobState.WAITING)


@dataclass(frozen=True)
class Outcome:
    """How an experiment ends: its final phase and what the grader records."""

    phase: Phase
    grader_status: FinishStatus
    message: str

    @property
    def reason(self) -> Reason:
        if self.phase is Phase.SUCCEEDED:
            return Reason.COMPLETED
        return Reason.BUDGET_EXHAUSTED if self.phase is Phase.TIMED_OUT else Reason.AGENT_FAILED


def agent_outcome(job: JobStatus, *, past_deadline: bool) -> Outcome | None:
    """The experiment's outcome once the agent Job has ended (or overrun its budget); None: still running."""
    if job.state is JobState.SUCCEEDED:
        return Outcome(Phase.SUCCEEDED, "completed", "the agent finished within its budget")
    if job.state is JobState.DEADLINE_EXCEEDED or (past_deadline and not job.state.ended):
        return Outcome(Phase.TIMED_OUT, "timed_out", "the agent was stopped at the end of its budget")
    if job.state is JobState.FAILED:
        detail = f": {job.message}" if job.message else ""
        return Outcome(Phase.FAILED, "failed", f"the agent Job failed ({job.reason}){detail}")
    if job.state is JobState.MISSING:
        return Outcome(Phase.FAILED, "failed", "the agent Job was deleted before it finished")
    return None


def agent_running_since(pods: list[dict[str, Any]], job_uid: str, container: str) -> float | None:
    """When the agent's container first ran in one of the Job's pods (epoch seconds), or None.

    The budget starts then: not while the Job is suspended by Kueue, nor while its pod is Pending
    (scheduling, pulling images, init containers). A container that already ended still tells when it
    started. Pods of another Job (an earlier run's, still terminating) do not count.
    """
    starts = []
    for pod in pods:
        owners = (pod.get("metadata") or {}).get("ownerReferences") or []
        if not any(owner.get("uid") == job_uid for owner in owners):
            continue
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            if status.get("name") != container:
                continue
            state = status.get("state") or {}
            started = (state.get("running") or state.get("terminated") or {}).get("startedAt")
            moment = epoch_from_iso(started)
            if moment is not None and moment > 0:
                starts.append(moment)
    return min(starts, default=None)


def agent_deadline_s(job: dict[str, Any] | None, end_time: float | None, *, slack_s: int) -> int | None:
    """The agent Job's ``activeDeadlineSeconds`` that ends it ``slack_s`` after the budget's end.

    Kubernetes counts it from the Job's ``status.startTime``, which precedes the budget's start by
    the time spent scheduling and pulling the image; at the deadline the Job controller deletes the
    pod (SIGTERM, SIGKILL after its terminationGracePeriodSeconds). None while either time is unknown.
    """
    started = epoch_from_iso(((job or {}).get("status") or {}).get("startTime"))
    if started is None or end_time is None:
        return None
    return max(1, math.ceil(end_time - started)) + slack_s


def outcome_condition(outcome: Outcome, now: datetime) -> dict[str, Any]:
    return {
        "type": AGENT_FINISHED,
        "status": "True",
        "reason": outcome.phase.value,
        "message": outcome.message,
        "lastTransitionTime": iso(now),
    }


def provenance_condition(view: ExperimentAnswer, unchecked: str, now: datetime) -> dict[str, Any]:
    """``ProvenanceVerified``: True where the checks after the agent were made whole, False with
    what could not be verified (the notes of the experiment's message, ``unchecked``: why the check
    of its files was not made) otherwise (autorl.provenance.unverified)."""
    notes = notes_in(view.message) + ([note(TEST_UNVERIFIED, unchecked)] if unchecked else [])
    return {
        "type": PROVENANCE_VERIFIED,
        "status": "False" if notes else "True",
        "reason": "Unverified" if notes else "Complete",
        "message": "; ".join(notes)
        or "the agent's files were read whole and the final, if any, scored on twins",
        "lastTransitionTime": iso(now),
    }


def with_condition(
    conditions: list[dict[str, Any]] | None, condition: dict[str, Any]
) -> list[dict[str, Any]]:
    """The conditions with ``condition`` in place of any earlier one of its type."""
    return [*(c for c in conditions or [] if c.get("type") != condition["type"]), condition]


def evaluators_condition(
    conditions: list[dict[str, Any]] | None, *, unavailable: bool, reason: str, message: str, now: datetime
) -> list[dict[str, Any]] | None:
    """The conditions with ``EvaluatorsUnavailable`` set (True while the baseline waits for evaluators
    that are not there, False once that ends); None when nothing changes (never set and not needed)."""
    existing = next((c for c in conditions or [] if c.get("type") == EVALUATORS_UNAVAILABLE_CONDITION), None)
    if existing is None and not unavailable:
        return None
    status = "True" if unavailable else "False"
    if existing is not None and existing.get("status") == status and existing.get("message") == message:
        return None
    since = existing.get("lastTransitionTime") if existing and existing.get("status") == status else None
    condition = {
        "type": EVALUATORS_UNAVAILABLE_CONDITION,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": since or iso(now),
    }
    return with_condition(conditions, condition)


def agent_finished_since(conditions: list[dict[str, Any]] | None) -> float | None:
    """When Finishing began (the AgentFinished condition's time)."""
    for condition in conditions or []:
        if condition.get("type") == AGENT_FINISHED:
            return epoch_from_iso(condition.get("lastTransitionTime"))
    return None


def outcome_from_conditions(conditions: list[dict[str, Any]] | None) -> Outcome | None:
    """Recover the outcome recorded when Finishing began."""
    by_phase = {Phase.SUCCEEDED: "completed", Phase.FAILED: "failed", Phase.TIMED_OUT: "timed_out"}
    for condition in conditions or []:
        if condition.get("type") == AGENT_FINISHED and condition.get("status") == "True":
            phase = Phase(str(condition.get("reason")))
            status: FinishStatus = by_phase[phase]  # type: ignore[assignment]
            return Outcome(phase, status, str(condition.get("message") or ""))
    return None


def iso(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def iso_from_epoch(seconds: float | None) -> str | None:
    return None if seconds is None else iso(datetime.fromtimestamp(seconds, UTC))


def moment(seconds: float | None) -> datetime | None:
    """An epoch time as status holds it: UTC, whole seconds (as :func:`iso` writes it)."""
    return None if seconds is None else datetime.fromtimestamp(seconds, UTC).replace(microsecond=0)


def merged(*parts: ExperimentResourceStatus) -> ExperimentResourceStatus:
    """The status fields set in any of ``parts``, a later part's over an earlier one's."""
    first, *rest = parts
    update = {name: getattr(part, name) for part in rest for name in part.model_fields_set}
    return first.model_copy(update=update)


def conditions_status(conditions: list[dict[str, Any]] | None) -> ExperimentResourceStatus:
    """Status with these conditions (as read from the object, or built here); nothing when None."""
    if conditions is None:
        return ExperimentResourceStatus()
    return ExperimentResourceStatus.model_validate({"conditions": conditions})


def status_patch(status: ExperimentResourceStatus) -> dict[str, Any]:
    """The status fields as the status subresource is patched with them: the model's JSON by alias
    (camelCase), only the fields set (one set to None is sent as null, which removes it)."""
    return status.model_dump(mode="json", by_alias=True, exclude_unset=True)


def epoch_from_iso(text: str | None) -> float | None:
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def queue_summary(view: ExperimentAnswer) -> str:
    """The Queue column: the baseline's place while it waits, else the evaluations in flight; and
    how many evaluators take this experiment's work."""
    evaluators = "" if view.evaluators is None else f", {evaluators_count(view.evaluators)}"
    if view.waiting is not None:
        return f"baseline #{view.waiting.queue_position}{evaluators}"
    return f"{view.in_flight} in flight{evaluators}"


def evaluators_count(evaluators: int) -> str:
    return f"{evaluators} evaluator" + ("" if evaluators == 1 else "s")


def budget_left(view: ExperimentAnswer) -> str | None:
    if view.remaining_s is None:
        return None
    return format_duration(view.remaining_s)


def status_from_view(view: ExperimentAnswer) -> ExperimentResourceStatus:
    """The grader's experiment view as Experiment status fields (the database is the truth)."""
    return merged(
        ExperimentResourceStatus(
            budgetLeft=budget_left(view),
            queue=queue_summary(view),
            evaluators=view.evaluators,
            baselineScore=view.baseline_score,
            bestScore=view.best_score,
            bestSubmission=view.best_submission,
            improvement=improvement_shown(view),
            submissions=view.submissions,
            startTime=moment(view.start_time),
            deadline=moment(view.end_time),
        ),
        final_status(view),
        ExperimentResourceStatus(result=result_text(view)),
        provenance_status(view),
    )


def provenance_findings(view: ExperimentAnswer) -> list[str]:
    """What the closing message flags of what the agent may have brought in (docs/PROTOCOL.md)."""
    found = []
    if view.test_overlap:
        found.append(f"{view.test_overlap} test problem(s) found in the agent's files")
    if view.twin_p_value is not None and view.twin_p_value < TWIN_FLAG_P:
        found.append(f"the final's gap on the twin split is flagged (p={view.twin_p_value:.3g})")
    if view.lineage:
        found.append("a submission is nearer a registered public checkpoint than the base (status.lineage)")
    # What the checks could not verify (a budget reached, files unread, the final changed).
    return found + notes_in(view.message)


def provenance_status(view: ExperimentAnswer) -> ExperimentResourceStatus:
    """What the agent may have brought in (docs/PROTOCOL.md), once the grader has it: only the fields
    found, so that a status mirrored before they are never loses them."""
    found = {
        "testOverlap": view.test_overlap,
        "twinScore": view.twin_score,
        "twinPValue": view.twin_p_value,
        "lineage": view.lineage,
    }
    return ExperimentResourceStatus.model_validate(
        {name: value for name, value in found.items() if value is not None}
    )


def improvement_shown(view: ExperimentAnswer) -> float | None:
    """The Improvement column, over the base model's score on the split of the Best column's
    (:func:`result_text`): sealed, the final's over the baseline on test once it is scored (as
    results.csv has it), before that the best on validation's over the baseline there."""
    final = view.final
    if view.feedback == Feedback.SEALED and final is not None and final.final_score is not None:
        return None if view.baseline_score is None else final.final_score - view.baseline_score
    return view.improvement


def result_text(view: ExperimentAnswer) -> str | None:
    """The Best column: the score on the test split with its 95 % interval (test mode: the best
    submission; sealed: the final evaluation), else, sealed, the best on validation so far."""
    final = view.final
    sealed = view.feedback == Feedback.SEALED
    if final is not None and final.final_score is not None:
        text = f"{final.final_score:.2f}"
        if final.final_interval:
            text += f" [{final.final_interval[0]:.2f}, {final.final_interval[1]:.2f}]"
        return text + (" on test" if sealed else "")
    if view.best_score is None:
        return None
    return f"{view.best_score:.2f}" + (" on validation" if sealed else "")


def final_status(view: ExperimentAnswer) -> ExperimentResourceStatus:
    """The result on the test split (docs/PROTOCOL.md) as Experiment status fields: results.csv's
    columns ``feedback`` to ``test_evaluations`` (autorl.protocol.final.result_columns)."""
    final = view.final
    interval = final.final_interval if final is not None else None
    return ExperimentResourceStatus(
        feedback=view.feedback,
        finalScore=final.final_score if final is not None else None,
        finalLow=interval[0] if interval else None,
        finalHigh=interval[1] if interval else None,
        finalSelection=final.made_selection if final is not None else None,
        testEvaluations=view.test_evaluations,
    )


def changed(current: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    """The part of ``update`` that differs from ``current`` (a status patch of nothing is not sent)."""
    return {key: value for key, value in update.items() if current.get(key) != value}
