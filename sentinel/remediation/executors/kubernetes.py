"""Kubernetes executor: cordon and taint a quarantined node, evict the pods on a quarantined accelerator.

Pods leave through the Eviction API, never a plain delete, so PodDisruptionBudgets hold as in `kubectl drain`.
The NVIDIA device plugin injects NVIDIA_VISIBLE_DEVICES at container start, so the API server rarely knows which
GPU a pod holds: a pod says so with the `sentinel.dev/accelerators` annotation or an explicit env value, and when
no pod on the node does, every pod requesting the GPU resource is moved. The client library is the optional
`[kubernetes]` extra, imported on first use.
"""

from __future__ import annotations

import importlib
import json
import logging
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from sentinel.remediation.executors.base import Action, Executor, JobRef, Outcome, register

log = logging.getLogger("sentinel.remediation.kubernetes")

QUARANTINE_TAINT_KEY = "sentinel.dev/quarantined"
REASON_ANNOTATION = "sentinel.dev/quarantine-reason"
INCIDENT_ANNOTATION = "sentinel.dev/incident-id"
# set only when Sentinel made the node unschedulable, so release never uncordons a node a person cordoned
CORDONED_ANNOTATION = "sentinel.dev/cordoned-by-sentinel"
ACCELERATORS_ANNOTATION = "sentinel.dev/accelerators"
JOB_LABEL = "sentinel.dev/job"
MIRROR_POD_ANNOTATION = "kubernetes.io/config.mirror"
INSTALL_HINT = "pip install 'sentinel-cluster[kubernetes]'"
CONFLICT_ATTEMPTS = 3  # read-modify-patch rounds when another writer changes the node in between
_LABEL_VALUE_MAX_CHARS = 63
DETAIL_MAX_CHARS = 400  # an outcome is one timeline line
_NO_DEVICE_TOKENS = frozenset({"", "none", "void"})


def import_kubernetes() -> SimpleNamespace:
    """The official client, imported on first use so Sentinel runs without the [kubernetes] extra."""
    return SimpleNamespace(
        client=importlib.import_module("kubernetes.client"),
        config=importlib.import_module("kubernetes.config"),
        urllib3=importlib.import_module("urllib3"),
    )


