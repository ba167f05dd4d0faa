"""`autorl agent-runner prepare`, the Kubernetes prepare Job's command: fills the shared cache once
and lays out the workspace the agent pod then finds."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from autorl.experiment import ExperimentSpec
from autorl.layout import BUILTIN_BUILD_VERSION
from autorl_controller.operator.manifests import ExperimentRef, build_agent_job, build_prepare_job
from autorl_controller.operator.pod_waits import last_words
from autorl_controller.operator.settings import ControllerSettings
from tests.conftest import FIXTURE_DATA
from tests.support.infra import free_port
from tests.support.kubelet import failed_pod_status

AUTORL = str(Path(sys.executable).parent / "autorl")


def prepare(tmp_path: Path, *args: str, hub: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run the prepare step; offline, or asking the hub at ``hub``."""
    env = {
        **os.environ,
        "AUTORL_CACHE_DIR": str(tmp_path / "shared" / "cache"),
        "AUTORL_HOME": str(tmp_path / "home"),
        "AUTORL_DATA_SOURCE_DIR": str(FIXTURE_DATA),
        "HF_HUB_OFFLINE": "1",
        **({"HF_HUB_OFFLINE": "0", "HF_ENDPOINT": hub, "HF_HOME": str(tmp_path / "hf")} if hub else {}),
    }
    return subprocess.run([AUTORL, "agent-runner", "prepare", *args], env=env, capture_output=True, text=True)


def test_prepare_fills_the_cache_once_and_lays_out_the_workspace(tmp_path: Path) -> None:
    workspace = tmp_path / "shared" / "experiments" / "team-a" / "exp-1"
    args = (
        "--task",
        "gsm8k",
        "--model",
        "builtin:tiny-qwen2",
        "--workspace",
        str(workspace),
        "--timeout",
        "600",
    )
    first = prepare(tmp_path, *args)
    assert first.returncode == 0, first.stderr
    cache = tmp_path / "shared" / "cache"
    built_dir = cache / "models" / "builtin" / f"tiny-qwen2-v{BUILTIN_BUILD_VERSION}"
    assert (built_dir / "config.json").is_file()
    train = cache / "data" / "gsm8k" / "train.jsonl"
    assert train.is_file()
    assert sorted(p.name for p in workspace.iterdir() if not p.name.startswith(".")) == [
        "code",
        "data",
        "description.md",
        "instructions.md",
        "models",
        "output",
        "run_meta.json",
        "scores.json",
    ]
    assert (workspace / "data" / "train.jsonl").read_text() == train.read_text()
    assert not (workspace / "data" / "test.jsonl").exists()
    assert (workspace / "models" / "tiny-qwen2" / "config.json").is_file()
    assert json.loads((workspace / "run_meta.json").read_text())["timeout_s"] == 600
    built = (built_dir / "model.safetensors").stat().st_mtime_ns
    again = prepare(tmp_path, *args)  # a retried Job: nothing rebuilt, nothing refused
    assert again.returncode == 0, again.stderr
    assert (built_dir / "model.safetensors").stat().st_mtime_ns == built


def test_a_sealed_prepare_leaves_the_validation_split_out_of_the_workspace(tmp_path: Path) -> None:
    from autorl.tasks.base import read_problems, split_train

    workspace = tmp_path / "shared" / "experiments" / "team-a" / "sealed-1"
    args = ("--task", "gsm8k", "--model", "builtin:tiny-qwen2", "--workspace", str(workspace))
    done = prepare(tmp_path, *args, "--feedback", "sealed")
    assert done.returncode == 0, done.stderr
    whole = read_problems(tmp_path / "shared" / "cache" / "data" / "gsm8k" / "train.jsonl")
    train, validation = split_train(whole)
    assert read_problems(workspace / "data" / "train.jsonl") == train  # the cache keeps the whole split
    assert validation and not {p.question for p in validation} & {p.question for p in train}
    assert "Sealed evaluation" in (workspace / "instructions.md").read_text()


def test_prepare_refuses_bad_input_with_the_fix(tmp_path: Path) -> None:
    unknown = prepare(
        tmp_path, "--task", "chess", "--model", "builtin:tiny-qwen2", "--workspace", str(tmp_path / "w")
    )
    assert unknown.returncode == 2
    assert "known tasks: arith, gsm8k" in unknown.stderr
    missing = prepare(
        tmp_path, "--task", "gsm8k", "--model", str(tmp_path / "nowhere"), "--workspace", str(tmp_path / "w")
    )
    assert missing.returncode == 2
    assert "config.json" in missing.stderr or "does not exist" in missing.stderr
    assert not (tmp_path / "w").exists()


