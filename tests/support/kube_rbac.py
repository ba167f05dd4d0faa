"""The API server's RBAC authorizer, for the emulated cluster (tests/support/kube_emulator.py): the
chart's rendered Roles, ClusterRoles and bindings decide what one user may do, with Kubernetes'
matching rules (k8s.io/kubernetes plugin/pkg/auth/authorizer/rbac), and a refusal is the API server's
403 Status in its words.

What it leaves out: aggregated ClusterRoles, impersonation, and every other authorizer (Node,
webhooks). Discovery (``/api``, ``/apis``, ``/version``, …) is open to every authenticated user, as
the default ``system:discovery`` ClusterRole makes it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tests.support.kube_status import failure

#: Non-resource paths the default ``system:discovery`` and ``system:public-info-viewer`` roles open.
DISCOVERY_PATHS = ("/api", "/apis", "/version", "/healthz", "/livez", "/readyz", "/openapi")


@dataclass(frozen=True)
class ServiceAccountUser:
    """A ServiceAccount as the API server authenticates it: its user name and its groups."""

    namespace: str
    name: str

    @property
    def username(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.name}"

    @property
    def groups(self) -> frozenset[str]:
        return frozenset(
            {"system:serviceaccounts", f"system:serviceaccounts:{self.namespace}", "system:authenticated"}
        )


@dataclass(frozen=True)
class Attributes:
    """What a resource request asks (the API server's authorizer attributes); ``namespace`` None: the
    cluster scope; ``name`` empty for create, list, watch and deletecollection of a collection."""

    verb: str
    group: str
    resource: str
    namespace: str | None
    name: str = ""
    subresource: str = ""

    @property
    def combined_resource(self) -> str:
        return f"{self.resource}/{self.subresource}" if self.subresource else self.resource


def request_verb(method: str, *, named: bool, params: Mapping[str, str]) -> str:
    """The authorizer's verb of an HTTP request on a resource path (k8s.io/apiserver's RequestInfo)."""
    method = method.upper()
    if method == "GET":
        if params.get("watch") in ("true", "1"):
            return "watch"
        return "get" if named else "list"
    if method == "HEAD":
        return "get" if named else "list"
    if method == "DELETE":
        return "delete" if named else "deletecollection"
    return {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(method, method.lower())


def _rule_allows(rule: Mapping[str, Any], request: Attributes) -> bool:
    verbs = rule.get("verbs") or []
    groups = rule.get("apiGroups") or []
    resources = rule.get("resources") or []
    names = rule.get("resourceNames") or []
    return (
        ("*" in verbs or request.verb in verbs)
        and ("*" in groups or request.group in groups)
        and any(
            resource in ("*", request.combined_resource)
            or (bool(request.subresource) and resource == f"*/{request.subresource}")
            for resource in resources
        )
        and (not names or request.name in names)
    )


class Authorizer:
    """RBAC over a set of rendered manifests (Roles, ClusterRoles, RoleBindings, ClusterRoleBindings;
    other kinds are ignored), for one user."""

    def __init__(self, manifests: Iterable[Mapping[str, Any]], user: ServiceAccountUser) -> None:
        self.user = user
        documents = list(manifests)
        roles = {
            (doc["metadata"].get("namespace"), doc["metadata"]["name"]): list(doc.get("rules") or [])
            for doc in documents
            if doc.get("kind") == "Role"
        }
        cluster_roles = {
            doc["metadata"]["name"]: list(doc.get("rules") or [])
            for doc in documents
            if doc.get("kind") == "ClusterRole"
        }
        #: (namespace the rules apply in, None: every namespace and the cluster scope; the rules)
        self.grants: list[tuple[str | None, list[dict[str, Any]]]] = []
        for doc in documents:
            kind = doc.get("kind")
            if kind not in ("RoleBinding", "ClusterRoleBinding") or not self._binds(doc):
                continue
            ref = doc["roleRef"]
            namespace = doc["metadata"].get("namespace") if kind == "RoleBinding" else None
            if ref["kind"] == "ClusterRole":
                self.grants.append((namespace, cluster_roles.get(ref["name"], [])))
            elif kind == "RoleBinding":  # a Role is only ever bound in its own namespace
                self.grants.append((namespace, roles.get((namespace, ref["name"]), [])))

    def _binds(self, binding: Mapping[str, Any]) -> bool:
        binding_namespace = binding["metadata"].get("namespace")
        for subject in binding.get("subjects") or []:
            kind, name = subject.get("kind"), subject.get("name")
            if kind == "ServiceAccount":
                # A RoleBinding's subject without a namespace means the binding's own.
                if name == self.user.name and (subject.get("namespace") or binding_namespace) == (
                    self.user.namespace
                ):
                    return True
            elif (kind == "User" and name == self.user.username) or (
                kind == "Group" and name in self.user.groups
            ):
                return True
        return False

    def allows(self, request: Attributes) -> bool:
        return any(
            (scope is None or scope == request.namespace) and _rule_allows(rule, request)
            for scope, rules in self.grants
            for rule in rules
        )

    def allows_path(self, verb: str, path: str) -> bool:
        """A non-resource request: discovery, or a ClusterRole's ``nonResourceURLs`` (``/x/*``: a prefix)."""
        if verb == "get" and any(
            path.rstrip("/") == open_ or path.startswith(f"{open_}/") for open_ in DISCOVERY_PATHS
        ):
            return True
        return any(
            scope is None
            and ("*" in (rule.get("verbs") or []) or verb in (rule.get("verbs") or []))
            and any(
                url == path or (url.endswith("*") and path.startswith(url[:-1]))
                for url in rule.get("nonResourceURLs") or []
            )
            for scope, rules in self.grants
            for rule in rules
        )


def forbidden_status(request: Attributes, user: ServiceAccountUser) -> dict[str, Any]:
    """The API server's answer to a request its authorizer denies (HTTP 403)."""
    qualified = f"{request.resource}.{request.group}" if request.group else request.resource
    subject = f'{qualified} "{request.name}"' if request.name else qualified
    where = (
        f'in the namespace "{request.namespace}"' if request.namespace is not None else "at the cluster scope"
    )
    message = (
        f'{subject} is forbidden: User "{user.username}" cannot {request.verb} resource '
        f'"{request.combined_resource}" in API group "{request.group}" {where}'
    )
    details: dict[str, str] = {"group": request.group, "kind": request.resource}
    if request.name:
        details["name"] = request.name
    return failure(403, "Forbidden", message, details)


def forbidden_path_status(verb: str, path: str, user: ServiceAccountUser) -> dict[str, Any]:
    """The API server's 403 for a non-resource path the user may not reach."""
    return failure(403, "Forbidden", f'forbidden: User "{user.username}" cannot {verb} path "{path}"', {})
