"""The built images against the chart that runs them, and the evaluator image's environment.

- Every image the chart and the controller's Jobs reference exists; each container's command is on
  the image's PATH; the platform pods' user is the image's own non-root user; each port the chart
  declares is one the image exposes; with the chart's read-only root file system, every folder the
  image's environment writes to (HOME, AUTORL_HOME) lies on one of the pod's volumes; the chart's
  environment loads the service's own settings inside the image.
- The cpu evaluator image holds the lock's OpenCompass side at the CPU OpenCompass venv's versions
  (torch aside), with the CPU build of torch and neither vLLM nor a CUDA package nor the gpu
  variant's engine environment (/opt/vllm, AUTORL_VLLM_PYTHON), and `opencompass --help` runs.
"""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any
from unittest import mock

import pytest

from autorl_controller.operator.manifests import ExperimentRef, build_agent_job, build_prepare_job
from autorl_controller.operator.settings import ControllerSettings
from tests.containers.conftest import (
    APP_VERSION,
    CPU_TAGS,
    EXTERNAL_STORES,
    REPO,
    env_value,
    merge,
    render_chart,
    workload,
)
from tests.support.podman_pods import PodHost, podman
from tests.support.requirements import require

pytestmark = [pytest.mark.slow, pytest.mark.containers]

OC_PYTHON = REPO / ".venv-opencompass" / "bin" / "python"
EVALUATOR_CPU = f"ghcr.io/autorl/evaluator-worker:{APP_VERSION}-cpu"
CUSTOM_AGENT = f"ghcr.io/autorl/example-custom-agent:{APP_VERSION}"
AGENT_RUNNER_CPU = f"ghcr.io/autorl/agent-runner:{APP_VERSION}-cpu"
#: Dummy Secret values: enough for the settings to load (nothing connects).
SECRETS = {
    "pg-url": {"url": "postgresql+psycopg://autorl:secret@127.0.0.1:5432/autorl"},
    "redis-url": {"url": "redis://127.0.0.1:6379/0"},
    "lab-autorl-admin-token": {"admin-token": "a" * 32},
    ExperimentRef("arith-grpo", "autorl", "uid-1").secret_name: {
        "AUTORL_TOKEN": "t" * 32,
        "GRADING_SERVER_URL": "http://lab-autorl-grader.autorl.svc:8000/a/" + "t" * 32,
    },
}


def in_image(image: str, script: str, *, env: dict[str, str] | None = None, user: str | None = None) -> str:
    args = ["run", "--rm", "--network", "none", "--pull", "never", "--entrypoint", '["sh", "-c"]']
    for key, value in (env or {}).items():
        args += ["--env", f"{key}={value}"]
    if user is not None:
        args += ["--user", user]
    result = podman(*args, image, script, timeout=300, check=False)
    assert result.returncode == 0, f"{image}: {script}\n{result.stdout}\n{result.stderr}"
    return result.stdout


def image_config(image: str) -> dict[str, Any]:
    config: dict[str, Any] = json.loads(podman("image", "inspect", image).stdout)[0]["Config"]
    return config


#: `helm test` pods: one-shot commands that write nothing (no scratch volume needed).
HOOK_PODS: set[str] = set()


def chart_pods() -> list[tuple[str, dict[str, Any]]]:
    """(name, pod spec) of every pod running an AutoRL image: the chart's and the controller's Jobs."""
    documents = render_chart(merge(EXTERNAL_STORES, CPU_TAGS), "lab")
    pods = []
    for doc in documents:
        if doc["kind"] in {"Deployment", "StatefulSet", "Job", "Pod"}:
            spec = doc["spec"]["template"]["spec"] if "template" in doc["spec"] else doc["spec"]
            if any("/autorl/" in c["image"] for c in spec["containers"]):
                if "helm.sh/hook" in doc["metadata"].get("annotations", {}):
                    HOOK_PODS.add(doc["metadata"]["name"])
                pods.append((doc["metadata"]["name"], spec))
    controller = workload(documents, "Deployment", "lab-autorl-controller")["containers"][0]
    settings = controller_settings(controller)
    from autorl.experiment import ExperimentSpec

    spec = ExperimentSpec.model_validate(
        {
            "task": "arith",
            "model": "builtin:tiny-qwen2",
            "agent": {"builtin": "example_grpo"},
            "timeoutSeconds": 600,
        }
    )
    ref = ExperimentRef("arith-grpo", NAMESPACE_OF_EXPERIMENTS, "uid-1")
    for job in (build_prepare_job(ref, spec, settings), build_agent_job(ref, spec, settings)):
        pods.append((job["metadata"]["name"], job["spec"]["template"]["spec"]))
    return pods


