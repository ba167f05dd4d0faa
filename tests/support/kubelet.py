"""What the kubelet reports about a container that ended, for tests of what the controller reads, and
the environment it gives a container."""

from __future__ import annotations

from typing import Any

#: The kubelet's bounds on a log tail taken as the termination message (FallbackToLogsOnError).
LOG_TAIL_LINES = 80
LOG_TAIL_BYTES = 2048


def termination_message(log: str) -> str:
    """The termination message of a container that failed without writing its message file, under
    ``terminationMessagePolicy: FallbackToLogsOnError``: its log's last 80 lines, at most 2048 bytes."""
    tail = "".join(log.splitlines(keepends=True)[-LOG_TAIL_LINES:]).encode()
    return tail[-LOG_TAIL_BYTES:].decode(errors="replace")


def failed_pod_status(container: str, exit_code: int, log: str, *, init: bool = True) -> dict[str, Any]:
    """A pod (restartPolicy Never) whose ``container`` exited with ``exit_code`` after writing ``log``."""
    terminated = {"exitCode": exit_code, "reason": "Error", "message": termination_message(log)}
    statuses = [{"name": container, "state": {"terminated": terminated}, "restartCount": 0}]
    return {"phase": "Failed", "initContainerStatuses" if init else "containerStatuses": statuses}


def kubelet_environment(
    container: dict[str, Any],
    secrets_by_name: dict[str, dict[str, str]],
    configmaps: dict[str, dict[str, str]],
) -> dict[str, str]:
    """A container's environment as the kubelet builds it: envFrom sources (with their prefix), then env."""
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        if "secretRef" in source:
            data = secrets_by_name[source["secretRef"]["name"]]
        else:
            data = configmaps[source["configMapRef"]["name"]]
        env.update({source.get("prefix", "") + key: value for key, value in data.items()})
    env.update({item["name"]: item["value"] for item in container.get("env", [])})
    return env
