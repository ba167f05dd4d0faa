"""The emulated API server's RBAC (tests/support/kube_rbac.py) decides as Kubernetes' RBAC authorizer
does: the chart's rendered Role for the controller, and the matching rules on small Roles of their own."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.kube_emulator import GRADER_NAMESPACE, NAMESPACE, chart_authorizer
from tests.support.kube_rbac import (
    Attributes,
    Authorizer,
    ServiceAccountUser,
    forbidden_status,
    request_verb,
)

CHART = chart_authorizer()


@pytest.mark.parametrize(
    ("request_", "allowed"),
    [
        (Attributes("watch", "autorl.io", "experiments", NAMESPACE), True),
        (Attributes("list", "autorl.io", "experiments", NAMESPACE), True),
        (Attributes("patch", "autorl.io", "experiments", NAMESPACE, "x", "status"), True),
        (Attributes("update", "autorl.io", "experiments", NAMESPACE, "x", "finalizers"), True),
        (Attributes("create", "batch", "jobs", NAMESPACE), True),
        (Attributes("patch", "batch", "jobs", NAMESPACE, "x-agent"), True),
        (Attributes("list", "", "pods", NAMESPACE), True),
        (Attributes("create", "", "events", NAMESPACE), True),
        (Attributes("get", "", "services", GRADER_NAMESPACE, "autorl-grader"), True),
        # Only what the operator uses: no status of Jobs, no logs, no reading Secrets in bulk.
        (Attributes("patch", "batch", "jobs", NAMESPACE, "x-agent", "status"), False),
        (Attributes("get", "", "pods", NAMESPACE, "x", "log"), False),
        (Attributes("list", "", "secrets", NAMESPACE), False),
        (Attributes("watch", "", "pods", NAMESPACE), False),
        (Attributes("delete", "autorl.io", "experiments", NAMESPACE, "x"), False),
        (Attributes("update", "autorl.io", "experiments", NAMESPACE, "x"), False),
        # The grader's Service by name only, in the release's namespace only.
        (Attributes("get", "", "services", GRADER_NAMESPACE, "autorl-postgres"), False),
        (Attributes("list", "", "services", GRADER_NAMESPACE), False),
        (Attributes("get", "", "services", NAMESPACE, "autorl-grader"), False),
        # The Role is namespaced: nothing in another namespace, nothing at the cluster scope.
        (Attributes("create", "batch", "jobs", "default"), False),
        (Attributes("list", "autorl.io", "experiments", None), False),
        (Attributes("list", "", "namespaces", None), False),
        # A resource of that name in another group is another resource.
        (Attributes("create", "apps", "jobs", NAMESPACE), False),
    ],
    ids=lambda value: repr(value) if isinstance(value, Attributes) else str(value),
)
def test_the_charts_role_allows_the_controller_exactly_its_rules(request_: Attributes, allowed: bool) -> None:
    assert CHART.allows(request_) is allowed


USER = ServiceAccountUser("ops", "robot")


def _role(kind: str, name: str, rules: list[dict[str, Any]], namespace: str | None = None) -> dict[str, Any]:
    meta = {"name": name} | ({"namespace": namespace} if namespace else {})
    return {"kind": kind, "metadata": meta, "rules": rules}


def _binding(
    kind: str, role_kind: str, role: str, subject: dict[str, str], namespace: str | None = None
) -> dict[str, Any]:
    meta = {"name": f"{role}-binding"} | ({"namespace": namespace} if namespace else {})
    return {
        "kind": kind,
        "metadata": meta,
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": role},
        "subjects": [subject],
    }


SA = {"kind": "ServiceAccount", "name": "robot", "namespace": "ops"}
RULES = [
    {"apiGroups": ["batch"], "resources": ["jobs", "jobs/status"], "verbs": ["get", "patch"]},
    {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
    {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["settings"], "verbs": ["*"]},
    {"apiGroups": ["*"], "resources": ["*/scale"], "verbs": ["update"]},
]
NAMESPACED = Authorizer(
    [_role("Role", "r", RULES, "team"), _binding("RoleBinding", "Role", "r", SA, "team")], USER
)
#: A ClusterRole bound in one namespace grants only there; bound cluster-wide, everywhere.
CLUSTER_ROLE_IN_TEAM = Authorizer(
    [_role("ClusterRole", "c", RULES), _binding("RoleBinding", "ClusterRole", "c", SA, "team")], USER
)
CLUSTER_WIDE = Authorizer(
    [
        _role("ClusterRole", "c", [{"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list"]}]),
        _binding(
            "ClusterRoleBinding", "ClusterRole", "c", {"kind": "Group", "name": "system:serviceaccounts"}
        ),
    ],
    USER,
)
#: The same Role bound to a ServiceAccount of that name in another namespace grants this one nothing.
OTHER_ACCOUNT = Authorizer(
    [
        _role("Role", "r", RULES, "team"),
        _binding(
            "RoleBinding", "Role", "r", {"kind": "ServiceAccount", "name": "robot", "namespace": "x"}, "team"
        ),
    ],
    USER,
)


@pytest.mark.parametrize(
    ("authorizer", "request_", "allowed"),
    [
        (NAMESPACED, Attributes("get", "batch", "jobs", "team", "a"), True),
        (NAMESPACED, Attributes("patch", "batch", "jobs", "team", "a", "status"), True),
        (NAMESPACED, Attributes("update", "batch", "jobs", "team", "a", "status"), False),
        (NAMESPACED, Attributes("list", "batch", "jobs", "team"), False),
        (NAMESPACED, Attributes("get", "", "pods", "team", "a", "log"), True),
        (NAMESPACED, Attributes("get", "", "pods", "team", "a"), False),
        (NAMESPACED, Attributes("get", "", "pods", "team", "a", "exec"), False),
        (NAMESPACED, Attributes("delete", "", "configmaps", "team", "settings"), True),
        (NAMESPACED, Attributes("delete", "", "configmaps", "team", "other"), False),
        # resourceNames never match a request without a name (create, list, watch).
        (NAMESPACED, Attributes("list", "", "configmaps", "team"), False),
        (NAMESPACED, Attributes("create", "", "configmaps", "team"), False),
        (NAMESPACED, Attributes("update", "apps", "deployments", "team", "d", "scale"), True),
        (NAMESPACED, Attributes("update", "apps", "deployments", "team", "d"), False),
        (NAMESPACED, Attributes("get", "batch", "jobs", "other", "a"), False),
        (CLUSTER_ROLE_IN_TEAM, Attributes("get", "batch", "jobs", "team", "a"), True),
        (CLUSTER_ROLE_IN_TEAM, Attributes("get", "batch", "jobs", "other", "a"), False),
        (CLUSTER_ROLE_IN_TEAM, Attributes("get", "batch", "jobs", None, "a"), False),
        (CLUSTER_WIDE, Attributes("list", "", "namespaces", None), True),
        (CLUSTER_WIDE, Attributes("watch", "", "namespaces", None), False),
        (OTHER_ACCOUNT, Attributes("get", "batch", "jobs", "team", "a"), False),
    ],
)
def test_rbac_matches_groups_resources_subresources_verbs_names_and_scope(
    authorizer: Authorizer, request_: Attributes, allowed: bool
) -> None:
    assert authorizer.allows(request_) is allowed


@pytest.mark.parametrize(
    ("method", "named", "params", "verb"),
    [
        ("GET", True, {}, "get"),
        ("GET", False, {}, "list"),
        ("GET", False, {"watch": "true"}, "watch"),
        ("GET", False, {"watch": "1"}, "watch"),
        ("POST", False, {}, "create"),
        ("PUT", True, {}, "update"),
        ("PATCH", True, {}, "patch"),
        ("DELETE", True, {}, "delete"),
        ("DELETE", False, {}, "deletecollection"),
    ],
)
def test_http_requests_map_to_the_authorizers_verbs(
    method: str, named: bool, params: dict[str, str], verb: str
) -> None:
    assert request_verb(method, named=named, params=params) == verb


def test_discovery_is_open_and_other_paths_are_not() -> None:
    assert CHART.allows_path("get", "/apis/autorl.io/v1alpha1")
    assert CHART.allows_path("get", "/version")
    assert not CHART.allows_path("get", "/metrics")
    assert not CHART.allows_path("get", "/logs/")


def test_a_refusal_is_the_api_servers_forbidden_status() -> None:
    status = forbidden_status(Attributes("get", "batch", "jobs", "team", "a-agent"), USER)
    assert status == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'jobs.batch "a-agent" is forbidden: User "system:serviceaccount:ops:robot" cannot get '
        'resource "jobs" in API group "batch" in the namespace "team"',
        "reason": "Forbidden",
        "details": {"name": "a-agent", "group": "batch", "kind": "jobs"},
        "code": 403,
    }
    cluster = forbidden_status(Attributes("list", "", "pods", None, "", "log"), USER)["message"]
    assert cluster == (
        'pods is forbidden: User "system:serviceaccount:ops:robot" cannot list resource "pods/log" '
        'in API group "" at the cluster scope'
    )
