"""Why an experiment is where it is: one machine-readable reason per state, shared by every surface.

The controller writes these into ``Experiment.status.reason`` (next to a message for a person that
says what it waits for and what to do), the grader's admin API answers the evaluator side of them
(``waiting``), and ``autorl run``, ``autorl results`` and the dashboard show the same words.
docs/KUBERNETES.md ("Troubleshooting") lists every reason; a test keeps that list complete.
"""

from __future__ import annotations

from enum import StrEnum


class Reason(StrEnum):
    # --- Pending / Preparing, and the agent pod in Running ------------------------------------------
    ACCEPTED = "Accepted"
    PREPARING = "Preparing"
    JOB_SUSPENDED = "JobSuspended"
    POD_CREATE_FAILED = "PodCreateFailed"
    POD_STARTING = "PodStarting"
    UNSCHEDULABLE = "Unschedulable"
    IMAGE_PULL_FAILED = "ImagePullFailed"
    CONTAINER_CONFIG_ERROR = "ContainerConfigError"
    CRASH_LOOP_BACK_OFF = "CrashLoopBackOff"
    # --- Baseline: the grader's side ---------------------------------------------------------------
    WAITING_FOR_EVALUATOR = "WaitingForEvaluator"
    EVALUATORS_UNAVAILABLE = "EvaluatorsUnavailable"
    EVALUATING_BASELINE = "EvaluatingBaseline"
    # --- Running / Finishing ------------------------------------------------------------------------
    TRAINING = "Training"
    EVALUATIONS_IN_FLIGHT = "EvaluationsInFlight"
    # --- final phases -------------------------------------------------------------------------------
    COMPLETED = "Completed"
    BUDGET_EXHAUSTED = "BudgetExhausted"
    AGENT_FAILED = "AgentFailed"
    INVALID_SPEC = "InvalidSpec"
    PREPARE_FAILED = "PrepareFailed"
    BASELINE_FAILED = "BaselineFailed"
    GRADER_REFUSED = "GraderRefused"
    KUBERNETES_REFUSED = "KubernetesRefused"
    ID_COLLISION = "IdCollision"
    EXPERIMENT_LOST = "ExperimentLost"


#: The condition an Experiment carries while its baseline waits for an evaluator that is not there.
EVALUATORS_UNAVAILABLE_CONDITION = "EvaluatorsUnavailable"

#: What to do when no evaluator takes work.
EVALUATOR_FIX = (
    "start an evaluator: on Kubernetes check the evaluator pods "
    "(kubectl get pods -l app.kubernetes.io/component=evaluator: a GPU node for them, their image, "
    "their logs); on one machine run `autorl worker` against the same database"
)


def reason_named(name: str, default: Reason) -> Reason:
    """The reason of that name; a name this version does not know (a newer grader's) reads as
    ``default``, and the message beside it still says why."""
    return Reason(name) if name in {member.value for member in Reason} else default


def evaluators_phrase(evaluators: int, backend: str) -> str:
    """'2 evaluators take hf work' / 'no evaluator takes hf work'."""
    if evaluators == 0:
        return f"no evaluator takes {backend} work"
    noun = "evaluator takes" if evaluators == 1 else "evaluators take"
    return f"{evaluators} {noun} {backend} work"


def baseline_wait(
    *, position: int, evaluators: int, backend: str, waited_s: float, unavailable_after_s: float
) -> tuple[Reason, str]:
    """The reason and message of a baseline that no evaluator has taken yet.

    ``EvaluatorsUnavailable`` once it waited ``unavailable_after_s`` with no evaluator alive for its
    backend; until then, or while evaluators are alive (busy with earlier work), ``WaitingForEvaluator``.
    """
    where = f"queue position {position}" if position > 0 else "queued"
    who = evaluators_phrase(evaluators, backend)
    waited = f"waited {format_duration(waited_s)}"
    if evaluators == 0 and waited_s >= unavailable_after_s:
        return (
            Reason.EVALUATORS_UNAVAILABLE,
            f"the base model waits for an evaluator ({where}, {waited}) and {who}; {EVALUATOR_FIX}",
        )
    busy = "; evaluators take baselines first" if evaluators else ""
    return (
        Reason.WAITING_FOR_EVALUATOR,
        f"the base model waits for an evaluator ({where}, {waited}; {who}{busy})",
    )


def format_duration(seconds: float) -> str:
    """A short duration: 45s, 12m, 1h05m."""
    whole = max(0, int(seconds))
    if whole < 60:
        return f"{whole}s"
    minutes = whole // 60
    if minutes < 60:
        return f"{minutes}m"
    return f"{minutes // 60}h{minutes % 60:02d}m"
