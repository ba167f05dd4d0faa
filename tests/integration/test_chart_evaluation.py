"""One owner for each evaluation setting: the chart's `evaluator.*` values reach the evaluation config
the grader records, and the workers obey that record.

The chart is rendered by Helm; the grader runs as a real process with exactly the rendered
container's evaluation settings (only the addresses of Postgres, Redis and the storage are this
test's own), registers an experiment in its own Postgres database and queues its baseline on a
private Redis. The recorded config and the queue's job timeout are read back.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError
from redis import Redis
from rq.job import Job
from rq.serializers import JSONSerializer

from autorl.eval_config import DECODING, EVAL_PROTOCOL_VERSION, EvalConfig
from autorl.queue import JOB_TIMEOUT_MARGIN_S, job_id
from autorl_evaluator.settings import WorkerSettings
from tests.integration.test_chart import IMAGES, RELEASE, merge, of_kind, render
from tests.support.infra import free_port, grader_process

AUTORL = str(Path(sys.executable).parent / "autorl")
EVALUATION_VALUES: dict[str, Any] = {
    "evaluator": {"backend": "hf", "timeoutSeconds": 1234, "maxNewTokens": 96, "batchSize": 24}
}
#: Rendered variables that name cluster-only places; the test gives its own.
LOCAL_ADDRESSES = {
    "AUTORL_DATABASE_URL",
    "AUTORL_REDIS_URL",
    "AUTORL_REDIS_KEY_PREFIX",
    "AUTORL_ADMIN_TOKEN",
    "AUTORL_HOME",
    "AUTORL_CACHE_DIR",
    "AUTORL_SNAPSHOT_DIR",
    "AUTORL_PUBLIC_URL",
    "POSTGRES_PASSWORD",
    "REDIS_PASSWORD",
}


def container_env(documents: list[dict[str, Any]], component: str) -> dict[str, str]:
    deployment = of_kind(documents, "Deployment")[f"{RELEASE}-autorl-{component}"]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e["value"] for e in container["env"] if "value" in e}


#: The evaluation settings the grader records (AUTORL_EVAL_DIR is a worker's storage, not one of them).
RECORDED = (
    "AUTORL_EVAL_BACKEND",
    "AUTORL_EVAL_TIMEOUT_S",
    "AUTORL_EVAL_MAX_NEW_TOKENS",
    "AUTORL_EVAL_BATCH_SIZE",
)


def evaluation_env(env: dict[str, str]) -> dict[str, str]:
    return {name: value for name, value in env.items() if name in RECORDED}


def test_the_grader_and_the_workers_get_the_same_evaluation_settings() -> None:
    for values, expected in (
        ({}, {"AUTORL_EVAL_BACKEND": "opencompass", "AUTORL_EVAL_TIMEOUT_S": "7200"}),
        (
            EVALUATION_VALUES,
            {
                "AUTORL_EVAL_BACKEND": "hf",
                "AUTORL_EVAL_TIMEOUT_S": "1234",
                "AUTORL_EVAL_MAX_NEW_TOKENS": "96",
                "AUTORL_EVAL_BATCH_SIZE": "24",
            },
        ),
    ):
        documents = render(merge(IMAGES, values))
        grader = evaluation_env(container_env(documents, "grader"))
        assert grader == expected
        assert evaluation_env(container_env(documents, "evaluator")) == grader


@pytest.fixture
def chart_grader(
    fresh_pg_url: str, redis_url: str, fresh_queue_prefix: str, tmp_path: Path
) -> Iterator[tuple[str, str, str]]:
    """The grader started with the rendered container's settings; yields (admin URL, token, prefix)."""
    rendered = container_env(render(merge(IMAGES, EVALUATION_VALUES)), "grader")
    kept = {name: value for name, value in rendered.items() if name not in LOCAL_ADDRESSES}
    assert evaluation_env(kept) == evaluation_env(rendered)  # every evaluation setting as rendered
    agent_port, admin_port = free_port(), free_port()
    token = secrets.token_hex(16)
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith("AUTORL_") and name not in ("POSTGRES_PASSWORD", "REDIS_PASSWORD")
    }
    env |= kept | {
        "AUTORL_DATABASE_URL": fresh_pg_url,
        "AUTORL_REDIS_URL": redis_url,
        "AUTORL_REDIS_KEY_PREFIX": fresh_queue_prefix,
        "AUTORL_ADMIN_TOKEN": token,
        "AUTORL_HOME": str(tmp_path / "home"),
        "AUTORL_SNAPSHOT_DIR": str(tmp_path / "snapshots"),
        "AUTORL_PUBLIC_URL": f"http://127.0.0.1:{agent_port}",
    }
    command = [
        AUTORL,
        "grader",
        "--host",
        "127.0.0.1",
        "--port",
        str(agent_port),
        "--admin-port",
        str(admin_port),
    ]
    admin = f"http://127.0.0.1:{admin_port}"
    with grader_process(command, env, [admin]):
        yield admin, token, fresh_queue_prefix


