"""KubernetesExecutor against a Kubernetes-shaped API server on loopback, through the real `kubernetes` client.

What this proves: the requests the official client sends for our calls (paths, bearer token, patch content type,
field selector, policy/v1 Eviction body, grace period) are the ones kube-apiserver accepts and checks the way it
does (resourceVersion conflicts, taint and annotation validation, 404/409/429 Status replies); which taints,
annotations and pods the executor changes; and the one-line outcomes for PDB refusals, a dead API server, a bad
token and a missing client library.

What it cannot prove without a cluster: that the scheduler really keeps new pods off the tainted, cordoned node
(and that tolerations of `sentinel.dev/quarantined` behave); that the kubelet and the NVIDIA device plugin gave a pod
the devices its `NVIDIA_VISIBLE_DEVICES` or `sentinel.dev/accelerators` names (the plugin injects the real value
at container start, invisible to the API); that the disruption controller computes a PDB's allowed disruptions as
modelled (here a pod is simply marked "protected"), or how evicted pods terminate and get rescheduled; that the
service account's RBAC allows get/patch nodes, list pods and create pods/eviction; and strategic-merge semantics
beyond the fields we send (the fake applies them as a JSON merge patch, which is what they reduce to for these).
"""

from __future__ import annotations

import importlib.util
import json
import re
import socket
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from sentinel.remediation.executors import kubernetes as k8s_executor
from sentinel.remediation.executors.base import EXECUTORS, Action, JobRef
from sentinel.remediation.executors.kubernetes import KubernetesExecutor, taint_value

TOKEN = "sentinel-test-token"
BAD_UUID = "GPU-0b1c2d3e-0000-4000-8000-000000000bad"
GOOD_UUID = "GPU-0b1c2d3e-0000-4000-8000-000000000900"
REASON = "Xid 79: GPU has fallen off the bus (GPU-0b1c2d3e-0000-4000-8000-000000000bad) on gpu-7, incident 41"

needs_client = pytest.mark.skipif(
    importlib.util.find_spec("kubernetes") is None, reason="the [kubernetes] extra is not installed"
)

_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
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
            else "value: Invalid value" if len(value) > 63 or not _LABEL_VALUE.match(value)
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


@pytest.fixture
def api() -> Iterator[FakeKubeApiServer]:
    fake = FakeKubeApiServer()
    fake.start()
    yield fake
    fake.stop()


def executor_for(fake: FakeKubeApiServer, **options: Any) -> KubernetesExecutor:
    return KubernetesExecutor({"host": fake.url, "token": TOKEN, "node_map": {"gpu-7": "ip-10-0-0-7"},
                               "timeout_seconds": 5, **options})


OTHER_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


def test_registered_by_name() -> None:
    assert EXECUTORS["kubernetes"] is KubernetesExecutor


@needs_client
def test_drain_cordons_taints_and_annotates(api: FakeKubeApiServer) -> None:
    api.add_node("ip-10-0-0-7", taints=[OTHER_TAINT])
    outcome = executor_for(api).execute(Action("drain_node", "gpu-7", REASON, (BAD_UUID,), incident_id=41))
    assert outcome.ok, outcome.detail
    node = api.nodes["ip-10-0-0-7"]
    assert node["spec"]["unschedulable"] is True
    assert node["spec"]["taints"] == [
        OTHER_TAINT, {"key": "sentinel.dev/quarantined", "value": taint_value(REASON), "effect": "NoSchedule"}
    ]
    assert node["metadata"]["annotations"] == {"sentinel.dev/quarantine-reason": REASON,
                                               "sentinel.dev/incident-id": "41",
                                               "sentinel.dev/cordoned-by-sentinel": "true"}
    patches = [r for r in api.requests if r[0] == "PATCH"]
    assert [(r[1], r[2]) for r in patches] == [("/api/v1/nodes/ip-10-0-0-7", "application/strategic-merge-patch+json")]
    assert outcome.detail.startswith("cordoned node gpu-7 (k8s ip-10-0-0-7) with taint sentinel.dev/quarantined")


@needs_client
def test_release_removes_only_ours(api: FakeKubeApiServer) -> None:
    api.add_node("ip-10-0-0-7", taints=[OTHER_TAINT])
    executor = executor_for(api)
    assert executor.execute(Action("drain_node", "gpu-7", REASON, incident_id=41)).ok
    api.nodes["ip-10-0-0-7"]["metadata"]["annotations"]["team"] = "infra"
    outcome = executor.execute(Action("release_node", "gpu-7", "repaired", incident_id=41))
    assert outcome.ok and outcome.detail == "released node gpu-7 (k8s ip-10-0-0-7)"
    node = api.nodes["ip-10-0-0-7"]
    assert node["spec"] == {"taints": [OTHER_TAINT], "unschedulable": False}
    assert node["metadata"]["annotations"] == {"team": "infra"}
    again = executor.execute(Action("release_node", "gpu-7", "repaired"))
    assert again.ok and "carried no Sentinel quarantine" in again.detail