def taint_value(reason: str) -> str:
    """`reason` squeezed into a label value (63 chars of [A-Za-z0-9_.-], alphanumeric at both ends)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", reason)[:_LABEL_VALUE_MAX_CHARS].strip("-_.")


def quarantine_patch(node: dict[str, Any], reason: str, incident_id: int | None) -> dict[str, Any]:
    """Strategic-merge patch that cordons `node`, sets our taint and records why; other taints are kept."""
    annotations = node.get("metadata", {}).get("annotations") or {}
    taints = [t for t in node.get("spec", {}).get("taints") or [] if t.get("key") != QUARANTINE_TAINT_KEY]
    taints.append({"key": QUARANTINE_TAINT_KEY, "value": taint_value(reason), "effect": "NoSchedule"})
    ours = CORDONED_ANNOTATION in annotations or not node.get("spec", {}).get("unschedulable")
    return {
        "metadata": {
            "resourceVersion": node["metadata"]["resourceVersion"],  # 409 instead of losing a concurrent edit
            "annotations": {
                REASON_ANNOTATION: reason,
                INCIDENT_ANNOTATION: None if incident_id is None else str(incident_id),
                CORDONED_ANNOTATION: "true" if ours else None,
            },
        },
        "spec": {"unschedulable": True, "taints": taints},
    }


def release_patch(node: dict[str, Any]) -> dict[str, Any] | None:
    """Patch that removes our taint and annotations, and the cordon if we set it; None when there is none."""
    annotations = node.get("metadata", {}).get("annotations") or {}
    taints = node.get("spec", {}).get("taints") or []
    kept = [t for t in taints if t.get("key") != QUARANTINE_TAINT_KEY]
    ours = [key for key in (REASON_ANNOTATION, INCIDENT_ANNOTATION, CORDONED_ANNOTATION) if key in annotations]
    if len(kept) == len(taints) and not ours:
        return None
    spec: dict[str, Any] = {"taints": kept}
    if CORDONED_ANNOTATION in annotations:
        spec["unschedulable"] = False
    return {
        "metadata": {
            "resourceVersion": node["metadata"]["resourceVersion"],
            "annotations": dict.fromkeys(ours),
        },
        "spec": spec,
    }


def declared_accelerators(pod: dict[str, Any]) -> frozenset[str] | None:
    """Lower-cased device uuids the pod says it holds ("all" for every one), or None when it does not say."""
    annotation = (pod["metadata"].get("annotations") or {}).get(ACCELERATORS_ANNOTATION)
    if annotation is not None:
        return _device_tokens(annotation)
    values = [
        env["value"]
        for container in pod.get("spec", {}).get("containers") or []
        for env in container.get("env") or []
        if env.get("name") == "NVIDIA_VISIBLE_DEVICES" and isinstance(env.get("value"), str)
    ]
    if not values:
        return None
    devices: set[str] = set()
    for value in values:
        tokens = _device_tokens(value)
        if tokens is None:
            return None
        devices |= tokens
    return frozenset(devices)


def _device_tokens(value: str) -> frozenset[str] | None:
    tokens = {token.strip().lower() for token in value.split(",")} - _NO_DEVICE_TOKENS
    if any(token.isdigit() for token in tokens):
        return None  # device indices name no uuid we can match
    return frozenset(tokens)


def requests_resource(pod: dict[str, Any], resource: str) -> bool:
    spec = pod.get("spec", {})
    for container in (spec.get("containers") or []) + (spec.get("initContainers") or []):
        resources = container.get("resources") or {}
        for amounts in (resources.get("limits") or {}, resources.get("requests") or {}):
            if str(amounts.get(resource, "0")) not in ("0", ""):
                return True
    return False


def skip_reason(pod: dict[str, Any]) -> str | None:
    """Why `kubectl drain` would leave this pod alone, or None."""
    metadata = pod["metadata"]
    if any(ref.get("kind") == "DaemonSet" for ref in metadata.get("ownerReferences") or []):
        return "DaemonSet"
    if MIRROR_POD_ANNOTATION in (metadata.get("annotations") or {}):
        return "mirror pod"
    if metadata.get("deletionTimestamp"):
        return "already terminating"
    if pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
        return "finished"
    return None


def pod_id(pod: dict[str, Any]) -> str:
    return f"{pod['metadata'].get('namespace', 'default')}/{pod['metadata']['name']}"


def job_pod_ids(jobs: Iterable[JobRef]) -> tuple[set[str], set[str]]:
    """Pods named by the jobs' attributes (`namespace/name`), and the jobs' ids for the `sentinel.dev/job` label."""
    named: set[str] = set()
    for job in jobs:
        pods = job.attributes.get("k8s_pods") or []
        namespace = job.attributes.get("k8s_namespace") or "default"
        named.update(f"{namespace}/{name}" for name in ([pods] if isinstance(pods, str) else pods))
    return named, {str(job.id) for job in jobs}


@dataclass
class EvictionPlan:
    evict: list[str] = field(default_factory=list)  # namespace/name
    skipped: list[str] = field(default_factory=list)  # "namespace/name (why)"
    fell_back_to_gpu_pods: bool = False


def plan_evictions(pods: list[dict[str, Any]], action: Action, gpu_resource: str) -> EvictionPlan:
    """Which pods on the node to evict for `action`: those holding a quarantined device, and the jobs' pods."""
    quarantined = {uuid.lower() for uuid in action.accelerators}
    named, job_ids = job_pod_ids(action.jobs)
    declared = {pod_id(pod): declared_accelerators(pod) for pod in pods}
    plan = EvictionPlan()
    plan.fell_back_to_gpu_pods = bool(quarantined) and all(devices is None for devices in declared.values())
    for pod in sorted(pods, key=pod_id):
        key, devices = pod_id(pod), declared[pod_id(pod)]
        uses_gpu = requests_resource(pod, gpu_resource)
        of_job = key in named or (pod["metadata"].get("labels") or {}).get(JOB_LABEL) in job_ids
        holds = devices is not None and ("all" in devices or bool(devices & quarantined))
        if of_job or holds or (plan.fell_back_to_gpu_pods and uses_gpu):
            reason = skip_reason(pod)
            if reason:
                plan.skipped.append(f"{key} ({reason})")
            else:
                plan.evict.append(key)
        elif quarantined and uses_gpu and devices is None:
            plan.skipped.append(f"{key} (requests {gpu_resource} but names no device)")
    return plan


