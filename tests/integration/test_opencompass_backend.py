"""Real OpenCompass on the CPU, through the worker path, against the in-process backend.

One worker (the in-process evaluation worker on this run's Redis, Postgres database of its own) takes
two submissions: the first with a hard timeout OpenCompass cannot meet (the submission fails
with the reason, no process is left, and the same worker goes on), the second, a tiny
transformers-5 checkpoint, to the end (scored). The ``hf`` backend then evaluates the same checkpoint on
the same problems in-process: per-sample predictions and all three scores must be identical.
A model trained to answer half the problems scores through OpenCompass too: OpenCompass's own
summary accuracy is strictly between 0 and 100 and equals the stored score.
A checkpoint whose weights cannot be loaded is evaluated too: OpenCompass writes ``-`` in its
summary and exits 0, and the backend fails with OpenCompass's own error instead of a score.
"""

from __future__ import annotations

import csv
import functools
import json
import os
import re
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from redis import Redis

from autorl.errors import EvaluationError
from autorl.eval_config import EvalConfig
from autorl.tasks import get_task
from autorl.tasks.base import Problem
from autorl_evaluator.backends import get_backend
from autorl_evaluator.backends.opencompass.backend import OpenCompassBackend
from autorl_evaluator.backends.opencompass.resident_engine import ENGINES
from autorl_evaluator.backends.opencompass.warm_opencompass import SERVERS
from autorl_evaluator.jobs import predictions_path
from autorl_evaluator.rq_worker import InProcessEvaluationWorker, evaluation_queue
from autorl_evaluator.time_budget import BudgetExceededError, TimeBudget
from autorl_grader.main import create_app
from tests.support.grading import (
    RegisteredExperiment,
    copy_model,
    make_workspace,
    register,
    row_id,
    submit_accepted,
)
from tests.support.models import TrainedModel, poison_padding
from tests.support.opencompass_models import corrupt_weights, save_answering_model, save_sharp_model
from tests.support.settings import DeploymentSettings

pytestmark = [pytest.mark.opencompass, pytest.mark.slow]

REPO_ROOT = Path(__file__).resolve().parents[2]
OPENCOMPASS_BIN = REPO_ROOT / ".venv-opencompass" / "bin" / "opencompass"
#: Short answers keep a CPU evaluation to about a minute; the prompts are the real 4-shot ones.
MAX_NEW_TOKENS = 24
LIMIT = 4
#: The timed-out submission belongs to an experiment asking for this many new tokens on each of
#: its test problems (the fixture's 16, LONG_REPEATS times), one prompt at a time. The builtin tiny
#: model's answers stop before that (16 problems took about 25 s on an idle machine), so the repeats
#: make inference last minutes, well past TIMEOUT_TOO_SHORT_S, by which time OpenCompass has started
#: it (its tasks in its own process: a whole cold evaluation of 8 problems took 8.7 s on 2 cores
#: beside an image build).
LONG_MAX_NEW_TOKENS = 2500
LONG_BATCH_SIZE = 1
#: How many times the long experiment's test split repeats the fixture problems.
LONG_REPEATS = 12
TIMEOUT_TOO_SHORT_S = 60
TIMEOUT_S = 900
#: The warm OpenCompass's run starts at once (its server has imported OpenCompass): a few seconds
#: into the long experiment's inference.
WARM_TIMEOUT_TOO_SHORT_S = 8


@dataclass
class WorkerRun:
    settings: DeploymentSettings
    checkpoint: Path
    timed_out: dict[str, Any]
    scored: dict[str, Any]
    predictions: list[dict[str, str]]
    leftovers: list[int]
    #: Whether OpenCompass had started inference when the timeout struck.
    inference_started: bool
    problems: list[Problem]
    #: A model trained to answer half the problems right, scored through OpenCompass.
    trained: dict[str, Any]
    #: OpenCompass's own accuracy for it, from the summary CSV of its run.
    trained_summary_accuracy: float


