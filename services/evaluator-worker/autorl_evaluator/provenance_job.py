"""The cluster's provenance check: `check_provenance(experiment_id)`, a queue job of its own.

Once a cluster experiment is closed (its agent has ended and cannot react; its final chosen and
scored), the grader copies the agent's text files out of the workspace into the snapshot volume and,
where a final was scored, snapshots the final again from the agent's folder, checked against the
fingerprint it was scored under (:mod:`autorl.provenance.agent_copy`; the evaluators mount no
workspace). This job, on an evaluator (it holds the test split):

* reads the copy (``code/``, ``output/``, the rest of the workspace) for the test split's
  questions, and sealed, the validation split's
  (:func:`autorl_evaluator.provenance.read_agent_files`, the rule of ``autorl run``); the files
  and counts go to ``AUTORL_EVAL_DIR/provenance/<experiment>.json``, never a question;
* scores the final and the base model once on the twin split
  (:func:`autorl_evaluator.provenance.score_twin_split`);
* records ``test_overlap``, ``twin_score`` and ``twin_p_value`` in the store together, and what
  could not be verified as a note in the experiment's message (:mod:`autorl.provenance.unverified`:
  a copy or read that reached a budget or left files unread, a final whose folder no longer holds
  what was scored, a twin evaluation that failed); a recorded ``test_overlap`` or note means the
  check is done.

A custom agent image's own files are not read on a cluster: they are in the image, which no
platform pod runs; only what the agent left in its workspace is. Safe to run twice: a
recorded check is not made again.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import Any

from autorl.errors import AutoRLError
from autorl.provenance.agent_area import LABELS
from autorl.provenance.agent_copy import FILES, copy_unverified, provenance_folder, read_manifest
from autorl.provenance.final_twin import NoTwinScore, TwinInputs, twin_inputs
from autorl.provenance.unverified import TEST_UNVERIFIED, TWIN_UNVERIFIED, check_made, note, with_notes
from autorl.store import Database, Experiment, Feedback, experiments
from autorl.tasks import get_task
from autorl_evaluator.provenance import TwinResult, read_agent_files, score_twin_split
from autorl_evaluator.settings import WorkerSettings

log = logging.getLogger("autorl.evaluator.provenance")


class CopyNotReadyError(AutoRLError):
    """The grader's copy of the agent's files is not (or no longer) in the snapshot volume."""


def check_provenance(experiment_id: int, settings: WorkerSettings | None = None) -> dict[str, Any]:
    """Check one closed experiment; its outcome as a small dict (the queue's job result)."""
    settings = settings or WorkerSettings()
    db = Database(settings.database_url)
    try:
        return _check(db, experiment_id, settings)
    finally:
        db.dispose()


def _check(db: Database, experiment_id: int, settings: WorkerSettings) -> dict[str, Any]:
    with db.read_session() as session:
        experiment = session.get(Experiment, experiment_id)
        if experiment is None:
            return {"experiment_id": experiment_id, "status": "gone"}
        if check_made(experiment.test_overlap, experiment.message):
            return {"experiment_id": experiment_id, "status": "done"}
        name, task_name = experiment.name, experiment.task
        sealed = experiment.feedback == Feedback.SEALED
        inputs: TwinInputs | None = None
        why = ""
        try:
            inputs = twin_inputs(session, experiment)
        except NoTwinScore as exc:
            why = str(exc)
    folder = settings.snapshot_dir / provenance_folder(experiment_id)
    manifest = read_manifest(folder)
    if manifest is None:
        # The grader copies before it queues this job; a copy pruned since is made again when the
        # controller asks once more.
        raise CopyNotReadyError(f"no complete copy of experiment {name!r}'s files in {folder}")
    twins: TwinResult | None = None
    twin_unverified = ""
    final = manifest.get("final")
    if inputs is not None and isinstance(final, str) and final:
        try:
            with tempfile.TemporaryDirectory(prefix="twins-", dir=_scratch_root(settings)) as scratch:
                twins = score_twin_split(inputs, folder / final, settings, Path(scratch))
            why = f"scored on {twins.twins} twins of {twins.problems} test problems"
        except NoTwinScore as exc:
            why = str(exc)
        except (AutoRLError, OSError, ValueError) as exc:  # the platform's: the run's scores stand
            why = f"could not be scored: {type(exc).__name__}: {exc}"
            twin_unverified = "the twin evaluation failed (the record in evaluator storage says why)"
            log.warning("event=twins_failed experiment=%d error_type=%s", experiment_id, type(exc).__name__)
    elif inputs is not None:
        why = str(manifest.get("final_note") or "the grader took no snapshot of the final")
        twin_unverified = why
    copied = manifest.get("copied")
    notes = {
        "copy": copied,
        "not_read": "a custom image's own files (only the agent's workspace is copied)",
        "twins": {"score": twins.score, "p_value": twins.p_value, "note": why} if twins else {"note": why},
    }
    read = read_agent_files(
        get_task(task_name),
        settings,
        run_id=name,
        roots=[folder / FILES / label for label in LABELS],
        sealed=sealed,
        notes=notes,
        incomplete=copy_unverified(copied),
    )
    test_overlap = read.counts["test"]
    # Checked, complete or not: a note says what could not be verified (docs/PROTOCOL.md); a count
    # found in an incomplete read is a lower bound and is recorded too.
    unverified = [
        note(TEST_UNVERIFIED, read.unverified) if read.unverified else "",
        note(TWIN_UNVERIFIED, twin_unverified) if twin_unverified else "",
    ]
    with db.session() as session:
        experiment = experiments.get_experiment(session, name, for_update=True)
        experiments.record_provenance(
            session,
            experiment,
            test_overlap=test_overlap,
            twin_score=twins.score if twins else None,
            twin_p_value=twins.p_value if twins else None,
        )
        experiment.message = with_notes(experiment.message, filter(None, unverified))
    log.info(
        "event=provenance_checked experiment=%d test_overlap=%s complete=%s twins=%s record=%s",
        experiment_id,
        test_overlap,
        not read.unverified,
        "scored" if twins else "none",
        read.record,
    )
    return {"experiment_id": experiment_id, "status": "checked", "test_overlap": test_overlap}


def _scratch_root(settings: WorkerSettings) -> Path:
    settings.eval_dir.mkdir(parents=True, exist_ok=True)
    return settings.eval_dir