@needs_client
def test_release_leaves_a_cordon_that_a_person_set(api: FakeKubeApiServer) -> None:
    api.add_node("ip-10-0-0-7", unschedulable=True)
    executor = executor_for(api)
    assert executor.execute(Action("drain_node", "gpu-7", REASON)).ok
    assert executor.execute(Action("release_node", "gpu-7", "repaired")).ok
    node = api.nodes["ip-10-0-0-7"]
    assert node["spec"]["unschedulable"] is True and node["spec"]["taints"] == []


@needs_client
def test_drain_rereads_on_conflict_and_keeps_a_concurrent_taint(api: FakeKubeApiServer) -> None:
    api.add_node("ip-10-0-0-7")
    maintenance = {"key": "example.com/maintenance", "value": "firmware", "effect": "NoExecute"}

    def someone_else_taints(name: str) -> None:
        node = api.nodes[name]
        node["spec"]["taints"] = [maintenance]
        node["metadata"]["resourceVersion"] = api.next_resource_version()

    api.before_patch = someone_else_taints
    outcome = executor_for(api).execute(Action("drain_node", "gpu-7", REASON))
    assert outcome.ok, outcome.detail
    assert [t["key"] for t in api.nodes["ip-10-0-0-7"]["spec"]["taints"]] == [
        "example.com/maintenance", "sentinel.dev/quarantined"
    ]
    assert [r[0] for r in api.requests] == ["GET", "PATCH", "GET", "PATCH"]


@needs_client
def test_move_work_evicts_exactly_the_pods_on_the_quarantined_device(
    api: FakeKubeApiServer, caplog: pytest.LogCaptureFixture
) -> None:
    api.add_pod("train-0", gpus=1, visible_devices=BAD_UUID)
    api.add_pod("train-1", gpus=1, visible_devices=GOOD_UUID)
    api.add_pod("infer-0", namespace="serving", gpus=2, annotations={
        "sentinel.dev/accelerators": f"{GOOD_UUID},{BAD_UUID.upper()}"})
    api.add_pod("dcgm-exporter-x", namespace="monitoring", visible_devices="all", daemonset=True)
    api.add_pod("elsewhere", node="ip-10-0-0-8", gpus=1, visible_devices=BAD_UUID)
    caplog.set_level("INFO", logger="sentinel.remediation.kubernetes")
    outcome = executor_for(api, grace_period_seconds=45).execute(
        Action("move_work", "gpu-7", REASON, (BAD_UUID,), incident_id=41))
    assert outcome.ok, outcome.detail
    assert api.evictions == [("default/train-0", 45), ("serving/infer-0", 45)]
    assert outcome.detail == (f"move_work node gpu-7 (k8s ip-10-0-0-7) ({BAD_UUID}): evicted 2 pod(s): "
                              "default/train-0, serving/infer-0; skipped: monitoring/dcgm-exporter-x (DaemonSet)")
    assert ("GET", "/api/v1/pods?fieldSelector=spec.nodeName%3Dip-10-0-0-7", None) in api.requests
    assert [r.getMessage() for r in caplog.records] == [f"incident=41 {outcome.detail}"]


@needs_client
def test_move_work_falls_back_to_every_gpu_pod_when_no_pod_names_its_devices(api: FakeKubeApiServer) -> None:
    api.add_pod("train-0", gpus=4)
    api.add_pod("train-1", gpus=4, visible_devices="0,1,2,3")  # indices name no uuid
    api.add_pod("sidecar", gpus=0)
    api.add_pod("node-agent", namespace="monitoring", gpus=1, daemonset=True)
    outcome = executor_for(api).execute(Action("move_work", "gpu-7", REASON, (BAD_UUID,)))
    assert outcome.ok, outcome.detail
    assert api.evicted() == {"default/train-0", "default/train-1"}
    assert "no pod names its devices, so every pod requesting nvidia.com/gpu was chosen" in outcome.detail
    assert "skipped: monitoring/node-agent (DaemonSet)" in outcome.detail


