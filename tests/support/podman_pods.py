"""Kubernetes pod specs run as podman containers: what a kubelet would start, on this machine.

A pod's container becomes ``podman run`` with the same image, command, arguments, working folder,
environment (values, ``$(VAR)`` references, Secret keys), user and groups, read-only root file system,
dropped capabilities and volume mounts. A PersistentVolumeClaim is a host folder standing in for it
(``subPath`` and ``readOnly`` kept); an ``emptyDir`` is a tmpfs. Containers share the host's network
(``--network host``): the services find each other and the test's Postgres and Redis at 127.0.0.1, as
pods find each other through Services. Anything else a pod spec may hold fails loudly.

podman runs with docker/containers.conf (runc, ulimits this machine grants), as ``make images`` builds.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
CONTAINERS_CONF = REPO / "docker" / "containers.conf"
_VAR_REFERENCE = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def podman_environment() -> dict[str, str]:
    return {**os.environ, "CONTAINERS_CONF": os.environ.get("CONTAINERS_CONF", str(CONTAINERS_CONF))}


def podman(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        ["podman", *args], capture_output=True, text=True, timeout=timeout, env=podman_environment()
    )
    if check and result.returncode != 0:
        raise AssertionError(
            f"podman {' '.join(args[:3])} ... failed ({result.returncode}):\n{result.stderr}"
        )
    return result


def podman_unavailable(image: str | None = None) -> str | None:
    """Why podman cannot run containers here (a trivial one in ``image``, if given), or None."""
    if shutil.which("podman") is None:
        return "podman is not installed (make images installs it: apt-get install podman runc)"
    try:
        result = podman("version", timeout=60, check=False)
        if result.returncode == 0 and image is not None:
            args = ["run", "--rm", "--network", "none", "--pull", "never", "--entrypoint", "true", image]
            result = podman(*args, timeout=120, check=False)
    except subprocess.TimeoutExpired:
        return "podman does not answer"
    if result.returncode != 0:
        return f"podman cannot run containers here: {result.stderr.strip()[:300]}"
    return None


def image_exists(reference: str) -> bool:
    return podman("image", "exists", reference, check=False).returncode == 0


@dataclass
class PodHost:
    """What a node gives pods: claims (PVC name -> host folder), Secrets (name -> key -> value) and
    the Services' DNS names (all 127.0.0.1: every container shares the host's network)."""

    claims: dict[str, Path]
    secrets: dict[str, dict[str, str]] = field(default_factory=dict)
    field_values: dict[str, str] = field(default_factory=dict)
    service_names: list[str] = field(default_factory=list)

    def environment(self, container: Mapping[str, Any]) -> dict[str, str]:
        env: dict[str, str] = {}
        for source in container.get("envFrom", []):
            if "secretRef" not in source:
                raise NotImplementedError(f"envFrom {source}")
            name = source["secretRef"]["name"]
            if name not in self.secrets:
                if source["secretRef"].get("optional"):
                    continue
                raise KeyError(f"envFrom: no Secret {name}")
            env.update({f"{source.get('prefix', '')}{k}": v for k, v in self.secrets[name].items()})
        for item in container.get("env", []):
            if "value" in item:
                env[item["name"]] = _VAR_REFERENCE.sub(
                    lambda m: env.get(m.group(1), m.group(0)), str(item["value"])
                )
            elif "secretKeyRef" in item.get("valueFrom", {}):
                ref = item["valueFrom"]["secretKeyRef"]
                value = self.secrets.get(ref["name"], {}).get(ref["key"])
                if value is None:
                    if ref.get("optional"):
                        continue
                    raise KeyError(f"env {item['name']}: no key {ref['key']} in Secret {ref['name']}")
                env[item["name"]] = value
            elif "fieldRef" in item.get("valueFrom", {}):
                env[item["name"]] = self.field_values[item["valueFrom"]["fieldRef"]["fieldPath"]]
            elif "valueFrom" in item:
                raise NotImplementedError(f"env {item}")
            else:
                env[item["name"]] = ""
        return env

    def mounts(self, pod: Mapping[str, Any], container: Mapping[str, Any]) -> list[str]:
        volumes = {volume["name"]: volume for volume in pod.get("volumes", [])}
        args: list[str] = []
        for mount in container.get("volumeMounts", []):
            volume = volumes[mount["name"]]
            if "persistentVolumeClaim" in volume:
                claim = volume["persistentVolumeClaim"]
                source = self.claims[claim["claimName"]] / mount.get("subPath", "")
                if not source.exists():
                    # The kubelet creates a missing subPath folder.
                    source.mkdir(parents=True)
                read_only = mount.get("readOnly", False) or claim.get("readOnly", False)
                args += ["-v", f"{source}:{mount['mountPath']}:{'ro' if read_only else 'rw'}"]
            elif "emptyDir" in volume:
                args += ["--tmpfs", f"{mount['mountPath']}:rw,mode=1777,exec"]
            else:
                raise NotImplementedError(f"volume {volume}")
        return args


def run_args(pod: Mapping[str, Any], container: Mapping[str, Any], host: PodHost, name: str) -> list[str]:
    """``podman run`` arguments (without ``--rm``/``-d``) for one container of a pod spec."""
    pod_security = pod.get("securityContext", {})
    security = {**pod_security, **container.get("securityContext", {})}
    args = ["--name", name, "--network", "host", "--pull", "never"]
    for service in host.service_names:
        args += ["--add-host", f"{service}:127.0.0.1"]
    user, group = security.get("runAsUser"), security.get("runAsGroup")
    if user is not None:
        args += ["--user", f"{user}:{group if group is not None else 0}"]
    for extra in [pod_security.get("fsGroup"), *pod_security.get("supplementalGroups", [])]:
        if extra is not None:
            args += ["--group-add", str(extra)]
    if security.get("readOnlyRootFilesystem"):
        # As Kubernetes: no implicit tmpfs; the pod's emptyDir volumes are its scratch space.
        args += ["--read-only", "--read-only-tmpfs=false"]
    if "ALL" in security.get("capabilities", {}).get("drop", []):
        args += ["--cap-drop", "ALL"]
    if security.get("allowPrivilegeEscalation") is False:
        args += ["--security-opt", "no-new-privileges"]
    if security.get("privileged"):
        raise NotImplementedError("privileged containers")
    if "workingDir" in container:
        args += ["--workdir", container["workingDir"]]
    for key, value in host.environment(container).items():
        args += ["--env", f"{key}={value}"]
    args += host.mounts(pod, container)
    if "command" in container:
        args += ["--entrypoint", json.dumps(container["command"])]
    args.append(container["image"])
    args += [str(arg) for arg in container.get("args", [])]
    return args


def _run_one(
    pod: Mapping[str, Any], container: Mapping[str, Any], host: PodHost, name: str, timeout: float
) -> tuple[str, int, str]:
    """One container run to its end: (its name in the pod, exit code, logs)."""
    container_name = f"{name}-{container['name']}"
    podman("rm", "-f", container_name, check=False)
    result = podman("run", *run_args(pod, container, host, container_name), timeout=timeout, check=False)
    podman("rm", "-f", container_name, check=False)
    return container["name"], result.returncode, result.stdout + result.stderr


def _start_one(pod: Mapping[str, Any], container: Mapping[str, Any], host: PodHost, name: str) -> str:
    """One container started in the background; returns its podman name."""
    container_name = f"{name}-{container['name']}"
    podman("rm", "-f", container_name, check=False)
    podman("run", "-d", *run_args(pod, container, host, container_name))
    return container_name


def run_to_completion(
    pod: Mapping[str, Any], host: PodHost, name: str, *, timeout: float
) -> list[tuple[str, int, str]]:
    """Run a pod's init containers, then its containers, one after the other, each to its end.

    A native sidecar (an init container with ``restartPolicy: Always``) is started in the background
    where it stands and stopped (SIGTERM) once the rest have ended, as the kubelet does.
    Returns (container, exit code, logs) for each container run to its end; stops at the first that
    fails.
    """
    results = []
    sidecars: list[str] = []
    try:
        for container in [*pod.get("initContainers", []), *pod["containers"]]:
            if container.get("restartPolicy") == "Always":
                sidecars.append(_start_one(pod, container, host, name))
                continue
            results.append(_run_one(pod, container, host, name, timeout))
            if results[-1][1] != 0:
                break
    finally:
        for sidecar in sidecars:
            podman("stop", "--time", "30", sidecar, check=False)
            podman("rm", "-f", sidecar, check=False)
    return results


def start(pod: Mapping[str, Any], host: PodHost, name: str, *, init_timeout: float = 600) -> list[str]:
    """Start a pod's containers in the background (a Deployment's pod); returns their names.

    As the kubelet: each init container first, in order, run to its end (one that fails stops the
    start, with its logs), a native sidecar started where it stands; then the containers.
    """
    names: list[str] = []
    try:
        for container in pod.get("initContainers", []):
            if container.get("restartPolicy") == "Always":
                names.append(_start_one(pod, container, host, name))
                continue
            init_name, code, output = _run_one(pod, container, host, name, init_timeout)
            if code != 0:
                raise AssertionError(f"init container {init_name} of {name} exited {code}:\n{output[-5000:]}")
        names += [_start_one(pod, container, host, name) for container in pod["containers"]]
    except BaseException:
        remove(*names)
        raise
    return names


def logs(container_name: str) -> str:
    result = podman("logs", container_name, check=False)
    return result.stdout + result.stderr


def running(container_name: str) -> bool:
    result = podman("inspect", "--format", "{{.State.Running}}", container_name, check=False)
    return result.stdout.strip() == "true"


def remove(*container_names: str) -> None:
    for container_name in container_names:
        podman("rm", "-f", "-t", "5", container_name, check=False)
