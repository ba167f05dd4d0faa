"""Helpers to stand up a grader and an experiment workspace in tests."""

from __future__ import annotations

import json
import secrets
import shutil
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tests.support.settings import DeploymentSettings

if TYPE_CHECKING:
    import httpx
    from fastapi.testclient import TestClient

    from autorl.store import Database


@dataclass
class RegisteredExperiment:
    name: str
    token: str
    url_path: str  # /a/<token>
    workspace: Path
    output_dir: Path
    view: dict[str, Any]

    @property
    def bearer(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}


def admin_headers(settings: Any) -> dict[str, str]:
    return {"Authorization": f"Bearer {settings.admin_token_value}"}


def admin_call(client: TestClient, settings: DeploymentSettings, method: str, path: str) -> Any:
    """The admin API's answer under ``/v1/experiments`` (200 or 202 expected), as JSON."""
    response = client.request(method, f"/v1/experiments{path}", headers=admin_headers(settings))
    assert response.status_code in (200, 202), response.text
    return response.json()


def agent_get(
    client: TestClient | httpx.Client, experiment: RegisteredExperiment, path: str, **params: Any
) -> Any:
    """The agent's ``GET`` of ``path`` (query ``params``) under its experiment's URL (200 expected),
    as JSON."""
    response = client.get(f"{experiment.url_path}{path}", params=params)
    assert response.status_code == 200, response.text
    return response.json()


def nominate(client: TestClient, experiment: RegisteredExperiment, submission_id: int) -> Any:
    """The agent's ``POST /final`` of its submission ``submission_id``."""
    return client.post(f"{experiment.url_path}/final", json={"submission_id": submission_id})


def submit_no_wait(
    client: TestClient | httpx.Client, experiment: RegisteredExperiment, model_path: str
) -> Any:
    """The agent's ``POST /submit?wait=false`` of ``model_path`` (relative to its workspace): the
    grader answers without waiting for the evaluation."""
    return client.post(
        f"{experiment.url_path}/submit", json={"model_path": model_path}, params={"wait": "false"}
    )


def submit_accepted(
    client: TestClient | httpx.Client, experiment: RegisteredExperiment, model_path: str
) -> dict[str, Any]:
    """:func:`submit_no_wait`, queued for its evaluation (202 expected): the answer, as JSON."""
    response = submit_no_wait(client, experiment, model_path)
    assert response.status_code == 202, response.text
    body: dict[str, Any] = response.json()
    return body


def check_token_rotation(client: TestClient, settings: Any, experiment: RegisteredExperiment) -> None:
    """The admin gives ``experiment`` a new token: the old one is refused at once, the new one works."""
    rotated = client.post(f"/v1/experiments/{experiment.name}/token", headers=admin_headers(settings))
    assert rotated.status_code == 200
    assert client.get(f"{experiment.url_path}/time").status_code == 401
    assert client.get(f"/a/{rotated.json()['token']}/time").status_code == 200


def make_workspace(root: Path) -> Path:
    workspace = root / f"ws-{uuid.uuid4().hex[:8]}"
    (workspace / "output").mkdir(parents=True)
    return workspace


def register(
    client: TestClient | httpx.Client,
    settings: Any,
    base_model_dir: Path,
    workspace: Path,
    *,
    start: bool = True,
    **fields: Any,
) -> RegisteredExperiment:
    """Register an experiment through ``client`` (the grader in-process or over HTTP) and (unless
    `start=False`) start its budget, as the platform does before its agent runs: submissions are
    accepted only inside the budget."""
    body = {
        "name": f"exp-{uuid.uuid4().hex[:10]}",
        "task": "gsm8k",
        "model": f"local:{base_model_dir.name}-{uuid.uuid4().hex[:6]}",
        "timeout_s": 3600,
        "workspace": str(workspace),
        "base_model_dir": str(base_model_dir),
        **fields,
    }
    response = client.post("/v1/experiments", json=body, headers=admin_headers(settings))
    assert response.status_code == 201, response.text
    view = response.json()
    if start:
        path = f"/v1/experiments/{view['name']}/start"
        started = client.post(path, json={}, headers=admin_headers(settings))
        assert started.status_code == 200, started.text
    return RegisteredExperiment(
        name=view["name"],
        token=view["token"],
        url_path=f"/a/{view['token']}",
        workspace=workspace,
        output_dir=workspace / "output",
        view=view,
    )


