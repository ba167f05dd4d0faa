"""The Helm chart, rendered by Helm's own engine (helm-python-sdk) and checked against the Kubernetes
OpenAPI schemas of a current release, for the default values and the variants operators use."""

from __future__ import annotations

import copy
import json
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

from autorl.crd import crd_manifest
from autorl_controller.operator.manifests import agent_grading_url
from autorl_controller.operator.settings import ControllerSettings
from autorl_evaluator.settings import WorkerSettings
from tests.support.chart import render_chart

CHART = Path(__file__).resolve().parents[2] / "charts" / "autorl"
RELEASE, NAMESPACE = "lab", "autorl"
KUBERNETES_VERSION = kubernetes_validate.latest_version()

#: Every image comes from these values; a rendered image outside them is hard-coded somewhere.
IMAGES: dict[str, Any] = {
    "image": {"registry": "registry.test", "tag": "9.9.9", "pullPolicy": "Always"},
    "grader": {"image": {"repository": "team/grader"}},
    "evaluator": {"image": {"repository": "team/evaluator", "tag": "9.9.9-cuda"}},
    "controller": {"image": {"repository": "team/controller"}},
    "agents": {"image": {"repository": "team/agent-runner"}},
    "postgresql": {"image": {"registry": "mirror.test", "repository": "lib/postgres", "tag": "17"}},
    "redis": {"image": {"registry": "mirror.test", "repository": "lib/redis", "tag": "7"}},
}
EXPECTED_IMAGES = {
    "registry.test/team/grader:9.9.9",
    "registry.test/team/evaluator:9.9.9-cuda",
    "registry.test/team/controller:9.9.9",
    "mirror.test/lib/postgres:17",
    "mirror.test/lib/redis:7",
}
EXTERNAL: dict[str, Any] = {
    "postgresql": {"enabled": False, "external": {"existingSecret": "pg-url", "existingSecretKey": "url"}},
    "redis": {"enabled": False, "external": {"existingSecret": "redis-url"}},
}
GPU: dict[str, Any] = {
    "evaluator": {
        "replicas": 3,
        "gpus": 4,
        "runtimeClassName": "nvidia",
        "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H200"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    },
    "agents": {
        "nodeSelector": {"nvidia.com/gpu.present": "true"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    },
}
INGRESS_NAMESPACE_LABEL = "kubernetes.io/metadata.name"
INGRESS: dict[str, Any] = {
    "grader": {
        "ingress": {
            "enabled": True,
            "className": "nginx",
            "host": "autorl.lab.test",
            "tlsSecret": "autorl-tls",
            "annotations": {"nginx.ingress.kubernetes.io/proxy-read-timeout": "600"},
        }
    },
    "networkPolicy": {
        "adminFrom": [{"namespaceSelector": {"matchLabels": {INGRESS_NAMESPACE_LABEL: "ingress-nginx"}}}]
    },
}
MULTI_NAMESPACE: dict[str, Any] = {
    "controller": {"watchNamespaces": ["team-a", "team-b"]},
    "shared": {"existingClaim": "rwx"},
}
BUNDLED_EXISTING: dict[str, Any] = {
    "postgresql": {"auth": {"existingSecret": "pg-pass", "existingSecretKey": "pw"}},
    "redis": {"auth": {"existingSecret": "redis-pass"}},
    "snapshots": {"existingClaim": "snapshots-rwx"},
    "evaluator": {"storage": {"existingClaim": "eval-only"}},
}
VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    "external-databases": EXTERNAL,
    "bundled-existing-secrets": BUNDLED_EXISTING,
    "gpu-workers": GPU,
    "ingress": INGRESS,
}
VARIANTS["watch-namespaces"] = MULTI_NAMESPACE


def merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in extra.items():
        out[key] = (
            merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
        )
    return out


def render(values: dict[str, Any]) -> list[dict[str, Any]]:
    return render_chart(values, release=RELEASE, namespace=NAMESPACE)


