"""The Kubernetes manifests, validated statically (no cluster here), and the discovery script."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from collector import settings as collector_settings
from collector.targets import read_discovery_file
from webui import settings as web_settings

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "kubernetes"
sys.path.insert(0, str(K8S))
import k8s_file_sd  # noqa: E402 - the script lives in deploy/kubernetes

KNOWN_KINDS = {
    ("v1", "Namespace"),
    ("v1", "ServiceAccount"),
    ("v1", "ConfigMap"),
    ("v1", "Secret"),
    ("v1", "Service"),
    ("apps/v1", "Deployment"),
    ("rbac.authorization.k8s.io/v1", "ClusterRole"),
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"),
}


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def _all() -> list[dict[str, Any]]:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    docs = []
    for name in kustomization["resources"]:
        docs += _docs(K8S / name)
    return docs


def _by_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def test_every_manifest_has_a_known_kind_a_name_and_the_namespace() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert kustomization["kind"] == "Kustomization"
    for name in kustomization["resources"]:
        assert (K8S / name).is_file(), name
    files = sorted(K8S.glob("*.yaml")) + sorted((K8S / "examples").glob("*.yaml"))
    for path in files:
        if path.name == "kustomization.yaml":
            continue
        for doc in _docs(path):
            assert (doc.get("apiVersion"), doc.get("kind")) in KNOWN_KINDS, (
                path.name,
                doc.get("kind"),
            )
            assert doc["metadata"]["name"], path.name
            if doc["kind"] not in ("Namespace", "ClusterRole", "ClusterRoleBinding"):
                assert doc["metadata"].get("namespace"), (path.name, doc["metadata"]["name"])
    kinds = {d["kind"] for d in _all()}
    assert {"Deployment", "Service", "ConfigMap", "ServiceAccount", "ClusterRole"} <= kinds


def test_deployments_are_consistent_with_their_volumes_config_and_secrets() -> None:
    docs = _all()
    config_maps = _by_kind(docs, "ConfigMap")
    secrets = _by_kind(_docs(K8S / "secret.example.yaml"), "Secret")
    accounts = _by_kind(docs, "ServiceAccount")
    deployments = _by_kind(docs, "Deployment")
    assert set(deployments) == {"fleetflame-collector", "fleetflame-web"}
    for name, dep in deployments.items():
        spec = dep["spec"]
        template = spec["template"]
        labels = template["metadata"]["labels"]
        assert spec["selector"]["matchLabels"].items() <= labels.items(), name
        pod = template["spec"]
        if "serviceAccountName" in pod:
            assert pod["serviceAccountName"] in accounts
        volumes = {v["name"]: v for v in pod["volumes"]}
        for volume in volumes.values():
            if "configMap" in volume:
                data = config_maps[volume["configMap"]["name"]]["data"]
                for item in volume["configMap"].get("items", []):
                    assert item["key"] in data, (name, item["key"])
        for container in pod["containers"]:
            assert container["image"] and container["command"], (name, container["name"])
            ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
            for probe in ("readinessProbe", "livenessProbe"):
                if probe in container:
                    check = container[probe].get("httpGet") or container[probe]["tcpSocket"]
                    assert check["port"] in ports or check["port"] in ports.values(), (name, probe)
            # A liveness probe that fails while the database is down (the web UI's /healthz)
            # restarts pods that a restart cannot mend.
            if name == "fleetflame-web":
                assert "httpGet" not in container.get("livenessProbe", {}), container
            for mount in container.get("volumeMounts", []):
                assert mount["name"] in volumes, (name, mount["name"])
                if "subPath" in mount:
                    items = volumes[mount["name"]]["configMap"]["items"]
                    assert mount["subPath"] in {i["path"] for i in items}
            for env in container.get("env", []):
                ref = env.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    assert ref["key"] in secrets[ref["name"]]["stringData"], (name, env["name"])


def test_env_variables_are_real_settings() -> None:
    known = (
        {s.env_var for s in collector_settings.SETTINGS}
        | {s.env_var for s in web_settings.SETTINGS}
        | {web_settings.CONFIG_ENV}
    )
    for dep in _by_kind(_all(), "Deployment").values():
        for container in dep["spec"]["template"]["spec"]["containers"]:
            for env in container.get("env", []):
                assert env["name"] in known, env["name"]


def test_services_select_a_deployment_and_target_a_named_port() -> None:
    docs = _all()
    deployments = list(_by_kind(docs, "Deployment").values())
    for name, service in _by_kind(docs, "Service").items():
        selector = service["spec"]["selector"]
        matches = [
            d
            for d in deployments
            if selector.items() <= d["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert len(matches) == 1, name
        ports = {
            p["name"]
            for c in matches[0]["spec"]["template"]["spec"]["containers"]
            for p in c.get("ports", [])
        }
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in ports, (name, port)


def test_the_service_account_may_list_pods() -> None:
    docs = _all()
    binding = _by_kind(docs, "ClusterRoleBinding")["fleetflame-pod-discovery"]
    role = _by_kind(docs, "ClusterRole")[binding["roleRef"]["name"]]
    assert any("pods" in r["resources"] and "list" in r["verbs"] for r in role["rules"])
    subject = binding["subjects"][0]
    assert subject["kind"] == "ServiceAccount"
    assert subject["name"] in _by_kind(docs, "ServiceAccount")


def test_the_configmap_files_load_with_the_real_settings_loaders(tmp_path) -> None:
    data = _by_kind(_all(), "ConfigMap")["fleetflame-config"]["data"]
    collector_file = tmp_path / "collector.toml"
    collector_file.write_text(data["collector.toml"])
    loaded = collector_settings.load_settings(str(collector_file), environ={})
    assert loaded.target_files == ["/etc/fleetflame/targets/*.json"]
    assert loaded.health_listen.endswith(":9021")
    web_file = tmp_path / "webui.toml"
    web_file.write_text(data["webui.toml"])
    web = web_settings.load_settings(str(web_file), environ={})
    assert web["TITLE"] == "fleetflame"


def test_the_sidecar_runs_the_script_the_image_installs(tmp_path) -> None:
    dockerfile = (REPO / "deploy" / "docker" / "Dockerfile").read_text()
    assert "COPY deploy/kubernetes/k8s_file_sd.py /usr/local/bin/fleetflame-k8s-sd" in dockerfile
    dep = _by_kind(_all(), "Deployment")["fleetflame-collector"]
    sidecar = {c["name"]: c for c in dep["spec"]["template"]["spec"]["containers"]}["discovery"]
    assert "/usr/local/bin/fleetflame-k8s-sd" in sidecar["command"]
    output = sidecar["command"][sidecar["command"].index("--output") + 1]
    config = tmp_path / "collector.toml"
    config.write_text(_by_kind(_all(), "ConfigMap")["fleetflame-config"]["data"]["collector.toml"])
    collector = collector_settings.load_settings(str(config), environ={})
    assert Path(output).parent == Path(collector.target_files[0]).parent


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_kustomize_builds_the_manifests() -> None:
    out = subprocess.run(
        ["kubectl", "kustomize", str(K8S)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    kinds = [d["kind"] for d in yaml.safe_load_all(out.stdout) if d]
    assert kinds.count("Deployment") == 2 and "ConfigMap" in kinds


# -- the discovery script --------------------------------------------------------------------


def _pod(name: str, *, ip: str | None = "10.0.0.7", phase: str = "Running", **notes: str) -> dict:
    return {
        "metadata": {
            "name": name,
            "namespace": "shop",
            "labels": {"app.kubernetes.io/name": "api", "app.kubernetes.io/version": "1.4.2"},
            "annotations": {f"fleetflame.io/{k}": v for k, v in notes.items()},
        },
        "spec": {"nodeName": "node-1"},
        "status": {"phase": phase, "podIP": ip},
    }


def test_only_annotated_running_pods_become_targets() -> None:
    warnings: list[str] = []
    pods = {
        "kind": "PodList",
        "items": [
            _pod("api-b", scrape="true", port="8021-8036"),
            _pod("api-a", ip="fd00::5", scrape="true", port="9000", service="checkout"),
            _pod("plain"),
            _pod("pending", phase="Pending", scrape="true"),
            _pod("no-ip", ip=None, scrape="true"),
            _pod("bad-port", scrape="true", port="80-70"),
            {
                **_pod("leaving", scrape="true"),
                "metadata": {
                    **_pod("leaving", scrape="true")["metadata"],
                    "deletionTimestamp": "2026-01-01T00:00:00Z",
                },
            },
        ],
    }
    groups = k8s_file_sd.targets_from_pods(pods, warn=warnings.append)
    assert groups == [
        {
            "targets": ["[fd00::5]:9000"],
            "labels": {
                "namespace": "shop",
                "pod": "api-a",
                "service": "checkout",
                "node": "node-1",
                "version": "1.4.2",
            },
        },
        {
            "targets": ["10.0.0.7:8021-8036"],
            "labels": {
                "namespace": "shop",
                "pod": "api-b",
                "service": "api",
                "node": "node-1",
                "version": "1.4.2",
            },
        },
    ]
    assert len(warnings) == 1 and "bad-port" in warnings[0] and "80-70" in warnings[0]


class _FakeApiServer(BaseHTTPRequestHandler):
    """Answers /api/v1/pods like the Kubernetes API (a real HTTP server on 127.0.0.1)."""

    body: bytes = b""
    status = 200
    seen: list[tuple[str, str | None]] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        _FakeApiServer.seen.append((self.path, self.headers.get("Authorization")))
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def api_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeApiServer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _FakeApiServer.seen, _FakeApiServer.status = [], 200
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


def test_the_script_writes_a_file_the_collector_reads(api_server, tmp_path) -> None:
    _FakeApiServer.body = json.dumps(
        {"kind": "PodList", "items": [_pod("api-1", scrape="true", port="8021-8023")]}
    ).encode()
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    out = tmp_path / "pods.json"
    argv = [
        "--output",
        str(out),
        "--once",
        "--api-url",
        api_server,
        "--token-file",
        str(token),
        "--namespace",
        "shop",
        "--selector",
        "tier=web",
    ]
    assert k8s_file_sd.main(argv) == 0
    path, auth = _FakeApiServer.seen[0]
    assert path == "/api/v1/namespaces/shop/pods?labelSelector=tier%3Dweb"
    assert auth == "Bearer s3cret"
    targets = read_discovery_file(str(out))  # the collector's own reader
    assert [t.address for t in targets] == ["10.0.0.7:8021", "10.0.0.7:8022", "10.0.0.7:8023"]
    assert targets[0].labels["pod"] == "api-1"
    stamp = out.stat().st_mtime_ns
    assert k8s_file_sd.main(argv) == 0
    assert out.stat().st_mtime_ns == stamp  # unchanged targets: the file is not rewritten


@pytest.mark.parametrize(
    "status, body, message",
    [
        (403, b"{}", "HTTP 403"),
        (200, b"not json", "Expecting value"),
        (200, b'{"kind": "Status"}', "expected a PodList"),
    ],
)
def test_api_failures_keep_the_previous_file(
    api_server, tmp_path, capsys, status, body, message
) -> None:
    out = tmp_path / "pods.json"
    out.write_text('[{"targets": ["10.0.0.1:8021"], "labels": {}}]\n')
    before = out.read_text()
    _FakeApiServer.status, _FakeApiServer.body = status, body
    assert k8s_file_sd.main(["--output", str(out), "--once", "--api-url", api_server]) == 1
    assert out.read_text() == before
    assert message in capsys.readouterr().err


def test_outside_a_cluster_without_api_url_is_a_usage_error(monkeypatch, capsys, tmp_path) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(SystemExit) as exc:
        k8s_file_sd.main(["--output", str(tmp_path / "x.json"), "--once"])
    assert exc.value.code == 2
    assert "pass --api-url" in capsys.readouterr().err
