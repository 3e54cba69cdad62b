"""deploy/kubernetes/ against the Kubernetes API schemas, and what its settings must agree on.

Every manifest is validated with ``kubernetes-validate`` in strict mode (an unknown field fails)
against the oldest Kubernetes the manifests are written for (1.33: user namespaces on by
default) and the newest schemas the package carries. Then what a schema cannot see: the probes'
paths, the selectors, the drain's time against the server's own settings, the environment the
replicas share, and what bwrap needs in the pod. No real cluster runs here (docs/scaling.md says so).
"""

from __future__ import annotations

import copy
import re
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from mcp_sandbox.config import load_config, load_settings
from mcp_sandbox.server.lifecycle import ANSWER_SECONDS

REPO = Path(__file__).resolve().parents[2]
KUBE = REPO / "deploy" / "kubernetes"
# The oldest version the manifests are for (docs/scaling.md#kubernetes), and the newest schemas here.
VERSIONS = ("1.33.0", kubernetes_validate.utils.latest_version())
# What the kubelet gives the Service to take the pod out of its endpoints (preStop) comes on top.
HTTP_STOP_SECONDS = 1  # DrainingServer: uvicorn's last wait, at least a second

Manifest = dict[str, Any]


def _documents(path: Path) -> list[Manifest]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _kustomization() -> Manifest:
    kustomization: Manifest = yaml.safe_load((KUBE / "kustomization.yaml").read_text())
    return kustomization


def _manifests() -> list[Manifest]:
    return [doc for name in _kustomization()["resources"] for doc in _documents(KUBE / name)]


def _one(kind: str) -> Manifest:
    (found,) = [doc for doc in _manifests() if doc["kind"] == kind]
    return found


def _pod() -> Manifest:
    pod: Manifest = _one("Deployment")["spec"]["template"]
    return pod


def _server() -> Manifest:
    containers: list[Manifest] = _pod()["spec"]["containers"]
    (server,) = [c for c in containers if c["name"] == "server"]
    return server


def _env() -> dict[str, Manifest]:
    env: list[Manifest] = _server()["env"]
    return {entry["name"]: entry for entry in env}


def _config_toml(tmp_path: Path) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(_one("ConfigMap")["data"]["config.toml"])
    return path


def test_the_kustomization_lists_every_manifest_of_the_directory() -> None:
    listed = set(_kustomization()["resources"])
    present = {path.name for path in KUBE.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == present


@pytest.mark.parametrize("version", VERSIONS)
def test_every_manifest_validates_against_the_kubernetes_api_schemas(version: str) -> None:
    manifests = _manifests()
    kinds = {"ConfigMap", "Deployment", "Service", "PodDisruptionBudget", "NetworkPolicy"}
    assert {doc["kind"] for doc in manifests} == kinds
    for manifest in manifests:
        kubernetes_validate.validate(manifest, version, strict=True)


def test_the_strict_validation_refuses_a_misspelt_field() -> None:
    # Proof that the validation above can fail: a probe under a wrong name is an unknown field.
    deployment = copy.deepcopy(_one("Deployment"))
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    container["readinesProbe"] = container.pop("readinessProbe")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, VERSIONS[0], strict=True)


@pytest.mark.parametrize("version", VERSIONS)
def test_the_apparmor_component_patches_into_a_valid_deployment(version: str) -> None:
    component: Manifest = yaml.safe_load((KUBE / "apparmor-unconfined" / "kustomization.yaml").read_text())
    assert component["kind"] == "Component"
    (patch,) = component["patches"]
    assert patch["target"] == {"kind": "Deployment", "name": _one("Deployment")["metadata"]["name"]}
    (operation,) = yaml.safe_load(patch["patch"])
    assert operation["op"] == "add"
    deployment = copy.deepcopy(_one("Deployment"))
    *parents, leaf = operation["path"].strip("/").split("/")
    target: Any = deployment
    for part in parents:
        target = target[int(part)] if isinstance(target, list) else target[part]
    target[leaf] = operation["value"]
    assert _server_of(deployment)["securityContext"]["appArmorProfile"] == {"type": "Unconfined"}
    kubernetes_validate.validate(deployment, version, strict=True)


def _server_of(deployment: Manifest) -> Manifest:
    server: Manifest = deployment["spec"]["template"]["spec"]["containers"][0]
    assert server["name"] == "server"
    return server


