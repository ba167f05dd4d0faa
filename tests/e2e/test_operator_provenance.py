"""What a cluster experiment's agent brought in, found after it ended: the real kopf operator
against the kmock emulator and a real grader (tests/support/kube_emulator.py), the test playing the
evaluator that takes the check (autorl_evaluator.provenance_job) as it plays the one that scores.

An agent that leaves test questions in its ``output/`` (one file plain, one under a name built to
break terminals; one more behind a link out of the workspace and a FIFO beside them) and one in a
folder of its own beside ``code/`` and ``output/`` gets
``testOverlap`` in its Experiment's status, the files and counts in evaluator storage (never a
question), and its final scored on the twin split; one that leaves train questions gets 0."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from autorl.layout import cached_model_subpath
from autorl.provenance import agent_copy
from autorl.provenance.agent_copy import provenance_folder, read_manifest
from autorl.store import Database, experiments, submissions
from autorl.tasks import get_task
from autorl.tasks.base import read_problems
from autorl_controller.operator.manifests import ExperimentRef
from autorl_evaluator.jobs import evaluate
from autorl_evaluator.provenance import RECORDS_DIR
from autorl_evaluator.provenance_job import check_provenance
from tests.support.grading import make_unique
from tests.support.hostile_files import nest_past_path_max
from tests.support.kube_emulator import (
    EXPERIMENTS,
    FIXTURE_DATA,
    JOBS,
    PODS,
    Platform,
    admin,
    complete,
    load_example,
    operator_platform,
)
from tests.support.settings import DeploymentSettings

pytestmark = pytest.mark.asyncio(loop_scope="module")

CHECKING = "checking the agent's files for test questions"
POD_RUNS = "waiting for the agent's pod to stop"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def platform(
    grader_settings: DeploymentSettings, grader_port: int, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Platform]:
    """The operator platform whose controller waits for the provenance check the test plays."""
    async with operator_platform(
        grader_settings, grader_port, tmp_path_factory.mktemp("shared"), provenance_wait_s=300.0
    ) as running:
        yield running


def experiment_id(platform: Platform, ref: ExperimentRef) -> int:
    db = Database(platform.grader_settings.database_url or "")
    try:
        with db.session() as session:
            return experiments.get_experiment(session, ref.grader_name).id
    finally:
        db.dispose()


async def evaluate_waiting(platform: Platform, ref: ExperimentRef) -> list[int]:
    """Evaluate, for real, every evaluation of this experiment still waiting."""
    db = Database(platform.grader_settings.database_url or "")
    try:
        with db.session() as session:
            experiment = experiments.get_experiment(session, ref.grader_name)
            waiting = [
                s.id for s in submissions.experiment_submissions(session, experiment) if not s.status.final
            ]
    finally:
        db.dispose()
    for submission_id in waiting:
        await asyncio.to_thread(evaluate, submission_id, platform.grader_settings)
    return waiting


async def run_agent(
    platform: Platform, name: str, tiny_base_model: Path, *, timeout_s: int | None = None
) -> tuple[ExperimentRef, str]:
    """The example gsm8k Experiment (with a budget of ``timeout_s``, where given) applied, through its
    baseline, and its agent's pod running with its budget started: its ref and the pod's name."""
    manifest = load_example("experiment-gsm8k.yaml", rename=name)
    if timeout_s is not None:
        manifest["spec"]["timeoutSeconds"] = timeout_s
    ref, _ = await platform.start_running(manifest, tiny_base_model)
    pod = await platform.run_agent_pod(ref)
    await platform.wait_for(
        f"{EXPERIMENTS}/{name}", lambda obj: bool(obj["status"].get("deadline")), "the budget to start"
    )
    return ref, pod


async def submit_a_scored_checkpoint(platform: Platform, ref: ExperimentRef) -> Path:
    """The agent submits a copy of the cached base model, made a model of its own, as
    ``output/ckpt-1``, and the evaluator scores it: its final. The checkpoint's folder."""
    url, _ = await platform.agent_credentials(ref.name)
    checkpoint = platform.shared / ref.workspace_subpath / "output" / "ckpt-1"
    shutil.copytree(
        platform.shared / "cache" / "models" / cached_model_subpath("Qwen/Qwen2.5-1.5B"), checkpoint
    )
    make_unique(checkpoint)
    submitted = await platform.grader.post(f"{url}/submit?wait=false", json={"model_path": "output/ckpt-1"})
    assert submitted.status_code == 202, submitted.text
    assert await evaluate_waiting(platform, ref)
    return checkpoint


