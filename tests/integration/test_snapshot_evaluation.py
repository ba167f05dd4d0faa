"""What is evaluated is what was submitted: the grader's snapshot, never the agent's live folder.

Real grader (Postgres), the real job function with the ``hf`` backend on the tiny model. The
time-of-check tests change the agent's files right after the 202 and, through inotify, the moment
the grader or the evaluator opens a file; the score must be that of the submitted bytes or a
"files changed" refusal, never a load error of the new bytes, and a score is never reused for
other bytes. A chat template that fails only on test prompts gets a generic error: no test text.
"""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from autorl.errors import EVALUATOR_FAULT_PREFIX
from autorl.models.tiny import CHATML_TEMPLATE
from autorl.store import Database, experiments, outcomes, submissions
from autorl.tasks import get_task
from autorl_evaluator.failures import TEMPLATE_FAILURE
from autorl_evaluator.jobs import evaluate, predictions_path
from tests.support.checkpoints import edit_json
from tests.support.grading import (
    Grader,
    RegisteredExperiment,
    admin_headers,
    agent_get,
    copy_model,
    evaluating_settings,
    make_workspace,
    register,
    row_id,
    submit_accepted,
    submit_no_wait,
)
from tests.support.inotify import IN_ACCESS, IN_OPEN, watch
from tests.support.settings import DeploymentSettings

