"""After the agent: the run's final checkpoint and the base model scored once on the twin split.

The final's files are snapshotted again from the agent's folder (they must still be the files that
were scored) and scored, with the base model, by
:func:`autorl_evaluator.provenance.score_twin_split`, as a cluster's evaluators score them.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from autorl.checkpoints.snapshot import snapshot_submission
from autorl.errors import CheckpointError
from autorl.provenance.final_twin import FinalChanged, twin_inputs
from autorl.store import Database, experiments
from autorl_evaluator.provenance import TwinResult, score_twin_split
from autorl_evaluator.settings import WorkerSettings


def score_twins(name: str, settings: WorkerSettings) -> TwinResult:
    """Evaluate experiment ``name``'s final and its base model on the twins of the test problems
    its final was scored on; NoTwinScore says why not (FinalChanged: the final's folder no longer
    holds what was scored, which leaves the twin split unverified)."""
    db = Database(settings.database_url)
    try:
        with db.read_session() as session:
            inputs = twin_inputs(session, experiments.get_experiment(session, name))
    finally:
        db.dispose()
    settings.eval_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="twins-", dir=settings.eval_dir) as root:
        try:
            snapshot = snapshot_submission(
                inputs.model_path,
                workspace=inputs.workspace,
                output_dir=inputs.output_dir,
                base_model_dir=inputs.base_dir,
                snapshot_root=Path(root),
            )
        except CheckpointError as exc:
            raise FinalChanged(f"the final's folder can no longer be read: {exc}") from exc
        if not snapshot.holds(inputs.fingerprint):
            raise FinalChanged("the final's folder no longer holds the files that were scored")
        return score_twin_split(inputs, snapshot.path, settings, Path(root))
