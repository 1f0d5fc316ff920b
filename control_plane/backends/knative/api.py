"""The thin applier: the Kubernetes API calls the knative backend makes, and nothing else.

It wraps the official ``kubernetes`` client, whose calls block, so each runs on this
object's own thread pool with a bounded request timeout (STYLE C11, C13). Answers are
the API server's JSON as plain dicts (camelCase, as in the manifests), read without the
client's model classes: the backend's pure modules work on the same shapes the tests build.

The RBAC this needs is in ``deploy/kubernetes/rbac.yaml``: Knative Services (apply, delete),
Revisions (get, patch) and pods (list, patch, delete) in the runtime namespace, and ``get``
on three named config maps and the ``controller`` Deployment in ``knative-serving``.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

import urllib3
from kubernetes import client as k8s, config as k8s_config
from kubernetes.client.exceptions import ApiException

from control_plane.backends.knative.errors import KubeApiError, KubeConflictError
from control_plane.backends.knative.manifests import GROUP, VERSION
from control_plane.backends.knative.settings import KnativeSettings

__all__ = ["FIELD_MANAGER", "KubeApi", "create_api_client"]

FIELD_MANAGER = "zeroserve-control-plane"
"""Owner of the fields we set, for server-side apply."""
_APPLY = "application/apply-patch+yaml"
_MERGE = "application/merge-patch+json"


def create_api_client(settings: KnativeSettings) -> Any:
    """A ``kubernetes.client.ApiClient`` from the kubeconfig in ``settings``, or from the
    pod's service account when there is none (the client reads the standard in-cluster
    environment and token file itself)."""
    if settings.kubeconfig is not None:
        return k8s_config.new_client_from_config(config_file=str(settings.kubeconfig))
    configuration = k8s.Configuration()
    k8s_config.load_incluster_config(client_configuration=configuration)
    return k8s.ApiClient(configuration)


class KubeApi:
    """Async calls to the Kubernetes API for one namespace's Knative Services and pods.

    Parameters:
        api_client: a ``kubernetes.client.ApiClient`` (closed by ``close``).
        namespace: where the runtime pools live.
        request_timeout_s: bound on each call, connect and read.
        threads: size of the pool the blocking client calls run on.
    """

    def __init__(
        self, api_client: Any, *, namespace: str, request_timeout_s: float, threads: int = 4
    ) -> None:
        self._client = api_client
        self._custom = k8s.CustomObjectsApi(api_client)
        self._core = k8s.CoreV1Api(api_client)
        self._apps = k8s.AppsV1Api(api_client)
        self.namespace = namespace
        self._timeout = request_timeout_s
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="kube-api")

    async def apply_service(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        """Create or update a Knative Service by server-side apply (idempotent)."""
        name = manifest["metadata"]["name"]
        return await self._call(
            f"apply service {name}",
            self._custom.patch_namespaced_custom_object,
            GROUP,
            VERSION,
            self.namespace,
            "services",
            name,
            dict(manifest),
            field_manager=FIELD_MANAGER,
            force=True,
            _content_type=_APPLY,
        )

    async def get_service(self, name: str) -> dict[str, Any] | None:
        return await self._get(
            f"get service {name}",
            self._custom.get_namespaced_custom_object,
            GROUP,
            VERSION,
            self.namespace,
            "services",
            name,
        )

    async def delete_service(self, name: str) -> bool:
        """Delete the Service (its Revisions and pods go with it); False if it was absent."""
        try:
            await self._call(
                f"delete service {name}",
                self._custom.delete_namespaced_custom_object,
                GROUP,
                VERSION,
                self.namespace,
                "services",
                name,
                propagation_policy="Background",
            )
        except KubeApiError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    async def get_revision(self, name: str) -> dict[str, Any] | None:
        return await self._get(
            f"get revision {name}",
            self._custom.get_namespaced_custom_object,
            GROUP,
            VERSION,
            self.namespace,
            "revisions",
            name,
        )

    async def patch_revision(self, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        """Merge-patch a Revision; ``KubeConflictError`` when the patch names a
        ``resourceVersion`` that is no longer current."""
        return await self._call(
            f"patch revision {name}",
            self._custom.patch_namespaced_custom_object,
            GROUP,
            VERSION,
            self.namespace,
            "revisions",
            name,
            dict(patch),
            field_manager=FIELD_MANAGER,
            _content_type=_MERGE,
        )

    async def list_pods(self, label_selector: str) -> dict[str, Any]:
        """The namespace's pods matching ``label_selector``, as a ``PodList`` document."""
        return await self._call(
            f"list pods {label_selector}",
            self._core.list_namespaced_pod,
            self.namespace,
            label_selector=label_selector,
        )

    async def patch_pod(self, name: str, patch: Mapping[str, Any]) -> None:
        await self._call(
            f"patch pod {name}",
            self._core.patch_namespaced_pod,
            name,
            self.namespace,
            dict(patch),
            field_manager=FIELD_MANAGER,
            _content_type=_MERGE,
        )

    async def delete_pod(self, name: str, *, grace_period_s: int | None = None) -> bool:
        """Delete a pod (it gets SIGTERM and ``grace_period_s``); False if it was absent."""
        try:
            await self._call(
                f"delete pod {name}",
                self._core.delete_namespaced_pod,
                name,
                self.namespace,
                grace_period_seconds=grace_period_s,
            )
        except KubeApiError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    async def read_config_map(self, namespace: str, name: str) -> dict[str, str] | None:
        """The ``data`` of a config map in any namespace; None when it does not exist."""
        doc = await self._get(
            f"read configmap {namespace}/{name}",
            self._core.read_namespaced_config_map,
            name,
            namespace,
        )
        if doc is None:
            return None
        return {str(k): str(v) for k, v in (doc.get("data") or {}).items()}

    async def read_deployment(self, namespace: str, name: str) -> dict[str, Any] | None:
        """A Deployment in any namespace (Knative's, for its release labels); None when it
        does not exist."""
        return await self._get(
            f"read deployment {namespace}/{name}",
            self._apps.read_namespaced_deployment,
            name,
            namespace,
        )

    async def close(self) -> None:
        """Wait for calls in flight (each is bounded by the request timeout), then close."""
        await asyncio.to_thread(self._executor.shutdown, wait=True)
        self._client.close()

    async def _get(
        self, operation: str, method: Callable[..., Any], *args: Any
    ) -> dict[str, Any] | None:
        try:
            return await self._call(operation, method, *args)
        except KubeApiError as exc:
            if exc.status == 404:
                return None
            raise

    async def _call(
        self, operation: str, method: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> dict[str, Any]:
        call = functools.partial(
            _raw_json,
            operation,
            method,
            *args,
            _preload_content=False,
            _request_timeout=(self._timeout, self._timeout),
            **kwargs,
        )
        return await asyncio.get_running_loop().run_in_executor(self._executor, call)


def _raw_json(operation: str, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run one client call (in a worker thread) and parse its JSON body ourselves."""
    try:
        response = method(*args, **kwargs)
    except ApiException as exc:
        status = int(exc.status or 0)
        reason = _reason(exc)
        if status == 409:
            raise KubeConflictError(operation=operation, status=status, reason=reason) from None
        raise KubeApiError(operation=operation, status=status, reason=reason) from None
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        raise KubeApiError(operation=operation, status=0, reason=str(exc)) from None
    try:
        body = response.data
    finally:
        response.release_conn()
    if not body:
        return {}
    return cast(dict[str, Any], json.loads(body))


def _reason(exc: ApiException) -> str:
    """The API server's ``Status.message`` when it sent one, else the HTTP reason."""
    body = getattr(exc, "body", None)
    if body:
        try:
            message = json.loads(body).get("message")
        except (ValueError, AttributeError):
            message = None
        if message:
            return str(message)
    return str(exc.reason or "error")