def new_experiment(
    client: TestClient | httpx.Client, settings: Any, base_model_dir: Path, root: Path, **fields: Any
) -> RegisteredExperiment:
    """:func:`register` an experiment of ``base_model_dir`` in a new workspace under ``root``."""
    return register(client, settings, base_model_dir, make_workspace(root), **fields)


@dataclass(frozen=True)
class Grader:
    """The grader in-process (``client``) with its ``settings`` and store (``db``), as its tests reach
    it: experiments of ``base_model`` are registered in workspaces of their own under ``root``."""

    client: TestClient
    settings: DeploymentSettings
    db: Database
    base_model: Path
    root: Path

    def register(self, **fields: Any) -> RegisteredExperiment:
        """:func:`new_experiment` of the base model; ``start`` and ``fields`` as for :func:`register`."""
        return new_experiment(self.client, self.settings, self.base_model, self.root, **fields)

    def copy(self, experiment: RegisteredExperiment, folder: str, *, unique: bool = True) -> Path:
        """:func:`copy_model` of the base model into ``output/<folder>`` of ``experiment``'s workspace:
        a model of its own unless ``unique=False`` (the base model's own files)."""
        return copy_model(self.base_model, experiment.output_dir / folder, unique=unique)

    def admin(self, method: str, path: str) -> Any:
        """:func:`admin_call` of this grader."""
        return admin_call(self.client, self.settings, method, path)

    def end_budget(self, experiment: RegisteredExperiment) -> None:
        """``experiment``'s budget ended a second ago."""
        from datetime import timedelta

        from autorl.store import experiments
        from autorl.store.models import utcnow

        with self.db.session() as session:
            experiments.get_experiment(session, experiment.name).end_time = utcnow() - timedelta(seconds=1)


def copy_model(source: Path, target: Path, *, unique: bool = False) -> Path:
    """Copy a model folder. `unique` changes the lowest bits of the first weight (only the weights of
    a submission are evaluated and fingerprinted), so that the copy is a model of its own: identical
    weights would reuse an earlier score."""
    shutil.copytree(source, target)
    if unique:
        make_unique(target)
    return target


def submit_copy(
    client: TestClient | httpx.Client,
    database: Any,
    experiment: RegisteredExperiment,
    base: Path,
    folder: str,
) -> int:
    """Submit a copy of ``base`` in ``output/<folder>``, a model of its own, without waiting (202
    expected): its global id (the database's, the evaluators'; ``database`` as for :func:`row_id`)."""
    copy_model(base, experiment.output_dir / folder, unique=True)
    number = submit_accepted(client, experiment, f"output/{folder}")["submission_id"]
    return row_id(database, experiment, int(number))


def submit_copies(
    client: TestClient, experiment: RegisteredExperiment, base: Path, count: int, prefix: str
) -> list[int]:
    """:func:`submit_copy` ``count`` times (folders ``<prefix>0``, ``<prefix>1``, ...): their global
    ids (the agent's numbers are 1, 2, ...: :func:`row_id`)."""
    db = client.app.state.grader.db  # type: ignore[attr-defined]
    return [submit_copy(client, db, experiment, base, f"{prefix}{index}") for index in range(count)]


#: Elements of the first weight whose lowest byte :func:`make_unique` changes: 255**4 (4.2 billion)
#: equally likely results, so two copies of one model come out identical about once in billions
#: (a single byte's 255 made that a few percent for a test's handful of copies).
UNIQUE_ELEMENTS = 4
_ELEMENT_BYTES = {"F32": 4, "F16": 2, "BF16": 2, "F64": 8}


