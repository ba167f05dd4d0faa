"""What scoring an experiment's final on the twin split needs from the store (docs/PROTOCOL.md).

The final (the best on test, the nominated one, or the best on validation) and the base model are
scored once on the twins of the test problems the final was scored on; their per-problem results on
those problems pair with the twins'. Read by whoever takes the final's snapshot (``autorl run``, or
on a cluster the grader, which reads the workspace) and by the evaluator that scores the twins.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.orm import Session

from autorl.checkpoints.snapshot import Snapshot, remove_snapshot, snapshot_submission
from autorl.errors import CheckpointError
from autorl.eval_config import EvalConfig
from autorl.protocol.final import final_result
from autorl.provenance.unverified import MAX_REASON_CHARS
from autorl.store import Experiment, Split, Submission, submissions
from autorl.untrusted_text import printable_within


class NoTwinScore(Exception):
    """Why the final cannot be scored on the twins (said, not fatal: the run's scores stand)."""


class FinalChanged(NoTwinScore):
    """The final's folder no longer holds what was scored (the agent removed or changed it): the
    twin split is unverified, not merely not applicable. Its text quotes the agent's strings
    escaped and shortened (autorl.untrusted_text.printable_within)."""


@dataclass(frozen=True)
class TwinInputs:
    task: str
    #: The final's and the base model's per-problem results on the test split (autorl.protocol.statistics).
    final_test: str
    base_test: str
    #: The final's files: where the agent left them, and the fingerprint they were scored under.
    model_path: str
    fingerprint: str
    workspace: Path
    output_dir: Path
    base_dir: Path
    config: EvalConfig


def twin_inputs(session: Session, experiment: Experiment) -> TwinInputs:
    """The final and the baseline of ``experiment`` as the twin scoring takes them; NoTwinScore
    says why there is nothing to score."""
    final = final_result(session, experiment)
    if final is None or not final.scored:
        raise NoTwinScore("no final was scored on the test split")
    evaluation = session.get(Submission, final.submission_id)
    chosen = session.get(Submission, final.of)
    baseline = submissions.baseline_submission(session, experiment, Split.TEST)
    if evaluation is None or chosen is None or baseline is None:
        raise NoTwinScore("the final or the baseline is not in the store")
    if not (evaluation.correctness and baseline.correctness):
        raise NoTwinScore("the final's or the baseline's per-problem results were not kept")
    return TwinInputs(
        task=experiment.task,
        final_test=evaluation.correctness,
        base_test=baseline.correctness,
        model_path=chosen.model_path,
        fingerprint=chosen.fingerprint,
        workspace=Path(experiment.workspace),
        output_dir=Path(experiment.output_dir),
        base_dir=Path(experiment.base_model_dir),
        config=EvalConfig.model_validate(dict(experiment.eval_config)),
    )


def snapshot_final(inputs: TwinInputs, root: Path) -> Snapshot:
    """The final's files taken again from the agent's folder into ``root``; FinalChanged where they
    can no longer be read or are no longer the files that were scored."""
    try:
        snapshot = snapshot_submission(
            inputs.model_path,
            workspace=inputs.workspace,
            output_dir=inputs.output_dir,
            base_model_dir=inputs.base_dir,
            snapshot_root=root,
        )
    except CheckpointError as exc:
        why = printable_within(str(exc), MAX_REASON_CHARS)
        raise FinalChanged(f"the final's folder can no longer be read: {why}") from exc
    if not snapshot.holds(inputs.fingerprint):
        remove_snapshot(snapshot.path)
        raise FinalChanged("the final's folder no longer holds the files that were scored")
    return snapshot
