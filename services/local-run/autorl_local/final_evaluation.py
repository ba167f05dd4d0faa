"""A sealed run's one evaluation on the test split, as `autorl run` asks for it after its agent."""

from __future__ import annotations

from collections.abc import Callable

from autorl.api.admin_client import AdminClient
from autorl.api.answers import ExperimentAnswer
from autorl.untrusted_text import printable_within


def evaluate_final(
    admin: AdminClient,
    name: str,
    *,
    wait: Callable[[], ExperimentAnswer | None],
    phase: Callable[[str], None],
    note: Callable[[str], None],
) -> ExperimentAnswer | None:
    """Ask the grader for the final evaluation (of the nomination, else the best on validation)
    and ``wait`` for it (``wait`` answers the experiment's view once nothing is in flight or its
    own time is up). After a failed final it is asked for again: the grader makes it again of the
    same submission when the failure was the platform's (before the test split was loaded, or the
    evaluator's own fault) and its attempts allow, and otherwise answers the one it has, which ends
    this. Returns the last view."""
    made: list[int] = []
    failure = ""
    while True:
        view = admin.final(name)
        final = view.final
        if final is None or final.submission_id is None:
            note("final evaluation: nothing was scored on validation")
            return view
        if final.submission_id in made:  # no new one: this is the result
            return view
        if made:
            note(
                f"final evaluation {made[-1]} failed ({failure}), not for the checkpoint's own "
                f"reasons: evaluating submission {final.of} on the test split again"
            )
        made.append(final.submission_id)
        phase(f"evaluating submission {final.of} ({final.selection}) on the test split, once")
        ended = wait()
        last = None if ended is None else ended.final
        if last is None or last.status != "failed":
            return ended
        failure = printable_within(last.error or "no error recorded", 300)