async def end_agent_and_play_the_check(platform: Platform, ref: ExperimentRef, pod: str) -> dict[str, Any]:
    """The agent's Job ends, its pod a moment later; the evaluator takes what the controller asks
    for (a sealed experiment's final evaluation), and once the controller has asked for the check,
    makes it. Nothing is read while the agent's pod still runs."""
    await platform.patch_job_status(
        ref.agent_job_name, {"active": 0, "succeeded": 1, "conditions": [complete()]}
    )
    folder = platform.grader_settings.snapshot_dir / provenance_folder(experiment_id(platform, ref))
    pod_ended = False
    for _ in range(240):
        await evaluate_waiting(platform, ref)
        current = await platform.get(f"{EXPERIMENTS}/{ref.name}")
        message = (current or {}).get("status", {}).get("message") or ""
        if POD_RUNS in message and not pod_ended:
            assert not folder.exists(), "the agent's files were copied while its pod ran"
            response = await platform.kube.patch(
                f"{PODS}/{pod}/status",
                json={"status": {"phase": "Succeeded"}},
                headers={"Content-Type": "application/merge-patch+json"},
            )
            response.raise_for_status()
            pod_ended = True
        if CHECKING in message:
            break
        await asyncio.sleep(0.5)
    else:
        raise AssertionError("the controller did not ask for the provenance check")
    assert pod_ended, "the controller asked for the check without waiting for the agent's pod"
    assert read_manifest(folder) is not None, "the grader copies the files before the check is asked"
    result = await asyncio.to_thread(check_provenance, experiment_id(platform, ref), platform.grader_settings)
    assert result["status"] == "checked", result
    done = await platform.wait_phase(ref.name, "Succeeded")
    status: dict[str, Any] = done["status"]
    return status


async def test_test_questions_in_the_agents_output_are_found_and_its_final_scored_on_twins(
    platform: Platform, tiny_base_model: Path, tmp_path: Path
) -> None:
    name = "gsm8k-brought-in"
    ref, pod = await run_agent(platform, name, tiny_base_model)
    workspace = platform.shared / ref.workspace_subpath
    await submit_a_scored_checkpoint(platform, ref)

    # While the agent runs, nothing is checked: it could react.
    early = await platform.grader.post(
        f"/v1/experiments/{ref.grader_name}/provenance/check", headers=admin(platform)
    )
    assert early.status_code == 409, early.text

    test = get_task("gsm8k").load_test_problems(tmp_path / "data", source_dir=FIXTURE_DATA)
    questions = [problem.question for problem in test]
    notes = workspace / "output" / "notes"
    notes.mkdir()
    (notes / "stolen.jsonl").write_text("".join(json.dumps({"q": q}) + "\n" for q in questions[:3]))
    odd = os.fsencode(workspace / "output") + b"/\x1b[31mred\nname\xff.txt"
    with open(odd, "wb") as handle:
        handle.write(questions[3].upper().encode())
    outside = tmp_path / "outside.txt"
    outside.write_text("\n".join(questions[4:8]))
    (workspace / "output" / "link.txt").symlink_to(outside)
    os.mkfifo(workspace / "output" / "pipe.txt")
    # Beside code/ and output/: the agent's pod writes the whole workspace but its read-only mounts.
    (workspace / ".stash").mkdir()
    (workspace / ".stash" / "q.md").write_text(f"- {questions[8]}\n")

    status = await end_agent_and_play_the_check(platform, ref, pod)

    assert status["testOverlap"] == 5
    (verified,) = [c for c in status["conditions"] if c["type"] == "ProvenanceVerified"]
    assert (verified["status"], verified["reason"]) == ("True", "Complete"), verified
    assert "5 test problem(s) found in the agent's files" in status["message"]
    assert isinstance(status["twinScore"], float) and 0.0 <= status["twinPValue"] <= 1.0
    record_path = platform.grader_settings.eval_dir / RECORDS_DIR / f"{ref.grader_name}.json"
    text = record_path.read_text()
    record = json.loads(text)
    files = {entry["path"]: entry["problems"] for entry in record["test"]["files"]}
    assert files == {
        "output/\\x1b[31mred\\nname\\\\xff.txt": 1,  # the agent's name, escaped
        "output/notes/stolen.jsonl": 3,
        "workspace/.stash/q.md": 1,
    }
    assert record["twins"]["score"] == status["twinScore"] and "custom image" in record["not_read"]
    assert not any(question[:60] in text for question in questions)
    view = (await platform.grader.get(f"/v1/experiments/{ref.grader_name}", headers=admin(platform))).json()
    assert (view["test_overlap"], view["twin_score"]) == (5, status["twinScore"])


