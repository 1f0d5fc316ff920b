"""A fake Kubernetes API server, over real HTTP, for the knative backend's tests.

No API server can run here (no cluster, no container runtime, no etcd), so the backend's
tests point the real ``kubernetes`` client at this small server instead. It implements only
the calls the backend makes (server-side apply, get and delete of Knative Services; get and
merge-patch of Revisions; list, merge-patch and delete of pods; get of config maps and of
Knative's controller Deployment, labelled with its release) and plays,
in a few lines each, the controllers a cluster would run behind them:

- Knative: an applied Service stamps the Revision its template names (the template is
  validated against the real CRD schema first); a Revision wants ``min-scale`` pods (capped
  by ``max-scale``) while it is routed (its Service's latest, or named in the Service's
  ``traffic``, at any percent), and none after (Knative scales an unreachable one to zero);
- the ReplicaSet: creates and removes pods to match, removing the cheapest first (not ready,
  then lowest ``pod-deletion-cost``, then newest), and replaces deleted ones;
- the kubelet: a pluggable ``Kubelet``; ``InstantKubelet`` makes pods ready at once on fake
  IPs, ``ProcessKubelet`` runs each pod's container command as a real process on its own
  loopback address (127.0.0.N), with the pod's environment and its volumes as folders.

What it does not do is everything else an API server does: authentication, watches,
admission webhooks beyond the schema, and the timing of real controllers.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import parse_qs, urlsplit

from kubernetes import client as k8s

from tests.control_plane.knative.schemas import knative_service_errors

KNATIVE = "/apis/serving.knative.dev/v1/namespaces/(?P<ns>[^/]+)"
CORE = "/api/v1/namespaces/(?P<ns>[^/]+)"
APPS = "/apis/apps/v1/namespaces/(?P<ns>[^/]+)"
MIN_SCALE = "autoscaling.knative.dev/min-scale"
MAX_SCALE = "autoscaling.knative.dev/max-scale"
REVISION_LABEL = "serving.knative.dev/revision"
SERVICE_LABEL = "serving.knative.dev/service"
COST = "controller.kubernetes.io/pod-deletion-cost"
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    content_type: str


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message


class Kubelet(Protocol):
    def start(self, kube: FakeKube, pod: str) -> None: ...

    def stop(self, kube: FakeKube, pod: str) -> None: ...


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _matches(labels: dict[str, str], selector: str) -> bool:
    for term in filter(None, selector.split(",")):
        key, sep, value = term.partition("=")
        if sep and labels.get(key) != value:
            return False
        if not sep and key not in labels:
            return False
    return True


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class FakeKube:
    """The fake API server and its simulated controllers; all state under one lock."""

    def __init__(
        self,
        *,
        kubelet: Kubelet | None = None,
        config_maps: dict[tuple[str, str], dict[str, str]] | None = None,
        knative_version: str | None = "1.21.0",
    ) -> None:
        self.lock = threading.RLock()
        self.kubelet: Kubelet = kubelet or InstantKubelet()
        self.services: dict[tuple[str, str], dict[str, Any]] = {}
        self.revisions: dict[tuple[str, str], dict[str, Any]] = {}
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.config_maps = dict(config_maps or {})
        self.deployments: dict[tuple[str, str], dict[str, Any]] = {}
        """Only Knative's controller, labelled as a release labels it (None: absent)."""
        if knative_version is not None:
            self.set_knative_version(knative_version)
        self.forbidden_config_maps: set[tuple[str, str]] = set()
        self.requests: list[Request] = []
        self.conflicts_to_inject = 0
        """The next this many Revision patches with a resourceVersion answer 409."""
        self._versions = itertools.count(1)
        self._pod_numbers = itertools.count(1)
        self._pod_order: dict[tuple[str, str], int] = {}
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> FakeKube:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        close = getattr(self.kubelet, "close", None)
        if close is not None:
            close()

    def api_client(self) -> Any:
        configuration = k8s.Configuration()
        configuration.host = self.url
        return k8s.ApiClient(configuration)

    # ---- what tests look at ----

    def live_pods(self, namespace: str = "zeroserve") -> list[dict[str, Any]]:
        with self.lock:
            return [
                copy.deepcopy(p)
                for (ns, _), p in sorted(self.pods.items())
                if ns == namespace and "deletionTimestamp" not in p["metadata"]
            ]

    def calls(self, method: str, fragment: str) -> list[Request]:
        with self.lock:
            return [r for r in self.requests if r.method == method and fragment in r.path]

    def set_knative_version(
        self, version: str, *, label: str = "app.kubernetes.io/version"
    ) -> None:
        with self.lock:
            self.deployments[("knative-serving", "controller")] = {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {
                    "name": "controller",
                    "namespace": "knative-serving",
                    "labels": {"app.kubernetes.io/name": "knative-serving", label: version},
                },
            }

    # ---- the kubelet's side ----

    def set_running(self, pod: str, *, ip: str, ready: bool, ns: str = "zeroserve") -> None:
        with self.lock:
            doc = self.pods.get((ns, pod))
            if doc is None:
                return
            status = doc["status"]
            status.update(phase="Running", podIP=ip, startTime=status.get("startTime", _now()))
            self._set_ready(doc, ready)

    def set_ready(self, pod: str, ready: bool, *, ns: str = "zeroserve") -> None:
        with self.lock:
            doc = self.pods.get((ns, pod))
            if doc is not None:
                self._set_ready(doc, ready)

    def set_unschedulable(self, pod: str, message: str, *, ns: str = "zeroserve") -> None:
        with self.lock:
            doc = self.pods.get((ns, pod))
            if doc is not None:
                doc["status"]["conditions"] = [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": message,
                    }
                ]

    def restarted(self, pod: str, *, ns: str = "zeroserve") -> None:
        with self.lock:
            doc = self.pods.get((ns, pod))
            if doc is not None:
                for container in doc["status"]["containerStatuses"]:
                    if container["name"] == "runtime":
                        container["restartCount"] += 1
                self._set_ready(doc, False)

    def remove_pod(self, pod: str, *, ns: str = "zeroserve") -> None:
        with self.lock:
            self.pods.pop((ns, pod), None)
            self._reconcile()

    @staticmethod
    def _set_ready(doc: dict[str, Any], ready: bool) -> None:
        value = "True" if ready else "False"
        doc["status"]["conditions"] = [
            {"type": "PodScheduled", "status": "True"},
            {"type": "Ready", "status": value},
        ]
        for container in doc["status"]["containerStatuses"]:
            container["ready"] = ready
            container["state"] = {"running": {"startedAt": _now()}}

    # ---- the API ----

    def handle(self, method: str, path: str, query: dict[str, list[str]], body: Any) -> Any:
        routes = [
            ("PATCH", f"{KNATIVE}/services/(?P<name>[^/]+)", self._apply_service),
            ("GET", f"{KNATIVE}/services/(?P<name>[^/]+)", self._get_service),
            ("DELETE", f"{KNATIVE}/services/(?P<name>[^/]+)", self._delete_service),
            ("GET", f"{KNATIVE}/revisions/(?P<name>[^/]+)", self._get_revision),
            ("PATCH", f"{KNATIVE}/revisions/(?P<name>[^/]+)", self._patch_revision),
            ("GET", f"{CORE}/pods", self._list_pods),
            ("PATCH", f"{CORE}/pods/(?P<name>[^/]+)", self._patch_pod),
            ("DELETE", f"{CORE}/pods/(?P<name>[^/]+)", self._delete_pod),
            ("GET", f"{CORE}/configmaps/(?P<name>[^/]+)", self._get_config_map),
            ("GET", f"{APPS}/deployments/(?P<name>[^/]+)", self._get_deployment),
        ]
        for route_method, pattern, action in routes:
            match = re.fullmatch(pattern, path)
            if match and method == route_method:
                with self.lock:
                    return copy.deepcopy(action(query=query, body=body, **match.groupdict()))
        raise ApiError(404, "NotFound", f"no route for {method} {path}")

    def _apply_service(self, *, ns: str, name: str, query: Any, body: Any) -> Any:
        if query.get("fieldManager") is None:
            raise ApiError(400, "BadRequest", "server-side apply needs a fieldManager")
        errors = knative_service_errors(body)
        if body.get("metadata", {}).get("name") != name:
            errors.append("metadata.name does not match the URL")
        template_name = body["spec"]["template"]["metadata"].get("name", "")
        if not template_name.startswith(f"{name}-"):
            errors.append("spec.template.metadata.name must start with the Service's name")
        if errors:
            raise ApiError(422, "Invalid", "; ".join(errors))
        existing = self.services.get((ns, name))
        revision = self.revisions.get((ns, template_name))
        if revision is not None and revision["spec"] != body["spec"]["template"]["spec"]:
            raise ApiError(400, "BadRequest", "saw changes to the template without a new name")
        service = merge_patch(existing or {}, body)
        service["spec"] = copy.deepcopy(body["spec"])
        service["metadata"]["namespace"] = ns
        service["metadata"]["resourceVersion"] = str(next(self._versions))
        service["status"] = {"latestCreatedRevisionName": template_name}
        self.services[(ns, name)] = service
        if revision is None:
            template = body["spec"]["template"]
            self.revisions[(ns, template_name)] = {
                "apiVersion": "serving.knative.dev/v1",
                "kind": "Revision",
                "metadata": {
                    "name": template_name,
                    "namespace": ns,
                    "labels": {**template["metadata"].get("labels", {}), SERVICE_LABEL: name},
                    "annotations": dict(template["metadata"].get("annotations", {})),
                    "resourceVersion": str(next(self._versions)),
                },
                "spec": copy.deepcopy(template["spec"]),
            }
        self._reconcile()
        return service

    def _get_service(self, *, ns: str, name: str, **_: Any) -> Any:
        return self._get(self.services, ns, name, "services")

    def _delete_service(self, *, ns: str, name: str, **_: Any) -> Any:
        if self.services.pop((ns, name), None) is None:
            raise ApiError(404, "NotFound", f'services.serving.knative.dev "{name}" not found')
        for key in [
            k
            for k, r in self.revisions.items()
            if r["metadata"]["labels"].get(SERVICE_LABEL) == name
        ]:
            del self.revisions[key]
        self._reconcile()
        return {"kind": "Status", "status": "Success"}

    def _get_revision(self, *, ns: str, name: str, **_: Any) -> Any:
        return self._get(self.revisions, ns, name, "revisions")

    def _patch_revision(self, *, ns: str, name: str, body: Any, **_: Any) -> Any:
        revision = self._get(self.revisions, ns, name, "revisions")
        wanted = body.get("metadata", {}).get("resourceVersion")
        if wanted is not None:
            if self.conflicts_to_inject > 0:
                self.conflicts_to_inject -= 1
                revision["metadata"]["resourceVersion"] = str(next(self._versions))
            if wanted != revision["metadata"]["resourceVersion"]:
                raise ApiError(409, "Conflict", "the object has been modified")
        patched = merge_patch(revision, body)
        patched["metadata"]["resourceVersion"] = str(next(self._versions))
        self.revisions[(ns, name)] = patched
        self._reconcile()
        return patched

    def _list_pods(self, *, ns: str, query: Any, **_: Any) -> Any:
        selector = (query.get("labelSelector") or [""])[0]
        items = [
            p
            for (pod_ns, _), p in sorted(self.pods.items())
            if pod_ns == ns and _matches(p["metadata"].get("labels", {}), selector)
        ]
        return {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items}

    def _patch_pod(self, *, ns: str, name: str, body: Any, **_: Any) -> Any:
        pod = self._get(self.pods, ns, name, "pods")
        self.pods[(ns, name)] = merge_patch(pod, body)
        return self.pods[(ns, name)]

    def _delete_pod(self, *, ns: str, name: str, **_: Any) -> Any:
        pod = self._get(self.pods, ns, name, "pods")
        self._terminate(ns, name)
        self._reconcile()
        return pod

    def _get_config_map(self, *, ns: str, name: str, **_: Any) -> Any:
        if (ns, name) in self.forbidden_config_maps:
            raise ApiError(403, "Forbidden", f'configmaps "{name}" is forbidden')
        data = self.config_maps.get((ns, name))
        if data is None:
            raise ApiError(404, "NotFound", f'configmaps "{name}" not found')
        return {"kind": "ConfigMap", "metadata": {"name": name, "namespace": ns}, "data": data}

    def _get_deployment(self, *, ns: str, name: str, **_: Any) -> Any:
        return self._get(self.deployments, ns, name, "deployments.apps")

    def _get(self, store: dict[Any, Any], ns: str, name: str, kind: str) -> Any:
        found = store.get((ns, name))
        if found is None:
            raise ApiError(404, "NotFound", f'{kind} "{name}" not found')
        return found

    # ---- the controllers ----

    def _reconcile(self) -> None:
        for (ns, name), revision in list(self.revisions.items()):
            service = self.services.get((ns, revision["metadata"]["labels"][SERVICE_LABEL]))
            is_routed = service is not None and (
                service["status"]["latestCreatedRevisionName"] == name
                or any(t.get("revisionName") == name for t in service["spec"].get("traffic", []))
            )
            annotations = revision["metadata"]["annotations"]
            want = int(annotations.get(MIN_SCALE, "0")) if is_routed else 0
            cap = int(annotations.get(MAX_SCALE, "0"))
            if cap:
                want = min(want, cap)
            live = [
                (key, p)
                for key, p in self.pods.items()
                if p["metadata"]["labels"].get(REVISION_LABEL) == name
                and "deletionTimestamp" not in p["metadata"]
            ]
            for _ in range(want - len(live)):
                self._create_pod(ns, revision)
            if len(live) > want:
                live.sort(key=lambda item: self._deletion_rank(*item))
                for (pod_ns, pod_name), _ in live[: len(live) - want]:
                    self._terminate(pod_ns, pod_name)
        # Pods whose revision is gone (Service deleted) go too.
        for (ns, pod_name), pod in list(self.pods.items()):
            revision = pod["metadata"]["labels"].get(REVISION_LABEL)
            if (ns, revision) not in self.revisions and "deletionTimestamp" not in pod["metadata"]:
                self._terminate(ns, pod_name)

    def _deletion_rank(self, key: tuple[str, str], pod: dict[str, Any]) -> tuple[bool, int, int]:
        """The ReplicaSet's order: not ready first, then lowest deletion cost, then newest."""
        is_ready = any(
            c["type"] == "Ready" and c["status"] == "True" for c in pod["status"]["conditions"]
        )
        cost = int(pod["metadata"].get("annotations", {}).get(COST, "0"))
        return (is_ready, cost, -self._pod_order.get(key, 0))

    def _create_pod(self, ns: str, revision: dict[str, Any]) -> None:
        number = next(self._pod_numbers)
        name = f"{revision['metadata']['name']}-deployment-{number:05d}"
        containers = copy.deepcopy(revision["spec"]["containers"])
        containers.append(
            {"name": "queue-proxy", "image": "queue", "ports": [{"containerPort": 8012}]}
        )
        self.pods[(ns, name)] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": ns,
                "uid": f"uid-{number}",
                "labels": {
                    **revision["metadata"]["labels"],
                    REVISION_LABEL: revision["metadata"]["name"],
                },
                "annotations": {},
                "creationTimestamp": _now(),
            },
            "spec": {
                "containers": containers,
                "volumes": copy.deepcopy(revision["spec"].get("volumes", [])),
                "nodeName": "node-1",
            },
            "status": {
                "phase": "Pending",
                "conditions": [{"type": "PodScheduled", "status": "True"}],
                "containerStatuses": [
                    {
                        "name": "runtime",
                        "restartCount": 0,
                        "ready": False,
                        "state": {"waiting": {"reason": "ContainerCreating"}},
                    }
                ],
            },
        }
        self._pod_order[(ns, name)] = number
        self.kubelet.start(self, name)

    def _terminate(self, ns: str, name: str) -> None:
        pod = self.pods.get((ns, name))
        if pod is None or "deletionTimestamp" in pod["metadata"]:
            return
        pod["metadata"]["deletionTimestamp"] = _now()
        self.kubelet.stop(self, name)


