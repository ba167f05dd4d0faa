"""The warm worker: weights swapped into a resident model answer as a cold load does, a base model
whose files besides the weights differ (another generation config) gets a model of its own, and an
evaluation past its hard timeout replaces the child process."""

from __future__ import annotations

import logging
import os
import re
import shutil
import signal
import sys
import textwrap
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from autorl.models.tiny import build_tiny_qwen2
from autorl.process_group import group_members
from autorl_evaluator.backends.hf.warm_models import WarmModels, swap_weights
from autorl_evaluator.warm_child import EvaluationStoppedError, WarmChild
from tests.support.checkpoints import edit_json, split_into_shards
from tests.support.service_processes import service_env
from tests.support.waiting import wait_for

TEST_DATA = Path(__file__).resolve().parents[1] / "data"


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("warm")
    return build_tiny_qwen2(root / "a", seed=0), build_tiny_qwen2(root / "b", seed=1)


def _cold(path: Path) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def _greedy(model: Any) -> tuple[list[list[int]], Any]:
    import torch

    ids = torch.tensor([[5, 9, 13, 40, 77, 100], [8, 8, 21, 3, 60, 2]])
    with torch.inference_mode():
        logits = model(input_ids=ids).logits
        tokens = model.generate(input_ids=ids, max_new_tokens=12, do_sample=False, eos_token_id=None).tolist()
    return tokens, logits


def test_swapped_weights_answer_as_a_cold_load(checkpoints: tuple[Path, Path]) -> None:
    import torch

    a, b = checkpoints
    warm = WarmModels()
    first, swapped = warm.load(a, "cpu", torch.float32, lambda: _cold(a))
    assert not swapped
    second, swapped = warm.load(b, "cpu", torch.float32, lambda: pytest.fail("no cold load expected"))
    assert swapped and second is first
    cold_tokens, cold_logits = _greedy(_cold(b))
    warm_tokens, warm_logits = _greedy(second)
    assert warm_tokens == cold_tokens
    assert torch.equal(warm_logits, cold_logits)
    # The two checkpoints differ, so equality above is not a model answering the same either way.
    assert not torch.equal(_greedy(_cold(a))[1], cold_logits)


def test_sharded_checkpoints_swap_too(checkpoints: tuple[Path, Path], tmp_path: Path) -> None:
    import torch

    a, b = checkpoints
    sharded = Path(shutil.copytree(b, tmp_path / "b-sharded"))
    split_into_shards(sharded)
    model = _cold(a)
    swap_weights(model, sharded)
    assert torch.equal(_greedy(model)[1], _greedy(_cold(b))[1])


def test_another_architecture_loads_cold(checkpoints: tuple[Path, Path], tmp_path: Path) -> None:
    import torch

    a, b = checkpoints
    other = Path(shutil.copytree(b, tmp_path / "other"))
    edit_json(other / "config.json", rms_norm_eps=1e-5)
    warm = WarmModels()
    first, _ = warm.load(a, "cpu", torch.float32, lambda: _cold(a))
    second, swapped = warm.load(other, "cpu", torch.float32, lambda: _cold(other))
    assert not swapped and second is not first


