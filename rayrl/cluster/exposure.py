"""Network exposure rules: what a cluster file leaves reachable, for every provider rayrl knows.

Ray 2.60 cannot switch some listeners off: `ray start --head` starts the Ray Client server on
port 10001 whenever grpc is installed (it rejects port 0), and every node's metrics endpoint
binds all interfaces unless the node's IP is loopback. So rayrl does not pretend to close them in
Ray; it checks that the network around the nodes does: no public IP on GCP or AWS, no security group
open to the world on AWS (`launcher_rules.security_problems`), a NetworkPolicy that admits only
the cluster's own pods on Kubernetes (and one that admits only the head to the GCS's Redis), no
core dumps (they can hold the cluster token), and containers that cannot become root. Each
function returns problem sentences naming the key.
"""

from __future__ import annotations

import re
from typing import Any

CLUSTER_LABEL = "rayrl.io/cluster"  # on every pod template (and a RayJob's submitter): what policies select
HEAD_LABEL = "ray.io/node-type"  # KubeRay labels head pods ray.io/node-type: head; the GCS runs there
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
    """No node with a public IP: Ray Client (10001) and metrics (8080) cannot be bound privately.

    Ray's GCP provider gives a node an external IP unless its networkInterfaces say otherwise; its
    AWS provider launches nodes in subnets that map public IPs unless ``use_internal_ips`` is set,
    and even then a subnet may map them, so only an interface that says
    ``AssociatePublicIpAddress: false`` is checkable here. Reach the head through IAP, SSM or a
    bastion (docs/security.md).
    """
    provider = config.get("provider") or {}
    kind = provider.get("type")
    if kind not in ("gcp", "aws"):
        return []
    problems = []
    if provider.get("use_internal_ips") is not True and kind == "gcp":
        problems.append(
            "provider.use_internal_ips: not true, so Ray talks to nodes over external IPs; set it "
            "to true and reach the head through IAP or a bastion (docs/security.md)."
        )
    elif provider.get("use_internal_ips") is not True:
        problems.append(
            "provider.use_internal_ips: not true, so Ray launches AWS nodes only in subnets that map public "
            "IPs and talks to them over those; set it to true and run `ray up` from inside the VPC (a "
            "bastion, a VPN or SSM port forwarding; docs/security.md)."
        )
    nodes = (config.get("available_node_types") or {}).items()
    for name, node in nodes:
        node_config = (node or {}).get("node_config") or {}
        if kind == "gcp":
            problems += _gcp_nic_problems(f"available_node_types.{name}.node_config.networkInterfaces", node_config)
        else:
            problems += _aws_nic_problems(f"available_node_types.{name}.node_config", node_config)
    return problems


def _gcp_nic_problems(where: str, node_config: dict) -> list[str]:
    nics = node_config.get("networkInterfaces")
    if not nics:
        return [
            f"{where}: not set, so GCP gives the node an external IP that exposes ports "
            f"{', '.join(map(str, RAY_PORTS))}; give a subnetwork with no accessConfigs."
        ]
    if any((nic or {}).get("accessConfigs") for nic in nics):
        return [
            f"{where}: accessConfigs gives the node an external IP that exposes ports "
            f"{', '.join(map(str, RAY_PORTS))}; remove accessConfigs (use IAP or a bastion)."
        ]
    return []


AWS_NIC_FIX = (
    "give `NetworkInterfaces: [{DeviceIndex: 0, AssociatePublicIpAddress: false, SubnetId: <a private "
    "subnet>, Groups: [<the cluster's security group id>]}]` (see cluster_configs/gpu.yaml)"
)


def _aws_nic_problems(where: str, node_config: dict) -> list[str]:
    """An AWS node type launches with no public IP, in a way Ray 2.60's AWS provider honours.

    Ray copies each interface's SubnetId and Groups into the node type and refuses SubnetId(s) or
    SecurityGroupIds beside NetworkInterfaces (ray/autoscaler/_private/aws/config.py). AWS gives a
    node launched with several interfaces (EFA) no public IP, and refuses AssociatePublicIpAddress there.
    """
    nics = node_config.get("NetworkInterfaces")
    ports = ", ".join(map(str, RAY_PORTS))
    if not isinstance(nics, list) or not nics:
        return [
            f"{where}.NetworkInterfaces: not set, so AWS gives the node a public IP (Ray picks a subnet "
            f"that maps one) and ports {ports} rest on the security group alone; {AWS_NIC_FIX}."
        ]
    problems = []
    for i, nic in enumerate(nics):
        nic = nic if isinstance(nic, dict) else {}
        public = nic.get("AssociatePublicIpAddress")
        if len(nics) == 1 and public is not False:
            problems.append(
                f"{where}.NetworkInterfaces[{i}].AssociatePublicIpAddress: {public!r}, so the node may get "
                f"a public IP (the subnet's default decides) that exposes ports {ports}; set it to false."
            )
        elif len(nics) > 1 and public is not None:
            problems.append(
                f"{where}.NetworkInterfaces[{i}].AssociatePublicIpAddress: set on a node with several "
                "interfaces, which AWS refuses (it gives such a node no public IP); remove it."
            )
        if not nic.get("SubnetId") or not nic.get("Groups"):
            problems.append(
                f"{where}.NetworkInterfaces[{i}]: needs SubnetId and Groups (Ray takes the subnet and the "
                f"security groups from each interface); {AWS_NIC_FIX}."
            )
    both = [k for k in ("SubnetId", "SubnetIds", "SecurityGroupIds") if k in node_config]
    if both:
        problems.append(
            f"{where}.{both[0]}: set beside NetworkInterfaces, which Ray refuses; give the subnet and the "
            "security groups in each interface only."
        )
    return problems


