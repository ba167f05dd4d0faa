"""After the agent: the run's final checkpoint and the base model scored once on the twin split.

The final's files are snapshotted again from the agent's folder (they must still be the files that
were scored) and scored, with the base model, by
:func:`autorl_evaluator.provenance.score_twin_split`, as a cluster's evaluators score them.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from autorl.provenance.final_twin import snapshot_final, twin_inputs
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
        snapshot = snapshot_final(inputs, Path(root))
        return score_twin_split(inputs, snapshot.path, settings, Path(root))