def test_a_base_with_another_generation_config_never_steers_the_resident_model(
    tiny_base_model: Path, make_settings: Callable[..., Any], tmp_path: Path
) -> None:
    """Base A evaluated cold, then base B (A byte for byte but for its generation config, whose eos
    ids name every token: each answer would stop at once) warms the resident model, then A in the
    same warm process: A gets a model of its own and answers as in its cold evaluation. A checkpoint
    of A (other weights, the same files besides) still swaps into A's resident model."""
    import json

    from autorl.eval_config import EvalConfig
    from autorl.tasks import get_task
    from autorl_evaluator.backends.hf.backend import HFBackend
    from autorl_evaluator.backends.hf.warm_models import RESIDENT

    a = Path(shutil.copytree(tiny_base_model, tmp_path / "a"))
    b = Path(shutil.copytree(tiny_base_model, tmp_path / "b"))
    vocab = json.loads((a / "config.json").read_text())["vocab_size"]
    edit_json(b / "generation_config.json", eos_token_id=list(range(vocab)))
    twin = Path(shutil.copytree(tiny_base_model, tmp_path / "twin"))
    other = build_tiny_qwen2(tmp_path / "other", seed=1)
    shutil.copyfile(other / "model.safetensors", twin / "model.safetensors")
    task = get_task("gsm8k")
    problems = task.load_test_problems(tmp_path / "data", source_dir=TEST_DATA, limit=2)
    warm = make_settings(eval_backend="hf", eval_max_new_tokens=12, eval_warm_worker=True)
    config = EvalConfig.record(task.name, warm)
    backend = HFBackend()
    cold_a = backend.evaluate(a, task, problems, config, warm.model_copy(update={"eval_warm_worker": False}))
    RESIDENT.clear()
    try:
        on_b = backend.evaluate(b, task, problems, config, warm)
        on_a = backend.evaluate(a, task, problems, config, warm)
        swapped = backend.evaluate(twin, task, problems, config, warm)
    finally:
        RESIDENT.clear()
    assert all(cold_a.completions) and on_b.completions != cold_a.completions  # B's eos ids cut answers
    assert on_a.completions == cold_a.completions
    assert not on_a.details["weights_swapped_into_resident_model"]
    assert swapped.details["weights_swapped_into_resident_model"]