def of_kind(documents: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {doc["metadata"]["name"]: doc for doc in documents if doc["kind"] == kind}


def pod_specs(documents: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    for doc in documents:
        if doc["kind"] in ("Deployment", "StatefulSet"):
            yield doc["metadata"]["name"], doc["spec"]["template"]["spec"]
        elif doc["kind"] == "Pod":
            yield doc["metadata"]["name"], doc["spec"]


@pytest.fixture(scope="module", params=list(VARIANTS), ids=list(VARIANTS))
def rendered(request: pytest.FixtureRequest) -> tuple[str, list[dict[str, Any]]]:
    return request.param, render(merge(IMAGES, VARIANTS[request.param]))


def test_every_object_passes_strict_kubernetes_validation(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    _, documents = rendered
    assert documents
    for doc in documents:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_no_image_is_hard_coded(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    variant, documents = rendered
    images = {
        container["image"]
        for _, pod in pod_specs(documents)
        for container in [*pod.get("initContainers", []), *pod["containers"]]
    }
    expected = EXPECTED_IMAGES - (
        {"mirror.test/lib/postgres:17", "mirror.test/lib/redis:7"}
        if variant == "external-databases"
        else set()
    )
    assert images == expected
    assert {pod["containers"][0]["imagePullPolicy"] for _, pod in pod_specs(documents)} == {"Always"}
    controller = of_kind(documents, "Deployment")[f"{RELEASE}-autorl-controller"]
    env = {e["name"]: e.get("value") for e in controller["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["AUTORL_RUNNER_IMAGE"] == "registry.test/team/agent-runner:9.9.9"


def test_lint_is_clean() -> None:
    for name, variant in VARIANTS.items():
        report = helm.lint(str(CHART), merge(IMAGES, variant), strict=True, namespace=NAMESPACE)
        problems = [m for m in report["messages"] if m["severity"] >= 2]
        assert not report["errors"] and not problems, (name, report)


def test_chart_ships_the_generated_crd() -> None:
    with helm.Chart.load(CHART) as chart:
        crds = chart.crds
    assert [yaml.safe_load(crd["data"]) for crd in crds] == [crd_manifest()]


def test_defaults_bundle_postgres_redis_and_a_generated_admin_token() -> None:
    documents = render(IMAGES)
    statefulsets = of_kind(documents, "StatefulSet")
    assert set(statefulsets) == {f"{RELEASE}-autorl-postgres", f"{RELEASE}-autorl-redis"}
    for statefulset in statefulsets.values():
        assert statefulset["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"]
    secrets = of_kind(documents, "Secret")
    assert len(secrets[f"{RELEASE}-autorl-admin-token"]["data"]["admin-token"]) >= 40
    claim = of_kind(documents, "PersistentVolumeClaim")[f"{RELEASE}-autorl-shared"]
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    grader = of_kind(documents, "Deployment")[f"{RELEASE}-autorl-grader"]["spec"]["template"]["spec"]
    env = {e["name"]: e for e in grader["containers"][0]["env"]}
    assert env["POSTGRES_PASSWORD"]["valueFrom"]["secretKeyRef"]["name"] == f"{RELEASE}-autorl-postgres"
    assert env["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"]["name"] == f"{RELEASE}-autorl-redis"
    assert len(secrets[f"{RELEASE}-autorl-postgres"]["data"]["password"]) >= 40
    assert len(secrets[f"{RELEASE}-autorl-redis"]["data"]["password"]) >= 40
    assert env["AUTORL_ADMIN_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == f"{RELEASE}-autorl-admin-token"
    assert {m["mountPath"]: m.get("readOnly") for m in grader["containers"][0]["volumeMounts"]}[
        "/shared"
    ] is True


def test_external_databases_use_existing_secrets_and_bundle_nothing() -> None:
    documents = render(merge(IMAGES, EXTERNAL))
    assert of_kind(documents, "StatefulSet") == {}
    for deployment in ("grader", "evaluator"):
        pod = of_kind(documents, "Deployment")[f"{RELEASE}-autorl-{deployment}"]["spec"]["template"]["spec"]
        env = {e["name"]: e for e in pod["containers"][0]["env"]}
        assert env["AUTORL_DATABASE_URL"]["valueFrom"]["secretKeyRef"] == {"name": "pg-url", "key": "url"}
        assert env["AUTORL_REDIS_URL"]["valueFrom"]["secretKeyRef"] == {
            "name": "redis-url",
            "key": "redis-url",
        }
    with pytest.raises(helm.HelmError, match="existingSecret"):
        render(merge(IMAGES, {"postgresql": {"enabled": False}}))


def test_gpu_workers_get_gpus_node_selector_and_tolerations() -> None:
    documents = render(merge(IMAGES, GPU))
    evaluator = of_kind(documents, "Deployment")[f"{RELEASE}-autorl-evaluator"]
    assert evaluator["spec"]["replicas"] == 3
    pod = evaluator["spec"]["template"]["spec"]
    resources = pod["containers"][0]["resources"]
    assert resources["limits"]["nvidia.com/gpu"] == 4 and resources["requests"]["nvidia.com/gpu"] == 4
    assert pod["nodeSelector"] == GPU["evaluator"]["nodeSelector"]
    assert pod["tolerations"] == GPU["evaluator"]["tolerations"]
    assert pod["runtimeClassName"] == "nvidia"
    controller = of_kind(documents, "Deployment")[f"{RELEASE}-autorl-controller"]
    env = {e["name"]: e.get("value") for e in controller["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert json.loads(env["AUTORL_AGENT_TOLERATIONS"]) == GPU["agents"]["tolerations"]
    assert json.loads(env["AUTORL_AGENT_NODE_SELECTOR"]) == GPU["agents"]["nodeSelector"]


@pytest.mark.parametrize("port", [9100, 0])
def test_evaluator_serves_its_metrics_on_a_named_port_unless_disabled(port: int) -> None:
    documents = render(merge(IMAGES, {"evaluator": {"metricsPort": port}}))
    container = of_kind(documents, "Deployment")[f"{RELEASE}-autorl-evaluator"]["spec"]["template"]["spec"][
        "containers"
    ][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    if port:
        assert container["ports"] == [{"name": "metrics", "containerPort": port}]
        assert (env["AUTORL_WORKER_METRICS_PORT"], env["AUTORL_WORKER_METRICS_HOST"]) == (
            str(port),
            "0.0.0.0",
        )
    else:
        assert "ports" not in container and "AUTORL_WORKER_METRICS_PORT" not in env


def evaluator_env(values: dict[str, Any]) -> list[dict[str, Any]]:
    """The evaluator container's environment, rendered with ``values`` under ``evaluator`` (its
    Deployment checked against the Kubernetes schema)."""
    deployment = of_kind(render(merge(IMAGES, {"evaluator": values})), "Deployment")[
        f"{RELEASE}-autorl-evaluator"
    ]
    kubernetes_validate.validate(deployment, KUBERNETES_VERSION, strict=True)
    env: list[dict[str, Any]] = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    return env


@pytest.mark.parametrize(
    ("values", "rendered_value", "warm"),
    [
        ({}, "false", False),
        ({"warmWorker": True}, "true", True),
        # An extraEnv that already set the variable (before the value existed) keeps its say.
        (
            {"warmWorker": True, "extraEnv": {"AUTORL_EVAL_WARM_WORKER": "0", "AUTORL_EVAL_LEASE_S": "60"}},
            "0",
            False,
        ),
    ],
    ids=["default", "warm", "extra-env-precedes"],
)
def test_evaluator_warm_worker_value_reaches_the_workers_setting(
    values: dict[str, Any], rendered_value: str, warm: bool
) -> None:
    env = evaluator_env(values)
    settings = [e["value"] for e in env if e["name"] == "AUTORL_EVAL_WARM_WORKER"]
    assert settings == [rendered_value]  # once: a second entry of one name would leave it to chance
    assert WorkerSettings(eval_warm_worker=settings[0]).eval_warm_worker is warm
    for name, value in values.get("extraEnv", {}).items():
        assert {"name": name, "value": value} in env


@pytest.mark.parametrize(
    ("values", "rendered", "budget"),
    [
        ({}, ("4", "120"), (4.0, 120.0)),
        ({"budgetFactor": 2.5, "budgetFloorSeconds": 30}, ("2.5", "30"), (2.5, 30.0)),
        # An extraEnv that already set a variable (before the values existed) keeps its say.
        ({"budgetFactor": 6, "extraEnv": {"AUTORL_EVAL_BUDGET_FACTOR": "8"}}, ("8", "120"), (8.0, 120.0)),
    ],
    ids=["default", "set", "extra-env-precedes"],
)
def test_evaluator_time_budget_values_reach_the_workers_settings(
    values: dict[str, Any], rendered: tuple[str, str], budget: tuple[float, float]
) -> None:
    env = evaluator_env(values)
    factor = [e["value"] for e in env if e["name"] == "AUTORL_EVAL_BUDGET_FACTOR"]
    floor = [e["value"] for e in env if e["name"] == "AUTORL_EVAL_BUDGET_FLOOR_S"]
    assert (factor, floor) == ([rendered[0]], [rendered[1]])  # once each
    worker = WorkerSettings(eval_budget_factor=factor[0], eval_budget_floor_s=floor[0])
    assert (worker.eval_budget_factor, worker.eval_budget_floor_s) == budget


def test_ingress_exposes_the_grader_service() -> None:
    documents = render(merge(IMAGES, INGRESS))
    ingress = of_kind(documents, "Ingress")[f"{RELEASE}-autorl-grader"]
    assert ingress["spec"]["ingressClassName"] == "nginx"
    assert ingress["spec"]["tls"] == [{"hosts": ["autorl.lab.test"], "secretName": "autorl-tls"}]
    backend = ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    assert backend["name"] in of_kind(documents, "Service")
    assert backend["port"] == {"name": "admin"}  # the dashboard and admin API, for people
    with pytest.raises(helm.HelmError, match=r"networkPolicy\.adminFrom"):
        render(merge(IMAGES, {"grader": INGRESS["grader"]}))
    assert of_kind(render(IMAGES), "Ingress") == {}


def test_controller_is_single_least_privileged_and_probed() -> None:
    documents = render(merge(IMAGES, MULTI_NAMESPACE))
    controller = of_kind(documents, "Deployment")[f"{RELEASE}-autorl-controller"]
    assert controller["spec"]["replicas"] == 1 and controller["spec"]["strategy"] == {"type": "Recreate"}
    container = controller["spec"]["template"]["spec"]["containers"][0]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    every_role = [doc for doc in documents if doc["kind"] == "Role"]
    assert not [doc for doc in documents if doc["kind"] in ("ClusterRole", "ClusterRoleBinding")]
    # In the release's namespace, only get on the grader's Service: its cluster IP is the agents' URL.
    service_role = of_kind(documents, "Role")[f"{RELEASE}-autorl-controller-grader-service"]
    assert service_role["metadata"]["namespace"] == NAMESPACE
    assert service_role["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["services"],
            "resourceNames": [f"{RELEASE}-autorl-grader"],
            "verbs": ["get"],
        }
    ]
    binding = of_kind(documents, "RoleBinding")[f"{RELEASE}-autorl-controller-grader-service"]
    assert binding["roleRef"]["name"] == service_role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": f"{RELEASE}-autorl-controller", "namespace": NAMESPACE}
    ]
    roles = [role for role in every_role if role is not service_role]
    assert {role["metadata"]["namespace"] for role in roles} == {"team-a", "team-b"}
    for role in every_role:
        for rule in role["rules"]:
            assert "*" not in rule["verbs"] and "*" not in rule["resources"]
            assert not {"deletecollection", "escalate", "bind", "impersonate"} & set(rule["verbs"])
            if "update" in rule["verbs"]:
                assert rule["resources"] == ["experiments/finalizers"], rule
    for role in roles:
        secrets = next(r for r in role["rules"] if r["resources"] == ["secrets"])
        assert "list" not in secrets["verbs"] and "watch" not in secrets["verbs"]
        # The budget starts when the agent container runs: the controller reads its Jobs' pods.
        pods = next(r for r in role["rules"] if r["resources"] == ["pods"])
        assert pods["apiGroups"] == [""] and pods["verbs"] == ["list"]


def test_controller_settings_agree_with_the_rendered_grader() -> None:
    """The controller's NetworkPolicy must select the grader pods the chart actually runs."""
    documents = render(IMAGES)
    deployments = of_kind(documents, "Deployment")
    container = deployments[f"{RELEASE}-autorl-controller"]["spec"]["template"]["spec"]["containers"][0]
    plain = {e["name"].removeprefix("AUTORL_").lower(): e["value"] for e in container["env"] if "value" in e}
    values = {k: json.loads(v) if v[:1] in "{[" else v for k, v in plain.items()}
    # The admin token comes from the chart's Secret (envFrom), not a plain value.
    settings = ControllerSettings.model_validate({**values, "admin_token": secrets.token_urlsafe(24)})
    grader = deployments[f"{RELEASE}-autorl-grader"]["spec"]["template"]
    assert settings.grader_pod_labels.items() <= grader["metadata"]["labels"].items()
    assert settings.grader_port == grader["spec"]["containers"][0]["ports"][0]["containerPort"]
    assert settings.grader_namespace == NAMESPACE and settings.watch_namespaces == [NAMESPACE]
    assert settings.shared_pvc in of_kind(documents, "PersistentVolumeClaim")
    service = of_kind(documents, "Service")[f"{RELEASE}-autorl-grader"]
    ports = {port["name"]: port["port"] for port in service["spec"]["ports"]}
    assert settings.grader_url == f"http://{RELEASE}-autorl-grader.{NAMESPACE}.svc:{ports['admin']}"
    # Agents get this Service's cluster IP and the port that leads to the grader's agent port.
    assert settings.grader_service == service["metadata"]["name"]
    assert agent_grading_url(
        service | {"spec": service["spec"] | {"clusterIP": "10.96.7.8"}}, "t", settings
    ) == (f"http://10.96.7.8:{ports['http']}/a/t")
    grader_env = {e["name"]: e.get("value") for e in grader["spec"]["containers"][0]["env"]}
    assert (
        grader_env["AUTORL_PUBLIC_URL"] == f"http://{RELEASE}-autorl-grader.{NAMESPACE}.svc:{ports['http']}"
    )
    assert settings.platform_uid == grader["spec"]["securityContext"]["runAsUser"]
    assert settings.platform_gid == grader["spec"]["securityContext"]["runAsGroup"]


def secrets_read(pod: dict[str, Any]) -> set[str]:
    """Every Secret a pod spec reads: by env, envFrom, volume or image pull."""
    names = {ref["name"] for ref in pod.get("imagePullSecrets") or []}
    names |= {v["secret"]["secretName"] for v in pod.get("volumes") or [] if "secret" in v}
    for container in [*(pod.get("initContainers") or []), *pod["containers"]]:
        names |= {
            e["valueFrom"]["secretKeyRef"]["name"]
            for e in container.get("env") or []
            if "secretKeyRef" in e.get("valueFrom", {})
        }
        names |= {e["secretRef"]["name"] for e in container.get("envFrom") or [] if "secretRef" in e}
    return names


@pytest.mark.parametrize(
    ("values", "named"),
    [
        (IMAGES, set()),
        (
            merge(
                merge(IMAGES, EXTERNAL),
                {
                    "image": {"pullSecrets": ["registry-creds"]},
                    "controller": {"prepareEnvSecret": "hub-token"},
                    "evaluator": {"testData": {"hubTokenSecret": "eval-hub-token"}},
                },
            ),
            {"registry-creds", "hub-token", "eval-hub-token", "pg-url", "redis-url"},
        ),
    ],
    ids=["bundled stores", "external stores and every secret value"],
)
def test_the_controller_knows_every_secret_the_platforms_pods_read(
    values: dict[str, Any], named: set[str]
) -> None:
    """An Experiment whose agent takes one of them by envFrom is refused: whoever may create an
    Experiment would otherwise read the stores' passwords or the admin token through its agent."""
    documents = render(values)
    read = set().union(*(secrets_read(pod) for _, pod in pod_specs(documents)))
    controller = of_kind(documents, "Deployment")[f"{RELEASE}-autorl-controller"]["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in controller["containers"][0]["env"]}
    listed = set(env["AUTORL_PLATFORM_SECRETS"].split(","))
    assert read and read <= listed, read - listed
    assert named <= listed  # the prepare Jobs' secret too, which no pod of the chart reads


def test_helm_test_pod_checks_the_grader_health() -> None:
    documents = render(IMAGES)
    test_pod = next(doc for doc in documents if doc["kind"] == "Pod")
    assert test_pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    script = test_pod["spec"]["containers"][0]["command"][-1]
    assert f"http://{RELEASE}-autorl-grader.{NAMESPACE}.svc:8000/healthz" in script


@pytest.mark.parametrize(
    "values",
    [
        {"evaluator": {"backend": "vllm"}},
        {"grader": {"replicas": 0}},
        {"image": {"pullPolicy": "Sometimes"}},
        {"controller": {"watchNamespaces": ["Team_A"]}},
        {"redis": {"enabled": False}},
        {"shared": {"mountPath": "relative"}},
        {"snapshots": {"mountPath": "snapshots"}},
        {"agents": {"idRange": {"start": 0}}},
        {"agents": {"clusterCIDRs": ["10.0.0.0"]}},
        {"grader": {"adminPort": 70000}},
        {"evaluator": {"metricsPort": 70000}},
        {"postgresql": {"auth": {"existingSecretKey": ""}}},
        {"evaluator": {"nodeSelector": {"nvidia.com/gpu.present": True}}},  # `--set` of a label: a boolean
        {"evaluator": {"testData": {"source": "s3"}}},
        {"evaluator": {"testData": {"url": "ftp://mirror/gsm8k"}}},
        {"evaluator": {"testData": {"tasks": []}}},
        {"evaluator": {"maxNewTokens": -1}},
        {"evaluator": {"warmWorker": "yes"}},
        {"evaluator": {"budgetFactor": 0}},
        {"evaluator": {"budgetFloorSeconds": -1}},
    ],
)
def test_schema_refuses_bad_values(values: dict[str, Any]) -> None:
    with helm.Chart.load(CHART) as chart, pytest.raises(helm.HelmValuesError):
        chart.validate_schema(merge(IMAGES, values))


def test_every_default_value_is_documented_in_the_schema() -> None:
    with helm.Chart.load(CHART) as chart:
        defaults, schema = chart.values, chart.schema
    assert schema is not None

    def check(values: dict[str, Any], node: dict[str, Any], path: str) -> None:
        for key, value in values.items():
            child = node.get("properties", {}).get(key)
            assert child is not None, f"{path}{key} is not in values.schema.json"
            assert child.get("description"), f"{path}{key} has no description"
            if isinstance(value, dict) and "properties" in child:
                check(value, child, f"{path}{key}.")

    check(defaults, schema, "")


def test_pull_secrets_reach_the_chart_pods_and_the_controllers_jobs() -> None:
    documents = render(merge(IMAGES, {"image": {"pullSecrets": ["regcred", "mirror-cred"]}}))
    for name, pod in pod_specs(documents):
        assert pod["imagePullSecrets"] == [{"name": "regcred"}, {"name": "mirror-cred"}], name
    controller = of_kind(documents, "Deployment")[f"{RELEASE}-autorl-controller"]
    env = {e["name"]: e.get("value") for e in controller["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["AUTORL_IMAGE_PULL_SECRETS"] == "regcred,mirror-cred"
    default = of_kind(render(IMAGES), "Deployment")[f"{RELEASE}-autorl-controller"]
    env = {e["name"]: e.get("value") for e in default["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert "AUTORL_IMAGE_PULL_SECRETS" not in env
