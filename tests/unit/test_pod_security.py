"""The emulated API server's Pod Security "restricted" check (tests/support/pod_security.py): the pods
of every Job the controller builds pass it, and each rule of the level refuses what it forbids."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from autorl_controller.operator.manifests import build_agent_job, build_prepare_job
from tests.support.pod_security import violations, would_violate_warning
from tests.unit.test_manifests import BUILTIN, CUSTOM, REF, SETTINGS

JOBS = {
    "agent-builtin": build_agent_job(REF, BUILTIN, SETTINGS),
    "agent-custom": build_agent_job(REF, CUSTOM, SETTINGS),
    "prepare": build_prepare_job(REF, BUILTIN, SETTINGS),
}


def pod(job: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = copy.deepcopy(job["spec"]["template"]["spec"])
    return spec


@pytest.mark.parametrize("job", list(JOBS.values()), ids=list(JOBS))
def test_the_controllers_pods_are_admitted_as_restricted(job: dict[str, Any]) -> None:
    assert violations(pod(job)) == []


def _first(spec: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = spec["containers"][0]
    return container


Change = Callable[[dict[str, Any]], object]


def _unset_everywhere(field: str) -> Change:
    """A change that removes ``field`` from the pod's security context and from its container's."""

    def change(spec: dict[str, Any]) -> None:
        spec["securityContext"].pop(field)
        _first(spec)["securityContext"].pop(field)

    return change


CASES: list[tuple[str, Change, str]] = [
    (
        "escalation",
        lambda s: _first(s)["securityContext"].pop("allowPrivilegeEscalation"),
        "allowPrivilegeEscalation != false (container",
    ),
    (
        "capabilities-kept",
        lambda s: _first(s)["securityContext"].pop("capabilities"),
        'must set securityContext.capabilities.drop=["ALL"]',
    ),
    (
        "capability-added",
        lambda s: _first(s)["securityContext"]["capabilities"].update(add=["SYS_ADMIN"]),
        "non-default capabilities (capabilities SYS_ADMIN must not be added)",
    ),
    (
        "net-bind-service",
        lambda s: _first(s)["securityContext"]["capabilities"].update(add=["NET_BIND_SERVICE"]),
        "",
    ),
    ("root-allowed", _unset_everywhere("runAsNonRoot"), "runAsNonRoot != true"),
    ("root-user", lambda s: s["securityContext"].update(runAsUser=0), "runAsUser=0 (pod must not set"),
    (
        "unconfined",
        lambda s: _first(s)["securityContext"].update(seccompProfile={"type": "Unconfined"}),
        'must set securityContext.seccompProfile.type to "RuntimeDefault" or "Localhost"',
    ),
    ("no-seccomp", _unset_everywhere("seccompProfile"), "seccompProfile (pod or container"),
    ("localhost-seccomp", lambda s: s["securityContext"].update(seccompProfile={"type": "Localhost"}), ""),
    (
        "host-path",
        lambda s: s["volumes"].append({"name": "docker", "hostPath": {"path": "/var/run/docker.sock"}}),
        'volume "docker" uses restricted volume type "hostPath"',
    ),
    (
        "nfs",
        lambda s: s["volumes"].append({"name": "nfs", "nfs": {"server": "x", "path": "/"}}),
        'volume "nfs" uses restricted volume type "nfs"',
    ),
    ("host-network", lambda s: s.update(hostNetwork=True), "host namespaces (hostNetwork=true)"),
    (
        "host-pid",
        lambda s: s.update(hostPID=True, hostIPC=True),
        "host namespaces (hostPID=true, hostIPC=true)",
    ),
    (
        "privileged",
        lambda s: _first(s)["securityContext"].update(privileged=True),
        "must not set securityContext.privileged=true",
    ),
    (
        "host-port",
        lambda s: _first(s).update(ports=[{"containerPort": 80, "hostPort": 80}]),
        "hostPort (hostPorts 80)",
    ),
    (
        "proc-mount",
        lambda s: _first(s)["securityContext"].update(procMount="Unmasked"),
        "procMount (container",
    ),
    (
        "sysctl",
        lambda s: s["securityContext"].update(sysctls=[{"name": "kernel.msgmax", "value": "1"}]),
        "forbidden sysctls (kernel.msgmax)",
    ),
    (
        "selinux-user",
        lambda s: s["securityContext"].update(seLinuxOptions={"user": "system_u"}),
        "seLinuxOptions",
    ),
    (
        "apparmor",
        lambda s: _first(s)["securityContext"].update(appArmorProfile={"type": "Unconfined"}),
        "appArmorProfile",
    ),
]


@pytest.mark.parametrize(("change", "says"), [(c, s) for _, c, s in CASES], ids=[i for i, _, _ in CASES])
def test_each_restricted_rule_refuses_what_it_forbids(change: Change, says: str) -> None:
    spec = pod(JOBS["agent-custom"])
    change(spec)
    found = violations(spec)
    if not says:
        assert found == []
    else:
        assert any(says in violation for violation in found), found


def test_a_workload_that_would_be_refused_gets_the_admissions_warning() -> None:
    spec = pod(JOBS["prepare"])
    spec["hostNetwork"] = True
    assert would_violate_warning(violations(spec)) == (
        '299 - "would violate PodSecurity \\"restricted:latest\\": host namespaces (hostNetwork=true)"'
    )
