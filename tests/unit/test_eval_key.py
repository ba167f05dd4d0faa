"""The evaluation key: which fields it covers, how a difference is named, what the worker measures,
and `autorl results --compare` refusing runs of different keys."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from autorl.cli import main
from autorl.eval_config import DECODING, EVAL_PROTOCOL_VERSION, EvalConfig, differing_fields
from autorl.runs.results import append_row
from autorl.settings import EvaluationSettings
from autorl.store import Database, experiments
from autorl.store.db import migrate
from autorl.tasks import get_task
from autorl.tasks.base import Problem, split_sha256, write_problems
from autorl_evaluator.settings import WorkerSettings
from autorl_evaluator.versions import NOT_INSTALLED, backend_versions, installed_versions
from tests.unit.test_backend_versions import installed_dist
from tests.unit.test_results import row

DATA_SHA256 = "a" * 64
VERSIONS = {"torch": "2.5.1", "transformers": "4.46.0"}
MEASURED: dict[str, Any] = {"data_sha256": DATA_SHA256, "backend_versions": VERSIONS}


def config(**changes: Any) -> EvalConfig:
    recorded = EvalConfig.record("gsm8k", EvaluationSettings(eval_limit=50), measured=MEASURED)
    return recorded.model_copy(update=changes)


def test_a_new_config_records_every_field_of_the_key() -> None:
    fields = config().key_fields()
    assert fields == {
        "task": "gsm8k",
        "data_sha256": "a" * 64,
        "prompt_version": get_task("gsm8k").prompt_version,
        "backend": "hf",
        "backend_versions": {"torch": "2.5.1", "transformers": "4.46.0"},
        "decoding": DECODING,
        "max_new_tokens": 512,
        "limit": 50,
        "protocol": "opencompass",
        "protocol_version": EVAL_PROTOCOL_VERSION,
    }
    # The key is the hash of exactly these fields as canonical JSON: anyone can recompute it.
    canonical = json.dumps(fields, sort_keys=True).encode()
    assert config().key == hashlib.sha256(canonical).hexdigest()[:32]


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"task": "arith"}, ["task"]),
        ({"data_sha256": "b" * 64}, ["data_sha256"]),
        ({"prompt_version": "gsm8k_gen_1d7fe4/2"}, ["prompt_version"]),
        ({"backend": "opencompass"}, ["backend"]),
        (
            {"backend_versions": {"torch": "2.5.1", "transformers": "4.47.0"}},
            ["backend_versions.transformers"],
        ),
        (
            {"backend_versions": {"torch": "2.5.1", "transformers": "4.46.0", "vllm": "0.6.3"}},
            ["backend_versions.vllm"],
        ),
        ({"decoding": "sampled"}, ["decoding"]),
        ({"max_new_tokens": 256}, ["max_new_tokens"]),
        ({"limit": None}, ["limit"]),
        ({"protocol": "strict"}, ["protocol"]),
        ({"protocol_version": EVAL_PROTOCOL_VERSION + 1}, ["protocol_version"]),
        ({"max_new_tokens": 256, "protocol_version": 99}, ["max_new_tokens", "protocol_version"]),
    ],
)
def test_each_field_changes_the_key_and_the_difference_is_named(
    change: dict[str, Any], named: list[str]
) -> None:
    changed = config(**change)
    assert changed.key != config().key
    assert differing_fields(config().stored(), changed.stored()) == named


def test_how_long_and_how_batched_leave_the_key_alone() -> None:
    same = config(timeout_s=5, batch_size=3)
    assert same.key == config().key
    assert differing_fields(config().stored(), same.stored()) == []
    assert EvalConfig.model_validate(json.loads(json.dumps(config().stored()))).key == config().key


def test_a_key_recorded_without_the_evaluators_facts_differs_from_a_measured_one() -> None:
    unmeasured = EvalConfig.record("gsm8k", EvaluationSettings(eval_limit=50))
    assert unmeasured.measured() == {}
    assert differing_fields(unmeasured.stored(), config().stored()) == ["backend_versions", "data_sha256"]
    completed = unmeasured.with_measured(DATA_SHA256, VERSIONS)
    assert completed.key == config().key


def test_a_config_recorded_before_the_decoding_rule_is_scored_under_a_key_of_its_own() -> None:
    """Plain ``greedy`` was recorded while the ``hf`` backend kept special tokens: an evaluation now
    drops them (every backend does), so it records the decoding it applied and a key that never
    reuses a score or baseline of the earlier rule."""
    earlier = config(decoding="greedy")
    assert DECODING == "greedy, special tokens skipped"
    evaluated = earlier.with_measured(DATA_SHA256, VERSIONS)
    assert evaluated.decoding == DECODING
    assert evaluated.key == config().key != earlier.key
    assert differing_fields(earlier.stored(), evaluated.stored()) == ["decoding"]


def test_the_split_hash_is_the_hash_of_the_cached_test_file(tmp_path: Path) -> None:
    problems = [Problem("Ann has 2 apples {x}. ünïcode?", "2 + 1 = 3\n#### 3"), Problem("b", "#### 4")]
    path = write_problems(tmp_path / "test.jsonl", problems)
    assert split_sha256(problems) == hashlib.sha256(path.read_bytes()).hexdigest()
    assert split_sha256(problems[:1]) != split_sha256(problems)
    assert split_sha256([Problem("Ann has 2 apples {x}. ünïcode?", "#### 3"), problems[1]]) != split_sha256(
        problems
    )


def test_the_hf_backend_records_the_versions_it_imports() -> None:
    versions = backend_versions("hf", WorkerSettings())
    assert versions == {
        "torch": importlib.metadata.version("torch"),
        "transformers": importlib.metadata.version("transformers"),
    }


def test_the_opencompass_backend_records_the_versions_of_its_own_venv(tmp_path: Path) -> None:
    venv = tmp_path / "venv-oc"
    (venv / "bin").mkdir(parents=True)
    command = venv / "bin" / "opencompass"
    command.write_text("#!/bin/sh\n")
    site = venv / "lib" / "python3.10" / "site-packages"
    for name, version in (("opencompass", "0.3.9"), ("vllm", "0.6.3.post1"), ("transformers", "4.45.2")):
        installed_dist(site, name, version)
    versions = backend_versions("opencompass", WorkerSettings(opencompass_bin=command))
    assert versions == {
        "opencompass": "0.3.9",
        "transformers": "4.45.2",
        "torch": NOT_INSTALLED,
        "vllm": "0.6.3.post1",
    }
    # Not this interpreter's own packages: a venv without them has none.
    assert installed_versions(["transformers"], [str(tmp_path / "nowhere")]) == {
        "transformers": NOT_INSTALLED
    }


def record_run(home: Path, run_id: str, recorded: EvalConfig) -> None:
    """A finished run as `autorl run` leaves it: its experiment in the home's store, its row."""
    settings = EvaluationSettings(home=home)
    db = Database(settings.database_url)
    migrate(db)
    with db.session() as session:
        experiments.create_experiment(
            session,
            token=experiments.new_token(),
            name=run_id,
            task=recorded.task,
            model="builtin:tiny-qwen2",
            base_model_dir=str(home / "base"),
            workspace=str(home / "ws"),
            output_dir=str(home / "ws" / "output"),
            agent="example_grpo",
            timeout_s=60,
            max_submissions=10,
            eval_config=recorded.stored(),
            eval_key=recorded.key,
        )
    db.dispose()
    append_row(row(run_id, task=recorded.task), home)


