"""After the agent: the run's final checkpoint and the base model scored once on the twin split.

The twin split is the test problems the run was scored on, each with other numbers and its answer
recomputed (:mod:`autorl.provenance.twins`; the numbers drawn from a secret seed in evaluator
storage). A model that learned the public test set by heart scores well on the problems and not on
their twins; a base model that met the test set in pretraining shows the same gap, so the final's
gap is tested against the base model's (:func:`autorl.uncertainty.twin_gap_p_value`). Both are
evaluated by the worker's own code (:func:`autorl_evaluator.jobs.evaluate_snapshot`), from snapshots
taken now: the final's folder must still hold the files that were scored.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from autorl.checkpoints.snapshot import snapshot_base_model, snapshot_submission
from autorl.eval_config import EvalConfig
from autorl.provenance.twins import twin_for, twin_seed, twin_split
from autorl.runs.final_result import final_view
from autorl.store import Database, Split, Submission, SubmissionStatus, experiments, submissions
from autorl.tasks import get_task
from autorl.uncertainty import twin_gap_p_value
from autorl_evaluator.jobs import evaluate_snapshot, load_split, measured_config
from autorl_evaluator.settings import WorkerSettings


@dataclass(frozen=True)
class TwinResult:
    score: float  # the final's headline score on the twins, in percent
    p_value: float  # twin_gap_p_value
    twins: int  # problems with a twin, of the evaluated ones
    problems: int


class NoTwinScore(Exception):
    """Why the final cannot be scored on the twins (said, not fatal: the run's scores stand)."""


def score_twins(name: str, settings: WorkerSettings) -> TwinResult:
    """Evaluate experiment ``name``'s final and its base model on the twins of the test problems
    its final was scored on; NoTwinScore says why not."""
    db = Database(settings.database_url)
    try:
        with db.read_session() as session:
            experiment = experiments.get_experiment(session, name)
            final = final_view(session, experiment)
            if final is None or final.get("status") != SubmissionStatus.SCORED.value:
                raise NoTwinScore("no final was scored on the test split")
            evaluation = session.get(Submission, final["submission_id"])
            chosen = session.get(Submission, final["of"])
            baseline = submissions.baseline_submission(session, experiment, Split.TEST)
            if evaluation is None or chosen is None or baseline is None:
                raise NoTwinScore("the final or the baseline is not in the store")
            if not (evaluation.correctness and baseline.correctness):
                raise NoTwinScore("the final's or the baseline's per-problem results were not kept")
            final_test, base_test = evaluation.correctness, baseline.correctness
            model_path, fingerprint = chosen.model_path, chosen.fingerprint
            workspace, output_dir = Path(experiment.workspace), Path(experiment.output_dir)
            base_dir, task_name = Path(experiment.base_model_dir), experiment.task
            config = EvalConfig.model_validate(dict(experiment.eval_config))
    finally:
        db.dispose()
    task = get_task(task_name)
    problems = load_split(task, Split.TEST, settings)[: len(final_test)]
    twins = twin_split(problems, twin_seed(settings.eval_dir / "data" / task.name), twin=twin_for(task.name))
    kept = [index for index, twin in enumerate(twins) if twin is not None]
    if not kept:
        raise NoTwinScore("no test problem has a twin")
    split = [twin for twin in twins if twin is not None]
    evaluated = measured_config(config.model_copy(update={"limit": None}), split, settings)
    settings.eval_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="twins-", dir=settings.eval_dir) as root:
        snapshot = snapshot_submission(
            model_path,
            workspace=workspace,
            output_dir=output_dir,
            base_model_dir=base_dir,
            snapshot_root=Path(root),
        )
        if snapshot.fingerprint != fingerprint:
            raise NoTwinScore("the final's folder no longer holds the files that were scored")
        base = snapshot_base_model(base_dir, Path(root))
        final_twin = evaluate_snapshot(snapshot.path, task, split, evaluated, settings)
        base_twin = evaluate_snapshot(base.path, task, split, evaluated, settings)
    p_value = twin_gap_p_value(
        "".join(final_test[i] for i in kept),
        final_twin.correctness,
        "".join(base_test[i] for i in kept),
        base_twin.correctness,
    )
    return TwinResult(
        score=final_twin.result.scores[config.protocol],
        p_value=p_value,
        twins=len(kept),
        problems=len(problems),
    )
