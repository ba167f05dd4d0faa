"""An evaluation's cost is bounded by what the base model needs (autorl_evaluator.time_budget).

An agent's evaluation gets a time budget measured from its experiment's baseline: past it the
evaluation stops and fails as the checkpoint's failure, counted against the submission limit, with
a message that names the budget (real grader on Postgres, the real job function with the ``hf``
backend on the tiny model, a budget factor made tiny through the worker's settings). And
denormal weights (every weight times 1e-39) cost a CPU evaluation nothing more: denormals compute
as zero in the process that evaluates, the hf backend's and the CPU engine server's.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from autorl.errors import EVALUATOR_FAULT_PREFIX
from autorl.eval_config import EvalConfig
from autorl.store import Database, FailureReason, Submission, SubmissionStatus, submissions
from autorl.tasks import get_task
from autorl_evaluator.backends.hf.backend import HFBackend
from autorl_evaluator.backends.opencompass.engine_server import denormals_flushed
from autorl_evaluator.backends.opencompass.engine_shim import vllm as shim
from autorl_evaluator.backends.opencompass.resident_engine import EngineSpec, ResidentEngine
from autorl_evaluator.failures import EvaluatorFaultError, agent_message
from autorl_evaluator.jobs import evaluate
from autorl_evaluator.time_budget import BudgetExceededError, CpuMeter, TimeBudget, evaluation_budget
from tests.support.grading import RegisteredExperiment, admin_headers, copy_model, evaluating_settings, row_id
from tests.support.settings import DeploymentSettings

LIMIT = 2
MAX_NEW_TOKENS = 6
TEST_DATA = Path(__file__).resolve().parents[1] / "data"


@pytest.fixture
def settings(make_settings: Callable[..., DeploymentSettings], pg_url: str) -> DeploymentSettings:
    return evaluating_settings(make_settings, pg_url, limit=LIMIT, max_new_tokens=MAX_NEW_TOKENS)


def test_an_evaluation_past_its_time_budget_is_the_checkpoints_failure_and_counts_against_the_limit(
    client: TestClient, experiment: RegisteredExperiment, settings: DeploymentSettings, tiny_base_model: Path
) -> None:
    queued = client.post(f"/v1/experiments/{experiment.name}/baseline", headers=admin_headers(settings))
    assert queued.status_code == 202, queued.text
    tight = settings.model_copy(update={"eval_budget_factor": 1e-6, "eval_budget_floor_s": 0.0})
    # The baseline is the measure: it has no budget, whatever the factor.
    assert evaluate(queued.json()["submission_id"], tight)["status"] == "scored"

    copy_model(tiny_base_model, experiment.output_dir / "slow", unique=True)
    slow_submit = client.post(f"{experiment.url_path}/submit", json={"model_path": "output/slow"})
    assert slow_submit.status_code == 202, slow_submit.text
    slow = row_id(settings.database_url, experiment, slow_submit.json()["submission_id"])
    db = Database(settings.database_url or "")
    try:
        with db.session() as session:
            row = session.get(Submission, slow)
            assert row is not None
            budget = evaluation_budget(session, row, settings)
            baseline = session.get(Submission, row.experiment.baseline_submission_id)
            assert budget is not None and baseline is not None and baseline.details is not None
            # The base model writing every row to its limit, times the factor, at least the floor.
            fill = baseline.details["new_tokens"] / (LIMIT * MAX_NEW_TOKENS)
            assert budget.baseline_fill == pytest.approx(fill) and 0 < fill <= 1
            assert budget.seconds == pytest.approx(
                max(settings.eval_budget_floor_s, settings.eval_budget_factor * baseline.eval_seconds / fill)
            )

        result = evaluate(slow, tight)
        assert result["status"] == "failed"
        with db.session() as session:
            failed = session.get(Submission, slow)
            assert failed is not None
            assert (failed.status, failed.failure_reason) == (SubmissionStatus.FAILED, FailureReason.TIMEOUT)
            error = failed.error or ""
            assert error.startswith("the evaluation passed its time budget and was stopped"), error
            assert "counts against your submission limit" in error and "AUTORL_EVAL_BUDGET_FACTOR" in error
            assert submissions.limited_submissions_count(session, failed.experiment) == 1
        # What the agent reads names the budget too.
        scores = client.get(f"{experiment.url_path}/scores").json()
        errors = [entry["error"] for entry in scores["submissions"]]
        assert len(errors) == 1 and errors[0].startswith("the evaluation passed its time budget"), scores

        # The same checkpoint's evaluation within the default budget scores.
        copy_model(tiny_base_model, experiment.output_dir / "fine", unique=True)
        fine = client.post(f"{experiment.url_path}/submit", json={"model_path": "output/fine"})
        assert fine.status_code == 202
        assert evaluate(row_id(db, experiment, fine.json()["submission_id"]), settings)["status"] == "scored"
    finally:
        db.dispose()


def test_a_budget_holds_only_on_the_kind_of_device_its_baseline_ran_on() -> None:
    budget = TimeBudget(
        seconds=30, baseline_seconds=5, baseline_fill=0.5, factor=3, floor_s=10, device="cuda"
    )
    assert budget.deadline(100.0, "cuda:1") == 130.0
    assert budget.deadline(100.0, "cpu") is None  # measured on a GPU: a CPU evaluation keeps the hard timeout
    # Its seconds may derive from another split's or another experiment's evaluation: never shown.
    message = str(budget.exceeded())
    assert message.startswith("the evaluation passed its time budget and was stopped"), message
    assert "3 times over" in message and not re.search(r"\d+ s\b", message), message


def _busy(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


#: Every 0.1 s, in step with the others, 2 ms of work, for 3 s.
BURSTS = (
    "import time\nend = time.time() + 3\nwhile time.time() < end:\n    time.sleep(0.1 - time.time() % 0.1)\n"
    "    began = time.thread_time()\n    while time.thread_time() - began < 0.002:\n        pass\n"
)


def _busy_child(seconds: float) -> None:
    """The evaluation's work in a process of its own (as OpenCompass's is), ended before it is read."""
    subprocess.run(
        [sys.executable, "-c", f"import time\nend = time.time() + {seconds}\nwhile time.time() < end: pass"],
        check=True,
    )


def test_an_evaluation_starved_of_the_cpu_past_its_budget_is_the_evaluators_failure() -> None:
    """Busy processes each in a session of their own (the kernel shares a CPU between sessions, and
    a sandboxed agent makes as many as it likes) keep the evaluation waiting for a CPU: past its
    budget that is not the checkpoint's doing, and the agent is told so (not counted). The
    evaluation's threads are its own process's and its descendants', ended or not (OpenCompass's)."""
    budget = TimeBudget(seconds=1, baseline_seconds=1, baseline_fill=1, factor=4, floor_s=0, device="cpu")
    with CpuMeter() as meter:
        _busy(1.0)
        _busy_child(2.0)
    quiet = meter.used()
    assert quiet.ran > 2.2 and not quiet.starved, quiet  # the child's seconds counted (read twice a second)
    assert budget.failure(budget.exceeded(), quiet).__class__ is BudgetExceededError
    # Not the evaluation's descendants (an agent's are not the evaluator's): started by a process that
    # has ended, they are no process's children here.
    launcher = (  # its burners write to no pipe of ours (-3: DEVNULL), so it returns at once
        "import subprocess, sys\n"
        "loop = 'import os, time\\nos.setsid()\\nend = time.time() + 8\\nwhile time.time() < end: pass'\n"
        f"print(*(subprocess.Popen([sys.executable, '-c', loop], stdout=-3, stderr=-3).pid "
        f"for _ in range({6 * (os.cpu_count() or 1)})))"
    )
    burners = subprocess.run([sys.executable, "-c", launcher], check=True, capture_output=True, text=True)
    try:
        time.sleep(0.3)
        with CpuMeter() as meter:
            _busy(2.0)
        loaded = meter.used()
        with CpuMeter() as meter:
            _busy_child(2.0)
        loaded_child = meter.used()
    finally:
        for pid in burners.stdout.split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
    assert loaded.starved, loaded
    assert loaded_child.starved, loaded_child
    # Its own threads, more than its CPUs, keep it waiting as long, yet keep every CPU busy: a slow
    # checkpoint's evaluation on a quiet machine is still the checkpoint's failure.
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(4 * len(os.sched_getaffinity(0)))
    try:
        with CpuMeter() as meter:
            square, started = torch.randn(384, 384), time.monotonic()
            while time.monotonic() - started < 2.0:
                square = torch.tanh(square @ square)
        oversubscribed = meter.used()
    finally:
        torch.set_num_threads(threads)
    assert oversubscribed.waited > oversubscribed.ran and not oversubscribed.starved, oversubscribed
    # Its own processes, more than its CPUs and waking together (a pool's short bursts), wait long
    # and run on little of its CPUs, but leave them idle between: no other work starved it.
    with CpuMeter() as meter:
        pool = [
            subprocess.Popen([sys.executable, "-c", BURSTS]) for _ in range(8 * len(os.sched_getaffinity(0)))
        ]
        for process in pool:
            process.wait()
    bursty = meter.used()
    assert bursty.waited >= 2 * bursty.ran and not bursty.starved, bursty
    for starved in (loaded, loaded_child):
        failure = budget.failure(budget.exceeded(), starved)
        assert isinstance(failure, EvaluatorFaultError), failure
        assert agent_message(failure).startswith(EVALUATOR_FAULT_PREFIX) and "submit it again" in str(failure)


def _denormal_copy(source: Path, target: Path) -> Path:
    """``source`` with every floating weight times 1e-39 (in float32: denormal numbers)."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(source, target)
    weights = target / "model.safetensors"
    tensors = {name: value.float() * 1e-39 for name, value in load_file(str(weights)).items()}
    save_file(tensors, str(weights), metadata={"format": "pt"})
    return target


