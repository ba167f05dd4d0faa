"""After the agent has ended: what it may have brought in, found where the test split is.

Shared by ``autorl run`` (autorl_local) and a cluster's evaluators
(:mod:`autorl_evaluator.provenance_job`):

* :func:`read_agent_files`: the agent's text files read for the test split's questions (and, in
  sealed mode, the validation split's) with :mod:`autorl.provenance.overlap`. The counts go to the
  store (results.csv ``test_overlap``); the files and counts, never a question, to a record in
  evaluator storage for the operator (:data:`RECORDS_DIR`). The files are read in a process of
  their own under a hard memory limit (:mod:`autorl.provenance.scan_process`): an agent's file
  cannot spend this process's memory, and a read that ended early is unverified, never clean.
* :func:`score_twin_split`: the final checkpoint and the base model scored once on the twin split,
  the test problems the final was scored on with other numbers and their answers recomputed
  (:mod:`autorl.provenance.twins`; the numbers drawn from a secret seed in evaluator storage). A
  model that learned the public test set by heart scores well on the problems and not on their
  twins; a base model that met the test set in pretraining shows the same gap, so the final's gap is
  tested against the base model's (:func:`autorl.protocol.statistics.twin_gap_p_value`). Both are
  evaluated by the worker's own code (:func:`autorl_evaluator.jobs.evaluate_snapshot`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autorl.checkpoints.snapshot import snapshot_base_model
from autorl.protocol.statistics import twin_gap_p_value
from autorl.provenance.final_twin import NoTwinScore, TwinInputs
from autorl.provenance.overlap import MAX_FILE_BYTES, OverlapIndex, normalize
from autorl.provenance.scan_process import scan_files_apart
from autorl.provenance.twins import twin_for, twin_seed, twin_split
from autorl.settings import EvaluationSettings
from autorl.store import Split
from autorl.tasks import get_task
from autorl.tasks.base import Task
from autorl_evaluator.jobs import evaluate_snapshot, load_split, measured_config
from autorl_evaluator.settings import WorkerSettings

#: Evaluator storage's folder of the records, one ``<experiment name>.json`` an experiment.
RECORDS_DIR = "provenance"


@dataclass(frozen=True)
class AgentFiles:
    """What :func:`read_agent_files` found."""

    #: Problems found by split name; None where the read was not complete and found none (a
    #: count found in an incomplete read is a lower bound, still a finding).
    counts: dict[str, int | None]
    #: Why the read is not complete (autorl.provenance.unverified), else "".
    unverified: str
    record: Path


def read_agent_files(
    task: Task,
    settings: EvaluationSettings,
    *,
    run_id: str,
    roots: list[Path] | dict[str, Path],
    sealed: bool,
    leave_out: tuple[Path, ...] = (),
    program: Path | None = None,
    notes: dict[str, Any] | None = None,
    incomplete: str = "",
) -> AgentFiles:
    """The problems of each split found in the files under ``roots`` (less ``leave_out``,
    :func:`autorl.provenance.scan_process.scan_files_apart`) and in ``program`` (by split name),
    read in one pass for all splits, and the operator's record of which files hold how many
    (with ``notes`` beside them). ``incomplete`` says why the files given are already not all of
    them (a copy that stopped early)."""
    data_dir, source_dir = settings.eval_dir / "data", settings.data_source_dir
    splits = {"test": task.load_test_problems(data_dir, source_dir=source_dir)}
    if sealed:
        splits["validation"] = task.load_validation_problems(data_dir, source_dir=source_dir)
    folders = roots.values() if isinstance(roots, dict) else roots
    record: dict[str, object] = {"run_id": run_id, "roots": [str(root) for root in folders], **(notes or {})}
    text = _program_text(program)
    questions = [problem.question for problems in splits.values() for problem in problems]
    index = OverlapIndex(questions)
    report = scan_files_apart(roots, index, leave_out=leave_out)
    in_program = index.find(normalize(text)) if text else set()
    unverified = "; ".join(filter(None, [incomplete, report.unverified()]))
    counts: dict[str, int | None] = {}
    start = 0
    for split, problems in splits.items():
        stop = start + len(problems)
        part = report.part(start, stop)
        in_split = {i - start for i in in_program if start <= i < stop}
        found = part.found | in_split
        counts[split] = len(found) if found or not unverified else None
        record[split] = {
            **part.to_json(),
            "program": {"path": str(program), "problems": len(in_split)},
        }
        start = stop
    record["unverified"] = unverified
    return AgentFiles(counts, unverified, write_record(settings, run_id, record))


def write_record(settings: EvaluationSettings, name: str, record: dict[str, Any]) -> Path:
    """``record`` as the operator's file of experiment ``name`` in evaluator storage."""
    path = settings.eval_dir / RECORDS_DIR / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        json.dump(record, handle, indent=1)
    return path


def _program_text(program: Path | None) -> str:
    if program is None:
        return ""
    try:
        descriptor = os.open(program, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return ""
    with os.fdopen(descriptor, "rb") as handle:
        return handle.read(MAX_FILE_BYTES).decode("utf-8", errors="replace")


@dataclass(frozen=True)
class TwinResult:
    score: float  # the final's headline score on the twins, in percent
    p_value: float  # twin_gap_p_value
    twins: int  # problems with a twin, of the evaluated ones
    problems: int


def score_twin_split(
    inputs: TwinInputs, final_dir: Path, settings: WorkerSettings, scratch: Path
) -> TwinResult:
    """Evaluate the final (its snapshot in ``final_dir``) and the base model (snapshotted into
    ``scratch``) on the twins of the test problems the final was scored on; NoTwinScore says why not."""
    task = get_task(inputs.task)
    problems = load_split(task, Split.TEST, settings)[: len(inputs.final_test)]
    twins = twin_split(problems, twin_seed(settings.eval_dir / "data" / task.name), twin=twin_for(task.name))
    kept = [index for index, twin in enumerate(twins) if twin is not None]
    if not kept:
        raise NoTwinScore("no test problem has a twin")
    split = [twin for twin in twins if twin is not None]
    evaluated = measured_config(inputs.config.model_copy(update={"limit": None}), split, settings)
    base = snapshot_base_model(inputs.base_dir, scratch)
    final_twin = evaluate_snapshot(final_dir, task, split, evaluated, settings)
    base_twin = evaluate_snapshot(base.path, task, split, evaluated, settings)
    p_value = twin_gap_p_value(
        "".join(inputs.final_test[i] for i in kept),
        final_twin.correctness,
        "".join(inputs.base_test[i] for i in kept),
        base_twin.correctness,
    )
    return TwinResult(
        score=final_twin.result.scores[inputs.config.protocol],
        p_value=p_value,
        twins=len(kept),
        problems=len(problems),
    )