async def test_train_questions_in_the_agents_output_count_nothing(
    platform: Platform, tiny_base_model: Path
) -> None:
    name = "gsm8k-honest"
    ref, pod = await run_agent(platform, name, tiny_base_model)
    train = read_problems(FIXTURE_DATA / "gsm8k" / "train.jsonl")
    output = platform.shared / ref.workspace_subpath / "output"
    (output / "train-copy.jsonl").write_text("".join(json.dumps({"q": p.question}) + "\n" for p in train))

    status = await end_agent_and_play_the_check(platform, ref, pod)

    # Nothing was submitted: no final, so no twin score; the files hold no test question.
    assert status["testOverlap"] == 0 and "twinScore" not in status
    assert "found in the agent's files" not in status["message"]
    record = json.loads(
        (platform.grader_settings.eval_dir / RECORDS_DIR / f"{ref.grader_name}.json").read_text()
    )
    assert (
        record["test"]["files"] == [] and record["twins"]["note"] == "no final was scored on the test split"
    )


async def test_a_sealed_experiments_validation_problems_are_counted_and_its_final_scored_on_twins(
    platform: Platform, tiny_base_model: Path, tmp_path: Path
) -> None:
    name = "gsm8k-sealed-brought-in"
    manifest = load_example("experiment-gsm8k.yaml", rename=name)
    manifest["spec"]["evaluation"]["feedback"] = "sealed"
    ref = await platform.applied(manifest)
    platform.run_prepare_pod(manifest["spec"], ref, tiny_base_model)
    await platform.patch_job_status(ref.prepare_job_name, {"succeeded": 1, "conditions": [complete()]})
    await platform.wait_phase(name, "Baseline")
    await evaluate_waiting(platform, ref)
    await platform.wait_phase(name, "Running")
    pod = await platform.run_agent_pod(ref)
    await platform.wait_for(
        f"{EXPERIMENTS}/{name}", lambda obj: bool(obj["status"].get("deadline")), "the budget to start"
    )
    workspace = platform.shared / ref.workspace_subpath
    await submit_a_scored_checkpoint(platform, ref)
    task = get_task("gsm8k")
    test = task.load_test_problems(tmp_path / "data", source_dir=FIXTURE_DATA)
    validation = task.load_validation_problems(tmp_path / "data", source_dir=FIXTURE_DATA)
    (workspace / "code" / "prompts.py").write_text(
        f"EXAMPLES = {[test[0].question, validation[0].question]!r}\n"
    )

    status = await end_agent_and_play_the_check(platform, ref, pod)

    assert status["finalSelection"] == "best_on_validation" and status["testOverlap"] == 1
    assert isinstance(status["twinScore"], float) and 0.0 <= status["twinPValue"] <= 1.0
    record = json.loads(
        (platform.grader_settings.eval_dir / RECORDS_DIR / f"{ref.grader_name}.json").read_text()
    )
    assert record["test"]["files"] == [{"path": "code/prompts.py", "problems": 1}]
    assert record["validation"]["files"] == [{"path": "code/prompts.py", "problems": 1}]