def _handler(kube: FakeKube) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _serve(self) -> None:
            parts = urlsplit(self.path)
            query = parse_qs(parts.query)
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            content_type = self.headers.get("Content-Type", "")
            with kube.lock:
                kube.requests.append(Request(self.command, parts.path, query, content_type))
            try:
                if self.command == "PATCH" and "/services/" in parts.path:
                    if content_type != "application/apply-patch+yaml":
                        raise ApiError(415, "UnsupportedMediaType", content_type)
                elif self.command == "PATCH" and content_type != "application/merge-patch+json":
                    raise ApiError(415, "UnsupportedMediaType", content_type)
                body = json.loads(raw) if raw else None
                answer = kube.handle(self.command, parts.path, query, body)
                self._send(200, answer)
            except ApiError as exc:
                status = {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "status": "Failure",
                    "message": exc.message,
                    "reason": exc.reason,
                    "code": exc.code,
                }
                self._send(exc.code, status)

        def _send(self, code: int, doc: Any) -> None:
            data = json.dumps(doc).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_PATCH = do_DELETE = do_POST = do_PUT = _serve

    return Handler


class InstantKubelet:
    """Pods become ready at once on made-up addresses; deletions finish at once.

    With ``is_schedulable`` False new pods stay Pending, unschedulable, as on a cluster
    without a free GPU.
    """

    def __init__(self) -> None:
        self.is_schedulable = True
        self._addresses = itertools.count(2)

    def start(self, kube: FakeKube, pod: str) -> None:
        if not self.is_schedulable:
            kube.set_unschedulable(pod, "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.")
            return
        kube.set_running(pod, ip=f"10.0.0.{next(self._addresses)}", ready=True)

    def stop(self, kube: FakeKube, pod: str) -> None:
        kube.remove_pod(pod)


