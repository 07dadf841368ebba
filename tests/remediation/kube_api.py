"""Test double for kube-apiserver on loopback: what the Kubernetes executor talks to through the real client.

Only GET/PATCH node, list pods (with field selectors) and pod eviction, validated as the real API server
validates them (resourceVersion conflicts, taint and annotation syntax, 404/409/415/429 Status replies); state
in memory. Shared by tests/remediation/test_kubernetes_executor.py and the Executor contract suite. What it
cannot stand in for (the scheduler, kubelet, disruption controller, RBAC) is listed in the former's docstring.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

TOKEN = "sentinel-test-token"

LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_QUALIFIED_NAME = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_POD_FIELDS = {  # the field selectors kube-apiserver supports for pods
    "metadata.name", "metadata.namespace", "spec.nodeName", "spec.restartPolicy", "spec.schedulerName",
    "spec.serviceAccountName", "spec.hostNetwork", "status.phase", "status.podIP", "status.nominatedNodeName",
}
_PATCH_TYPES = {"application/strategic-merge-patch+json", "application/merge-patch+json"}


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.code, self.reason, self.message, self.headers = code, reason, message, headers or {}


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge, null deletes, everything else (lists included) replaces."""
    if not isinstance(patch, dict):
        return patch
    merged = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = merge_patch(merged.get(key), value)
    return merged


class FakeKubeApiServer:
    """Test double for kube-apiserver: only GET/PATCH node, list pods and pod eviction, validated as the real one
    validates them; state in memory. `protected` pods answer eviction with 429 as a PDB at its limit does."""

    def __init__(self, token: str = TOKEN):
        self.token = token
        self.nodes: dict[str, dict[str, Any]] = {}
        self.pods: dict[str, dict[str, Any]] = {}  # "namespace/name"
        self.protected: set[str] = set()
        self.requests: list[tuple[str, str, str | None]] = []  # method, path?query, content type
        self.evictions: list[tuple[str, int | None]] = []  # pod, deleteOptions.gracePeriodSeconds
        self.before_patch: Callable[[str], None] | None = None  # a concurrent writer, run once
        self._resource_version = 100
        self._lock = threading.Lock()
        self._http = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._thread = threading.Thread(target=self._http.serve_forever, args=(0.05,), daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._http.server_address[1]}"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._http.shutdown()
        self._http.server_close()

    def next_resource_version(self) -> str:
        self._resource_version += 1
        return str(self._resource_version)

    def add_node(self, name: str, *, taints: list[dict[str, Any]] | None = None, unschedulable: bool = False) -> None:
        spec: dict[str, Any] = {"taints": taints} if taints else {}
        if unschedulable:
            spec["unschedulable"] = True
        self.nodes[name] = {"kind": "Node", "apiVersion": "v1", "spec": spec, "status": {},
                            "metadata": {"name": name, "uid": f"uid-{name}", "labels": {},
                                         "resourceVersion": self.next_resource_version()}}

    def add_pod(self, name: str, *, node: str = "ip-10-0-0-7", namespace: str = "default", gpus: int = 0,
                visible_devices: str | None = None, annotations: dict[str, str] | None = None,
                labels: dict[str, str] | None = None, daemonset: bool = False) -> None:
        container: dict[str, Any] = {"name": "main", "image": "trainer:1"}
        if gpus:
            amount = {"nvidia.com/gpu": str(gpus)}
            container["resources"] = {"limits": amount, "requests": amount}
        if visible_devices is not None:
            container["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": visible_devices}]
        metadata: dict[str, Any] = {"name": name, "namespace": namespace, "uid": f"uid-{name}",
                                    "labels": labels or {}, "annotations": annotations or {},
                                    "resourceVersion": self.next_resource_version()}
        if daemonset:
            metadata["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "dcgm-exporter",
                                            "uid": "uid-ds", "controller": True}]
        self.pods[f"{namespace}/{name}"] = {"kind": "Pod", "apiVersion": "v1", "metadata": metadata,
                                            "spec": {"nodeName": node, "containers": [container]},
                                            "status": {"phase": "Running"}}

    def handle(self, method: str, target: str, headers: Any, body: bytes) -> tuple[int, dict[str, Any]]:
        self.requests.append((method, target, headers.get("Content-Type")))
        if headers.get("Authorization") != f"Bearer {self.token}":
            raise ApiError(401, "Unauthorized", "Unauthorized")
        url = urlsplit(target)
        with self._lock:
            if m := re.fullmatch(r"/api/v1/nodes/([a-z0-9.-]+)", url.path):
                if method == "GET":
                    return 200, self._node(m[1])
                if method == "PATCH":
                    return 200, self._patch_node(m[1], headers.get("Content-Type"), body)
            if url.path == "/api/v1/pods" and method == "GET":
                return 200, self._list_pods(parse_qs(url.query))
            m = re.fullmatch(r"/api/v1/namespaces/([a-z0-9-]+)/pods/([a-z0-9.-]+)/eviction", url.path)
            if m and method == "POST":
                return 201, self._evict(m[1], m[2], headers.get("Content-Type"), body)
        raise ApiError(404, "NotFound", "the server could not find the requested resource")

    def _node(self, name: str) -> dict[str, Any]:
        if name not in self.nodes:
            raise ApiError(404, "NotFound", f'nodes "{name}" not found')
        return self.nodes[name]

    def _patch_node(self, name: str, content_type: str | None, body: bytes) -> dict[str, Any]:
        if _media_type(content_type) not in _PATCH_TYPES:
            raise ApiError(415, "UnsupportedMediaType", f"the body of the request was in an unknown format: "
                           f"accepted media types include: {', '.join(sorted(_PATCH_TYPES))}")
        patch = json.loads(body)
        node = self._node(name)
        if self.before_patch is not None:
            hook, self.before_patch = self.before_patch, None
            hook(name)
            node = self.nodes[name]
        wanted = patch.get("metadata", {}).get("resourceVersion")
        if wanted is not None and wanted != node["metadata"]["resourceVersion"]:
            raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on nodes "{name}": the object has been '
                           "modified; please apply your changes to the latest version and try again")
        updated = merge_patch(node, patch)
        _validate_node(updated)
        updated["metadata"]["resourceVersion"] = self.next_resource_version()
        self.nodes[name] = updated
        return updated

    def _list_pods(self, query: dict[str, list[str]]) -> dict[str, Any]:
        terms = [t for t in ",".join(query.get("fieldSelector", [])).split(",") if t]
        pods = list(self.pods.values())
        for term in terms:
            m = re.fullmatch(r"([A-Za-z.]+)(==|=|!=)(.*)", term)
            if not m:
                raise ApiError(400, "BadRequest", f'unable to parse requirement: invalid selector: "{term}"')
            if m[1] not in _POD_FIELDS:
                raise ApiError(400, "BadRequest", f'field label not supported: {m[1]}')
            pods = [p for p in pods if (_field(p, m[1]) == m[3]) == (m[2] != "!=")]
        return {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": str(self._resource_version)},
                "items": pods}

    def _evict(self, namespace: str, name: str, content_type: str | None, body: bytes) -> dict[str, Any]:
        if _media_type(content_type) not in (None, "application/json"):  # it reads a missing type as JSON
            raise ApiError(415, "UnsupportedMediaType", f"unsupported media type {content_type}")
        eviction = json.loads(body)
        if eviction.get("kind") != "Eviction" or eviction.get("apiVersion") != "policy/v1":
            raise ApiError(400, "BadRequest", f"expected policy/v1 Eviction, got {eviction.get('apiVersion')} "
                           f"{eviction.get('kind')}")
        metadata = eviction.get("metadata") or {}
        if metadata.get("name") != name or metadata.get("namespace", namespace) != namespace:
            raise ApiError(400, "BadRequest", "name in URL does not match name in Eviction object")
        grace = (eviction.get("deleteOptions") or {}).get("gracePeriodSeconds")
        if grace is not None and (not isinstance(grace, int) or grace < 0):
            raise ApiError(422, "Invalid", f"deleteOptions.gracePeriodSeconds: Invalid value: {grace}")
        key = f"{namespace}/{name}"
        if key not in self.pods:
            raise ApiError(404, "NotFound", f'pods "{name}" not found')
        if key in self.protected:
            raise ApiError(429, "TooManyRequests", "Cannot evict pod as it would violate the pod's disruption "
                           "budget.", headers={"Retry-After": "10"})
        self.evictions.append((key, grace))
        del self.pods[key]
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}

    def evicted(self) -> set[str]:
        return {key for key, _ in self.evictions}