NAMESPACE_OF_EXPERIMENTS = "autorl"


def controller_settings(controller: dict[str, Any]) -> ControllerSettings:
    """The controller's settings, read from the chart's environment as the controller reads them."""
    with mock.patch.dict(os.environ, PodHost(claims={}, secrets=SECRETS).environment(controller)):
        return ControllerSettings()


@pytest.mark.parametrize("name_and_pod", chart_pods(), ids=lambda item: item[0])
def test_chart_containers_agree_with_their_images(
    name_and_pod: tuple[str, dict[str, Any]], chart_images: set[str]
) -> None:
    name, pod = name_and_pod
    security = pod.get("securityContext", {})
    for container in [*pod.get("initContainers", []), *pod["containers"]]:
        image = container["image"]
        assert image in chart_images
        config = image_config(image)
        command = container.get("command") or config.get("Entrypoint") or config["Cmd"]
        # The entry point exists in the image.
        found = in_image(image, f"command -v {command[0]}").strip()
        assert found, f"{name}/{container['name']}: {command[0]} is not on {image}'s PATH"
        # Non-root: the image's own user, and the platform pods run as exactly that user.
        image_user = config.get("User", "")
        assert image_user and image_user not in {"0", "root"}, f"{image} runs as root"
        run_as = container.get("securityContext", {}).get("runAsUser", security.get("runAsUser"))
        assert run_as != 0
        if run_as is not None and name.startswith("lab-autorl-"):
            assert str(run_as) == image_user.split(":")[0], (
                f"{name}: runAsUser {run_as}, image user {image_user}"
            )
        # Ports: what the chart routes to, the image exposes.
        exposed = {int(port.split("/")[0]) for port in config.get("ExposedPorts") or {}}
        for port in container.get("ports", []):
            assert port["containerPort"] in exposed, (
                f"{name}: port {port['containerPort']} not exposed by {image}"
            )
        # A read-only root: every folder the image's and the chart's environment write to is a volume.
        if container.get("securityContext", {}).get("readOnlyRootFilesystem") and name not in HOOK_PODS:
            mounts = [mount["mountPath"] for mount in container.get("volumeMounts", [])]
            env = {item.split("=", 1)[0]: item.split("=", 1)[1] for item in config.get("Env", [])}
            env.update(PodHost(claims={}, secrets=SECRETS).environment(container))
            for variable in ("HOME", "AUTORL_HOME"):
                if variable in env and env[variable] != "/":
                    path = env[variable]
                    assert any(path == m or path.startswith(m.rstrip("/") + "/") for m in mounts), (
                        f"{name}/{container['name']}: {variable}={path} is on the read-only root ({mounts})"
                    )


def test_chart_environment_loads_each_services_settings_in_its_image(chart_images: set[str]) -> None:
    documents = render_chart(merge(EXTERNAL_STORES, CPU_TAGS), "lab")
    host = PodHost(claims={}, secrets=SECRETS)
    grader = "from autorl_grader.settings import GraderSettings as G; "
    worker = "from autorl_evaluator.settings import WorkerSettings as W; "
    controller = "from autorl_controller.operator.settings import ControllerSettings as C; "
    checks = {
        "lab-autorl-grader": grader + "print(G().snapshot_dir)",
        "lab-autorl-evaluator": worker + "print(W().eval_backend)",
        "lab-autorl-controller": controller + "print(C().runner_image)",
    }
    for name, script in checks.items():
        container = workload(documents, "Deployment", name)["containers"][0]
        output = in_image(container["image"], f"python -c '{script}'", env=host.environment(container))
        assert output.strip(), name
    evaluator = workload(documents, "Deployment", "lab-autorl-evaluator")["containers"][0]
    assert env_value(evaluator, "AUTORL_EVAL_BACKEND") in in_image(
        evaluator["image"], f"python -c '{checks['lab-autorl-evaluator']}'", env=host.environment(evaluator)
    )


