"""rayrl's own rules for launcher YAMLs, run once Ray's launcher has accepted the file.

Ray's schema says a file is well formed, not that the cluster it makes is safe or useful: these
rules say learners get GPUs, the image runs the installed Ray, `ray start` uses token auth with
the token read from a mounted file, the dashboard stays on localhost, Prometheus finds metrics on
its port, the security group is not open to the world, and nodes install this rayrl.
`rayrl.cluster.launcher.validate_launcher` calls each; each returns problem sentences.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
import sys

from rayrl.cluster.common import LEARNER_LABEL, image_version_problem

METRICS_PORT = 8080  # Prometheus scrapes every node here
TOKEN_DEFAULT_PATH = "~/.ray/auth_token"  # where Ray looks for the token without RAY_AUTH_TOKEN_PATH
_AWS_GPU_FAMILY = re.compile(r"^(p\d+[a-z]*|g\d+[a-z]*)\.")  # p4de, p5, g5, g6e, ...
_GCP_GPU_MACHINE = re.compile(r"^(a2|a3|a4|g2)-")  # accelerator-optimized
_LOCALHOST = {"127.0.0.1", "localhost", "::1"}


def image_problems(config: dict, ray_version: str) -> list[str]:
    """Every image the nodes run must name ``ray_version``: nodes and driver must run the same Ray."""
    docker = config.get("docker") or {}
    images = {f"docker.{k}": docker[k] for k in ("image", "head_image", "worker_image") if docker.get(k)}
    for name, node in (config.get("available_node_types") or {}).items():
        image = ((node or {}).get("docker") or {}).get("worker_image")
        if image:
            images[f"available_node_types.{name}.docker.worker_image"] = image
    if "docker.image" not in images and not {"docker.head_image", "docker.worker_image"} <= set(images):
        return [
            f"docker.image: not set, so nodes run whatever Ray their machine image has; set it to "
            f"rayproject/ray:{ray_version}-py{sys.version_info.major}{sys.version_info.minor}-gpu."
        ]
    return [m for key, image in images.items() if (m := image_version_problem(key, image, ray_version))]


def _commands(config: dict, key: str) -> list[str]:
    value = config.get(key) or []
    return [str(c) for c in value] if isinstance(value, list) else [str(value)]


def auth_problems(config: dict) -> list[str]:
    """`ray start` with token auth and the token from a mounted file: a cluster without it runs anyone's code."""
    problems = []
    run_options = " ".join(str(o) for o in ((config.get("docker") or {}).get("run_options") or []))
    in_container = re.search(r"(-e|--env)[ =]RAY_AUTH_MODE=token\b", run_options) is not None
    token_paths: set[str] = set()
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        starts = [c for c in _commands(config, key) if "ray start" in c]
        if not starts:
            problems.append(f"{key}: no `ray start` command; add one (see cluster_configs/gpu.yaml).")
        elif not in_container and not all(re.search(r"\bRAY_AUTH_MODE=token\b", c) for c in starts):
            problems.append(
                f"{key}: `ray start` runs without token authentication, so anyone who reaches "
                "the cluster can run code on it; set RAY_AUTH_MODE=token in the same command "
                "(export RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH=$HOME/.ray/auth_token; ray start ...)."
            )
        for c in starts:
            token_paths.update(_normalise_home(m) for m in re.findall(r"RAY_AUTH_TOKEN_PATH=(\S+?);?(?:\s|$)", c))
    if "RAY_AUTH_TOKEN=" in json.dumps(config, default=str):
        problems.append(
            "RAY_AUTH_TOKEN: the token is written into the cluster YAML; remove it and mount the "
            f"token file instead (file_mounts: {{{TOKEN_DEFAULT_PATH}: {TOKEN_DEFAULT_PATH}}})."
        )
    mounts = {_normalise_home(str(k)) for k in (config.get("file_mounts") or {})}
    for path in sorted(token_paths or {TOKEN_DEFAULT_PATH}):
        if path not in mounts:
            problems.append(
                f"file_mounts: no entry puts the token file at {path}, where the nodes read it; add "
                f"`{path}: ~/.ray/auth_token` (your local token file, from `ray get-auth-token "
                "--generate`)."
            )
    return problems


def _normalise_home(path: str) -> str:
    path = path.strip("'\"")
    for home in ("$HOME/", "${HOME}/"):
        if path.startswith(home):
            return "~/" + path[len(home) :]
    return path


def start_flag_problems(config: dict) -> list[str]:
    """Dashboard bound to localhost (its job API runs code) and metrics on the port Prometheus scrapes."""
    problems = []
    head = " ".join(_commands(config, "head_start_ray_commands"))
    host = re.search(r"--dashboard-host[= ](\S+)", head)
    if host and host.group(1).strip("'\";") not in _LOCALHOST:
        problems.append(
            f"head_start_ray_commands: --dashboard-host={host.group(1)} exposes the dashboard (and "
            "its job API) on the network; bind it to 127.0.0.1 and reach it with `ray dashboard "
            "CLUSTER.yaml` (an SSH tunnel)."
        )
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        text = " ".join(_commands(config, key))
        port = re.search(r"--metrics-export-port[= ](\d+)", text)
        if "ray start" in text and (port is None or int(port.group(1)) != METRICS_PORT):
            problems.append(
                f"{key}: `ray start` lacks --metrics-export-port={METRICS_PORT}, the fixed port "
                "Prometheus scrapes on every node; add it."
            )
    return problems


