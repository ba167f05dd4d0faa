"""Pod Security "restricted" (latest), as the API server's PodSecurity admission checks a pod spec
(k8s.io/pod-security-admission/policy), for the emulated cluster (tests/support/kube_emulator.py).

Every check of the baseline and restricted levels, in the admission's words. Left out: the
deprecated AppArmor annotations and Windows-only pods (``spec.os.name: windows`` relaxes some checks).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from tests.support.kube_status import failure

LEVEL = "restricted:latest"

#: Volume types a restricted pod may use.
RESTRICTED_VOLUME_TYPES = frozenset(
    {
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "persistentVolumeClaim",
        "projected",
        "secret",
    }
)
#: Capabilities the baseline level lets a container add (restricted: only NET_BIND_SERVICE).
BASELINE_CAPABILITIES = frozenset(
    {
        "AUDIT_WRITE",
        "CHOWN",
        "DAC_OVERRIDE",
        "FOWNER",
        "FSETID",
        "KILL",
        "MKNOD",
        "NET_BIND_SERVICE",
        "SETFCAP",
        "SETGID",
        "SETPCAP",
        "SETUID",
        "SYS_CHROOT",
    }
)
SAFE_SYSCTLS = frozenset(
    {
        "kernel.shm_rmid_forced",
        "net.ipv4.ip_local_port_range",
        "net.ipv4.ip_unprivileged_port_start",
        "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range",
        "net.ipv4.ip_local_reserved_ports",
        "net.ipv4.tcp_keepalive_time",
        "net.ipv4.tcp_fin_timeout",
        "net.ipv4.tcp_keepalive_intvl",
        "net.ipv4.tcp_keepalive_probes",
    }
)
SELINUX_TYPES = frozenset({"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"})

Container = Mapping[str, Any]


def _containers(pod: Mapping[str, Any]) -> Iterator[Container]:
    for key in ("initContainers", "containers", "ephemeralContainers"):
        yield from pod.get(key) or []


def _security(container: Container) -> Mapping[str, Any]:
    return container.get("securityContext") or {}


def _names(containers: list[Container]) -> str:
    quoted = ", ".join(f'"{c.get("name", "")}"' for c in containers)
    return f"container {quoted}" if len(containers) == 1 else f"containers {quoted}"


def _each(pod: Mapping[str, Any], forbidden: Callable[[Container], bool], title: str, must: str) -> list[str]:
    offending = [c for c in _containers(pod) if forbidden(c)]
    return [f"{title} ({_names(offending)} {must})"] if offending else []


def violations(pod: Mapping[str, Any]) -> list[str]:
    """What in a pod spec ``restricted`` forbids, one "check (detail)" each; empty: admitted."""
    pod_security: Mapping[str, Any] = pod.get("securityContext") or {}
    found: list[str] = []

    # --- baseline -------------------------------------------------------------------------------
    if pod_security.get("windowsOptions", {}).get("hostProcess") or any(
        _security(c).get("windowsOptions", {}).get("hostProcess") for c in _containers(pod)
    ):
        found.append(
            "hostProcess (pod or containers must not set securityContext.windowsOptions.hostProcess=true)"
        )
    host = [f"{key}=true" for key in ("hostNetwork", "hostPID", "hostIPC") if pod.get(key)]
    if host:
        found.append(f"host namespaces ({', '.join(host)})")
    found += _each(
        pod,
        lambda c: bool(_security(c).get("privileged")),
        "privileged",
        "must not set securityContext.privileged=true",
    )
    added = sorted(
        {cap for c in _containers(pod) for cap in _security(c).get("capabilities", {}).get("add") or []}
        - BASELINE_CAPABILITIES
    )
    if added:
        found.append(f"non-default capabilities (capabilities {', '.join(added)} must not be added)")
    host_paths = [v["name"] for v in pod.get("volumes") or [] if "hostPath" in v]
    if host_paths:
        found.append(f"hostPath volumes (volumes {', '.join(map(repr, host_paths))})")
    host_ports = sorted(
        {p["hostPort"] for c in _containers(pod) for p in c.get("ports") or [] if p.get("hostPort")}
    )
    if host_ports:
        found.append(f"hostPort (hostPorts {', '.join(map(str, host_ports))})")
    if (
        any((_security(c).get("appArmorProfile") or {}).get("type") == "Unconfined" for c in _containers(pod))
        or (pod_security.get("appArmorProfile") or {}).get("type") == "Unconfined"
    ):
        found.append('appArmorProfile (pod or containers must not set appArmorProfile.type to "Unconfined")')
    selinux = [pod_security.get("seLinuxOptions") or {}] + [
        _security(c).get("seLinuxOptions") or {} for c in _containers(pod)
    ]
    if any(o.get("type", "") not in SELINUX_TYPES or o.get("user") or o.get("role") for o in selinux):
        found.append(
            "seLinuxOptions (pod or containers must not set a forbidden seLinuxOptions type, user or role)"
        )
    found += _each(
        pod,
        lambda c: _security(c).get("procMount", "Default") != "Default",
        "procMount",
        'must not set securityContext.procMount to "Unmasked"',
    )
    unsafe = [s["name"] for s in pod_security.get("sysctls") or [] if s.get("name") not in SAFE_SYSCTLS]
    if unsafe:
        found.append(f"forbidden sysctls ({', '.join(unsafe)})")

    # --- restricted -----------------------------------------------------------------------------
    restricted_volumes = [
        (volume["name"], kind)
        for volume in pod.get("volumes") or []
        for kind in volume
        if kind != "name" and kind not in RESTRICTED_VOLUME_TYPES
    ]
    if restricted_volumes:
        found.append(
            "restricted volume types ("
            + ", ".join(
                f'volume "{name}" uses restricted volume type "{kind}"' for name, kind in restricted_volumes
            )
            + ")"
        )
    found += _each(
        pod,
        lambda c: _security(c).get("allowPrivilegeEscalation") is not False,
        "allowPrivilegeEscalation != false",
        "must set securityContext.allowPrivilegeEscalation=false",
    )
    drops_all = _each(
        pod,
        lambda c: "ALL" not in (_security(c).get("capabilities", {}).get("drop") or []),
        "unrestricted capabilities",
        'must set securityContext.capabilities.drop=["ALL"]',
    )
    adds = _each(
        pod,
        lambda c: bool(set(_security(c).get("capabilities", {}).get("add") or []) - {"NET_BIND_SERVICE"}),
        "unrestricted capabilities",
        'must not include capabilities other than "NET_BIND_SERVICE" in securityContext.capabilities.add',
    )
    found += drops_all + adds
    pod_non_root = pod_security.get("runAsNonRoot") is True
    not_non_root = [
        c
        for c in _containers(pod)
        if _security(c).get("runAsNonRoot") is False
        or (not pod_non_root and _security(c).get("runAsNonRoot") is not True)
    ]
    if not_non_root:
        found.append(
            f"runAsNonRoot != true (pod or {_names(not_non_root)} must set securityContext.runAsNonRoot=true)"
        )
    if pod_security.get("runAsUser") == 0:
        found.append("runAsUser=0 (pod must not set runAsUser=0)")
    found += _each(
        pod, lambda c: _security(c).get("runAsUser") == 0, "runAsUser=0", "must not set runAsUser=0"
    )
    allowed_seccomp = ("RuntimeDefault", "Localhost")
    pod_seccomp = (pod_security.get("seccompProfile") or {}).get("type")
    # A container's own profile overrides the pod's; one without either is unconfined.
    bad_seccomp = [
        c
        for c in _containers(pod)
        if ((_security(c).get("seccompProfile") or {}).get("type") or pod_seccomp) not in allowed_seccomp
    ]
    if pod_seccomp is not None and pod_seccomp not in allowed_seccomp:
        found.append(
            f'seccompProfile (pod must not set securityContext.seccompProfile.type to "{pod_seccomp}")'
        )
    elif bad_seccomp:
        found.append(
            f"seccompProfile (pod or {_names(bad_seccomp)} must set securityContext.seccompProfile.type to "
            '"RuntimeDefault" or "Localhost")'
        )
    return found


def forbidden_pod_status(name: str, found: list[str]) -> dict[str, Any]:
    """The PodSecurity admission's refusal of a pod (HTTP 403)."""
    message = f'pods "{name}" is forbidden: violates PodSecurity "{LEVEL}": {", ".join(found)}'
    return failure(403, "Forbidden", message, {"name": name, "kind": "pods"})


def would_violate_warning(found: list[str]) -> str:
    """The ``Warning`` header the admission adds to a workload (a Job) whose pod template it would refuse:
    the workload is admitted; its pods are not."""
    text = f'would violate PodSecurity "{LEVEL}": {", ".join(found)}'.replace('"', '\\"')
    return f'299 - "{text}"'