def test_a_failed_swap_drops_the_resident_model(checkpoints: tuple[Path, Path], tmp_path: Path) -> None:
    import torch
    from safetensors.torch import load_file, save_file

    a, b = checkpoints
    broken = Path(shutil.copytree(b, tmp_path / "broken"))
    tensors = load_file(str(broken / "model.safetensors"))
    tensors.pop(sorted(tensors)[-1])  # one parameter without a tensor
    save_file(tensors, str(broken / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match="has no tensor for"):
        swap_weights(_cold(a), broken)
    warm = WarmModels()
    first, _ = warm.load(a, "cpu", torch.float32, lambda: _cold(a))
    second, swapped = warm.load(broken, "cpu", torch.float32, lambda: _cold(a))
    assert not swapped and second is not first


def test_a_timeout_replaces_the_child(tmp_path: Path) -> None:
    # A real child process speaking the warm worker's protocol; id 2 hangs.
    script = tmp_path / "child.py"
    script.write_text(
        textwrap.dedent(
            """
            import os, sys, time
            for line in sys.stdin:
                if int(line) == 2:
                    time.sleep(600)
                print(f"done {int(line)} ok-{os.getpid()}", flush=True)
            """
        )
    )
    child = WarmChild([sys.executable, str(script)])
    first = child.run(1, timeout_s=30)
    assert first.startswith("ok-") and child.run(3, timeout_s=30) == first  # the same process
    hung = child.process
    assert hung is not None
    with pytest.raises(TimeoutError):
        child.run(2, timeout_s=1)
    assert hung.poll() is not None and child.process is None  # killed, not reused
    after = child.run(4, timeout_s=30)
    assert after.startswith("ok-") and after != first and child.started == 2
    child.stop()


def test_a_child_that_dies_is_reported_and_replaced(tmp_path: Path) -> None:
    script = tmp_path / "child.py"
    script.write_text("import sys\nfor line in sys.stdin:\n    sys.exit(3)\n")
    child = WarmChild([sys.executable, str(script)])
    with pytest.raises(ChildProcessError, match=r"exited with code 3 during the evaluation of submission 1"):
        child.run(1, timeout_s=30)
    assert child.process is None


def test_an_interrupt_ends_only_an_evaluation_in_progress_with_the_childs_whole_group(tmp_path: Path) -> None:
    # Id 2 starts a process in the child's group (as an engine would) and hangs.
    script = tmp_path / "child.py"
    started = tmp_path / "engine.pid"
    script.write_text(
        textwrap.dedent(
            f"""
            import os, subprocess, sys, time
            for line in sys.stdin:
                if int(line) == 2:
                    engine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
                    open({str(started)!r}, "w").write(str(engine.pid))
                    time.sleep(600)
                print(f"done {{int(line)}} ok-{{os.getpid()}}", flush=True)
            """
        )
    )
    child = WarmChild([sys.executable, str(script)])
    first = child.run(1, timeout_s=30)
    assert child.interrupt() is None  # nothing in progress: the idle child stays
    assert child.run(3, timeout_s=30) == first
    hung = child.process
    assert hung is not None
    interrupter = threading.Thread(
        target=lambda: (wait_for(started.exists, "the hung evaluation", timeout_s=30), child.interrupt())
    )
    interrupter.start()
    with pytest.raises(EvaluationStoppedError, match=f"evaluation 2 was stopped.*pid {hung.pid}.*SIGKILL"):
        child.run(2, timeout_s=60)
    interrupter.join()
    assert group_members(hung.pid) == []  # the child and the process it started
    with pytest.raises(EvaluationStoppedError, match="before it began"):
        child.run(4, timeout_s=30, stop_requested=lambda: True)
    after = child.run(5, timeout_s=30)
    assert after.startswith("ok-") and after != first
    child.stop()


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("own_timeout_s", "recorded_timeout_s"),
    [(1, None), (3600, 1)],
    ids=["recorded-before-timeouts-were-the-workers-own", "the-recorded-one-over-the-workers-own"],
)
def test_the_local_worker_fails_a_timed_out_warm_evaluation_and_replaces_the_child(
    make_settings: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    own_timeout_s: int,
    recorded_timeout_s: int | None,
) -> None:
    """The hard timeout is the experiment's recorded one (autorl.eval_config), whatever the worker's
    own AUTORL_EVAL_TIMEOUT_S says; a config recorded before timeouts were takes the worker's own."""
    from autorl.store import Database, experiments, migrate, submissions
    from autorl_evaluator import local_worker
    from tests.support.runs import EVAL_CONFIG, add_submission, create_experiment

    settings = make_settings(
        database_url=f"sqlite:///{tmp_path}/store.db", eval_warm_worker=True, eval_timeout_s=own_timeout_s
    )
    db = Database(settings.database_url)
    migrate(db)
    experiment = create_experiment(db, tmp_path / "workspace")
    if recorded_timeout_s is not None:
        with db.session() as session:
            recorded = {**EVAL_CONFIG, "max_new_tokens": 8, "timeout_s": recorded_timeout_s}
            experiments.get_experiment(session, experiment.name).eval_config = recorded
    submission_id = add_submission(db, experiment.name)
    monkeypatch.setattr(local_worker, "CHILD_MARGIN_S", 0.0)
    worker = local_worker.LocalWorker(settings)
    assert worker.warm is not None
    # A child that takes the id and never answers, as a hung evaluation would.
    worker.warm.command = [sys.executable, "-c", "import sys, time\nsys.stdin.readline()\ntime.sleep(600)"]
    worker.run_one(submission_id)
    assert worker.warm.process is None and worker.warm.started == 1
    with db.session() as session:
        submission = submissions.get_submission(session, submission_id)
        assert submission.status.final and "hard timeout of 1 s" in (submission.error or "")
    db.dispose()


# --- `autorl worker` on RQ (rq_worker.WarmEvaluationWorker) -----------------------------------------


@pytest.fixture
def rq_settings(
    make_settings: Any,
    fresh_pg_url: str,
    redis_url: str,
    fresh_queue_prefix: str,
    monkeypatch: pytest.MonkeyPatch,
) -> Any:
    """An RQ deployment that evaluates the tiny model for real on one problem, its warm child (run
    from this process in the in-process tests) configured through the environment as in a pod."""
    settings = make_settings(
        database_url=fresh_pg_url,
        redis_url=redis_url,
        redis_key_prefix=fresh_queue_prefix,
        eval_backend="hf",
        eval_limit=1,
        eval_max_new_tokens=2,
        submit_wait_s=0.0,
        eval_warm_worker=True,
    )
    for variable, value in service_env(settings).items():
        monkeypatch.setenv(variable, value)
    return settings


