"""A check after the agent that could not be made whole is said as unverified, with its reason, on
every surface that shows the checks (autorl.provenance.unverified): the summary of ``autorl run``,
the controller's closing message, the controller's wait where it may not read pods."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

from autorl.provenance.unverified import (
    TEST_UNVERIFIED,
    TWIN_UNVERIFIED,
    check_made,
    note,
    notes_in,
    with_notes,
)
from autorl.runs.reports import provenance_lines
from autorl_controller.operator.handlers.reconcile import Step, summary
from autorl_controller.operator.kube import KubeError
from autorl_controller.operator.lifecycle import JobState, JobStatus, agent_outcome, iso
from tests.support.answers import experiment_answer

CAP = note(TEST_UNVERIFIED, "the scan stopped early (its 50-entry budget was reached); 2 file(s) unread")
DODGE = note(TWIN_UNVERIFIED, "the final's folder no longer holds the files that were scored")


def test_notes_ride_in_the_message_once_and_mark_the_check_made() -> None:
    message = with_notes("the agent finished within its budget", [CAP, DODGE])
    assert with_notes(message, [CAP]) == message
    assert notes_in(message) == [CAP, DODGE] and ";" not in CAP.removeprefix(TEST_UNVERIFIED)
    assert check_made(None, message) and check_made(0, None)
    assert not check_made(None, with_notes("done", [DODGE])) and not check_made(None, None)


def test_a_reason_cannot_make_a_note_of_its_own() -> None:
    # A separator of ';' and any white space (a line feed, a no-break space, a tab) in a reason
    # stays inside its note: no second note is read out of it, and the check is not marked made.
    for space in ("\n", "\t", "\xa0", "\u2028", "\u3000", "\x1c"):
        forged = note(TWIN_UNVERIFIED, f"the copy failed;{space}{TEST_UNVERIFIED}: forged")
        assert notes_in(with_notes("done", [forged])) == [forged]
        assert not check_made(None, with_notes("done", [forged]))


def test_the_run_summary_says_unverified_never_a_clean_zero() -> None:
    unread = provenance_lines({"test_overlap": None, "unverified": [CAP, DODGE]})
    assert unread[0].startswith("test overlap unverified: the scan stopped early (its 50-entry budget")
    assert (
        unread[1] == "twin split   unverified: the final's folder no longer holds the files that were scored"
    )
    lower_bound = provenance_lines({"test_overlap": 2, "unverified": [CAP]})
    assert (
        lower_bound[0].startswith("test overlap 2  ! test problems found")
        and "! unverified:" in lower_bound[0]
    )
    assert provenance_lines({"test_overlap": 0}) == ["test overlap 0"]


def test_the_closing_message_says_what_could_not_be_verified() -> None:
    outcome = agent_outcome(JobStatus(JobState.SUCCEEDED), past_deadline=False)
    assert outcome is not None
    noted = experiment_answer(message=with_notes(outcome.message, [CAP, DODGE]))
    message = summary(outcome, noted)
    assert CAP in message and DODGE in message
    never = summary(outcome, experiment_answer(), unchecked="the check was not recorded within 300 s")
    assert never.endswith(f"{TEST_UNVERIFIED}: the check was not recorded within 300 s")
    assert TEST_UNVERIFIED not in summary(outcome, experiment_answer(test_overlap=0))


def pod_wait(finished_ago_s: float) -> str:
    """What the check waits for where this controller's Role may not list pods (403)."""

    async def forbidden(*args: Any, **kwargs: Any) -> list[dict[str, Any]]:
        raise KubeError(403, "pods is forbidden")

    step = Step.__new__(Step)
    step.context = SimpleNamespace(kube=SimpleNamespace(list=forbidden))  # type: ignore[assignment]
    step.settings = SimpleNamespace(agent_stop_grace_s=30)  # type: ignore[assignment]
    step.ref = SimpleNamespace(namespace="ns", agent_job_name="job")  # type: ignore[assignment]
    finished = {"type": "AgentFinished", "status": "True", "reason": "Succeeded"}
    step.status = {"conditions": [{**finished, "lastTransitionTime": iso_ago(finished_ago_s)}]}
    return asyncio.run(step.agent_pod_wait())


def iso_ago(seconds: float) -> str:
    from datetime import UTC, datetime

    return iso(datetime.fromtimestamp(time.time() - seconds, UTC))


def test_pods_that_cannot_be_read_are_waited_for_through_their_grace_period() -> None:
    waiting = pod_wait(finished_ago_s=10)
    assert "cannot be read (403)" in waiting and "grace period (35 s)" in waiting
    assert pod_wait(finished_ago_s=60) == ""


def test_the_provenance_verified_condition_is_false_with_what_could_not_be_verified() -> None:
    from datetime import UTC, datetime

    from autorl_controller.operator.lifecycle import provenance_condition

    now = datetime.now(UTC)
    unverified = provenance_condition(experiment_answer(message=with_notes("done", [CAP])), "", now)
    assert (unverified["type"], unverified["status"], unverified["reason"]) == (
        "ProvenanceVerified",
        "False",
        "Unverified",
    )
    assert unverified["message"] == CAP
    late = provenance_condition(experiment_answer(), "the check was not recorded within 300 s", now)
    assert late["status"] == "False" and late["message"].startswith(TEST_UNVERIFIED)
    whole = provenance_condition(experiment_answer(test_overlap=0, message="done"), "", now)
    assert (whole["status"], whole["reason"]) == ("True", "Complete")