def _job_environment(settings: DeploymentSettings) -> dict[str, str]:
    """The worker's environment: the job reads its settings from AUTORL_* variables. Its own timeout
    and batch size say otherwise than the experiments' recorded ones, which win."""
    return {
        "AUTORL_EVAL_BATCH_SIZE": "64",
        "AUTORL_HOME": str(settings.home),
        "AUTORL_DATABASE_URL": settings.database_url or "",
        "AUTORL_REDIS_URL": settings.redis_url or "",
        "AUTORL_REDIS_KEY_PREFIX": settings.redis_key_prefix,
        "AUTORL_ADMIN_TOKEN": settings.admin_token_value,
        "AUTORL_DATA_SOURCE_DIR": str(settings.data_source_dir),
        "AUTORL_EVAL_DEVICE": "cpu",
        "AUTORL_OPENCOMPASS_BIN": str(OPENCOMPASS_BIN),
        "AUTORL_EVAL_TIMEOUT_S": "7200",
    }


def processes_under(root: Path) -> list[int]:
    """Live processes whose working directory lies under ``root``: OpenCompass and everything it
    started run in their evaluation's folder."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cwd = Path(os.readlink(entry / "cwd"))
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if cwd.is_relative_to(root) and state != "Z":
            found.append(int(entry.name))
    return found


@pytest.fixture(scope="module")
def sharp_checkpoint(tiny_base_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_sharp_model(tiny_base_model, tmp_path_factory.mktemp("ckpt") / "model")


@pytest.fixture(scope="module")
def own_pg_url() -> Iterator[str]:
    """A database of this module's own: the grader hands everything queued in its database to its
    queue, and other tests leave unevaluated submissions in the run's shared one."""
    from autorl.store import migrate
    from tests.support.infra import new_run_id, postgres_database

    with postgres_database(new_run_id()) as url:
        migrate(url)
        yield url