def gpu_problems(config: dict) -> list[str]:
    """Learner node types must have GPUs Ray can see, or learners wait for resources that never come."""
    provider = config["provider"]["type"]
    if provider == "local":
        workers = " ".join(_commands(config, "worker_start_ray_commands"))
        if re.search(r"--num-gpus[= ]0(?![\d.])", workers):
            return [
                "worker_start_ray_commands: --num-gpus=0 hides the machines' GPUs from Ray, so learners "
                "have nowhere to run; drop the flag (Ray detects each machine's GPUs)."
            ]
        return []
    node_types = config.get("available_node_types") or {}
    learners = {
        n: t for n, t in node_types.items() if ((t or {}).get("labels") or {}).get(LEARNER_LABEL[0]) == LEARNER_LABEL[1]
    }
    if not learners:
        return [
            f"available_node_types: no node type is labelled {LEARNER_LABEL[0]}: {LEARNER_LABEL[1]}, so "
            "nothing says where learners run; add `labels: {rayrl.io/role: learner}` to the GPU node types."
        ]
    return [m for name, node in learners.items() if (m := _learner_gpu_problem(provider, name, node or {}))]


def _learner_gpu_problem(provider: str, name: str, node: dict) -> str | None:
    where = f"available_node_types.{name}"
    declared = (node.get("resources") or {}).get("GPU")
    nc = node.get("node_config") or {}
    if provider == "aws":
        instance = str(nc.get("InstanceType", ""))
        implied = bool(_AWS_GPU_FAMILY.match(instance))
        hardware = f"InstanceType {instance or '(none)'}"
    elif provider == "gcp":
        count = sum(int(a.get("acceleratorCount", 0)) for a in nc.get("guestAccelerators") or [])
        implied = count > 0 or bool(_GCP_GPU_MACHINE.match(str(nc.get("machineType", ""))))
        hardware = f"machineType {nc.get('machineType')} with {count} guestAccelerators"
    else:
        implied, hardware = bool(declared), "its node_config"
    if declared is not None and declared <= 0:
        return (
            f"{where}.resources.GPU: {declared} on a node type labelled for learners; learners need GPUs, "
            "declare the node's GPU count."
        )
    if not implied:
        return (
            f"{where}: labelled for learners but {hardware} has no GPUs; use a GPU machine "
            "(e.g. p5.48xlarge, a3-highgpu-8g) or drop the learner label."
        )
    if declared is None and provider != "aws":  # only the AWS provider reads GPU counts from the cloud
        return f"{where}.resources: no GPU count; {provider} does not detect it, declare resources: {{GPU: N}}."
    return None


def worker_count_problems(config: dict, prepared: dict) -> list[str]:
    """min_workers above max_workers: the autoscaler cannot satisfy it."""
    problems = []
    if config["provider"]["type"] == "local":
        low, high = config.get("min_workers"), config.get("max_workers")
        if isinstance(low, int) and isinstance(high, int) and low > high:
            problems.append(f"min_workers: {low} is above max_workers ({high}); lower it or raise max_workers.")
        return problems
    for name, node in prepared.get("available_node_types", {}).items():
        low, high = node.get("min_workers", 0), node.get("max_workers", 0)
        if isinstance(low, int) and isinstance(high, int) and low > high:
            problems.append(
                f"available_node_types.{name}.min_workers: {low} is above its max_workers ({high}); "
                "lower min_workers or raise max_workers."
            )
    return problems


def security_problems(config: dict) -> list[str]:
    """On AWS, a named security group with nothing open to the whole internet (Ray's default opens SSH)."""
    if config["provider"]["type"] != "aws":
        return []
    problems = []
    group = config["provider"].get("security_group") or {}
    own = all(
        "SecurityGroupIds" in ((n or {}).get("node_config") or {})
        for n in (config.get("available_node_types") or {}).values()
    )
    if not group.get("GroupName") and not own:
        problems.append(
            "provider.security_group.GroupName: not set, so Ray creates a group named after the "
            "cluster with SSH open to the world; name a group you created (docs/cluster.md) that "
            "admits only the cluster itself and your admin CIDR."
        )
    for rule in group.get("IpPermissions") or []:
        ranges = [r.get("CidrIp") for r in rule.get("IpRanges") or []] + [
            r.get("CidrIpv6") for r in rule.get("Ipv6Ranges") or []
        ]
        if any(r in ("0.0.0.0/0", "::/0") for r in ranges):
            problems.append(
                f"provider.security_group.IpPermissions: port {rule.get('FromPort')} is open to the "
                "whole internet; restrict CidrIp to your admin CIDR."
            )
    return problems


def setup_problems(config: dict) -> list[str]:
    """Nodes must install this checkout's rayrl, or jobs import another version or none."""
    version = importlib.metadata.version("rayrl")
    text = " ".join(
        c for k in ("setup_commands", "head_setup_commands", "worker_setup_commands") for c in _commands(config, k)
    )
    if f"rayrl-{version}-" in text or f"rayrl=={version}" in text:
        return []
    return [
        f"setup_commands: no command installs rayrl {version} (the version of this checkout), so nodes would "
        f"run another rayrl or none; add `pip install $HOME/rayrl-dist/rayrl-{version}-py3-none-any.whl` with "
        "file_mounts {~/rayrl-dist: ./dist} (build it with `pip wheel --no-deps -w dist .`)."
    ]