def _media_type(content_type: str | None) -> str | None:
    return None if content_type is None else content_type.split(";")[0].strip().lower()


def _field(pod: dict[str, Any], path: str) -> str:
    value: Any = pod
    for part in path.split("."):
        value = value.get(part, "") if isinstance(value, dict) else ""
    return str(value)


def _validate_node(node: dict[str, Any]) -> None:
    seen = set()
    for taint in node.get("spec", {}).get("taints") or []:
        key, value, effect = taint.get("key", ""), taint.get("value", ""), taint.get("effect")
        problem = (
            "key: Invalid value" if not _QUALIFIED_NAME.match(key)
            else "value: Invalid value" if len(value) > 63 or not LABEL_VALUE.match(value)
            else "effect: Unsupported value" if effect not in ("NoSchedule", "PreferNoSchedule", "NoExecute")
            else "taints must be unique by key and effect pair" if (key, effect) in seen
            else None
        )
        if problem:
            raise ApiError(422, "Invalid", f"Node is invalid: spec.taints: {problem}: {taint}")
        seen.add((key, effect))
    for key, value in (node["metadata"].get("annotations") or {}).items():
        if not _QUALIFIED_NAME.match(key) or not isinstance(value, str):
            raise ApiError(422, "Invalid", f"Node is invalid: metadata.annotations: Invalid value: {key!r}")
    if not isinstance(node.get("spec", {}).get("unschedulable", False), bool):
        raise ApiError(400, "BadRequest", "spec.unschedulable: expected bool")


def _handler_for(fake: FakeKubeApiServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            headers: dict[str, str] = {}
            try:
                code, payload = fake.handle(self.command, self.path, self.headers, body)
            except ApiError as exc:
                code, headers = exc.code, exc.headers
                payload = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                           "message": exc.message, "reason": exc.reason, "code": exc.code}
            data = json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_PATCH = do_POST = _serve

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler
