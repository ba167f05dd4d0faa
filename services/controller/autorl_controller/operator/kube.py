"""A small async Kubernetes client for the handful of calls the handlers make.

Why not ``kubernetes_asyncio``: the controller touches a handful of kinds (Secrets, Jobs, Pods and the
grader's Service (read only), NetworkPolicies, Events, Experiments' status) with five verbs; a generated
client of the whole API, with its own configuration loader, would be a second way to log in beside
kopf's. This client is built from the very ``kopf.ConnectionInfo`` that the operator's login handler
gives kopf, so both always talk to the same server with the same credentials, and it speaks plain JSON
over ``httpx`` (already a core dependency), which any conforming API server or emulator answers.
"""

from __future__ import annotations

import json
import os
import ssl
import tempfile
from dataclasses import dataclass
from typing import Any

import httpx
import kopf

from autorl.crd import API_VERSION, PLURAL

MERGE_PATCH = "application/merge-patch+json"


class KubeError(Exception):
    """An API call failed; ``status`` is the HTTP status (0: no answer)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"Kubernetes API {status}: {message}" if status else f"Kubernetes API: {message}")
        self.status = status


@dataclass(frozen=True)
class Resource:
    """One resource type: ``Resource("batch/v1", "jobs")``."""

    api_version: str
    plural: str

    def path(self, namespace: str | None, name: str | None = None, subresource: str | None = None) -> str:
        """The object's path; ``namespace`` None: the collection across the cluster."""
        root = "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"
        path = (
            f"{root}/{self.plural}" if namespace is None else f"{root}/namespaces/{namespace}/{self.plural}"
        )
        if name is not None:
            path += f"/{name}"
        if subresource is not None:
            path += f"/{subresource}"
        return path


SECRETS = Resource("v1", "secrets")
SERVICES = Resource("v1", "services")
PODS = Resource("v1", "pods")
EVENTS = Resource("v1", "events")
JOBS = Resource("batch/v1", "jobs")
NETWORK_POLICIES = Resource("networking.k8s.io/v1", "networkpolicies")
EXPERIMENTS = Resource(API_VERSION, PLURAL)


def _ssl_context(info: kopf.ConnectionInfo, scratch: str) -> ssl.SSLContext | bool:
    """TLS settings from a ConnectionInfo; PEM data is written to private files, as ssl wants paths."""
    if info.insecure:
        return False
    context = ssl.create_default_context()
    if info.ca_path:
        context.load_verify_locations(cafile=os.fsdecode(info.ca_path))
    elif info.ca_data:
        ca = info.ca_data.decode() if isinstance(info.ca_data, bytes) else info.ca_data
        context.load_verify_locations(cadata=ca)
    cert = _pem_file(info.certificate_path, info.certificate_data, scratch, "client.crt")
    key = _pem_file(info.private_key_path, info.private_key_data, scratch, "client.key")
    if cert:
        context.load_cert_chain(cert, key)
    return context


def _pem_file(path: Any, data: str | bytes | None, scratch: str, name: str) -> str | None:
    if path:
        return os.fsdecode(path)
    if not data:
        return None
    target = os.path.join(scratch, name)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data if isinstance(data, bytes) else data.encode())
    return target


class KubeClient:
    """Create-if-missing, get, list, merge-patch and delete of namespaced objects."""

    def __init__(self, *, timeout_s: float = 30.0) -> None:
        self._timeout_s = timeout_s
        self._client: httpx.AsyncClient | None = None
        # Clients replaced by a re-login may still carry a request; they are closed at shutdown.
        self._retired: list[httpx.AsyncClient] = []
        self._scratch = tempfile.TemporaryDirectory(prefix="autorl-kube-")

    def use(self, info: kopf.ConnectionInfo) -> None:
        """Switch to new credentials (called by the login handler, also after a re-login)."""
        old, self._client = self._client, None
        headers = {"Accept": "application/json", "User-Agent": "autorl-controller"}
        headers.update(info.as_http_headers())
        self._client = httpx.AsyncClient(
            base_url=info.server.rstrip("/"),
            headers=headers,
            verify=_ssl_context(info, self._scratch.name),
            timeout=self._timeout_s,
        )
        if old is not None:
            self._retired.append(old)

    async def aclose(self) -> None:
        for client in [*self._retired, *([self._client] if self._client else [])]:
            await client.aclose()
        self._retired.clear()
        self._client = None
        self._scratch.cleanup()

    async def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        if self._client is None:
            raise KubeError(0, "not logged in yet")
        try:
            return await self._client.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise KubeError(0, f"{method} {path}: {exc}") from exc

    @staticmethod
    def _fail(response: httpx.Response) -> KubeError:
        try:
            message = str(response.json().get("message", response.text))
        except ValueError:
            message = response.text
        return KubeError(
            response.status_code, f"{response.request.method} {response.request.url.path}: {message}"
        )

    @classmethod
    def _object_or_none(cls, response: httpx.Response) -> dict[str, Any] | None:
        """The object an answer holds; None when there is none (404); any other error raised."""
        if response.status_code == 404:
            return None
        if response.is_error:
            raise cls._fail(response)
        body: dict[str, Any] = response.json()
        return body

    async def get(self, resource: Resource, namespace: str, name: str) -> dict[str, Any] | None:
        return self._object_or_none(await self._request("GET", resource.path(namespace, name)))

    async def list(
        self,
        resource: Resource,
        namespace: str | None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> list[dict[str, Any]]:
        """Every object of ``resource`` in ``namespace`` (None: the whole cluster), or those matching
        ``label_selector`` and ``field_selector``."""
        params = {
            key: value
            for key, value in (("labelSelector", label_selector), ("fieldSelector", field_selector))
            if value
        } or None
        response = await self._request("GET", resource.path(namespace), params=params)
        if response.is_error:
            raise self._fail(response)
        items: list[dict[str, Any]] = response.json().get("items") or []
        return items

    async def ensure(self, resource: Resource, manifest: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        """Create the object unless one of that name exists; returns (object, created)."""
        namespace = manifest["metadata"]["namespace"]
        response = await self._request("POST", resource.path(namespace), json=manifest)
        if response.status_code == 409:
            existing = await self.get(resource, namespace, manifest["metadata"]["name"])
            if existing is not None:
                return existing, False
        if response.is_error:
            raise self._fail(response)
        body: dict[str, Any] = response.json()
        return body, True

    async def patch(
        self,
        resource: Resource,
        namespace: str,
        name: str,
        patch: dict[str, Any],
        *,
        subresource: str | None = None,
    ) -> dict[str, Any] | None:
        response = await self._request(
            "PATCH",
            resource.path(namespace, name, subresource),
            content=json.dumps(patch),
            headers={"Content-Type": MERGE_PATCH},
        )
        return self._object_or_none(response)

    async def delete(self, resource: Resource, namespace: str, name: str) -> bool:
        """Delete with background propagation (a Job's pods go too); False when already gone."""
        response = await self._request(
            "DELETE",
            resource.path(namespace, name),
            json={"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"},
        )
        if response.status_code == 404:
            return False
        if response.is_error:
            raise self._fail(response)
        return True
