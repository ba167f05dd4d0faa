"""`make images` builds what the chart runs: by default every AutoRL image the chart's default values
name (its Deployments, the helm test pod and the controller's Jobs), with GPU=0 every image the chart
names with the CPU tags; and every image is built on BASE_IMAGE, the gpu evaluator's included, so an
offline machine builds them all on the same base. Read from the build script's own plan
(`docker/build-images.sh --list`, which runs no podman)."""

from __future__ import annotations

import itertools
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.chart import render_chart

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "docker" / "build-images.sh"
APP_VERSION = str(yaml.safe_load((REPO / "charts" / "autorl" / "Chart.yaml").read_text())["appVersion"])
CPU_TAGS: dict[str, Any] = {
    "agents": {"image": {"tag": f"{APP_VERSION}-cpu"}},
    "evaluator": {"image": {"tag": f"{APP_VERSION}-cpu"}},
}
CUSTOM_AGENT_EXAMPLE = REPO / "examples" / "experiment-custom-agent.yaml"


def plan(**env: str) -> dict[str, tuple[str, dict[str, str]]]:
    """tag -> (Dockerfile, build arguments) of each image the script would build."""
    clean = {key: value for key, value in os.environ.items() if key not in {"GPU", "BASE_IMAGE", "REGISTRY"}}
    out = subprocess.run(
        [str(SCRIPT), "--list"], env={**clean, **env}, capture_output=True, text=True, check=True, timeout=60
    ).stdout
    builds: dict[str, tuple[str, dict[str, str]]] = {}
    for line in out.splitlines():
        tag, dockerfile, *rest = line.split()
        args = dict(
            value.split("=", 1)
            for flag, value in zip(rest[::2], rest[1::2], strict=True)
            if flag == "--build-arg"
        )
        builds[tag] = (dockerfile, args)
    return builds


def chart_images(values: dict[str, Any]) -> set[str]:
    """Every AutoRL image a release with these values runs, the controller's Jobs' included."""
    images: set[str] = set()
    for doc in render_chart(values, release="lab", namespace="autorl"):
        if doc["kind"] not in {"Deployment", "StatefulSet", "Job", "Pod"}:
            continue
        spec = doc["spec"]["template"]["spec"] if "template" in doc["spec"] else doc["spec"]
        for container in [*spec.get("initContainers", []), *spec["containers"]]:
            images.add(container["image"])
            images.update(
                item["value"] for item in container.get("env", []) if item["name"].endswith("_IMAGE")
            )
    return {image for image in images if "/autorl/" in image}


def from_arguments(dockerfile: str) -> set[str]:
    """The build arguments a Dockerfile's FROM lines take their images from."""
    text = (REPO / dockerfile).read_text()
    return set(re.findall(r"^FROM\s+\$\{(\w+)\}", text, re.MULTILINE))


def test_the_default_build_is_every_image_the_charts_defaults_name() -> None:
    built = set(plan())
    needed = chart_images({})
    assert f"ghcr.io/autorl/evaluator-worker:{APP_VERSION}" in needed
    assert f"ghcr.io/autorl/agent-runner:{APP_VERSION}" in needed
    assert needed <= built, f"the chart's defaults name images `make images` does not build: {needed - built}"
    # ... and nothing else but the custom agent the examples run (from the operator's registry).
    custom = yaml.safe_load(CUSTOM_AGENT_EXAMPLE.read_text())["spec"]["agent"]["image"]
    assert built - needed == {"ghcr.io/" + custom.split("/", 1)[1]}


def test_the_cpu_build_is_every_image_the_chart_names_with_the_cpu_tags() -> None:
    built = set(plan(GPU="0"))
    needed = chart_images(CPU_TAGS)
    assert needed <= built
    assert all(image.endswith("-cpu") for image in built if "agent-runner" in image or "evaluator" in image)


def test_a_registry_tags_every_image_for_it() -> None:
    assert all(
        tag.startswith("registry.example.com/autorl/") for tag in plan(REGISTRY="registry.example.com")
    )


@pytest.mark.parametrize("gpu", ["1", "0"])
def test_every_image_is_built_on_base_image(gpu: str) -> None:
    builds = plan(GPU=gpu, BASE_IMAGE="localhost/autorl/python:3.11-bookworm")
    for tag, (dockerfile, args) in builds.items():
        # Every image a FROM line takes from a build argument is given: BASE_IMAGE, or the agent runner
        # of the same build for the custom agent.
        for name in from_arguments(dockerfile):
            assert name in args, (
                f"{tag}: {dockerfile} takes FROM ${{{name}}}, which the build leaves to its default"
            )
        if "BASE_IMAGE" in from_arguments(dockerfile):
            assert args["BASE_IMAGE"] == "localhost/autorl/python:3.11-bookworm", tag
        else:
            assert args["AGENT_RUNNER_IMAGE"] in builds, tag
    evaluator = next(args for tag, (_, args) in builds.items() if "/evaluator-worker:" in tag)
    assert evaluator["VARIANT"] == ("gpu" if gpu == "1" else "cpu")


def first_steps_on_the_base(dockerfile: str) -> set[str]:
    """The first instruction of each stage the Dockerfile begins on ${BASE_IMAGE}."""
    lines = re.sub(r"\\\n", " ", (REPO / dockerfile).read_text()).splitlines()
    steps = [" ".join(line.split()) for line in lines if line.strip() and not line.lstrip().startswith("#")]
    return {
        step for previous, step in itertools.pairwise(steps) if re.match(r"FROM\s+\$\{BASE_IMAGE\}", previous)
    }


@pytest.mark.parametrize("gpu", ["1", "0"])
def test_images_built_side_by_side_never_begin_with_the_same_step(gpu: str) -> None:
    # Two builds that make the same first layer at once each keep their own copy; the next build
    # continues from one of them and misses the cache of the other image's later layers (its
    # dependencies installed again: minutes). The controller is built after the grader, on its layers.
    one_after_another = {"docker/grader.Dockerfile", "docker/controller.Dockerfile"}
    dockerfiles = {dockerfile for dockerfile, _ in plan(GPU=gpu).values()}
    seen: dict[str, str] = {}
    for dockerfile in sorted(dockerfiles):
        for step in first_steps_on_the_base(dockerfile):
            other = seen.setdefault(step, dockerfile)
            assert other == dockerfile or {other, dockerfile} <= one_after_another, (
                f"{other} and {dockerfile}, built side by side, both begin a stage with {step!r}"
            )
    assert len(seen) >= 5, seen  # the script's images begin at least five stages on the base


@pytest.mark.parametrize(
    ("argument", "env", "message"),
    [
        ("--list", {"GPU": "yes"}, "GPU must be 0 or 1, not 'yes'"),
        ("--list", {"PARALLEL": "4"}, "PARALLEL must be 0 or 1, not '4'"),
        ("--push", {}, "unknown argument '--push' (--list prints the plan)"),
    ],
)
def test_bad_input_is_refused_before_anything_is_built(
    argument: str, env: dict[str, str], message: str
) -> None:
    result = subprocess.run(
        [str(SCRIPT), argument], env={**os.environ, **env}, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2 and message in result.stderr and not result.stdout