def test_the_chart_values_are_the_recorded_config_and_the_job_timeout(
    chart_grader: tuple[str, str, str], redis_url: str, tiny_base_model: Path, tmp_path: Path
) -> None:
    admin, token, prefix = chart_grader
    headers = {"Authorization": f"Bearer {token}"}
    body = {
        "name": "chart-settings",
        "task": "gsm8k",
        "model": "builtin:tiny-qwen2",
        "timeout_s": 600,
        "workspace": str(tmp_path / "workspace"),
        "base_model_dir": str(tiny_base_model),
    }
    registered = httpx.post(f"{admin}/v1/experiments", headers=headers, json=body, timeout=30)
    assert registered.status_code == 201, registered.text
    config = httpx.get(f"{admin}/v1/experiments/chart-settings", headers=headers).json()["eval_config"]
    assert config == {
        "task": "gsm8k",
        "backend": "hf",
        "protocol": "opencompass",
        "protocol_version": EVAL_PROTOCOL_VERSION,
        "max_new_tokens": 96,
        "limit": None,
        "timeout_s": 1234,
        "batch_size": 24,
        "prompt_version": "gsm8k_gen_1d7fe4/1",
        "decoding": DECODING,
        # Measured by the evaluator: none has evaluated in this store yet, the first completes them.
        "data_sha256": None,
        "backend_versions": None,
        "split": None,  # the test split
    }

    # The baseline is queued with the recorded timeout plus the queue's margin as its job timeout.
    queued = httpx.post(f"{admin}/v1/experiments/chart-settings/baseline", headers=headers, timeout=60)
    assert queued.status_code == 202, queued.text
    submission_id = queued.json()["submission_id"]
    redis = Redis.from_url(redis_url)
    job = Job.fetch(job_id(prefix, submission_id), connection=redis, serializer=JSONSerializer)
    assert job.timeout == 1234 + JOB_TIMEOUT_MARGIN_S

    # A worker whose own environment says otherwise evaluates under the recorded settings.
    worker = WorkerSettings(
        eval_backend="opencompass", eval_timeout_s=60, eval_batch_size=512, eval_max_new_tokens=512
    )
    run = EvalConfig.model_validate(config)
    in_force = (
        run.backend,
        run.timeout_in_force_s(worker.eval_timeout_s),
        run.batch_size_in_force(worker.eval_batch_size),
        run.max_new_tokens,
    )
    assert in_force == ("hf", 1234, 24, 96)


def test_how_long_and_how_batched_do_not_change_which_scores_are_comparable() -> None:
    config = EvalConfig(task="gsm8k", backend="opencompass", max_new_tokens=512, limit=None, timeout_s=7200)
    assert config.key == config.model_copy(update={"timeout_s": 60, "batch_size": 8}).key
    assert config.key != config.model_copy(update={"max_new_tokens": 256}).key
    assert config.key != config.model_copy(update={"backend": "hf"}).key


def test_keys_recorded_before_the_typed_config_are_reproduced() -> None:
    """The key is the hash of the score-changing fields as the store has always kept them, so the
    scores and baselines cached under earlier keys stay reusable."""
    scored = {
        "task": "gsm8k",
        "backend": "hf",
        "protocol": "opencompass",
        "protocol_version": EVAL_PROTOCOL_VERSION,
        "max_new_tokens": 512,
        "limit": 50,
    }
    earlier_key = hashlib.sha256(json.dumps(scored, sort_keys=True).encode()).hexdigest()[:32]
    assert EvalConfig.model_validate(scored).key == earlier_key  # recorded before timeout and batch
    assert EvalConfig.model_validate(scored | {"timeout_s": 900, "batch_size": None}).key == earlier_key


def test_a_config_from_a_newer_grader_is_refused_not_half_obeyed() -> None:
    recorded = {"task": "gsm8k", "backend": "hf", "max_new_tokens": 512, "limit": None, "sampling": "top_p"}
    with pytest.raises(ValidationError, match="sampling"):
        EvalConfig.model_validate(recorded)


def test_a_config_recorded_without_timeout_or_batch_keeps_the_workers_own() -> None:
    worker = WorkerSettings(eval_timeout_s=60, eval_batch_size=512)
    recorded = EvalConfig.model_validate({"task": "gsm8k", "backend": "hf", "max_new_tokens": 96, "limit": 5})
    assert recorded.timeout_in_force_s(worker.eval_timeout_s) == 60
    assert recorded.batch_size_in_force(worker.eval_batch_size) == 512