def _submit_copies(
    settings: Any, base: Path, tmp_path: Path, count: int, *, timeout_s: int | None = None
) -> list[int]:
    """``count`` submissions of one new experiment (its recorded hard timeout ``timeout_s`` if given)."""
    from fastapi.testclient import TestClient

    from autorl.store import Database, experiments
    from autorl_grader.main import create_app
    from tests.support.grading import make_workspace, register, submit_copies

    with TestClient(create_app(settings, reconcile=False)) as client:
        experiment = register(client, settings, base, make_workspace(tmp_path))
        if timeout_s is not None:
            db = Database(settings.database_url)
            with db.session() as session:
                recorded = experiments.get_experiment(session, experiment.name)
                recorded.eval_config = {**recorded.eval_config, "timeout_s": timeout_s}
            db.dispose()
        return submit_copies(client, experiment, base, count, "c")


def _warm_rq_worker(settings: Any, warm: WarmChild | None = None) -> Any:
    from redis import Redis

    from autorl.queue import make_dispatcher
    from autorl.store import Database
    from autorl_evaluator.rq_worker import WarmEvaluationWorker, evaluation_queue

    redis = Redis.from_url(settings.redis_url)
    return WarmEvaluationWorker(
        [evaluation_queue(settings.queue_name, redis)],
        connection=redis,
        key_prefix=settings.redis_key_prefix,
        db=Database(settings.database_url),
        own_timeout_s=settings.eval_timeout_s,
        warm=warm,
        dispatcher=make_dispatcher(settings),
    )


def _rows(settings: Any, ids: list[int]) -> list[Any]:
    from autorl.store import Database, submissions

    db = Database(settings.database_url)
    with db.session() as session:
        rows = [submissions.get_submission(session, i) for i in ids]
        found = [(r.status, r.failure_reason, r.error) for r in rows]
    db.dispose()
    return found


