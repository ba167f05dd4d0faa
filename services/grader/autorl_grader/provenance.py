"""A cluster's check of what a closed experiment's agent brought in (docs/PROTOCOL.md).

The evaluators hold the test split and mount no workspace; this grader reads the workspace. So once
the experiment is closed (the agent has ended and cannot react, the final is chosen and scored),
:func:`begin_provenance` copies the agent's text files of ``code/``, ``output/`` and the rest of
its workspace into the snapshot volume (:mod:`autorl.provenance.agent_copy`: no link followed, only
regular files, within the scan's caps), snapshots the final again from the agent's folder where one
was scored (refused unless its files are still the ones scored), and queues the evaluator's check
(:mod:`autorl_evaluator.provenance_job`), which records ``test_overlap`` (and the twin split's
``twin_score``, ``twin_p_value``) when done. Copies are made one at a time per experiment, under
the lease a submission's copy takes; asked again, it queues the check again unless it is recorded.
"""

from __future__ import annotations

import logging
import shutil
import uuid
from pathlib import Path
from typing import Any

from sqlalchemy import select

from autorl.checkpoints.snapshot import remove_snapshot
from autorl.errors import ConflictError
from autorl.provenance.agent_area import agent_area
from autorl.provenance.agent_copy import provenance_folder, publish, read_manifest, stage_copy
from autorl.provenance.final_twin import FinalChanged, NoTwinScore, TwinInputs, snapshot_final, twin_inputs
from autorl.provenance.unverified import TEST_UNVERIFIED, check_made
from autorl.store import Experiment, experiments
from autorl.store.models import ExperimentStatus
from autorl_grader.state import GraderState

log = logging.getLogger("autorl.grader")

#: The check's job runs the twin split twice (the final and the base model) and reads the files.
CHECK_EVALUATIONS = 3


def begin_provenance(state: GraderState, name: str) -> bool:
    """Copy a closed experiment's files for its check and queue the check; True when the check is
    recorded or queued, False while another grader copies or no queue takes it."""
    holder = uuid.uuid4().hex
    with state.db.session() as session:
        experiment = experiments.get_experiment(session, name, for_update=True)
        if experiment.status in (ExperimentStatus.PENDING, ExperimentStatus.RUNNING):
            raise ConflictError(
                f"experiment {name!r} is {experiment.status.value}: its files are checked once it is "
                "finished (POST /v1/experiments/{name}/finish), when its agent can no longer react"
            )
        folder = state.settings.snapshot_dir / provenance_folder(experiment.id)
        if check_made(experiment.test_overlap, experiment.message):
            remove_snapshot(folder)
            return True
        if not experiments.take_snapshot_lease(experiment, holder, state.settings.snapshot_lease_s):
            return False
        experiment_id = experiment.id
        workspace = Path(experiment.workspace)
        try:
            inputs: TwinInputs | None = twin_inputs(session, experiment)
            no_final = ""
        except NoTwinScore as exc:
            inputs, no_final = None, str(exc)
    try:
        if read_manifest(folder) is None:
            _copy(workspace, folder, inputs, no_final)
        timeout_s = CHECK_EVALUATIONS * state.settings.eval_timeout_s
        return state.dispatcher.dispatch_provenance(experiment_id, timeout_s)
    finally:
        with state.db.session() as session:
            experiments.release_snapshot_lease(session, experiment_id, holder)


def remove_checked_copies(state: GraderState) -> list[str]:
    """Remove the copies whose check is recorded (the reconciler's pass; the evaluators, which
    read the snapshot volume only, cannot). What was removed, by folder name."""
    root = state.settings.snapshot_dir
    ids: dict[int, Path] = {}
    if root.is_dir():
        for entry in root.iterdir():
            prefix, _, number = entry.name.rpartition("-")
            if prefix == "provenance" and number.isdigit() and entry.name == provenance_folder(int(number)):
                ids[int(number)] = entry
    if not ids:
        return []
    with state.db.read_session() as session:
        checked = set(
            session.scalars(
                select(Experiment.id).where(
                    Experiment.id.in_(ids),
                    Experiment.test_overlap.is_not(None)
                    | Experiment.message.contains(f"{TEST_UNVERIFIED}: ", autoescape=True),
                )
            )
        )
    for experiment_id in checked:
        remove_snapshot(ids[experiment_id])
    return sorted(ids[experiment_id].name for experiment_id in checked)


def _copy(workspace: Path, folder: Path, inputs: TwinInputs | None, no_final: str) -> None:
    # The base model's mount point holds nothing in the grader's view of the workspace.
    area = agent_area(workspace)
    staging, copied = stage_copy(area.roots, folder, leave_out=area.leave_out)
    manifest: dict[str, Any] = {"copied": copied.to_json(), "final": None, "final_note": no_final}
    try:
        if inputs is not None:
            manifest.update(_final_snapshot(inputs, staging))
        publish(staging, folder, manifest)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    log.info(
        "event=provenance_copied folder=%s files=%d bytes=%d final=%s",
        folder.name,
        copied.files,
        copied.bytes,
        manifest["final"] or "-",
    )


def _final_snapshot(inputs: TwinInputs, staging: Path) -> dict[str, Any]:
    """The final's files taken again into ``staging`` (its name there), or why not."""
    try:
        return {"final": snapshot_final(inputs, staging).name}
    except FinalChanged as exc:
        return {"final_note": str(exc)}