LIMIT = 2
MAX_NEW_TOKENS = 6
#: Passes the grader's dry render (a train question about Natalia), raises on every other
#: question with the question reversed: the old redaction of quoted test text missed exactly this.
SLY_TEMPLATE = (
    "{% for m in messages %}"
    "{% if loop.last and m['role'] == 'user' and 'Natalia' not in m['content'] %}"
    "{{ raise_exception(m['content']|reverse|join) }}{% endif %}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
LOOPING_TEMPLATE = (
    "{% if 'Natalia' not in messages[-1]['content'] %}{% for i in range(100000) %}"
    "{% for j in range(100000) %}{% endfor %}{% endfor %}{% endif %}" + CHATML_TEMPLATE
)


@pytest.fixture
def settings(make_settings: Callable[..., DeploymentSettings], pg_url: str) -> DeploymentSettings:
    return evaluating_settings(make_settings, pg_url, limit=LIMIT, max_new_tokens=MAX_NEW_TOKENS)


@pytest.fixture
def other_weights(tiny_base_model: Path, tmp_path: Path) -> Path:
    """Valid weights of the same architecture that generate differently: the base model's with
    the final norm negated, so every greedy pick becomes the least likely token."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(tiny_base_model / "model.safetensors")
    tensors["model.norm.weight"] = -tensors["model.norm.weight"]
    save_file(tensors, tmp_path / "other.safetensors", metadata={"format": "pt"})
    return tmp_path / "other.safetensors"


def completions(settings: DeploymentSettings, submission_id: int) -> list[str]:
    lines = predictions_path(settings, submission_id).read_text().splitlines()
    return [json.loads(line)["completion"] for line in lines]


def poison(checkpoint: Path, other_weights: Path) -> None:
    """Rewrite the agent's files in place: other weights, a hostile generation config."""
    with (checkpoint / "model.safetensors").open("r+b") as weights:
        weights.write(other_weights.read_bytes())
    (checkpoint / "generation_config.json").write_text(json.dumps({"max_new_tokens": 1, "eos_token_id": 7}))


def test_files_changed_after_the_202_are_not_what_is_evaluated(
    grading: Grader, experiment: RegisteredExperiment, other_weights: Path
) -> None:
    checkpoint = grading.copy(experiment, "a")
    original = {path.name: path.read_bytes() for path in checkpoint.iterdir()}
    first = submit_accepted(grading.client, experiment, "output/a")["submission_id"]
    first_id = row_id(grading.settings.database_url, experiment, first)
    poison(checkpoint, other_weights)
    # The evaluator never opens the agent's folder: it reads the snapshot.
    with watch(checkpoint, IN_OPEN | IN_ACCESS) as agent_files:
        result = evaluate(first_id, grading.settings)
        assert agent_files.events(timeout_s=0) == []
    assert result["status"] == "scored", result
    scored = agent_get(grading.client, experiment, f"/submissions/{first}")
    assert scored["status"] == "scored" and scored["error"] is None
    # The poisoned bytes are another model: evaluated on their own, never given the first score.
    poisoned = submit_no_wait(grading.client, experiment, "output/a").json()["submission_id"]
    assert agent_get(grading.client, experiment, f"/submissions/{poisoned}")["reused_from"] is None
    poisoned_id = row_id(grading.settings.database_url, experiment, poisoned)
    evaluate(poisoned_id, grading.settings)
    assert completions(grading.settings, poisoned_id) != completions(grading.settings, first_id)
    # The original bytes again: the first score, reused.
    for name, data in original.items():
        (checkpoint / name).write_bytes(data)
    again = submit_no_wait(grading.client, experiment, "output/a").json()["submission_id"]
    reused = agent_get(grading.client, experiment, f"/submissions/{again}")
    assert reused["reused_from"] == first and reused["score"] == scored["score"]


def test_files_changed_while_the_grader_copies_them_refuse_or_score_the_submitted_bytes(
    grading: Grader, experiment: RegisteredExperiment, other_weights: Path
) -> None:
    checkpoint = grading.copy(experiment, "b")
    original = (checkpoint / "model.safetensors").read_bytes()
    reference = submit_no_wait(grading.client, experiment, "output/b").json()["submission_id"]
    evaluate(row_id(grading.settings.database_url, experiment, reference), grading.settings)
    swapped = threading.Event()

    def swap_on_first_read() -> None:
        with watch(checkpoint, IN_OPEN | IN_ACCESS) as agent_files:
            ready.set()
            while not swapped.is_set():
                if any(name == "model.safetensors" for name, _ in agent_files.events(timeout_s=10)):
                    poison(checkpoint, other_weights)
                    swapped.set()

    ready = threading.Event()
    swapper = threading.Thread(target=swap_on_first_read, daemon=True)
    swapper.start()
    ready.wait(timeout=10)
    response = submit_no_wait(grading.client, experiment, "output/b")
    swapper.join(timeout=30)
    assert swapped.is_set()
    if response.status_code == 400:
        assert "changed while they were being submitted" in response.json()["detail"]
        return
    # Accepted: the snapshot holds the weights as they were when the grader opened them (the
    # swap may land between the open and the first read), never a mix. The original bytes reuse
    # the reference's score at once (200, final); other bytes are queued (202) on what was read.
    assert response.status_code in (200, 202), response.text
    submission_id = response.json()["submission_id"]
    body = agent_get(grading.client, experiment, f"/submissions/{submission_id}")
    if body["status"] == "queued":
        assert grading.settings.snapshot_dir is not None
        [snapshot] = [path for path in grading.settings.snapshot_dir.iterdir() if path.is_dir()]
        assert (snapshot / "model.safetensors").read_bytes() in (original, other_weights.read_bytes())
        assert (
            evaluate(row_id(grading.settings.database_url, experiment, submission_id), grading.settings)[
                "status"
            ]
            == "scored"
        )
    else:
        assert body["reused_from"] == reference


def test_agent_files_changed_while_the_evaluator_reads_change_nothing(
    grading: Grader, experiment: RegisteredExperiment, other_weights: Path
) -> None:
    checkpoint = grading.copy(experiment, "c")
    reference_dir = copy_model(checkpoint, experiment.output_dir / "c-reference")
    submission_id = row_id(
        grading.settings.database_url,
        experiment,
        submit_no_wait(grading.client, experiment, "output/c").json()["submission_id"],
    )
    assert grading.settings.snapshot_dir is not None
    [snapshot] = [path for path in grading.settings.snapshot_dir.iterdir() if path.is_dir()]
    swapped = threading.Event()

    def swap_when_the_evaluator_loads() -> None:
        with watch(snapshot, IN_OPEN) as snapshot_files:
            ready.set()
            for _ in range(60):
                if any(name == "model.safetensors" for name, _ in snapshot_files.events(timeout_s=1)):
                    poison(checkpoint, other_weights)
                    shutil.rmtree(reference_dir)
                    swapped.set()
                    return

    ready = threading.Event()
    swapper = threading.Thread(target=swap_when_the_evaluator_loads, daemon=True)
    swapper.start()
    ready.wait(timeout=10)
    result = evaluate(submission_id, grading.settings)
    swapper.join(timeout=30)
    assert swapped.is_set() and result["status"] == "scored", result
    # What was scored is the snapshot of the submitted bytes: a copy of the base model scores
    # exactly what the base model's own snapshot scores.
    base = grading.client.post(
        f"/v1/experiments/{experiment.name}/baseline", headers=admin_headers(grading.settings)
    ).json()
    evaluate(base["submission_id"], grading.settings)
    assert completions(grading.settings, submission_id) == completions(
        grading.settings, base["submission_id"]
    )
    assert not snapshot.exists(), "a scored submission's snapshot is removed"


@pytest.mark.parametrize("template", [SLY_TEMPLATE, LOOPING_TEMPLATE], ids=["raises", "loops"])
def test_a_template_failing_only_on_test_prompts_gets_a_generic_error(
    grading: Grader, tmp_path: Path, template: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A chat template that fails only on test prompts (the base model's: a submission's own is
    never evaluated, tests/unit/test_snapshot.py) is rendered under the limits, and what it says
    of a test question stays in evaluator storage. The template is the platform's, so its failure
    is the evaluator's: it does not count against the agent's limit."""
    base = Path(shutil.copytree(grading.base_model, tmp_path / "sly-base"))
    edit_json(base / "tokenizer_config.json", chat_template=template)
    experiment = register(grading.client, grading.settings, base, make_workspace(tmp_path / "own-template"))
    copy_model(base, experiment.output_dir / "sly", unique=True)
    submission_id = submit_accepted(grading.client, experiment, "output/sly")["submission_id"]
    evaluated = row_id(grading.settings.database_url, experiment, submission_id)
    from autorl_evaluator.backends.hf import backend as hf_backend

    loads: list[Path] = []
    monkeypatch.setattr(hf_backend, "_cold_load", lambda model_dir, *_: loads.append(model_dir))
    result = evaluate(evaluated, grading.settings)
    assert result["status"] == "failed"
    assert loads == []  # the prompts are rendered before the weights are loaded: no load was spent
    body = agent_get(grading.client, experiment, f"/submissions/{submission_id}")
    assert body["error"] == TEMPLATE_FAILURE
    assert body["error"].startswith(EVALUATOR_FAULT_PREFIX)
    assert limited(grading.settings, experiment) == 0  # the platform's failure
    answers = json.dumps(
        [
            agent_get(grading.client, experiment, f"/submissions/{submission_id}"),
            grading.client.get(f"{experiment.url_path}/scores").json(),
        ]
    )
    problems = get_task("gsm8k").load_test_problems(
        grading.settings.home / "probe", source_dir=grading.settings.data_source_dir
    )
    for problem in problems:
        for text in (problem.question, problem.question[::-1], problem.answer):
            for start in range(0, max(1, len(text) - 24), 12):
                assert text[start : start + 24] not in answers
    # The operator still has the whole story, in evaluator storage.
    assert grading.settings.eval_dir is not None
    detail = (grading.settings.eval_dir / "submissions" / str(evaluated) / "error.txt").read_text()
    assert "ChatTemplateError" in detail


def limited(settings: DeploymentSettings, experiment: RegisteredExperiment) -> int:
    db = Database(settings.database_url or "")
    try:
        with db.session() as session:
            return submissions.limited_submissions_count(
                session, experiments.get_experiment(session, experiment.name)
            )
    finally:
        db.dispose()


def test_an_evaluation_that_fails_before_the_test_split_is_read_is_the_evaluator_s_fault(
    grading: Grader, experiment: RegisteredExperiment
) -> None:
    """Set-up reads only what the grader already checked and stored (the snapshot, the recorded
    config, the task, the split): its failure is the platform's. The agent is told so, and the
    submission does not count against its limit."""
    grading.copy(experiment, "lost")
    lost = submit_no_wait(grading.client, experiment, "output/lost").json()["submission_id"]
    assert grading.settings.snapshot_dir is not None
    for snapshot in grading.settings.snapshot_dir.iterdir():
        shutil.rmtree(snapshot)  # gone from the evaluator's storage before the evaluation
    lost_id = row_id(grading.settings.database_url, experiment, lost)
    assert evaluate(lost_id, grading.settings)["status"] == "failed"
    error = agent_get(grading.client, experiment, f"/submissions/{lost}")["error"]
    assert error.startswith(f"{EVALUATOR_FAULT_PREFIX} (not your checkpoint's fault; it does not count"), (
        error
    )
    assert "could not be set up" in error and str(grading.settings.snapshot_dir) not in error
    assert grading.settings.eval_dir is not None  # the whole error, for the operator
    assert (grading.settings.eval_dir / "submissions" / str(lost_id) / "error.txt").read_text()
    assert limited(grading.settings, experiment) == 0
    grading.copy(experiment, "next")
    assert submit_no_wait(grading.client, experiment, "output/next").status_code == 202
    assert limited(grading.settings, experiment) == 1  # a submission of the agent's counts as ever


def test_the_reconciler_removes_snapshots_no_evaluation_needs(
    grading: Grader, experiment: RegisteredExperiment
) -> None:
    """Evaluators may mount the snapshots read-only: the grader removes those of final submissions,
    keeps those still queued, and removes folders nothing names once they are old."""
    import os
    import time

    from autorl.store import Database, FailureReason, experiments, submissions
    from autorl_grader.reconciler import reconcile_once

    assert grading.settings.snapshot_dir is not None
    grading.copy(experiment, "done")
    grading.copy(experiment, "waiting")
    done = row_id(
        grading.settings.database_url,
        experiment,
        submit_no_wait(grading.client, experiment, "output/done").json()["submission_id"],
    )
    submit_no_wait(grading.client, experiment, "output/waiting")
    orphan = grading.settings.snapshot_dir / "crashed-before-commit"
    orphan.mkdir()
    old = time.time() - 7200
    os.utime(orphan, (old, old))
    db = Database(grading.settings.database_url or "")
    with db.session() as session:  # failed without its worker, as after too many interrupted attempts
        assert outcomes.record_failure(session, done, error="interrupted", reason=FailureReason.INTERRUPTED)
    db.dispose()
    reconcile_once(grading.client.app.state.grader)  # type: ignore[attr-defined]
    with db.session() as session:
        rows = {
            row.id: row.snapshot
            for row in submissions.experiment_submissions(
                session, experiments.get_experiment(session, experiment.name)
            )
        }
    db.dispose()
    assert rows[done] is None
    [waiting_snapshot] = [name for name in rows.values() if name is not None]
    assert sorted(path.name for path in grading.settings.snapshot_dir.iterdir()) == [waiting_snapshot]
