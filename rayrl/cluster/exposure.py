"""Network exposure rules: what a cluster file leaves reachable, for every provider rayrl knows.

Ray 2.60 cannot switch some listeners off: `ray start --head` starts the Ray Client server on
port 10001 whenever grpc is installed (it rejects port 0), and every node's metrics endpoint
binds all interfaces unless the node's IP is loopback. So rayrl does not pretend to close them in
Ray; it checks that the network around the nodes does: no public IP on GCP, no security group
open to the world on AWS (`launcher_rules.security_problems`), a NetworkPolicy that admits only
the cluster's own pods on Kubernetes, no core dumps (they can hold the cluster token), and
containers that cannot become root. Each function returns problem sentences naming the key.
"""

from __future__ import annotations

import re
from typing import Any

CLUSTER_LABEL = "rayrl.io/cluster"  # on every pod template (and a RayJob's submitter): what policies select
RAY_PORTS = (6379, 8265, 8080, 10001)  # GCS, dashboard + job API, metrics, Ray Client


def _commands(config: dict) -> list[tuple[str, str]]:
    keys = (
        "initialization_commands",
        "setup_commands",
        "head_setup_commands",
        "worker_setup_commands",
        "head_start_ray_commands",
        "worker_start_ray_commands",
    )
    out = []
    for key in keys:
        value = config.get(key) or []
        out += [(key, str(c)) for c in (value if isinstance(value, list) else [value])]
    return out


def core_dump_problems(config: dict) -> list[str]:
    """No command raises the core-file limit, and containers run with core files off.

    A core dump of a Ray process holds the cluster token and the job's data, and fills the disk.
    """
    problems = [
        f"{key}: `{m.group(0)}` turns core dumps on; a core file of a Ray process holds the "
        "cluster token and fills the disk; remove it (core dumps stay off)."
        for key, cmd in _commands(config)
        if (m := re.search(r"ulimit\s+(-\w*c\w*|--core-size)\s+(unlimited|[1-9]\d*)", cmd))
    ]
    docker = config.get("docker") or {}
    if docker.get("image") or docker.get("head_image"):
        options = " ".join(str(o) for o in docker.get("run_options") or [])
        if not re.search(r"--ulimit[ =]core=0(:0)?\b", options):
            problems.append(
                "docker.run_options: no `--ulimit core=0`, so containers inherit the host's core-file "
                "limit; add `- --ulimit core=0` (a core dump holds the cluster token)."
            )
    return problems


NODE_PORT_FLAGS = (
    "object-manager-port",
    "node-manager-port",
    "dashboard-agent-grpc-port",
    "dashboard-agent-listen-port",
    "runtime-env-agent-port",
    "metrics-export-port",
    "min-worker-port",
    "max-worker-port",
)
HEAD_PORT_FLAGS = ("port", "ray-client-server-port", "dashboard-port") + NODE_PORT_FLAGS
HEAD_PORT_ENV = ("AUTOSCALER_METRIC_PORT", "DASHBOARD_METRIC_PORT")  # the autoscaler's and dashboard's metrics


def port_problems(config: dict) -> list[str]:
    """Every `ray start` names each port Ray opens, so the firewall can admit exactly those.

    Left to Ray, the raylet, agents and workers take random ports, and a firewall must then open
    whole ranges; tests/test_exposure_live.py checks a live head listens on nothing else.
    """
    problems = []
    for key, flags in (("head_start_ray_commands", HEAD_PORT_FLAGS), ("worker_start_ray_commands", NODE_PORT_FLAGS)):
        text = " ".join(cmd for k, cmd in _commands(config) if k == key and "ray start" in cmd)
        if not text:
            continue
        missing = [f"--{f}" for f in flags if not re.search(rf"--{f}[= ]\d+", text)]
        if key == "head_start_ray_commands":  # the head's metrics exporters take these from the environment
            missing += [v for v in HEAD_PORT_ENV if not re.search(rf"\b{v}=\d+", text)]
        if missing:
            problems.append(
                f"{key}: `ray start` leaves {', '.join(missing)} to Ray, which then "
                "opens random ports a firewall cannot name; pin each (see cluster_configs/gpu.yaml)."
            )
    return problems


def public_ip_problems(config: dict) -> list[str]:
    """GCP nodes without external IPs: Ray Client (10001) and metrics (8080) cannot be bound privately.

    Ray's GCP provider gives a node an external IP unless its networkInterfaces say otherwise;
    reach the head through IAP or a bastion (docs/security.md).
    """
    provider = config.get("provider") or {}
    if provider.get("type") != "gcp":
        return []
    problems = []
    if provider.get("use_internal_ips") is not True:
        problems.append(
            "provider.use_internal_ips: not true, so Ray talks to nodes over external IPs; set it "
            "to true and reach the head through IAP or a bastion (docs/security.md)."
        )
    for name, node in (config.get("available_node_types") or {}).items():
        nics = ((node or {}).get("node_config") or {}).get("networkInterfaces")
        where = f"available_node_types.{name}.node_config.networkInterfaces"
        if not nics:
            problems.append(
                f"{where}: not set, so GCP gives the node an external IP that exposes ports "
                f"{', '.join(map(str, RAY_PORTS))}; give a subnetwork with no accessConfigs."
            )
        elif any((nic or {}).get("accessConfigs") for nic in nics):
            problems.append(
                f"{where}: accessConfigs gives the node an external IP that exposes ports "
                f"{', '.join(map(str, RAY_PORTS))}; remove accessConfigs (use IAP or a bastion)."
            )
    return problems