def _one_line(text: str, limit: int = 200) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def api_error(exc: Any) -> str:
    """`403 Forbidden: <message>` from an ApiException, with the API server's Status message when it sent one."""
    message = ""
    try:
        message = json.loads(exc.body or "{}").get("message", "")
    except (ValueError, AttributeError, TypeError):
        message = ""
    return _one_line(f"{exc.status} {exc.reason}" + (f": {message}" if message else ""))


@register
class KubernetesExecutor(Executor):
    """Options: kubeconfig (+ context) or in-cluster config; host, token, verify_ssl override them;
    grace_period_seconds (pod's own when unset), gpu_resource, node_map, timeout_seconds (10)."""

    name = "kubernetes"
    handles = frozenset({"drain_node", "release_node", "move_work"})

    def __init__(self, options: dict[str, Any] | None = None):
        super().__init__(options)
        self._api: Any = None  # CoreV1Api, built on first use
        self._host = str(self.options.get("host") or "in-cluster")

    def execute(self, action: Action) -> Outcome:
        outcome = self._attempt(action)
        log.log(logging.INFO if outcome.ok else logging.WARNING, "incident=%s %s", action.incident_id, outcome.detail)
        return outcome

    def _attempt(self, action: Action) -> Outcome:
        node = str((self.options.get("node_map") or {}).get(action.node, action.node))
        where = f"node {action.node}" + (f" (k8s {node})" if node != action.node else "")
        failed = f"{action.kind} {where}:"
        try:
            k8s = import_kubernetes()
        except ImportError as exc:
            return Outcome(False, f"{failed} kubernetes client missing ({exc}); {INSTALL_HINT}")
        try:
            api = self._core_api(k8s)
        except (k8s.config.ConfigException, OSError, ValueError) as exc:
            return Outcome(False, f"{failed} Kubernetes client config: {_one_line(str(exc))}")
        try:
            return self._carry_out(api, action, node, where)
        except k8s.client.ApiException as exc:
            if not exc.status:  # TLS failure, raised by the client as status 0
                return Outcome(False, f"{failed} Kubernetes API at {self._host}: {_one_line(str(exc.reason))}")
            return Outcome(False, f"{failed} Kubernetes API refused: {api_error(exc)}")
        except (k8s.urllib3.exceptions.HTTPError, OSError) as exc:
            return Outcome(False, f"{failed} Kubernetes API at {self._host} unreachable: {_one_line(str(exc))}")
        except ValueError as exc:
            return Outcome(False, f"{failed} unreadable reply from the Kubernetes API: {_one_line(str(exc))}")

    def _carry_out(self, api: Any, action: Action, node: str, where: str) -> Outcome:
        if action.kind == "drain_node":
            self._patch_node(api, node, lambda n: quarantine_patch(n, action.reason, action.incident_id))
            return Outcome(True, _one_line(f"cordoned {where} with taint {QUARANTINE_TAINT_KEY}:NoSchedule "
                                           f"({action.reason})", DETAIL_MAX_CHARS))
        if action.kind == "release_node":
            changed = self._patch_node(api, node, release_patch)
            return Outcome(True, f"released {where}" if changed else f"{where} carried no Sentinel quarantine")
        if action.kind == "move_work":
            return self._move_work(api, action, node, where)
        return Outcome(False, f"unknown action {action.kind!r} for {where}")

    def _core_api(self, k8s: SimpleNamespace) -> Any:
        if self._api is None:
            self._api = k8s.client.CoreV1Api(k8s.client.ApiClient(self._configuration(k8s)))
        return self._api

    def _configuration(self, k8s: SimpleNamespace) -> Any:
        opts = self.options
        configuration = k8s.client.Configuration()
        if opts.get("kubeconfig"):
            k8s.config.load_kube_config(config_file=str(opts["kubeconfig"]), context=opts.get("context"),
                                        client_configuration=configuration, persist_config=False)
        elif not opts.get("host"):
            k8s.config.load_incluster_config(client_configuration=configuration)
        if opts.get("host"):
            configuration.host = str(opts["host"]).rstrip("/")
        if opts.get("token"):
            configuration.api_key = {"authorization": str(opts["token"])}
            configuration.api_key_prefix = {"authorization": "Bearer"}
        if "verify_ssl" in opts:
            configuration.verify_ssl = bool(opts["verify_ssl"])
        configuration.retries = 1  # one reconnect; the remediation engine owns retrying the action
        self._host = configuration.host
        return configuration

    @property
    def _timeout_seconds(self) -> float:
        return float(self.options.get("timeout_seconds", 10))

    def _patch_node(self, api: Any, node: str, build: Callable[[dict[str, Any]], dict[str, Any] | None]) -> bool:
        """Read, build a patch, apply it guarded by resourceVersion; re-read on 409. False when nothing to do."""
        conflict = import_kubernetes().client.ApiException
        attempt = 1
        while True:
            raw = api.read_node(node, _preload_content=False, _request_timeout=self._timeout_seconds)
            patch = build(json.loads(raw.data))
            if patch is None:
                return False
            try:
                api.patch_node(node, patch, _preload_content=False, _request_timeout=self._timeout_seconds).read()
                return True
            except conflict as exc:
                if exc.status != 409 or attempt == CONFLICT_ATTEMPTS:
                    raise
                attempt += 1

    def _move_work(self, api: Any, action: Action, node: str, where: str) -> Outcome:
        listing = api.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}", _preload_content=False,
                                                  _request_timeout=self._timeout_seconds)
        pods = json.loads(listing.data).get("items") or []
        if not pods:  # a node the API server does not have (a wrong node_map) must not look done: 404 raises
            api.read_node(node, _preload_content=False, _request_timeout=self._timeout_seconds).read()
        gpu_resource = str(self.options.get("gpu_resource", "nvidia.com/gpu"))
        plan = plan_evictions(pods, action, gpu_resource)
        evicted: list[str] = []
        refused: list[str] = []
        for key in plan.evict:
            why_not = self._evict(api, key)
            if why_not:
                refused.append(f"{key} ({why_not})")
            else:
                evicted.append(key)
        devices = ", ".join(action.accelerators) or "no accelerator"
        parts = [f"move_work {where} ({devices}): evicted {len(evicted)} pod(s)"
                 + (f": {', '.join(evicted)}" if evicted else "")]
        if plan.fell_back_to_gpu_pods and plan.evict:
            parts.append(f"no pod names its devices, so every pod requesting {gpu_resource} was chosen")
        if refused:
            parts.append(f"not evicted: {', '.join(refused)}")
        if plan.skipped:
            parts.append(f"skipped: {', '.join(plan.skipped)}")
        return Outcome(not refused, _one_line("; ".join(parts), DETAIL_MAX_CHARS))

    def _evict(self, api: Any, key: str) -> str | None:
        """Evict one pod; None when it is gone or going, else why not. A 429 is reported, never retried here."""
        namespace, name = key.split("/", 1)
        client = import_kubernetes().client
        grace = self.options.get("grace_period_seconds")
        body = client.V1Eviction(
            api_version="policy/v1",
            kind="Eviction",
            metadata=client.V1ObjectMeta(name=name, namespace=namespace),
            delete_options=client.V1DeleteOptions(grace_period_seconds=None if grace is None else int(grace)),
        )
        try:
            # explicit type: this generated method sets none, and urllib3-future (via grafana-client) would
            # label the JSON text/plain, which the API server refuses with 415
            response = api.create_namespaced_pod_eviction(
                name, namespace, body, _headers={"Content-Type": "application/json"}, _preload_content=False,
                _request_timeout=self._timeout_seconds,
            )
            response.read()
        except client.ApiException as exc:
            if exc.status == 404:
                return None  # already gone
            if exc.status == 429:
                return "a PodDisruptionBudget forbids it now, HTTP 429"
            return api_error(exc)
        return None