@pytest.mark.timeout(180)
def test_the_rq_worker_fails_a_timed_out_job_and_starts_a_fresh_child_for_the_next(
    rq_settings: Any,
    tiny_base_model: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    from autorl.store import FailureReason, SubmissionStatus
    from autorl_evaluator import local_worker

    (hung,) = _submit_copies(rq_settings, tiny_base_model, tmp_path, 1, timeout_s=1)
    (after,) = _submit_copies(rq_settings, tiny_base_model, tmp_path, 1)
    monkeypatch.setattr(local_worker, "CHILD_MARGIN_S", 0.0)
    # The real child, except that the evaluation of ``hung`` never answers (a hung engine).
    script = tmp_path / "child.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import itertools, sys, time
            from autorl_evaluator.warm_child import main
            first = sys.stdin.readline()
            if int(first) == {hung}:
                time.sleep(600)
            sys.stdin = itertools.chain([first], sys.stdin)
            raise SystemExit(main())
            """
        )
    )
    worker = _warm_rq_worker(rq_settings, WarmChild([sys.executable, str(script)]))
    with caplog.at_level(logging.INFO, logger="autorl.evaluator.warm"):
        worker.work(burst=True)
    pids = [int(pid) for pid in re.findall(r"event=warm_worker_started pid=(\d+)", caplog.text)]
    (failed, scored) = _rows(rq_settings, [hung, after])
    assert (
        failed[:2] == (SubmissionStatus.FAILED, FailureReason.TIMEOUT) and "hard timeout of 1 s" in failed[2]
    )
    assert scored[0] == SubmissionStatus.SCORED, scored
    assert len(pids) == 2 and pids[0] != pids[1]
    assert group_members(pids[0]) == [] and group_members(pids[1]) == []


@pytest.mark.timeout(180)
def test_autorl_worker_on_rq_evaluates_job_after_job_in_one_warm_child_and_sigterm_stops_both(
    rq_settings: Any, tiny_base_model: Path, tmp_path: Path
) -> None:
    import signal

    from autorl.store import SubmissionStatus
    from tests.support.service_processes import start, stop

    ids = _submit_copies(rq_settings, tiny_base_model, tmp_path, 2)
    log = tmp_path / "worker.log"
    worker = start(["worker"], rq_settings, log)
    try:
        wait_for(lambda: all(row[0].final for row in _rows(rq_settings, ids)), "both scores", timeout_s=120)
        rows = _rows(rq_settings, ids)
        assert [row[0] for row in rows] == [SubmissionStatus.SCORED] * 2, rows
        # One child for both jobs: the model stayed resident between them.
        (child,) = [int(pid) for pid in re.findall(r"event=warm_worker_started pid=(\d+)", log.read_text())]
        assert group_members(child), "the warm child stays between jobs"
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=30)
        # The child leads a process group of its own: nothing of it outlives the worker.
        assert group_members(child) == [], log.read_text()[-3000:]
    finally:
        stop(worker)


def _child_hanging_once_on(submission_id: int, tmp_path: Path) -> tuple[WarmChild, Path]:
    """The real warm child, except that the first evaluation of ``submission_id`` (the first in any
    child) hangs in its backend, after the claim, with a process of its own in the child's group
    as an engine's; the file returned appears when it hangs."""
    hanging = tmp_path / "hanging"
    script = tmp_path / "child.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import subprocess, sys, time
            from pathlib import Path
            import autorl_evaluator.backends as backends
            from autorl_evaluator import jobs
            from autorl_evaluator.warm_child import main

            real_get_backend, real_evaluate = backends.get_backend, jobs.evaluate

            class Hung:
                def evaluate(self, *args, **kwargs):
                    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
                    Path({str(hanging)!r}).touch()
                    time.sleep(600)

            def evaluate(submission_id, settings=None):
                hang = submission_id == {submission_id} and not Path({str(hanging)!r}).exists()
                backends.get_backend = (lambda name: Hung()) if hang else real_get_backend
                return real_evaluate(submission_id, settings)

            jobs.evaluate = evaluate
            raise SystemExit(main())
            """
        )
    )
    return WarmChild([sys.executable, str(script)]), hanging


def _meanwhile(action: Callable[[], None], on_failure: Callable[[], object]) -> Callable[[], None]:
    """Run ``action`` in a thread while the worker works in this one (RQ's signal handlers need the
    main thread); ``on_failure`` unblocks the worker if it fails. Returns the join, which re-raises."""
    failures: list[BaseException] = []

    def run() -> None:
        try:
            action()
        except BaseException as exc:
            failures.append(exc)
            on_failure()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()

    def join() -> None:
        thread.join(timeout=60)
        if failures:
            raise failures[0]

    return join


def _job_status(settings: Any, submission_id: int) -> Any:
    from redis import Redis
    from rq.job import Job
    from rq.serializers import JSONSerializer

    from autorl.queue import job_id

    redis = Redis.from_url(settings.redis_url)
    try:
        return Job.fetch(
            job_id(settings.redis_key_prefix, submission_id), connection=redis, serializer=JSONSerializer
        ).get_status()
    finally:
        redis.close()


@pytest.mark.timeout(180)
def test_an_operators_stop_job_kills_the_warm_childs_group_fails_the_submission_and_the_worker_goes_on(
    rq_settings: Any, tiny_base_model: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from rq.command import send_command, send_stop_job_command
    from rq.job import JobStatus
    from rq.serializers import JSONSerializer

    from autorl.queue import job_id
    from autorl.store import FailureReason, SubmissionStatus

    (stopped,) = _submit_copies(rq_settings, tiny_base_model, tmp_path, 1)
    (after,) = _submit_copies(rq_settings, tiny_base_model, tmp_path, 1)
    warm, hanging = _child_hanging_once_on(stopped, tmp_path)
    worker = _warm_rq_worker(rq_settings, warm)
    prefix = rq_settings.redis_key_prefix

    def operator() -> None:
        wait_for(hanging.exists, "the evaluation to hang", timeout_s=90)
        # A stop for a job this worker does not run (``after`` waits in the queue) changes nothing.
        send_command(worker.connection, worker.name, "stop-job", job_id=job_id(prefix, after))
        send_stop_job_command(worker.connection, job_id(prefix, stopped), serializer=JSONSerializer)

    join = _meanwhile(operator, warm.interrupt)
    with caplog.at_level(logging.INFO, logger="autorl.evaluator.warm"):
        worker.work(burst=True)
    join()
    (failed, scored) = _rows(rq_settings, [stopped, after])
    assert failed[:2] == (SubmissionStatus.FAILED, FailureReason.STOPPED), failed
    assert "stopped by an operator" in failed[2] and "no score was recorded" in failed[2]
    assert _job_status(rq_settings, stopped) == JobStatus.STOPPED  # as RQ leaves a killed horse's job
    assert scored[0] == SubmissionStatus.SCORED, scored
    pids = [int(pid) for pid in re.findall(r"event=warm_worker_started pid=(\d+)", caplog.text)]
    assert len(pids) == 2 and pids[0] != pids[1]  # the next job had a fresh child
    assert group_members(pids[0]) == [] and group_members(pids[1]) == []  # the engine stand-in too


@pytest.mark.timeout(180)
def test_a_warm_child_killed_mid_job_fails_the_job_and_its_submission_is_queued_again(
    rq_settings: Any,
    tiny_base_model: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """As the out-of-memory killer does: SIGKILL to the child alone, mid-evaluation."""
    from fastapi.testclient import TestClient
    from rq.job import JobStatus

    from autorl.store import Database, SubmissionStatus, claims
    from autorl_grader.main import create_app
    from autorl_grader.reconciler import reconcile_once

    monkeypatch.setenv("AUTORL_EVAL_LEASE_S", "1")  # the dead child's claim lapses within a second
    (killed,) = _submit_copies(rq_settings, tiny_base_model, tmp_path, 1)
    (after,) = _submit_copies(rq_settings, tiny_base_model, tmp_path, 1)
    warm, hanging = _child_hanging_once_on(killed, tmp_path)
    worker = _warm_rq_worker(rq_settings, warm)
    dead: list[int] = []

    def out_of_memory() -> None:
        wait_for(hanging.exists, "the evaluation to hang", timeout_s=90)
        assert warm.process is not None
        dead.append(warm.process.pid)
        os.kill(dead[0], signal.SIGKILL)

    join = _meanwhile(out_of_memory, warm.interrupt)
    with caplog.at_level(logging.INFO, logger="autorl.evaluator"):
        worker.work(burst=True)
    join()
    (unfinished, scored) = _rows(rq_settings, [killed, after])
    assert unfinished[0] == SubmissionStatus.RUNNING, unfinished  # never final, never scored
    assert f"pid {dead[0]}) was killed by SIGKILL" in caplog.text
    assert f"during the evaluation of submission {killed}" in caplog.text
    assert _job_status(rq_settings, killed) == JobStatus.SCHEDULED  # RQ retries it, as a dead horse's
    assert scored[0] == SubmissionStatus.SCORED, scored
    pids = [int(pid) for pid in re.findall(r"event=warm_worker_started pid=(\d+)", caplog.text)]
    assert pids[0] == dead[0] and len(pids) == 2 and group_members(dead[0]) == []

    # Once the dead child's lease has lapsed, the grader's reconciler queues the submission again.
    db = Database(rq_settings.database_url)
    with db.session() as session:
        wait_for(
            lambda: killed in {s.id for s in claims.stale_submissions(session)}, "the lease", timeout_s=10
        )
    db.dispose()
    state = TestClient(create_app(rq_settings, reconcile=False)).app.state.grader  # type: ignore[attr-defined]
    assert reconcile_once(state)["requeued"] == 1
    (requeued,) = _rows(rq_settings, [killed])
    assert requeued[0] == SubmissionStatus.QUEUED, requeued
    assert _job_status(rq_settings, killed) == JobStatus.QUEUED  # a fresh job for the next worker


@pytest.mark.timeout(120)
def test_a_stop_job_for_a_forked_work_horse_fails_its_submission_as_stopped(
    rq_settings: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`autorl worker` without the warm child: the stop kills the work horse's group (RQ) and the
    submission fails with the same reason, instead of coming back once its lease lapses."""
    import subprocess

    from redis import Redis
    from rq.command import send_stop_job_command
    from rq.job import JobStatus
    from rq.serializers import JSONSerializer

    from autorl.queue import EVALUATE_JOB, job_id
    from autorl.store import Database, FailureReason, SubmissionStatus
    from autorl_evaluator import jobs
    from autorl_evaluator.rq_worker import EvaluationWorker, evaluation_queue
    from tests.support.runs import add_submission, create_experiment

    db = Database(rq_settings.database_url)
    submission = add_submission(db, create_experiment(db, tmp_path / "workspace").name)
    hanging = tmp_path / "hanging"

    def hang(*args: object) -> None:  # in the forked horse, after the claim
        import time

        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # as an engine
        hanging.write_text(str(os.getpgrp()))
        time.sleep(600)

    monkeypatch.setattr(jobs, "snapshot_path", hang)
    redis = Redis.from_url(rq_settings.redis_url)
    queue = evaluation_queue(rq_settings.queue_name, redis)
    job = job_id(rq_settings.redis_key_prefix, submission)
    queue.enqueue(EVALUATE_JOB, submission, job_id=job)
    worker = EvaluationWorker([queue], connection=redis, key_prefix=rq_settings.redis_key_prefix, db=db)

    def operator() -> None:
        wait_for(
            lambda: hanging.exists() and bool(hanging.read_text()), "the evaluation to hang", timeout_s=60
        )
        send_stop_job_command(redis, job, serializer=JSONSerializer)

    join = _meanwhile(operator, worker.kill_horse)
    worker.work(burst=True)
    join()
    (row,) = _rows(rq_settings, [submission])
    assert row[:2] == (SubmissionStatus.FAILED, FailureReason.STOPPED) and "stopped by an operator" in row[2]
    assert _job_status(rq_settings, submission) == JobStatus.STOPPED
    horse_group = int(hanging.read_text())  # the horse and the process it started
    wait_for(lambda: group_members(horse_group) == [], "the horse's group to end", timeout_s=10)
    db.dispose()
    redis.close()


@pytest.mark.timeout(180)
def test_a_warm_rq_worker_stops_its_child_for_a_provenance_check_and_runs_it(
    rq_settings: Any, tiny_base_model: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The check loads the final and the base model itself: the warm child (and its GPU memory)
    goes first; the check is recorded."""
    from fastapi.testclient import TestClient

    from autorl.store import SubmissionStatus
    from autorl_grader.main import create_app
    from tests.support.grading import admin_headers, make_workspace, register

    (scored,) = _submit_copies(rq_settings, tiny_base_model, tmp_path, 1)
    with TestClient(create_app(rq_settings, reconcile=False)) as client:
        closed = register(client, rq_settings, tiny_base_model, make_workspace(tmp_path))
        (closed.output_dir / "notes.txt").write_text("no test question here")
        path = f"/v1/experiments/{closed.name}"
        client.post(f"{path}/finish", json={"status": "completed"}, headers=admin_headers(rq_settings))
        assert client.post(f"{path}/provenance/check", headers=admin_headers(rq_settings)).status_code == 200
        worker = _warm_rq_worker(rq_settings)
        with caplog.at_level(logging.INFO):
            worker.work(burst=True)
        view = client.get(path, headers=admin_headers(rq_settings)).json()
    assert _rows(rq_settings, [scored])[0][0] == SubmissionStatus.SCORED
    assert view["test_overlap"] == 0
    events = re.findall(r"event=(warm_worker_started|warm_worker_stopped|provenance_checked)", caplog.text)
    assert events[:3] == ["warm_worker_started", "warm_worker_stopped", "provenance_checked"], events
