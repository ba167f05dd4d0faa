"""docs/KUBERNETES.md is a journey that works: every `helm install` and `helm upgrade` it shows renders
the chart with exactly its flags (Helm's own engine, the chart's schema) into objects that pass
strict Kubernetes validation; every Experiment it shows or applies is valid for the CRD's
structural schema (what `kubectl apply` checks) and for the controller; the custom-agent example
names the image `make images` builds."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

from autorl_controller.operator.handlers.create import validation_error
from tests.integration.test_chart import CHART, KUBERNETES_VERSION, NAMESPACE, merge
from tests.support.chart import render_chart
from tests.unit.test_crd import CONTROLLER, crd_errors

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "KUBERNETES.md"
APP_VERSION = str(yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"])
CUSTOM_AGENT_EXAMPLE = REPO / "examples" / "experiment-custom-agent.yaml"


def code_blocks(language: str) -> list[str]:
    return re.findall(rf"^ *```{language}\n(.*?)^ *```", DOC.read_text(), re.M | re.S)


def shell_commands() -> list[str]:
    """Every command of the doc's bash blocks, continuation lines joined, comments dropped."""
    commands = []
    for block in code_blocks("bash"):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                commands.append(line)
    return commands


def helm_commands() -> list[list[str]]:
    return [shlex.split(c) for c in shell_commands() if c.startswith(("helm install", "helm upgrade"))]


def set_value(values: dict[str, Any], assignment: str, *, as_string: bool) -> None:
    """One `--set`/`--set-string` assignment, as Helm's strvals parses it: `\\.` escapes a dot in a
    key, `name[N]` indexes a list, `--set` types true/false and integers, `--set-string` never."""
    key, _, raw = assignment.partition("=")
    value: Any = raw
    if not as_string:
        if raw in ("true", "false"):
            value = raw == "true"
        elif re.fullmatch(r"-?\d+", raw):
            value = int(raw)
    parts = [part.replace("\\.", ".") for part in re.split(r"(?<!\\)\.", key)]
    node: Any = values
    for index, part in enumerate(parts):
        last = index == len(parts) - 1
        indexed = re.fullmatch(r"(.+)\[(\d+)\]", part)
        if indexed:
            items = node.setdefault(indexed.group(1), [])
            position = int(indexed.group(2))
            while len(items) <= position:
                items.append({} if not last else None)
            if last:
                items[position] = value
            else:
                node = items[position]
        elif last:
            node[part] = value
        else:
            node = node.setdefault(part, {})


def parse_helm(argv: list[str]) -> tuple[str, str, dict[str, Any], bool]:
    """(verb, release, values, reuse_values) of one `helm install|upgrade RELEASE CHART ...`."""
    verb, release, chart, *flags = argv[1:]
    assert (REPO / chart).resolve() == CHART, f"the doc installs {chart}, not the repository's chart"
    values: dict[str, Any] = {}
    reuse = False
    i = 0
    while i < len(flags):
        flag = flags[i]
        if flag in ("--set", "--set-string"):
            set_value(values, flags[i + 1], as_string=flag == "--set-string")
            i += 2
        elif flag in ("-n", "--namespace"):
            assert flags[i + 1] == NAMESPACE, "the doc's namespace is the one the tests render in"
            i += 2
        elif flag == "--reuse-values":
            reuse, i = True, i + 1
        elif flag == "--create-namespace":
            i += 1
        else:
            raise AssertionError(f"a flag this test does not know: {flag} (in {shlex.join(argv)})")
    return verb, release, values, reuse


def render_exactly(release: str, values: dict[str, Any], *, is_install: bool) -> list[dict[str, Any]]:
    return render_chart(values, release=release, namespace=NAMESPACE, is_install=is_install)


def test_the_doc_installs_then_upgrades_and_uninstalls() -> None:
    verbs = [argv[1] for argv in helm_commands()]
    assert verbs[0] == "install" and "upgrade" in verbs
    assert any(c.startswith("helm uninstall autorl") for c in shell_commands())


@pytest.mark.parametrize("index", range(len(helm_commands())))
def test_every_helm_command_of_the_doc_renders_valid_objects(index: int) -> None:
    commands = helm_commands()
    verb, release, values, reuse = parse_helm(commands[index])
    if reuse:  # --reuse-values: the values of this release's install, then these
        installs = [parse_helm(argv) for argv in commands[:index] if argv[1] == "install"]
        base = next(v for _, name, v, _ in installs if name == release)
        values = merge(base, values)
    documents = render_exactly(release, values, is_install=verb == "install")
    assert any(doc["kind"] == "Deployment" for doc in documents)
    for doc in documents:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_a_node_label_set_as_a_boolean_is_refused_and_the_doc_sets_strings() -> None:
    values: dict[str, Any] = {}
    set_value(values, r"evaluator.nodeSelector.nvidia\.com/gpu\.present=true", as_string=False)
    assert values == {"evaluator": {"nodeSelector": {"nvidia.com/gpu.present": True}}}
    with helm.Chart.load(CHART) as chart, pytest.raises(helm.HelmValuesError):
        chart.validate_schema(values)
    install = parse_helm(next(c for c in helm_commands() if any("nodeSelector" in a for a in c)))[2]
    assert install["evaluator"]["nodeSelector"] == {"nvidia.com/gpu.present": "true"}


def applied_experiments() -> list[dict[str, Any]]:
    """The Experiments of the doc: its YAML blocks and every example file it applies."""
    experiments = [doc for block in code_blocks("yaml") for doc in yaml.safe_load_all(block) if doc]
    for command in shell_commands():
        for name in re.findall(r"examples/[\w.-]+\.yaml", command):
            text = (REPO / name).read_text()
            if "sed " in command:  # the doc's own substitution of the registry
                text = text.replace("registry.example.com", "registry.lab.test")
            experiments.extend(doc for doc in yaml.safe_load_all(text) if doc and doc["kind"] == "Experiment")
    return experiments


def test_every_experiment_the_doc_applies_passes_the_crd_schema_and_the_controller() -> None:
    experiments = applied_experiments()
    assert {e["metadata"]["name"] for e in experiments} >= {"gsm8k-grpo", "gsm8k-custom-agent"}
    for manifest in experiments:
        assert crd_errors(manifest) == [], manifest["metadata"]["name"]
        assert validation_error(manifest["metadata"]["name"], manifest["spec"], CONTROLLER) is None


def test_the_unknown_field_the_doc_names_is_refused_by_the_schema() -> None:
    manifest = yaml.safe_load((REPO / "examples" / "experiment-gsm8k.yaml").read_text())
    manifest["spec"]["timeoutSecs"] = 60
    assert "spec.timeoutSecs" in DOC.read_text()
    assert any("timeoutSecs" in error for error in crd_errors(manifest))


def test_the_custom_agent_example_runs_the_image_make_images_builds() -> None:
    manifest = yaml.safe_load(CUSTOM_AGENT_EXAMPLE.read_text())
    registry, _, repository = manifest["spec"]["agent"]["image"].partition("/")
    assert registry == "registry.example.com"
    assert repository == f"autorl/example-custom-agent:{APP_VERSION}"
    assert "example-custom-agent" in DOC.read_text() and "make images" in DOC.read_text()