@needs_client
def test_move_work_takes_the_jobs_pods_by_name_and_by_label(api: FakeKubeApiServer) -> None:
    api.add_pod("launcher", namespace="train", gpus=0)
    api.add_pod("worker-3", gpus=0, labels={"sentinel.dev/job": "7"})
    api.add_pod("other", gpus=1, visible_devices=GOOD_UUID)
    api.add_pod("gpu-unnamed", gpus=1)
    jobs = (JobRef(7, "llama", attributes={"k8s_namespace": "train", "k8s_pods": ["launcher"]}),)
    outcome = executor_for(api).execute(Action("move_work", "gpu-7", REASON, (BAD_UUID,), jobs))
    assert outcome.ok, outcome.detail
    assert api.evicted() == {"train/launcher", "default/worker-3"}
    assert "skipped: default/gpu-unnamed (requests nvidia.com/gpu but names no device)" in outcome.detail


@needs_client
def test_pdb_refusal_is_reported_as_not_evicted_and_not_retried(api: FakeKubeApiServer) -> None:
    api.add_pod("train-0", gpus=1, visible_devices=BAD_UUID)
    api.add_pod("train-1", gpus=1, visible_devices=BAD_UUID)
    api.protected.add("default/train-1")
    outcome = executor_for(api).execute(Action("move_work", "gpu-7", REASON, (BAD_UUID,)))
    assert not outcome.ok
    assert api.evicted() == {"default/train-0"}
    assert "not evicted: default/train-1 (a PodDisruptionBudget forbids it now, HTTP 429)" in outcome.detail
    posts = [r for r in api.requests if r[0] == "POST"]
    assert [r[1] for r in posts] == ["/api/v1/namespaces/default/pods/train-0/eviction",
                                     "/api/v1/namespaces/default/pods/train-1/eviction"]
    assert {r[2] for r in posts} == {"application/json"}  # the API server answers text/plain with 415


@needs_client
def test_rejected_token_gives_a_clear_line(api: FakeKubeApiServer) -> None:
    api.add_node("ip-10-0-0-7")
    outcome = executor_for(api, token="wrong").execute(Action("drain_node", "gpu-7", REASON))
    assert not outcome.ok
    assert outcome.detail == "drain_node node gpu-7 (k8s ip-10-0-0-7): Kubernetes API refused: 401 Unauthorized: " \
                             "Unauthorized"


@needs_client
def test_unreachable_api_server_gives_ok_false() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    executor = KubernetesExecutor({"host": f"http://127.0.0.1:{port}", "token": TOKEN, "timeout_seconds": 2})
    outcome = executor.execute(Action("drain_node", "gpu-7", REASON))
    assert not outcome.ok
    assert outcome.detail.startswith(f"drain_node node gpu-7: Kubernetes API at http://127.0.0.1:{port} unreachable: ")
    assert "\n" not in outcome.detail


def test_missing_client_library_gives_ok_false_with_the_install_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_client() -> Any:
        raise ModuleNotFoundError("No module named 'kubernetes'")

    monkeypatch.setattr(k8s_executor, "import_kubernetes", no_client)
    outcome = KubernetesExecutor({"host": "http://127.0.0.1:1"}).execute(Action("drain_node", "gpu-7", REASON))
    assert not outcome.ok
    assert outcome.detail == ("drain_node node gpu-7: kubernetes client missing (No module named 'kubernetes'); "
                              "pip install 'sentinel-cluster[kubernetes]'")


def test_taint_value_is_a_valid_label_value() -> None:
    value = taint_value(REASON)
    assert len(value) <= 63 and _LABEL_VALUE.match(value)
    assert taint_value("  ") == "" and taint_value("ECC: uncorrectable") == "ECC-uncorrectable"


@needs_client
def test_kubeconfig_option_reaches_the_cluster_it_names(api: FakeKubeApiServer, tmp_path: Path) -> None:
    api.add_node("gpu-7")
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({  # JSON is YAML
        "apiVersion": "v1", "kind": "Config", "current-context": "test",
        "clusters": [{"name": "test", "cluster": {"server": api.url}}],
        "users": [{"name": "sentinel", "user": {"token": TOKEN}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "sentinel"}}],
    }))
    outcome = KubernetesExecutor({"kubeconfig": str(kubeconfig)}).execute(Action("drain_node", "gpu-7", REASON))
    assert outcome.ok, outcome.detail
    assert api.nodes["gpu-7"]["spec"]["unschedulable"] is True


@needs_client
def test_no_in_cluster_config_gives_ok_false(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_PORT", raising=False)
    outcome = KubernetesExecutor().execute(Action("drain_node", "gpu-7", REASON))
    assert not outcome.ok
    assert outcome.detail.startswith("drain_node node gpu-7: Kubernetes client config: ")