def kube_file_problems(docs: list[dict]) -> list[str]:
    """A manifest that makes a Ray cluster also ships the NetworkPolicy that fences it in."""
    names = [_cluster_name(d) for d in docs if d.get("kind") in ("RayCluster", "RayJob")]
    policies = [d for d in docs if d.get("kind") == "NetworkPolicy"]
    problems = []
    for name in names:
        if not any(_fences(p, name) for p in policies):
            problems.append(
                f"NetworkPolicy: none selects the pods of {name!r} ({CLUSTER_LABEL}: {name}) with "
                "policyTypes [Ingress], so any pod in the cluster reaches ports "
                f"{', '.join(map(str, RAY_PORTS))}; add the NetworkPolicy of "
                "cluster_configs/kuberay/raycluster.yaml."
            )
    return problems


def _cluster_name(doc: dict) -> str:
    """The name a cluster's pods carry in CLUSTER_LABEL: the RayCluster's or the RayJob's own name.

    KubeRay names a RayJob's cluster NAME-<random>, so its own labels cannot be selected in advance.
    """
    return str((doc.get("metadata") or {}).get("name") or "")


def pod_label_problems(where: str, template: dict, cluster: str) -> list[str]:
    """The pod template at ``where`` carries CLUSTER_LABEL, or the NetworkPolicy neither fences nor admits it."""
    labels = ((template or {}).get("metadata") or {}).get("labels") or {}
    if labels.get(CLUSTER_LABEL) == cluster:
        return []
    return [
        f"{where}.metadata.labels.{CLUSTER_LABEL}: {labels.get(CLUSTER_LABEL)!r}; set it to "
        f"{cluster!r} so the NetworkPolicy fences this pod in and admits its peers."
    ]


def _fences(policy: dict, cluster: str) -> bool:
    spec = policy.get("spec") or {}
    labels = (spec.get("podSelector") or {}).get("matchLabels") or {}
    if labels.get(CLUSTER_LABEL) != cluster or "Ingress" not in (spec.get("policyTypes") or []):
        return False
    return not any(_open_rule(r) for r in spec.get("ingress") or [])


def _open_rule(rule: dict) -> bool:
    """An ingress rule without `from`, or with an empty selector or a world CIDR, admits everyone."""
    sources = rule.get("from")
    if not sources:
        return True
    for src in sources:
        block = (src.get("ipBlock") or {}).get("cidr")
        if block in ("0.0.0.0/0", "::/0"):
            return True
        if "podSelector" in src and not src["podSelector"] and "namespaceSelector" not in src:
            return True
        if "namespaceSelector" in src and not src["namespaceSelector"]:
            return True
    return False


def network_policy_problems(doc: dict) -> list[str]:
    """A NetworkPolicy document itself: it must select pods and list who may reach them."""
    spec = doc.get("spec") or {}
    problems = []
    if not ((spec.get("podSelector") or {}).get("matchLabels") or {}).get(CLUSTER_LABEL):
        problems.append(f"spec.podSelector.matchLabels.{CLUSTER_LABEL}: missing; select the Ray cluster's pods.")
    for i, rule in enumerate(spec.get("ingress") or []):
        if _open_rule(rule or {}):
            problems.append(
                f"spec.ingress[{i}]: admits every pod or address; list the cluster's own pods and "
                "the monitoring / job-submitter namespaces by label."
            )
    return problems


SECURE_CONTEXT = {"runAsNonRoot": True, "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True}


def container_context_problems(where: str, container: dict) -> list[str]:
    """Ray containers run as non-root, cannot escalate, drop every capability, and keep / read-only."""
    ctx = container.get("securityContext") or {}
    problems = [
        f"{where}.securityContext.{key}: {ctx.get(key)!r}; set {str(want).lower()} (a container that "
        "runs code from any job must not be able to take the node)."
        for key, want in SECURE_CONTEXT.items()
        if ctx.get(key) is not want
    ]
    drop = (ctx.get("capabilities") or {}).get("drop") or []
    if "ALL" not in drop:
        problems.append(f"{where}.securityContext.capabilities.drop: {drop!r}; drop [ALL].")
    return problems


def gcs_ft_problems(spec: dict, at: str) -> list[str]:
    """The head is no single point of failure: GCS state in an external Redis, its password from a Secret."""
    ft = spec.get("gcsFaultToleranceOptions")
    if not isinstance(ft, dict) or not ft.get("redisAddress"):
        return [
            f"{at}.gcsFaultToleranceOptions.redisAddress: missing, so a lost head pod loses the cluster and "
            "every running trial; point it at an external Redis (docs/security.md)."
        ]
    password: Any = ft.get("redisPassword")
    if password is not None and not (isinstance(password, dict) and "valueFrom" in password):
        return [
            f"{at}.gcsFaultToleranceOptions.redisPassword: written into the manifest; read it from a Secret "
            "(valueFrom.secretKeyRef)."
        ]
    return []