def test_cpu_evaluator_has_the_opencompass_venvs_pins_and_runs_opencompass(chart_images: set[str]) -> None:
    assert EVALUATOR_CPU in chart_images
    in_image(EVALUATOR_CPU, "opencompass --help >/dev/null")
    image_pins = {
        p["name"].lower().replace("_", "-"): p["version"]
        for p in json.loads(in_image(EVALUATOR_CPU, "pip list --format json 2>/dev/null"))
    }
    torch = in_image(EVALUATOR_CPU, "python -c 'import torch; print(torch.__version__, torch.version.cuda)'")
    assert torch.split()[0].startswith("2.13.0") and torch.split()[1] == "None", torch
    assert not [
        name for name in image_pins if name.startswith(("nvidia-", "cuda-")) or name in {"vllm", "triton"}
    ]
    # No engine environment either: the worker runs OpenCompass's own engine (transformers).
    engine_settings = ("AUTORL_VLLM_PYTHON=", "VLLM_USE_FLASHINFER_SAMPLER=")
    assert not [item for item in image_config(EVALUATOR_CPU)["Env"] if item.startswith(engine_settings)]
    in_image(EVALUATOR_CPU, "test ! -e /opt/vllm")
    require(OC_PYTHON.exists(), "no .venv-opencompass (make setup builds it)")
    venv = subprocess.run(
        [str(OC_PYTHON), "-m", "pip", "list", "--format", "json"], capture_output=True, text=True, check=True
    )
    venv_pins = {p["name"].lower().replace("_", "-"): p["version"] for p in json.loads(venv.stdout)}
    ours = {"autorl", "autorl-evaluator", "torch", "pip", "setuptools", "wheel"}
    shared = (set(image_pins) & set(venv_pins)) - ours
    differ = {
        name: (image_pins[name], venv_pins[name]) for name in shared if image_pins[name] != venv_pins[name]
    }
    assert not differ, f"the image's pins differ from .venv-opencompass's (image, venv): {differ}"
    for name in ("opencompass", "transformers", "datasets", "pyarrow", "numpy"):
        assert name in shared, name


def test_example_custom_agent_image_starts_its_agent_folder(chart_images: set[str]) -> None:
    config = image_config(CUSTOM_AGENT)
    assert config["Entrypoint"][:4] == ["autorl", "agent-runner", "--agent", "/opt/agent"]
    assert config.get("User") not in {None, "", "0", "root"}
    in_image(
        CUSTOM_AGENT, "test -f /opt/agent/config.yaml && test -f /opt/agent/start.sh && command -v autorl"
    )


def test_the_agents_python_in_the_agent_image_holds_the_agents_and_no_supervisor(
    chart_images: set[str],
) -> None:
    """The image's agents' Python (AUTORL_AGENT_PYTHON) imports TRL, the core and the built-in agents,
    and finds none of the supervisor (sandbox, relay, egress) nor any service; the supervisor runs."""
    out = in_image(
        AGENT_RUNNER_CPU,
        'agents="$AUTORL_AGENT_PYTHON"; '
        '"$agents" -c "import trl, autorl.client, autorl_agents.example_grpo" && echo agents ok && '
        "for module in autorl_agent_runner autorl_grader autorl_evaluator; do "
        '"$agents" -c "import $module" 2>/dev/null && echo "imports $module"; done; '
        "autorl agent-runner --help >/dev/null && echo supervisor ok",
    )
    assert out.split() == ["agents", "ok", "supervisor", "ok"], out


def test_a_failing_build_fails_make_images_and_shows_each_failing_images_log(podman_ready: None) -> None:
    """`make images` builds side by side: every build that fails is named with the end of its log and
    the log's path, the others still finish, and the script exits non-zero (a base image that does
    not exist: each image built on it fails, the one built on the agent runner is never tried)."""
    registry = "localhost/autorl-build-failure"
    env = {**os.environ, "GPU": "0", "REGISTRY": registry, "BASE_IMAGE": f"{registry}/no-such-base:0"}
    result = subprocess.run(
        [str(REPO / "docker" / "build-images.sh")], env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode != 0, result.stdout
    assert "an image failed to build" in result.stderr
    for image in ("grader", "agent-runner", "evaluator-worker"):
        log = REPO / "build" / "images" / f"{image}.log"
        assert f"building {registry}/autorl/{image}:" in result.stderr
        assert f"its log: {log}" in result.stderr and "no-such-base" in log.read_text()
    assert "example-custom-agent" not in result.stderr + result.stdout
    assert " built in " not in result.stdout
    tagged = podman("images", "--format", "{{.Repository}}", check=False).stdout
    assert registry not in tagged