def test_compare_refuses_runs_of_different_keys_naming_the_fields(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    record_run(tmp_path, "20261203-100000-gsm8k-aaaaaa", config())
    record_run(tmp_path, "20261203-110000-gsm8k-bbbbbb", config(timeout_s=99))  # same key
    newer_vllm = {"torch": "2.5.1", "transformers": "4.46.0", "vllm": "0.7.0"}
    record_run(
        tmp_path, "20261203-120000-gsm8k-cccccc", config(backend_versions=newer_vllm, max_new_tokens=256)
    )
    home = ["results", "--home", str(tmp_path), "--compare"]

    assert main([*home, "20261203-10", "20261203-11"]) == 0
    out = capsys.readouterr().out
    assert "eval_key" in out and config().key in out

    assert main([*home, "20261203-10", "20261203-12"]) == 2
    err = capsys.readouterr().err
    assert "different evaluation keys" in err
    assert "they differ in backend_versions.vllm, max_new_tokens" in err
    assert main([*home, "20261203-10", "20261203-11", "20261203-12", "--json"]) == 2
    assert "backend_versions.vllm" in capsys.readouterr().err


def test_compare_refuses_a_run_whose_key_the_store_does_not_hold(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    record_run(tmp_path, "20261203-100000-gsm8k-aaaaaa", config())
    append_row(row("20261203-130000-gsm8k-dddddd"), tmp_path)  # a row with no experiment in this home
    assert main(["results", "--home", str(tmp_path), "--compare", "20261203-10", "20261203-13"]) == 2
    err = capsys.readouterr().err
    assert "20261203-130000-gsm8k-dddddd is not in this home's store" in err


def test_the_resident_engine_s_environment_is_part_of_the_opencompass_key(tmp_path: Path) -> None:
    """With AUTORL_VLLM_PYTHON the answers come from that environment's engine: its vLLM, torch and
    transformers are recorded beside OpenCompass's own, so its scores are never reused for (or
    compared with) OpenCompass's own engine's, nor across its releases."""
    venv = Path(sys.executable).parent.parent
    plain = backend_versions("opencompass", WorkerSettings(opencompass_bin=tmp_path / "bin" / "opencompass"))
    resident = backend_versions(
        "opencompass",
        WorkerSettings(opencompass_bin=tmp_path / "bin" / "opencompass", vllm_python=venv / "bin" / "python"),
    )
    assert not any(name.startswith("engine ") for name in plain)
    assert resident["engine torch"] == importlib.metadata.version("torch")
    assert resident["engine vllm"] == NOT_INSTALLED
    assert {k: v for k, v in resident.items() if not k.startswith("engine ")} == plain