@pytest.fixture(scope="module")
def worker_run(
    tiny_base_model: Path,
    sharp_checkpoint: Path,
    trained_tiny_model: TrainedModel,
    own_pg_url: str,
    redis_url: str,
    run_id: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[WorkerRun]:
    import secrets

    from tests.conftest import FIXTURE_DATA

    pg_url = own_pg_url
    root = tmp_path_factory.mktemp("worker-path")
    # The fixture problems repeated: the first LIMIT (the scored runs') are the fixture's own, and
    # the long experiment's evaluation of all of them outlasts its hard timeout on an idle machine
    # too (the tiny model's answers stop before 2,500 tokens: 16 problems took about 25 s).
    data_source = root / "data"
    (data_source / "gsm8k").mkdir(parents=True)
    shutil.copy(FIXTURE_DATA / "gsm8k" / "train.jsonl", data_source / "gsm8k" / "train.jsonl")
    fixture_test = (FIXTURE_DATA / "gsm8k" / "test.jsonl").read_text(encoding="utf-8")
    (data_source / "gsm8k" / "test.jsonl").write_text(fixture_test * LONG_REPEATS, encoding="utf-8")
    settings = DeploymentSettings(
        home=root / "home",
        admin_token=secrets.token_hex(16),
        redis_key_prefix=f"autorl-test-{run_id}-oc",
        data_source_dir=data_source,
        database_url=pg_url,
        redis_url=redis_url,
        submit_wait_s=0.0,
        eval_backend="opencompass",
        eval_max_new_tokens=MAX_NEW_TOKENS,
        eval_limit=LIMIT,
        eval_device="cpu",
        opencompass_bin=OPENCOMPASS_BIN,
        eval_timeout_s=TIMEOUT_S,
        eval_batch_size=LIMIT,
    )
    # Two graders on one database and queue: an experiment's generation limit, hard timeout and
    # batch size are fixed when it is registered, from its grader's settings.
    long_settings = settings.model_copy(
        update={
            "eval_max_new_tokens": LONG_MAX_NEW_TOKENS,
            "eval_limit": None,
            "eval_timeout_s": TIMEOUT_TOO_SHORT_S,
            "eval_batch_size": LONG_BATCH_SIZE,
        }
    )
    with (
        TestClient(create_app(settings, reconcile=False)) as client,
        TestClient(create_app(long_settings, reconcile=False)) as long_client,
        pytest.MonkeyPatch.context() as env,
    ):
        # The sharpened checkpoint is this experiment's base model: a submission must keep its base's
        # architecture (RoPE theta included), and the evaluator reads the base's config.json, which
        # transformers 5 wrote with RoPE only in rope_parameters: the view's fix is on this path.
        experiment = register(client, settings, sharp_checkpoint, make_workspace(root))
        trained_experiment = register(client, settings, tiny_base_model, make_workspace(root))
        long_experiment = register(long_client, long_settings, tiny_base_model, make_workspace(root))
        redis = Redis.from_url(redis_url)
        worker = InProcessEvaluationWorker(
            [evaluation_queue(settings.queue_name, redis)],
            connection=redis,
            key_prefix=settings.redis_key_prefix,
        )

        def submit_and_work(
            client: TestClient, experiment: RegisteredExperiment, model: Path
        ) -> dict[str, Any]:
            copy_model(model, experiment.output_dir / "ckpt", unique=True)
            submission_id = int(submit_accepted(client, experiment, "output/ckpt")["submission_id"])
            for name, value in _job_environment(settings).items():
                env.setenv(name, value)
            worker.work(burst=True)
            view = client.get(f"{experiment.url_path}/submissions/{submission_id}").json()
            assert isinstance(view, dict)
            return view

        timed_out = submit_and_work(long_client, long_experiment, tiny_base_model)
        assert settings.eval_dir is not None
        leftovers = processes_under(settings.eval_dir)
        [timed_out_run] = (settings.eval_dir / "opencompass").glob("2*")
        inference_started = "Start inferencing" in (timed_out_run / "opencompass.log").read_text()
        scored = submit_and_work(client, experiment, sharp_checkpoint)
        predictions_file = predictions_path(
            settings, row_id(settings.database_url, experiment, int(scored["submission_id"]))
        )
        predictions = [json.loads(line) for line in predictions_file.read_text().splitlines()]
        problems = get_task("gsm8k").load_test_problems(
            settings.eval_dir / "data" / "gsm8k", source_dir=FIXTURE_DATA, limit=LIMIT
        )
        runs_before = set((settings.eval_dir / "opencompass").glob("2*"))
        env.setenv("AUTORL_OPENCOMPASS_KEEP_RUNS", "1")  # its summary CSV is read below
        trained = submit_and_work(client, trained_experiment, trained_tiny_model.path)
        [trained_run] = set((settings.eval_dir / "opencompass").glob("2*")) - runs_before
        [summary] = trained_run.glob("work/*/summary/summary_*.csv")
        [row] = list(csv.DictReader(summary.open()))
        yield WorkerRun(
            settings,
            experiment.output_dir / "ckpt",
            timed_out,
            scored,
            predictions,
            leftovers,
            inference_started,
            problems,
            trained,
            float(row["submission"]),
        )
        redis.close()


def test_the_worker_path_scores_a_submission_with_real_opencompass(worker_run: WorkerRun) -> None:
    scored = worker_run.scored
    assert scored["status"] == "scored", scored
    completions = [p["completion"] for p in worker_run.predictions]
    assert len(completions) == LIMIT and all(completions)
    expected = get_task("gsm8k").score(completions, [p.answer for p in worker_run.problems])
    assert scored["scores"] == pytest.approx(expected)
    assert scored["n_samples"] == LIMIT


def test_opencompass_own_summary_accuracy_is_the_score_of_a_model_that_scores(worker_run: WorkerRun) -> None:
    """A real model that answers some problems right: OpenCompass's summary accuracy (its own
    evaluator, not our re-scoring) is the stored score, and it is neither 0 nor 100."""
    trained = worker_run.trained
    assert trained["status"] == "scored", trained
    assert 0 < worker_run.trained_summary_accuracy < 100
    assert trained["scores"]["opencompass"] == pytest.approx(worker_run.trained_summary_accuracy, abs=0.01)
    assert trained["score"] == pytest.approx(worker_run.trained_summary_accuracy, abs=0.01)


def test_a_timed_out_evaluation_fails_with_the_reason_and_leaves_no_process(worker_run: WorkerRun) -> None:
    failed = worker_run.timed_out
    assert failed["status"] == "failed" and failed["score"] is None
    assert f"hard timeout of {TIMEOUT_TOO_SHORT_S} s" in failed["error"]
    # It was stopped while OpenCompass's inference ran, and nothing it started is left.
    assert worker_run.inference_started
    assert worker_run.leftovers == []
    # The same worker went on to evaluate the next submission.
    assert worker_run.scored["status"] == "scored"


def test_hf_and_opencompass_backends_agree_on_every_sample(worker_run: WorkerRun) -> None:
    settings = worker_run.settings.model_copy(update={"eval_backend": "hf"})
    result = get_backend("hf").evaluate(
        worker_run.checkpoint,
        get_task("gsm8k"),
        worker_run.problems,
        EvalConfig.record("gsm8k", settings),
        settings,
    )
    opencompass = [p["completion"] for p in worker_run.predictions]
    # The model is sharp enough that its answers differ from prompt to prompt: equal outputs mean
    # equal prompts, ids, decoding and stop handling, not just a constant model.
    assert len(set(opencompass)) == LIMIT
    assert result.completions == opencompass
    assert result.scores == get_task("gsm8k").score(opencompass, [p.answer for p in worker_run.problems])
    assert result.scores["opencompass"] == pytest.approx(worker_run.scored["score"])


@pytest.fixture
def make_opencompass_settings(
    make_settings: Callable[..., DeploymentSettings],
) -> Callable[..., DeploymentSettings]:
    """:func:`make_settings` for the ``opencompass`` backend, run by the OpenCompass environment's
    command, with answers of at most MAX_NEW_TOKENS tokens unless told otherwise."""
    return functools.partial(
        make_settings,
        eval_backend="opencompass",
        eval_max_new_tokens=MAX_NEW_TOKENS,
        opencompass_bin=OPENCOMPASS_BIN,
    )


def test_a_checkpoint_opencompass_cannot_load_fails_with_its_error(
    sharp_checkpoint: Path, make_opencompass_settings: Callable[..., DeploymentSettings], tmp_path: Path
) -> None:
    broken = corrupt_weights(sharp_checkpoint, tmp_path / "broken")
    settings = make_opencompass_settings()
    task = get_task("gsm8k")
    problems = task.load_test_problems(tmp_path / "data", source_dir=settings.data_source_dir, limit=LIMIT)
    started = time.monotonic()
    with pytest.raises(EvaluationError) as failure:
        OpenCompassBackend().evaluate(
            broken, task, problems, EvalConfig.record(task.name, settings), settings
        )
    message = str(failure.value)
    assert "produced no score (exit code 1)" in message
    assert "safetensors" in message.lower() or "deserializ" in message.lower()
    assert not any(problem.question[:40] in message for problem in problems)
    assert len(message) <= 4000
    # The run folder is kept for the operator, with OpenCompass's own account of the failure.
    assert settings.eval_dir is not None
    [run_dir] = (settings.eval_dir / "opencompass").glob("2*")
    assert "SafetensorError" in (run_dir / "opencompass.log").read_text()
    assert processes_under(run_dir) == []
    assert time.monotonic() - started < TIMEOUT_S


def test_the_resident_engine_keeps_opencompass_prompts_and_scores_and_takes_weights_in_place(
    worker_run: WorkerRun,
    trained_tiny_model: TrainedModel,
    make_opencompass_settings: Callable[..., DeploymentSettings],
    tmp_path: Path,
) -> None:
    """``AUTORL_VLLM_PYTHON``: OpenCompass renders the prompts and scores the answers, the resident
    engine (transformers on the CPU, in that Python) generates. Its answers are OpenCompass's own
    path's, word for word; the next checkpoint of the same architecture is loaded into the same
    engine in place and answers as a fresh model does; a checkpoint that cannot be loaded fails with
    the engine's error and the engine is stopped, so the next evaluation starts a fresh one. Outside
    the warm worker the engine goes with its evaluation."""
    settings = make_opencompass_settings(
        vllm_python=Path(sys.executable),
        eval_warm_worker=True,  # the engine stays between evaluations only in the warm worker
    )
    task = get_task("gsm8k")
    config = EvalConfig.record(task.name, settings)
    backend = OpenCompassBackend()
    try:
        first = backend.evaluate(worker_run.checkpoint, task, worker_run.problems, config, settings)
        assert first.details["engine"] == "resident"
        assert first.details["opencompass_process"] == "warm"
        server = SERVERS.current
        assert server is not None and server.alive()
        assert first.completions == [p["completion"] for p in worker_run.predictions]
        assert first.scores["opencompass"] == pytest.approx(worker_run.scored["score"])
        engine = ENGINES.current
        assert engine is not None and engine.alive()

        # The trained model's weights in the first checkpoint's architecture files: the same engine.
        twin = tmp_path / "twin"
        shutil.copytree(worker_run.checkpoint, twin)
        shutil.copyfile(trained_tiny_model.path / "model.safetensors", twin / "model.safetensors")
        problems = list(trained_tiny_model.problems)
        second = backend.evaluate(twin, task, problems, config, settings)
        assert ENGINES.current is engine and engine.alive()  # the same process, the weights swapped
        assert SERVERS.current is server and server.alive()  # OpenCompass forked from the same server
        engine_log = (settings.eval_dir / "opencompass" / "engine.log").read_text()
        assert re.findall(r"engine load reused=(\w+)", engine_log) == ["False", "True"]
        # One start (with the arguments it got), and each evaluation's prompts timed by the engine.
        started = re.findall(r"engine start kwargs=(.*)", engine_log)
        assert len(started) == 1 and json.loads(started[0])["trust_remote_code"] is False
        generated = re.findall(r"engine generate prompts=(\d+) seconds=([\d.]+)", engine_log)
        assert [int(count) for count, _ in generated] == [len(worker_run.problems), len(problems)]
        fresh = get_backend("hf").evaluate(
            twin, task, problems, config, settings.model_copy(update={"eval_backend": "hf"})
        )
        assert second.completions == fresh.completions
        assert second.scores == fresh.scores

        broken = corrupt_weights(worker_run.checkpoint, tmp_path / "broken")
        with pytest.raises(EvaluationError) as failure:
            backend.evaluate(broken, task, worker_run.problems, config, settings)
        assert "resident engine failed" in str(failure.value)
        assert ENGINES.current is None and not engine.alive()
        assert SERVERS.current is None and not server.alive()

        # Outside the warm worker, the engine goes with its evaluation.
        cold = settings.model_copy(update={"eval_warm_worker": False})
        assert (
            backend.evaluate(twin, task, problems[:1], config, cold).details["opencompass_process"]
            == "command"
        )
        assert ENGINES.current is None and SERVERS.current is None
    finally:
        ENGINES.stop()
        SERVERS.stop()


def test_every_engine_drops_special_tokens_and_lets_no_padding_slot_reach_a_row(
    tiny_base_model: Path, make_opencompass_settings: Callable[..., DeploymentSettings], tmp_path: Path
) -> None:
    """One decoding rule for every engine: the ``hf`` backend, OpenCompass with the resident engine
    (transformers on the CPU, given the rule in OpenCompass's sampling parameters) and OpenCompass's
    own transformers model (given it by the config's model builder).

    - Special tokens are dropped, as vLLM drops them: a model that puts ``<|im_start|>`` between the
      two digits of its answer answers 19, not 9; the eos after the answer still ends it.
    - A padding slot adds nothing to a row: the same model, its pad token made to compute an
      infinite value, answers each of three prompts of different lengths (one batch, left-padded)
      as an unpadded row does."""
    from safetensors.torch import load_file, save_file

    settings = make_opencompass_settings(vllm_python=Path(sys.executable))
    task = get_task("gsm8k")
    problems = task.load_test_problems(tmp_path / "data", source_dir=settings.data_source_dir, limit=3)
    assert problems[0].answer.endswith("#### 19")
    assert len({len(problem.question) for problem in problems}) == 3
    answer = ["The", "Ġanswer", "Ġis", "Ġ", "1", "<|im_start|>", "9"]
    checkpoint = save_answering_model(tiny_base_model, tmp_path / "model", answer, "<|im_start|>assistant\n")
    weights = checkpoint / "model.safetensors"
    tensors = load_file(weights)
    poison_padding(tensors, json.loads((checkpoint / "config.json").read_text())["pad_token_id"])
    save_file(tensors, str(weights), metadata={"format": "pt"})
    config = EvalConfig.record(task.name, settings)
    try:
        engine = OpenCompassBackend().evaluate(checkpoint, task, problems, config, settings)
    finally:
        ENGINES.stop()
        SERVERS.stop()
    assert engine.details["engine"] == "resident"
    own = OpenCompassBackend().evaluate(checkpoint, task, problems, config, make_opencompass_settings())
    assert (own.details["engine"], own.details["device"]) == ("opencompass", "cpu")
    hf = get_backend("hf").evaluate(
        checkpoint, task, problems, config, settings.model_copy(update={"eval_backend": "hf"})
    )
    assert hf.completions == engine.completions == own.completions == ["The answer is 19"] * 3
    assert hf.scores == engine.scores == own.scores
    assert hf.scores["opencompass"] == pytest.approx(100 / 3)


def test_the_warm_worker_forks_opencompass_from_one_server_and_answers_as_the_command(
    worker_run: WorkerRun, make_opencompass_settings: Callable[..., DeploymentSettings], tmp_path: Path
) -> None:
    """In the warm worker each evaluation runs in a process forked from one server that imported
    OpenCompass once (OpenCompass's own command entry, its tasks in that process): the answers and
    the score are the ``opencompass`` command's, word for word; the next evaluation is forked from
    the same server, and each run's process ends with its run; outside the warm worker the command
    runs and no server is kept."""
    settings = make_opencompass_settings(eval_batch_size=LIMIT, eval_warm_worker=True)
    task = get_task("gsm8k")
    config = EvalConfig.record(task.name, settings)
    backend = OpenCompassBackend()
    command = [p["completion"] for p in worker_run.predictions]
    try:
        first = backend.evaluate(worker_run.checkpoint, task, worker_run.problems, config, settings)
        assert first.details["opencompass_process"] == "warm"
        assert first.completions == command
        assert first.scores["opencompass"] == pytest.approx(worker_run.scored["score"])
        server = SERVERS.current
        assert server is not None and server.alive()
        second = backend.evaluate(worker_run.checkpoint, task, worker_run.problems, config, settings)
        assert SERVERS.current is server and server.alive()
        assert second.completions == command
        assert settings.eval_dir is not None
        assert processes_under(settings.eval_dir) == []

        # A task that fails (OpenCompass's tasks run in the forked process, so the error ends the
        # run instead of a "-" in the summary): the same failure as the command's, and the server
        # goes with it.
        broken = corrupt_weights(worker_run.checkpoint, tmp_path / "broken")
        with pytest.raises(EvaluationError) as failure:
            backend.evaluate(broken, task, worker_run.problems, config, settings)
        message = str(failure.value)
        assert "produced no score" in message
        assert "safetensors" in message.lower() or "deserializ" in message.lower()
        assert not any(problem.question[:40] in message for problem in worker_run.problems)
        assert SERVERS.current is None and not server.alive()

        cold = settings.model_copy(update={"eval_warm_worker": False})
        third = backend.evaluate(worker_run.checkpoint, task, worker_run.problems, config, cold)
        assert third.details["opencompass_process"] == "command"
        assert third.completions == command
        assert SERVERS.current is None
    finally:
        SERVERS.stop()


def test_a_warm_evaluation_past_its_hard_timeout_ends_its_run_and_the_server(
    sharp_checkpoint: Path,
    make_opencompass_settings: Callable[..., DeploymentSettings],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The hard timeout ends the forked run and everything it started, as it ends the command's
    group; the server goes too, and the next evaluation gets a fresh one and a score."""
    settings = make_opencompass_settings(
        eval_max_new_tokens=LONG_MAX_NEW_TOKENS,
        eval_batch_size=LONG_BATCH_SIZE,
        eval_timeout_s=WARM_TIMEOUT_TOO_SHORT_S,
        eval_warm_worker=True,
    )
    task = get_task("gsm8k")
    problems = task.load_test_problems(tmp_path / "data", source_dir=settings.data_source_dir)
    backend = OpenCompassBackend()
    caplog.set_level("INFO", logger="autorl.evaluator.opencompass")
    try:
        with pytest.raises(EvaluationError) as failure:
            backend.evaluate(
                sharp_checkpoint, task, problems, EvalConfig.record(task.name, settings), settings
            )
        assert f"hard timeout of {WARM_TIMEOUT_TOO_SHORT_S} s" in str(failure.value)
        assert "every process it started were stopped" in str(failure.value)
        [started] = re.findall(r"event=compass_started pid=(\d+)", caplog.text)
        assert not Path(f"/proc/{started}").exists() and SERVERS.current is None
        assert settings.eval_dir is not None
        assert processes_under(settings.eval_dir) == []

        quick = settings.model_copy(
            update={"eval_max_new_tokens": MAX_NEW_TOKENS, "eval_timeout_s": TIMEOUT_S}
        )
        result = backend.evaluate(
            sharp_checkpoint, task, problems[:LIMIT], EvalConfig.record(task.name, quick), quick
        )
        assert result.details["opencompass_process"] == "warm" and len(result.completions) == LIMIT
        assert SERVERS.current is not None and str(SERVERS.current.process.pid) != started
    finally:
        SERVERS.stop()


def test_a_base_with_another_generation_config_never_steers_the_warm_opencompass_or_its_engine(
    sharp_checkpoint: Path, make_opencompass_settings: Callable[..., DeploymentSettings], tmp_path: Path
) -> None:
    """Base A evaluated by a fresh engine, then base B (A byte for byte but for its generation
    config, whose eos ids name every token) warms a fresh engine, then A in the same warm worker:
    OpenCompass forked from one server throughout, and the engine takes A as another model (a load,
    not weights in place), so A answers as it did first."""
    settings = make_opencompass_settings(vllm_python=Path(sys.executable), eval_warm_worker=True)
    a = Path(shutil.copytree(sharp_checkpoint, tmp_path / "a"))
    b = Path(shutil.copytree(sharp_checkpoint, tmp_path / "b"))
    generation = json.loads((b / "generation_config.json").read_text(encoding="utf-8"))
    vocab = json.loads((b / "config.json").read_text(encoding="utf-8"))["vocab_size"]
    generation["eos_token_id"] = list(range(vocab))
    (b / "generation_config.json").write_text(json.dumps(generation), encoding="utf-8")
    task = get_task("gsm8k")
    problems = task.load_test_problems(tmp_path / "data", source_dir=settings.data_source_dir, limit=LIMIT)
    config = EvalConfig.record(task.name, settings)
    backend = OpenCompassBackend()
    ENGINES.stop()
    SERVERS.stop()
    try:
        first = backend.evaluate(a, task, problems, config, settings)
        server = SERVERS.current
        ENGINES.stop()
        on_b = backend.evaluate(b, task, problems, config, settings)
        engine = ENGINES.current
        again = backend.evaluate(a, task, problems, config, settings)
        assert SERVERS.current is server and ENGINES.current is engine  # one server; B's engine process
    finally:
        ENGINES.stop()
        SERVERS.stop()
    assert all(first.completions) and on_b.completions != first.completions
    assert again.completions == first.completions
    engine_log = (settings.eval_dir / "opencompass" / "engine.log").read_text()
    assert re.findall(r"engine load reused=(\w+)", engine_log) == ["False", "False", "False"]


def test_an_evaluation_past_its_time_budget_stops_opencompass_and_says_so(
    sharp_checkpoint: Path, make_opencompass_settings: Callable[..., DeploymentSettings], tmp_path: Path
) -> None:
    """An agent's evaluation on the CPU gets a budget measured on the CPU: OpenCompass's run ends at
    it, every process of it with it, and the failure is the budget's (the checkpoint's)."""
    settings = make_opencompass_settings()
    task = get_task("gsm8k")
    problems = task.load_test_problems(tmp_path / "data", source_dir=settings.data_source_dir, limit=LIMIT)
    budget = TimeBudget(seconds=3, baseline_seconds=1, baseline_fill=1, factor=3, floor_s=0, device="cpu")
    started = time.monotonic()
    with pytest.raises(BudgetExceededError, match="passed its time budget and was stopped") as failure:
        OpenCompassBackend().evaluate(
            sharp_checkpoint, task, problems, EvalConfig.record(task.name, settings), settings, budget=budget
        )
    assert time.monotonic() - started < 60  # not the hard timeout
    assert "every process it started were stopped" in str(failure.value)
    assert settings.eval_dir is not None
    assert processes_under(settings.eval_dir) == []