@dataclass
class _Container:
    process: subprocess.Popen[bytes] | None = None
    is_stopping: bool = False
    log: Path | None = None
    threads: list[threading.Thread] = field(default_factory=list)


class ProcessKubelet:
    """Each pod's runtime container runs as a real process on its own loopback address.

    The container's command and args run as they are, except that ``zeroserve serve``
    becomes ``python -m data_plane`` (the same program; no console script needed), the
    bind address ``0.0.0.0`` becomes the pod's IP (127.0.0.N: a pod has its own network
    namespace), and every volume's mount path becomes a folder: one per hostPath (shared by
    the node's pods), one per pod for the others. A container that exits is restarted, as
    the kubelet does, with its restart count raised.
    """

    def __init__(self, root: Path, *, ready_timeout_s: float = 60.0) -> None:
        self.root = root
        self.ready_timeout_s = ready_timeout_s
        self._addresses = itertools.count(2)
        self._containers: dict[str, _Container] = {}
        self._lock = threading.Lock()

    def start(self, kube: FakeKube, pod: str) -> None:
        container = _Container()
        with self._lock:
            self._containers[pod] = container
        ip = f"127.0.0.{next(self._addresses)}"
        thread = threading.Thread(target=self._run, args=(kube, pod, ip, container), daemon=True)
        container.threads.append(thread)
        thread.start()

    def stop(self, kube: FakeKube, pod: str) -> None:
        with self._lock:
            container = self._containers.get(pod)
            if container is not None:
                container.is_stopping = True
                process = container.process
        if container is None:
            kube.remove_pod(pod)
            return
        threading.Thread(target=self._stop, args=(kube, pod, process), daemon=True).start()

    def kill(self, pod: str) -> int:
        """SIGKILL the pod's process (a crash); returns its pid."""
        with self._lock:
            process = self._containers[pod].process
        assert process is not None
        process.kill()
        return process.pid

    def pid(self, pod: str) -> int | None:
        with self._lock:
            container = self._containers.get(pod)
        if container is None or container.process is None or container.process.poll() is not None:
            return None
        return container.process.pid

    def close(self) -> None:
        with self._lock:
            containers = list(self._containers.values())
        for container in containers:
            container.is_stopping = True
            if container.process is not None and container.process.poll() is None:
                container.process.kill()
                container.process.wait(10)

    def _argv(self, kube: FakeKube, pod: str, ip: str) -> tuple[list[str], dict[str, str]]:
        with kube.lock:
            doc = copy.deepcopy(kube.pods[("zeroserve", pod)])
        (spec,) = [c for c in doc["spec"]["containers"] if c["name"] == "runtime"]
        paths: dict[str, str] = {}
        for volume in doc["spec"].get("volumes", []):
            (mount,) = [m for m in spec["volumeMounts"] if m["name"] == volume["name"]]
            if "hostPath" in volume:
                folder = self.root / "node" / volume["hostPath"]["path"].strip("/")
            else:
                folder = self.root / "pods" / pod / volume["name"]
            folder.mkdir(parents=True, exist_ok=True)
            paths[mount["mountPath"]] = str(folder)

        def place(value: str) -> str:
            if value == "0.0.0.0":
                return ip
            return paths.get(value, value)

        argv = [place(a) for a in [*spec["command"], *spec["args"]]]
        assert argv[:2] == ["zeroserve", "serve"], argv
        argv = [sys.executable, "-m", "data_plane", *argv[2:]]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env.update({e["name"]: place(e["value"]) for e in spec.get("env", [])})
        return argv, env

    def _run(self, kube: FakeKube, pod: str, ip: str, container: _Container) -> None:
        argv, env = self._argv(kube, pod, ip)
        port = int(argv[argv.index("--http-port") + 1])
        log = self.root / "logs" / f"{pod}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        first = True
        while True:
            with self._lock, log.open("ab") as out:
                # Under the lock: a stop either sees this process or prevents it.
                if container.is_stopping:
                    return
                process = subprocess.Popen(
                    argv, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
                )
                container.process = process
            if first:
                kube.set_running(pod, ip=ip, ready=False)
                first = False
            self._wait_ready(kube, pod, f"http://{ip}:{port}/v2/health/ready", process)
            process.wait()
            if container.is_stopping:
                return
            kube.restarted(pod)

    def _wait_ready(
        self, kube: FakeKube, pod: str, url: str, process: subprocess.Popen[bytes]
    ) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline and process.poll() is None:
            with contextlib.suppress(urllib.error.URLError, OSError):
                with _NO_PROXY.open(url, timeout=1) as response:
                    if response.status == 200:
                        kube.set_ready(pod, True)
                        return
            time.sleep(0.05)

    def _stop(self, kube: FakeKube, pod: str, process: subprocess.Popen[bytes] | None) -> None:
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
        kube.remove_pod(pod)
