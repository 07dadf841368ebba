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
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sentinel.remediation.executors import kubernetes as k8s_executor
from sentinel.remediation.executors.base import EXECUTORS, Action, JobRef
from sentinel.remediation.executors.kubernetes import KubernetesExecutor, taint_value
from tests.remediation.kube_api import LABEL_VALUE as _LABEL_VALUE
from tests.remediation.kube_api import TOKEN, FakeKubeApiServer

BAD_UUID = "GPU-0b1c2d3e-0000-4000-8000-000000000bad"
GOOD_UUID = "GPU-0b1c2d3e-0000-4000-8000-000000000900"
REASON = "Xid 79: GPU has fallen off the bus (GPU-0b1c2d3e-0000-4000-8000-000000000bad) on gpu-7, incident 41"

needs_client = pytest.mark.skipif(
    importlib.util.find_spec("kubernetes") is None, reason="the [kubernetes] extra is not installed"
)


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