async def test_a_timed_out_agents_files_are_read_after_its_pods_grace_period(
    platform: Platform, tiny_base_model: Path, tmp_path: Path
) -> None:
    """At the deadline the controller deletes the agent's Job; its pod keeps running through its
    grace period, and what it writes then is still read: the copy waits until the pod has stopped."""
    name = "gsm8k-late-brought-in"
    ref, pod = await run_agent(platform, name, tiny_base_model, timeout_s=1)
    await platform.wait_for(
        f"{EXPERIMENTS}/{name}",
        lambda obj: POD_RUNS in (obj["status"].get("message") or ""),
        "the controller to wait for the agent's pod",
    )
    assert await platform.get(f"{JOBS}/{ref.agent_job_name}") is None  # deleted at the deadline
    folder = platform.grader_settings.snapshot_dir / provenance_folder(experiment_id(platform, ref))
    assert not folder.exists()
    # The agent's last words, written during its grace period.
    test = get_task("gsm8k").load_test_problems(tmp_path / "data", source_dir=FIXTURE_DATA)
    (platform.shared / ref.workspace_subpath / "output" / "last.txt").write_text(test[0].question)
    (await platform.kube.delete(f"{PODS}/{pod}")).raise_for_status()
    await platform.wait_for(
        f"{EXPERIMENTS}/{name}",
        lambda obj: CHECKING in (obj["status"].get("message") or ""),
        "the controller to ask for the provenance check",
    )
    result = await asyncio.to_thread(check_provenance, experiment_id(platform, ref), platform.grader_settings)
    assert result["status"] == "checked", result
    done = await platform.wait_phase(name, "TimedOut")
    assert done["status"]["testOverlap"] == 1 and "end of its budget" in done["status"]["message"]


async def test_a_path_past_path_max_is_read_and_a_removed_final_leaves_the_twin_split_unverified(
    platform: Platform, tiny_base_model: Path, tmp_path: Path
) -> None:
    """Test questions at the bottom of 20 folders of 242-character names (a path past PATH_MAX)
    are copied and found; a final the agent removed before it ended is said, not silent."""
    name = "gsm8k-deep-dodge"
    ref, pod = await run_agent(platform, name, tiny_base_model)
    workspace = platform.shared / ref.workspace_subpath
    checkpoint = await submit_a_scored_checkpoint(platform, ref)
    test = get_task("gsm8k").load_test_problems(tmp_path / "data", source_dir=FIXTURE_DATA)
    nest_past_path_max(
        workspace / "output", "stolen.json", json.dumps([problem.question for problem in test[:3]])
    )
    shutil.rmtree(checkpoint)  # the twin dodge: the scored final is gone before the agent ends

    status = await end_agent_and_play_the_check(platform, ref, pod)

    assert status["testOverlap"] == 3 and "twinScore" not in status
    assert "twin split unverified: the final's folder can no longer be read" in status["message"]
    view = (await platform.grader.get(f"/v1/experiments/{ref.grader_name}", headers=admin(platform))).json()
    assert "twin split unverified" in view["message"]


async def test_a_copy_that_reaches_its_entry_budget_reads_as_unverified_not_clean(
    platform: Platform, tiny_base_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Junk entries (empty files, links, weight-named hard links) exhaust the copy's entry budget
    (20 here; 200,000 by default): the check is made and says it is unverified, never 0."""
    monkeypatch.setattr(agent_copy, "COPY_ENTRIES", 20)
    name = "gsm8k-flooded"
    ref, pod = await run_agent(platform, name, tiny_base_model)
    junk = platform.shared / ref.workspace_subpath / "code" / "junk"
    junk.mkdir()
    (junk / "w.safetensors").touch()
    for index in range(40):
        os.link(junk / "w.safetensors", junk / f"{index}.safetensors")

    status = await end_agent_and_play_the_check(platform, ref, pod)

    assert "testOverlap" not in status, status
    (verified,) = [c for c in status["conditions"] if c["type"] == "ProvenanceVerified"]
    assert (verified["status"], verified["reason"]) == ("False", "Unverified")
    assert (
        "test questions unverified: the copy stopped early (its 20-entry budget was reached)"
        in status["message"]
    )