def test_the_agent_jobs_mounts_find_what_the_real_prepare_job_lays_out(tmp_path: Path) -> None:
    """The operator's prepare Job, its two steps run with their own arguments and environment (the
    shared volume's mount point moved into a temporary folder), leaves every path the agent Job
    mounts from the shared volume: the workspace, the cached model and the task's training data."""
    settings = ControllerSettings(admin_token="x" * 32, runner_image="registry.example/runner:1")
    ref = ExperimentRef("layout", "team-a", "uid-1")
    spec = ExperimentSpec.model_validate(
        {
            "task": "gsm8k",
            "model": "builtin:tiny-qwen2",
            "agent": {"builtin": "example_grpo"},
            "timeoutSeconds": 600,
        }
    )
    shared = tmp_path / "shared"
    shared.mkdir()
    mount = settings.shared_mount.rstrip("/")

    def on_this_machine(value: str) -> str:
        return str(shared) + value[len(mount) :] if value.startswith(mount + "/") else value

    pod = build_prepare_job(ref, spec, settings)["spec"]["template"]["spec"]
    for container in [*pod["initContainers"], *pod["containers"]]:
        assert container["command"] == ["autorl", "agent-runner", "prepare"]
        env = {e["name"]: on_this_machine(e["value"]) for e in container["env"]}
        env |= {"AUTORL_HOME": str(tmp_path / "home"), "HOME": str(tmp_path)}
        done = subprocess.run(
            [AUTORL, "agent-runner", "prepare", *map(on_this_machine, container["args"])],
            env={**os.environ, **env, "AUTORL_DATA_SOURCE_DIR": str(FIXTURE_DATA), "HF_HUB_OFFLINE": "1"},
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, f"{container['name']}: {done.stderr}"

    [agent] = build_agent_job(ref, spec, settings)["spec"]["template"]["spec"]["containers"]
    mounted = {m["mountPath"]: shared / m["subPath"] for m in agent["volumeMounts"] if m["name"] == "shared"}
    workspace, model, data = (
        mounted[p] for p in ("/workspace", "/workspace/models/tiny-qwen2", "/workspace/data")
    )
    assert (workspace / "run_meta.json").is_file() and (workspace / "output").is_dir()
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in model.iterdir()}
    assert (data / "train.jsonl").is_file() and not (data / "test.jsonl").exists()
    # What the agent sees at those mount points is what the workspace step laid out for it.
    assert (workspace / "data" / "train.jsonl").read_text() == (data / "train.jsonl").read_text()


class _HubWithoutTheModel(http.server.BaseHTTPRequestHandler):
    """Answers every request as the Hugging Face hub answers for a repository it does not have."""

    def _not_found(self) -> None:
        body = b'{"error": "Repository Not Found"}'
        self.send_response(404)
        self.send_header("X-Error-Code", "RepoNotFound")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_HEAD = _not_found

    def log_message(self, format: str, *args: object) -> None:
        return


def job_fails_at_once(job: dict[str, Any], exit_code: int) -> bool:
    """Whether a pod of ``job`` that exits with ``exit_code`` fails the Job at once (the Job
    controller's podFailurePolicy: the first FailJob rule whose exit codes hold it), or is retried."""
    for rule in job["spec"].get("podFailurePolicy", {}).get("rules", []):
        codes = rule.get("onExitCodes") or {}
        held = exit_code in codes.get("values", [])
        if (held if codes.get("operator") == "In" else not held) and rule["action"] == "FailJob":
            return True
    return False


def test_a_hub_id_the_hub_does_not_know_fails_the_prepare_job_on_its_first_try(tmp_path: Path) -> None:
    """The real download code asks a hub (here a local server answering as the hub does for an
    unknown repository): the step exits with the bad-input code, which the prepare Job's
    podFailurePolicy turns into a failed Job at once, not after its retries; the log names the fix.
    A hub that cannot be reached is another exit code, which the Job tries again."""
    settings = ControllerSettings(admin_token="x" * 32, runner_image="registry.example/runner:1")
    spec = ExperimentSpec(task="gsm8k", model="no-such-org/no-such-model")
    job = build_prepare_job(ExperimentRef("hub-id", "team-a", "uid-1"), spec, settings)
    args = ("--task", "gsm8k", "--model", spec.model, "--workspace", str(tmp_path / "w"), "--step", "cache")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _HubWithoutTheModel)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        unknown = prepare(tmp_path, *args, hub=f"http://127.0.0.1:{server.server_port}")
    finally:
        server.shutdown()
        server.server_close()
    assert "no-such-org/no-such-model is not a model on the Hugging Face hub" in unknown.stderr
    assert "check the id, set HF_TOKEN for a private model" in unknown.stderr
    assert job_fails_at_once(job, unknown.returncode), unknown.returncode
    # The kubelet keeps the failed container's log tail as its termination message, and the controller
    # puts its last line into the Experiment's status.message.
    (cache,) = job["spec"]["template"]["spec"]["initContainers"]
    assert cache["terminationMessagePolicy"] == "FallbackToLogsOnError" and "cache" in cache["args"]
    said = last_words([{"status": failed_pod_status(cache["name"], unknown.returncode, unknown.stderr)}])
    assert said is not None and said.startswith(f"container cache exited with code {unknown.returncode}: ")
    assert said.endswith(
        "no-such-org/no-such-model is not a model on the Hugging Face hub (or is private); check the id, "
        "set HF_TOKEN for a private model, or pass a local folder that holds config.json"
    )

    unreachable = prepare(tmp_path, *args, hub=f"http://127.0.0.1:{free_port()}")
    assert "cannot download no-such-org/no-such-model from the Hugging Face hub" in unreachable.stderr
    assert unreachable.returncode != 0 and not job_fails_at_once(job, unreachable.returncode)
    assert not (tmp_path / "w").exists()