def kube_file_problems(docs: list[dict]) -> list[str]:
    """A manifest that makes a Ray cluster also ships the NetworkPolicy that fences it in, and, when
    its GCS keeps state in Redis, the one that admits only the cluster's head to Redis."""
    clusters = [d for d in docs if d.get("kind") in ("RayCluster", "RayJob")]
    policies = [d for d in docs if d.get("kind") == "NetworkPolicy"]
    problems = []
    for doc in clusters:
        name = _cluster_name(doc)
        if not any(_fences(p, name) for p in policies):
            problems.append(
                f"NetworkPolicy: none selects the pods of {name!r} ({CLUSTER_LABEL}: {name}) with "
                "policyTypes [Ingress], so any pod in the cluster reaches ports "
                f"{', '.join(map(str, RAY_PORTS))}; add the NetworkPolicy of "
                "cluster_configs/kuberay/raycluster.yaml."
            )
        port = _redis_port(doc)
        if port is not None and not any(_admits_head_to_redis(p, name, port) for p in policies):
            problems.append(
                f"NetworkPolicy: none selects the Redis pods of gcsFaultToleranceOptions.redisAddress and "
                f"admits only the head of {name!r} ({CLUSTER_LABEL}: {name}, {HEAD_LABEL}: head) on port "
                f"{port}, so any pod in the Kubernetes cluster that learns the password reads and rewrites "
                "the GCS's state (jobs, actors, the cluster's KV store); add the NetworkPolicy rayrl-redis of "
                "cluster_configs/kuberay/raycluster.yaml, its podSelector naming your Redis pods' labels."
            )
    return problems


def _redis_port(doc: dict) -> int | None:
    """The port of the cluster's GCS Redis (gcsFaultToleranceOptions.redisAddress), None without one."""
    spec = doc.get("spec") or {}
    if doc.get("kind") == "RayJob":
        spec = spec.get("rayClusterSpec") or {}
    address = str(((spec.get("gcsFaultToleranceOptions") or {}).get("redisAddress")) or "")
    if not address:
        return None
    tail = address.split("://")[-1].rsplit("@", 1)[-1]
    port = tail.rsplit(":", 1)[1] if ":" in tail else ""
    return int(port) if port.isdigit() else 6379


def _head_only_source(src: dict, cluster: str | None = None) -> bool:
    """A `from` entry that admits only a Ray cluster's head pods (that cluster's, when named)."""
    labels = (src.get("podSelector") or {}).get("matchLabels") or {}
    if set(src) != {"podSelector"} or labels.get(HEAD_LABEL) != "head" or not labels.get(CLUSTER_LABEL):
        return False
    return cluster is None or labels[CLUSTER_LABEL] == cluster


def _head_only_rule(rule: dict) -> bool:
    """An ingress rule that admits only Ray head pods, on named ports."""
    ports = rule.get("ports") or []
    sources = rule.get("from") or []
    return (
        bool(ports)
        and all((p or {}).get("port") for p in ports)
        and bool(sources)
        and all(_head_only_source(src or {}) for src in sources)
    )


def _admits_head_to_redis(policy: dict, cluster: str, port: int) -> bool:
    spec = policy.get("spec") or {}
    labels = (spec.get("podSelector") or {}).get("matchLabels") or {}
    if not labels or CLUSTER_LABEL in labels or "Ingress" not in (spec.get("policyTypes") or []):
        return False
    rules = [r or {} for r in spec.get("ingress") or []]
    return all(_head_only_rule(r) for r in rules) and any(
        any(_head_only_source(src or {}, cluster) for src in r.get("from") or [])
        and any((p or {}).get("port") == port for p in r.get("ports") or [])
        for r in rules
    )


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
    """A NetworkPolicy document itself: it must select pods and list who may reach them.

    It fences a Ray cluster's pods (podSelector with CLUSTER_LABEL), or a service the cluster uses,
    such as the GCS's Redis (any other podSelector): then it admits only Ray head pods, on named ports.
    """
    spec = doc.get("spec") or {}
    labels = (spec.get("podSelector") or {}).get("matchLabels") or {}
    if labels and not labels.get(CLUSTER_LABEL):
        return [
            f"spec.ingress[{i}]: admits more than a Ray cluster's head pods ({CLUSTER_LABEL}: NAME, "
            f"{HEAD_LABEL}: head) on named ports; a policy for the pods a cluster uses (its GCS's Redis) "
            "admits only the head, on the Redis port (see cluster_configs/kuberay/raycluster.yaml)."
            for i, rule in enumerate(spec.get("ingress") or [])
            if not _head_only_rule(rule or {})
        ]
    problems = []
    if not labels.get(CLUSTER_LABEL):
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