def test_denormal_weights_compute_as_zeros_in_the_hf_backends_evaluation(
    tiny_base_model: Path, make_settings: Callable[..., DeploymentSettings], tmp_path: Path
) -> None:
    """The flush is in force while the model runs (its denormal weights multiply to zero, so no
    arithmetic takes the processor's slow path) and undone after the evaluation."""
    import torch

    denormal = _denormal_copy(tiny_base_model, tmp_path / "denormal")
    seen: list[tuple[bool, bool]] = []

    def inspect(module: Any, inputs: Any, output: Any) -> None:
        if isinstance(module, torch.nn.Linear) and not seen:
            weight = module.weight.detach()
            # Its bits (integers, which no flush touches) are not zero; what it computes is.
            seen.append((bool((weight.view(torch.int32) != 0).any()), bool((weight * 1.0).abs().max() == 0)))

    settings = make_settings(eval_backend="hf", eval_max_new_tokens=MAX_NEW_TOKENS)
    task = get_task("gsm8k")
    problems = task.load_test_problems(tmp_path / "data", source_dir=TEST_DATA, limit=LIMIT)
    assert denormals_flushed() is False
    hook = torch.nn.modules.module.register_module_forward_hook(inspect)
    try:
        HFBackend().evaluate(denormal, task, problems, EvalConfig.record(task.name, settings), settings)
    finally:
        hook.remove()
    assert seen == [(True, True)]  # denormal weights, read as zeros
    assert denormals_flushed() is False  # the process's own setting again


def test_the_cpu_engine_server_flushes_denormals_for_its_whole_life(tmp_path: Path) -> None:
    engine = ResidentEngine(
        EngineSpec(python=Path(sys.executable), engine="transformers", cuda_visible_devices=""),
        {"PATH": "/usr/bin:/bin"},
        tmp_path / "engine.log",
    )
    try:
        engine.wait_until_listening()
        answer = shim.exchange(str(engine.socket_path), {"op": "ping"}, timeout_s=30)
        assert answer["denormals_flushed"] is True, (tmp_path / "engine.log").read_text()
    finally:
        engine.stop()
