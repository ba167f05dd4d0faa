"""Why a Job's pod does not run yet, read from what the scheduler and the kubelet report.

Pure functions over the Job, its pods (conditions, container statuses) and its Warning Events, so
that each cause is tested without a cluster: a Job Kueue holds, a pod Kubernetes refuses to create,
one no node can take, an image that cannot be pulled, a container whose Secret is missing, and a
container that keeps crashing; and what a failed container said last. Messages quote what Kubernetes
said (escaped where status is written) and say what to do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autorl.wait_reasons import Reason

#: What the kubelet reports while an image cannot be pulled.
IMAGE_PULL_REASONS = frozenset(
    {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull", "RegistryUnavailable"}
)
#: What it reports when a container cannot be created from its spec (a missing Secret or ConfigMap).
CONTAINER_CONFIG_REASONS = frozenset(
    {"CreateContainerConfigError", "CreateContainerError", "RunContainerError"}
)
#: Kubernetes' own messages can run long (a registry's whole answer); status keeps the start.
MAX_QUOTED = 300


@dataclass(frozen=True)
class PodWait:
    reason: Reason
    message: str


def _quote(text: str | None, limit: int = MAX_QUOTED) -> str:
    text = " ".join((text or "").split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def job_wait(job: dict[str, Any], what: str) -> PodWait | None:
    """A Job that makes no pod on purpose: suspended (Kueue holds it until its quota admits it)."""
    if not (job.get("spec") or {}).get("suspend"):
        return None
    queue = (job.get("metadata") or {}).get("labels", {}).get("kueue.x-k8s.io/queue-name")
    where = f" in LocalQueue {queue}" if queue else ""
    return PodWait(
        Reason.JOB_SUSPENDED,
        f"the {what} Job is suspended, waiting for its queue to admit it{where}; "
        "see kubectl get workloads (Kueue) for its quota",
    )


def pod_wait(pods: list[dict[str, Any]], what: str) -> PodWait | None:
    """Why the newest of a Job's pods that has not ended does not run, or None (nothing is wrong)."""
    live = [pod for pod in pods if (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]
    live.sort(key=lambda pod: str((pod.get("metadata") or {}).get("creationTimestamp") or ""), reverse=True)
    for pod in live:
        found = _one_pod(pod, what)
        if found is not None:
            return found
    return None


def _one_pod(pod: dict[str, Any], what: str) -> PodWait | None:
    name = (pod.get("metadata") or {}).get("name", "")
    status = pod.get("status") or {}
    for condition in status.get("conditions") or []:
        if (
            condition.get("type") == "PodScheduled"
            and condition.get("status") == "False"
            and condition.get("reason") == "Unschedulable"
        ):
            return unschedulable(what, condition.get("message"))
    statuses = [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]
    for container in statuses:
        waiting = (container.get("state") or {}).get("waiting") or {}
        reason, message = waiting.get("reason", ""), _quote(waiting.get("message"))
        detail = f": {message}" if message else ""
        if reason in IMAGE_PULL_REASONS:
            image = container.get("image") or _spec_image(pod, container.get("name", ""))
            return PodWait(
                Reason.IMAGE_PULL_FAILED,
                f"the {what} pod cannot pull image {image} ({reason}{detail}); push the image or correct "
                "its name, and give the cluster access to its registry (imagePullSecrets)",
            )
        if reason in CONTAINER_CONFIG_REASONS:
            return PodWait(
                Reason.CONTAINER_CONFIG_ERROR,
                f"the {what} pod cannot start container {container.get('name')} ({reason}{detail}); "
                "create the Secret or ConfigMap it names in this namespace, or correct the reference",
            )
        if reason == "CrashLoopBackOff":
            last = (container.get("lastState") or {}).get("terminated") or {}
            exit_code = last.get("exitCode")
            code = f", exit code {exit_code}" if exit_code is not None else ""
            return PodWait(
                Reason.CRASH_LOOP_BACK_OFF,
                f"container {container.get('name')} of the {what} pod keeps failing "
                f"({container.get('restartCount', 0)} restarts{code}); see kubectl logs {name} "
                f"-c {container.get('name')} --previous",
            )
    return None


#: A container's last words can run longer than a Kubernetes message (a refusal naming its fix).
MAX_LAST_WORDS = 600


def last_words(pods: list[dict[str, Any]]) -> str | None:
    """What the newest failed container of a Job's ended pods said last: its termination message
    (the file it wrote, or its log's tail under ``FallbackToLogsOnError``), the last line of it, with
    the container's name and exit code; None when no container failed with a message."""
    ended = [pod for pod in pods if (pod.get("status") or {}).get("phase") == "Failed"]
    ended.sort(key=lambda pod: str((pod.get("metadata") or {}).get("creationTimestamp") or ""), reverse=True)
    for pod in ended:
        status = pod.get("status") or {}
        for container in [
            *(status.get("initContainerStatuses") or []),
            *(status.get("containerStatuses") or []),
        ]:
            terminated = (container.get("state") or {}).get("terminated") or {}
            lines = [line for line in str(terminated.get("message") or "").splitlines() if line.strip()]
            if terminated.get("exitCode") and lines:
                said = _quote(lines[-1], MAX_LAST_WORDS)
                return f"container {container.get('name')} exited with code {terminated['exitCode']}: {said}"
    return None


def _spec_image(pod: dict[str, Any], container: str) -> str:
    spec = pod.get("spec") or {}
    for item in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        if item.get("name") == container:
            return str(item.get("image", "?"))
    return "?"


def unschedulable(what: str, message: str | None) -> PodWait:
    said = _quote(message) or "no node fits it"
    return PodWait(
        Reason.UNSCHEDULABLE,
        f"the {what} pod cannot be scheduled: {said}; add or free nodes with what it requests "
        "(GPUs, memory, node selector, tolerations), or request less",
    )


def event_wait(events: list[dict[str, Any]], what: str, *, has_pods: bool) -> PodWait | None:
    """What the latest Warning Event about the Job or its pod says, when the pods themselves do not.

    Without a pod, the Job controller's ``FailedCreate`` (quota, admission, Pod Security) is the only
    trace; with a Pending pod, the scheduler's ``FailedScheduling`` or the kubelet's ``FailedMount``.
    """
    warnings = [event for event in events if event.get("type") == "Warning"]
    warnings.sort(key=_event_time)
    if not warnings:
        return None
    latest = warnings[-1]
    reason, message = str(latest.get("reason") or ""), _quote(latest.get("message"))
    if reason == "FailedScheduling":
        return unschedulable(what, message)
    if not has_pods:
        return PodWait(
            Reason.POD_CREATE_FAILED,
            f"Kubernetes does not create the {what} pod ({reason}: {message}); fix what it names "
            "(a ResourceQuota, LimitRange or admission policy of the namespace)",
        )
    return PodWait(
        Reason.POD_STARTING,
        f"the {what} pod is not running yet ({reason}: {message}); see kubectl describe pod",
    )


def _event_time(event: dict[str, Any]) -> str:
    series = event.get("series") or {}
    return str(
        series.get("lastObservedTime")
        or event.get("lastTimestamp")
        or event.get("eventTime")
        or (event.get("metadata") or {}).get("creationTimestamp")
        or ""
    )