def make_unique(folder: Path) -> None:
    """Give the model in ``folder`` weights no other model has: the lowest byte of each of the first
    :data:`UNIQUE_ELEMENTS` elements of its first stored weight is changed at random (the lowest
    mantissa bits, a change far below what decoding notices on a tiny model)."""
    weights = min(folder.glob("*.safetensors"))
    with weights.open("r+b") as handle:
        header_size = int.from_bytes(handle.read(8), "little")
        header = json.loads(handle.read(header_size))
        first = min(
            (entry for name, entry in header.items() if name != "__metadata__"),
            key=lambda entry: entry["data_offsets"][0],
        )
        step = _ELEMENT_BYTES[first["dtype"]]
        data_start = 8 + header_size + first["data_offsets"][0]
        for element in range(UNIQUE_ELEMENTS):
            handle.seek(data_start + element * step)  # little-endian: the element's lowest byte
            old = handle.read(1)[0]
            handle.seek(data_start + element * step)
            handle.write(bytes([old ^ (secrets.randbelow(255) + 1)]))


def evaluating_settings(
    make_settings: Callable[..., DeploymentSettings], database_url: str, *, limit: int, max_new_tokens: int
) -> DeploymentSettings:
    """A grader's and its workers' settings that evaluate the tiny model for real (``hf``) on the
    first ``limit`` problems, and answer submits at once (``submit_wait_s`` 0)."""
    return make_settings(
        database_url=database_url,
        eval_backend="hf",
        eval_limit=limit,
        eval_max_new_tokens=max_new_tokens,
        submit_wait_s=0.0,
    )


def row_id(database: Any, experiment: RegisteredExperiment | str, number: int) -> int:
    """The global id (the database's, the evaluators', the admin API's) of the submission that
    ``experiment``'s agent numbers ``number`` (the ``submission_id`` of its answers); ``database``
    a ``Database`` or its URL."""
    from sqlalchemy import select

    from autorl.store import Database, Experiment, Submission

    name = experiment if isinstance(experiment, str) else experiment.name
    db = database if isinstance(database, Database) else Database(str(database))
    try:
        with db.session() as session:
            found = session.scalar(
                select(Submission.id)
                .join(Experiment, Submission.experiment_id == Experiment.id)
                .where(Experiment.name == name, Submission.number == number)
            )
    finally:
        if db is not database:
            db.dispose()
    assert found is not None, f"{name} has no submission numbered {number}"
    return int(found)


def submission_count(settings: DeploymentSettings, experiment: RegisteredExperiment) -> int:
    """How many submission rows the store of ``settings`` holds for ``experiment``."""
    from sqlalchemy import func, select

    from autorl.store import Database, Experiment, Submission

    db = Database(settings.database_url or "")
    try:
        with db.session() as session:
            exp_id = session.scalar(select(Experiment.id).where(Experiment.name == experiment.name))
            return int(
                session.scalar(select(func.count(Submission.id)).where(Submission.experiment_id == exp_id))
                or 0
            )
    finally:
        db.dispose()


def number_of(database: Any, submission_id: int) -> int:
    """The agent's number of the submission whose global id is ``submission_id`` (0: a baseline
    on the split its agent is scored on); ``database`` a ``Database`` or its URL."""
    from autorl.store import Database, Submission
    from autorl_grader.views import agent_number

    db = database if isinstance(database, Database) else Database(str(database))
    try:
        with db.session() as session:
            submission = session.get(Submission, submission_id)
            assert submission is not None, f"no submission {submission_id}"
            number = agent_number(submission.experiment, submission)
    finally:
        if db is not database:
            db.dispose()
    assert number is not None, f"submission {submission_id} is not one its agent sees"
    return number


def work_the_queue(settings: DeploymentSettings, redis: Any, db: Any, monkeypatch: Any) -> None:
    """An rq worker on the CPU (the test's settings in its environment) takes every job queued, then
    stops; ``db`` is the caller's to dispose."""
    from autorl.queue import make_dispatcher
    from autorl_evaluator.rq_worker import InProcessEvaluationWorker, evaluation_queue

    for variable, value in {
        "AUTORL_DATABASE_URL": settings.database_url or "",
        "AUTORL_HOME": str(settings.home),
        "AUTORL_DATA_SOURCE_DIR": str(settings.data_source_dir),
        "AUTORL_EVAL_DEVICE": "cpu",
    }.items():
        monkeypatch.setenv(variable, value)
    worker = InProcessEvaluationWorker(
        [evaluation_queue(settings.queue_name, redis)],
        connection=redis,
        key_prefix=settings.redis_key_prefix,
        dispatcher=make_dispatcher(settings),
        db=db,
    )
    worker.work(burst=True)