def test_readiness_asks_readyz_and_liveness_healthz_on_the_served_port() -> None:
    server = _server()
    port, _internal = server["ports"]
    assert port == {"name": "http", "containerPort": 8765, "protocol": "TCP"}
    assert server["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert server["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert server["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert _one("Service")["spec"]["ports"][0]["targetPort"] == "http"


def test_the_service_and_the_disruption_budget_select_exactly_the_deployments_pods() -> None:
    deployment = _one("Deployment")
    labels = _pod()["metadata"]["labels"]
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert selector.items() <= labels.items()
    budget = _one("PodDisruptionBudget")["spec"]
    assert budget["selector"] == {"matchLabels": selector}
    assert budget["maxUnavailable"] == 1 < deployment["spec"]["replicas"]
    assert _one("Service")["spec"]["selector"] == selector
    # A rollout starts a new pod before it drains an old one.
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0


def test_the_pods_grace_period_covers_the_pause_and_the_servers_whole_drain(tmp_path: Path) -> None:
    settings = load_settings(env={}, flags={}, config_file=_config_toml(tmp_path))
    pause = _server()["lifecycle"]["preStop"]["sleep"]["seconds"]
    grace = _pod()["spec"]["terminationGracePeriodSeconds"]
    assert settings.http.shutdown_grace > 0
    assert grace >= pause + settings.http.shutdown_grace + ANSWER_SECONDS + HTTP_STOP_SECONDS


def test_the_config_map_is_a_config_file_the_server_accepts(tmp_path: Path) -> None:
    settings = load_settings(env={}, flags={}, config_file=_config_toml(tmp_path))
    assert settings.http.public_url is not None
    assert settings.sandbox.accept_weaker_isolation  # no writable cgroup in a pod (docs/deployment.md)
    assert _env()["MCP_SANDBOX_CONFIG"]["value"] == "/etc/mcp-sandbox/config.toml"
    (mount,) = [m for m in _server()["volumeMounts"] if m["name"] == "config"]
    assert mount["mountPath"] == "/etc/mcp-sandbox"


def test_the_replicas_share_the_database_the_store_and_the_tokens_from_secrets() -> None:
    env = _env()
    for name in (
        "MCP_SANDBOX_DATABASE_URL",
        "MCP_SANDBOX_TOKEN",
        "MCP_SANDBOX_METRICS_TOKEN",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
    ):
        assert "value" not in env[name], name  # never a literal secret in the manifest
        assert env[name]["valueFrom"]["secretKeyRef"]["name"].startswith("mcp-sandbox"), name
    assert env["MCP_SANDBOX_OBJECT_STORE_URL"]["value"].startswith("s3://")
    assert env["AWS_ENDPOINT_URL"]["value"].startswith("https://")
    assert env["AWS_REGION"]["value"]


_ENTRYPOINT = "exec /usr/bin/tini -- /usr/local/bin/mcp-sandbox serve --transport http"


def test_the_service_exposes_the_public_port_and_only_the_replicas_reach_the_internal_one(tmp_path: Path) -> None:
    settings = load_settings(env={}, flags={}, config_file=_config_toml(tmp_path))
    ports = {port["name"]: port["containerPort"] for port in _server()["ports"]}
    assert ports == {"http": settings.http.port, "internal": settings.http.internal_port}
    (exposed,) = _one("Service")["spec"]["ports"]
    assert exposed["targetPort"] == "http"
    policy = _one("NetworkPolicy")["spec"]
    selector = _one("Deployment")["spec"]["selector"]
    assert policy["podSelector"] == selector and policy["policyTypes"] == ["Ingress"]
    anyone, replicas = policy["ingress"]
    assert "from" not in anyone and anyone["ports"] == [{"port": "http", "protocol": "TCP"}]
    assert replicas["from"] == [{"podSelector": selector}]
    assert replicas["ports"] == [{"port": "internal", "protocol": "TCP"}]


@pytest.mark.parametrize(
    ("pod_ip", "url"),
    [("10.244.1.7", "http://10.244.1.7:8766"), ("fd00:10:244::7", "http://[fd00:10:244::7]:8766")],
)
def test_each_replica_is_reached_at_its_pod_ip_on_either_address_family(pod_ip: str, url: str, tmp_path: Path) -> None:
    assert _env()["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    shell, flag, script = _server()["command"]
    assert (shell, flag) == ("/bin/sh", "-c") and script.endswith(_ENTRYPOINT)
    # The script as the pod runs it, but for the server it execs: env shows what it would get.
    shown = subprocess.run(
        [shell, flag, script.replace(_ENTRYPOINT, "exec /usr/bin/env")],
        env={"POD_IP": pod_ip, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout.splitlines()
    assert f"MCP_SANDBOX_REPLICA_URL={url}" in shown
    env = {"MCP_SANDBOX_REPLICA_URL": url, "MCP_SANDBOX_DATABASE_URL": "postgresql://db/app"}
    settings = load_config(env=env, config_file=_config_toml(tmp_path)).serving("http")
    assert settings.replicas.replica_url == url and url.endswith(f":{settings.http.internal_port}")  # internal


def test_every_replica_gets_the_same_server_secret_privately() -> None:
    spec = _pod()["spec"]
    (init,) = spec["initContainers"]
    state_dir = _env()["MCP_SANDBOX_STATE_DIR"]["value"]
    script = init["command"][-1]
    assert f'"{state_dir}/secret"' in script and "0o600" in script
    (volume,) = [v for v in spec["volumes"] if v["name"] == "server-secret"]
    assert volume["secret"]["items"] == [{"key": "server-secret", "path": "server-secret"}]
    assert {"name": "state", "mountPath": str(Path(state_dir).parent)} in init["volumeMounts"]


def test_the_pod_gives_bwrap_what_it_needs_and_nothing_more() -> None:
    spec = _pod()["spec"]
    assert spec["hostUsers"] is False  # a user namespace of its own, which Unmasked /proc requires
    assert spec["automountServiceAccountToken"] is False
    pod_security = spec["securityContext"]
    assert pod_security["runAsNonRoot"] is True
    image_uid = re.search(r"^uid=(\d+)$", (REPO / "scripts" / "build-server-image.sh").read_text(), re.M)
    assert image_uid is not None
    assert pod_security["runAsUser"] == pod_security["runAsGroup"] == int(image_uid.group(1))
    seccomp = pod_security["seccompProfile"]
    assert seccomp["type"] == "Localhost"
    assert seccomp["localhostProfile"].endswith("/seccomp-server.json")
    assert (REPO / "deploy" / "seccomp-server.json").is_file()
    for container in (_server(), *spec["initContainers"]):
        security = container["securityContext"]
        assert security["allowPrivilegeEscalation"] is False
        assert security["readOnlyRootFilesystem"] is True
        assert security["capabilities"] == {"drop": ["ALL"]}
        assert "privileged" not in security
    assert _server()["securityContext"]["procMount"] == "Unmasked"
    assert _server()["resources"]["limits"]["memory"]
