"""deploy/helm/sentinel rendered by Helm v4's own engine (helm-python-sdk binds Helm's Go SDK: no helm
binary, no cluster), linted strictly, and every built-in object validated against the Kubernetes 1.30
schemas (kubernetes-validate, strict: an unknown field fails). The two Prometheus Operator objects have no
schema there: the PrometheusRule's groups are checked by the real `promtool`, the ServiceMonitor's ports
and job label against the Services it selects. The agent's arguments are parsed by `sentinel collector`'s
own parser and the server's variables checked against Settings, so the chart cannot drift from the CLI.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from sentinel.cli import build_parser
from sentinel.config import Settings

helm = pytest.importorskip("helm_python")
kubernetes_validate = pytest.importorskip("kubernetes_validate")

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "sentinel"
KUBE = "1.30.0"
CRD_KINDS = {"ServiceMonitor", "PrometheusRule"}
PRODUCTION: dict[str, Any] = {
    "server": {"database": {"existingSecret": "sentinel-db"}},
    "metrics": {"serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True}},
    "cluster": "c1", "cell": "west",
}


def render(values: dict[str, Any]) -> list[dict[str, Any]]:
    chart = helm.Chart.load(str(CHART))
    manifests = chart.render(values, name="prod", namespace="gpu", is_install=True)
    objects = []
    for path, text in manifests.items():
        if path.endswith(".yaml"):
            objects += [doc for doc in yaml.safe_load_all(text) if doc]
    return objects


@pytest.fixture(scope="module")
def objects() -> list[dict[str, Any]]:
    return render(PRODUCTION)


def one(objects: list[dict[str, Any]], kind: str, suffix: str = "") -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"].endswith(suffix)]
    assert len(found) == 1, f"{kind} *{suffix}: {[o['metadata']['name'] for o in found]}"
    return found[0]


def test_the_chart_lints_strictly() -> None:
    report = helm.lint(str(CHART), PRODUCTION, strict=True, kube_version=f"v{KUBE}")
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert report["errors"] == [] and problems == [], report


def test_every_builtin_object_is_valid_kubernetes(objects: list[dict[str, Any]]) -> None:
    kinds = sorted({o["kind"] for o in objects})
    assert {"StatefulSet", "DaemonSet", "Service", "PodDisruptionBudget", "ConfigMap", "ServiceAccount",
            "ServiceMonitor", "PrometheusRule"} <= set(kinds), kinds
    for obj in objects:
        if obj["kind"] not in CRD_KINDS:
            kubernetes_validate.validate(obj, KUBE, strict=True)


def test_a_field_kubernetes_does_not_know_is_caught(objects: list[dict[str, Any]]) -> None:
    broken = json.loads(json.dumps(one(objects, "DaemonSet")))
    broken["spec"]["template"]["spec"]["hostPid"] = True  # a typo of hostPID
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBE, strict=True)


def test_several_servers_without_postgresql_are_refused_with_the_setting_to_change() -> None:
    with pytest.raises(helm.HelmError, match=r"server\.database\.existingSecret"):
        render({})
    single = render({"server": {"replicas": 1}})
    assert one(single, "StatefulSet")["spec"]["replicas"] == 1


def test_the_agent_arguments_are_the_collectors_own(objects: list[dict[str, Any]]) -> None:
    pod = one(objects, "DaemonSet")["spec"]["template"]["spec"]
    assert pod["hostPID"] and pod["hostNetwork"] and pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    agent = pod["containers"][0]
    assert "SYS_PTRACE" in agent["securityContext"]["capabilities"]["add"]
    args = [a.replace("$(NODE_NAME)", "gpu-node-1").replace("$(HOST_IP)", "10.0.0.5") for a in agent["args"]]
    parsed = build_parser().parse_args(args)
    assert parsed.source == ["nvml", "host", "rdma"] and parsed.sysfs_root == "/host/sys"
    assert parsed.probe == "10.0.0.5:9482" and parsed.node_name == "gpu-node-1"
    assert set(parsed.label) == {"cluster=c1", "cell=west"}
    mounts = {m["mountPath"] for m in agent["volumeMounts"]}
    assert {"/run/sentinel", "/var/lib/sentinel/agent", "/host/sys"} <= mounts
    assert parsed.token_file == "/run/sentinel/token" and parsed.state_dir == "/var/lib/sentinel/agent"


def test_the_agents_failover_list_names_every_server_by_its_stable_name(objects: list[dict[str, Any]]) -> None:
    stateful = one(objects, "StatefulSet")
    headless = one(objects, "Service", "-server")
    assert headless["spec"]["clusterIP"] == "None" and stateful["spec"]["serviceName"] == headless["metadata"]["name"]
    agent = one(objects, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]
    server_arg = next(a for a in agent["args"] if a.startswith("--server="))
    name = stateful["metadata"]["name"]
    assert server_arg == "--server=" + ",".join(
        f"http://{name}-{i}.{name}.gpu.svc:9480" for i in range(stateful["spec"]["replicas"]))


def test_the_server_environment_is_sentinels_settings(objects: list[dict[str, Any]]) -> None:
    container = one(objects, "StatefulSet")["spec"]["template"]["spec"]["containers"][0]
    names = {e["name"] for e in container["env"]} - {"POD_NAME"}
    unknown = {n for n in names if n.removeprefix("SENTINEL_").lower() not in Settings.model_fields}
    assert not unknown, unknown
    db = next(e for e in container["env"] if e["name"] == "SENTINEL_DATABASE_URL")
    assert db["valueFrom"]["secretKeyRef"] == {"name": "sentinel-db", "key": "url"}
    assert container["args"] == ["server"] and container["securityContext"]["readOnlyRootFilesystem"]


def test_the_prometheus_rule_is_the_shipped_rules_and_promtool_accepts_it(objects: list[dict[str, Any]],
                                                                           tmp_path: Path) -> None:
    rule = one(objects, "PrometheusRule")
    shipped = yaml.safe_load((ROOT / "dashboards" / "prometheus" / "sentinel-rules.yml").read_text())
    assert rule["spec"] == shipped
    if shutil.which("promtool") is None:
        pytest.skip("promtool (Debian's prometheus) is not installed")
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rule["spec"]))
    done = subprocess.run(["promtool", "check", "rules", str(tmp_path / "rules.yml")], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_service_monitor_scrapes_what_the_rules_expect(objects: list[dict[str, Any]]) -> None:
    monitor = one(objects, "ServiceMonitor")["spec"]
    services = [o for o in objects if o["kind"] == "Service"
                and all(o["metadata"]["labels"].get(k) == v for k, v in monitor["selector"]["matchLabels"].items())]
    jobs = {s["metadata"]["labels"].get(monitor["jobLabel"]) for s in services}
    assert {"sentinel-server", "sentinel-agent"} <= jobs  # the rules match job=~"sentinel-agent.*" and so on
    ports = {p["name"] for s in services if s["metadata"]["labels"].get(monitor["jobLabel"])
             for p in s["spec"]["ports"]}
    server, agent = monitor["endpoints"]
    assert {server["port"], agent["port"]} <= ports
    assert server["honorLabels"] and server["authorization"]["credentials"]["name"] == "sentinel-prometheus-token"
    for endpoint in (server, agent):
        labels = {r["targetLabel"]: r.get("replacement") for r in endpoint["relabelings"]}
        assert labels["cluster"] == "c1" and labels["cell"] == "west"


def test_the_dashboards_are_the_shipped_ones(objects: list[dict[str, Any]]) -> None:
    maps = [o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["labels"].get("grafana_dashboard")]
    shipped = {p.name: json.loads(p.read_text()) for p in (ROOT / "dashboards" / "grafana").glob("*.json")}
    rendered = {k: json.loads(v) for m in maps for k, v in m["data"].items()}
    assert rendered == shipped


def test_a_misspelt_value_is_refused_rather_than_ignored() -> None:
    with pytest.raises(helm.HelmError, match="replica"):
        render({"server": {"replica": 1, "database": {"existingSecret": "db"}}})
    with pytest.raises(helm.HelmError, match="sources"):
        render({"server": {"replicas": 1}, "agent": {"sources": ["nvlm"]}})
