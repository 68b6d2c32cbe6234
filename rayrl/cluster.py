"""`rayrl cluster validate`: check cluster YAMLs offline, before `ray up` or `kubectl apply`.

A bad cluster file is found late and paid for in GPU-hours, and Ray's launcher hides some
mistakes: it fills every top-level key a file leaves out from its own defaults.yaml (a missing
`setup_commands` installs a nightly development wheel of Ray). So a launcher YAML goes through
Ray's own default-filling and schema (`prepare_config`, `validate_config`), then rayrl's rules:
no key filled behind the user's back, learner node types with GPUs, the image's Ray equal to the
installed Ray, token auth on with the token read from a mounted file, the dashboard on localhost,
metrics on the Prometheus port. KubeRay manifests (RayCluster, RayJob, Volcano Queue) get the
Kubernetes counterparts. Nothing here starts Ray or reaches a cloud.

`fake_multinode_config` turns a launcher YAML into Ray's `fake_multinode` provider config, so the
autoscaling behaviour of the real node types can be tried on one machine (tests/test_autoscaling.py).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import difflib
import functools
import importlib.metadata
import io
import json
import logging
import re
import sys
import textwrap
from pathlib import Path
from typing import Any, Iterator, Sequence

import yaml

EXIT_OK, EXIT_INVALID = 0, 2
LEARNER_LABEL = ("rayrl.io/role", "learner")   # node types that host learners carry this label
METRICS_PORT = 8080                             # Prometheus scrapes every node here
TOKEN_DEFAULT_PATH = "~/.ray/auth_token"        # where Ray looks for the token without RAY_AUTH_TOKEN_PATH
KUBE_KINDS = {"RayCluster": "ray.io/v1", "RayJob": "ray.io/v1", "Queue": "scheduling.volcano.sh/v1beta1"}
# Ray builds the one node type of an on-premise (provider: local) cluster itself.
LOCAL_BUILT_KEYS = {"available_node_types", "head_node_type"}
_AWS_GPU_FAMILY = re.compile(r"^(p\d+[a-z]*|g\d+[a-z]*)\.")          # p4de, p5, g5, g6e, ...
_GCP_GPU_MACHINE = re.compile(r"^(a2|a3|a4|g2)-")                     # accelerator-optimized
_LOCALHOST = {"127.0.0.1", "localhost", "::1"}


def validate_file(path: str | Path) -> list[str]:
    """Problems with one cluster YAML (launcher or KubeRay), each a sentence naming key and fix."""
    p = Path(path)
    if not p.is_file():
        return [f"{p}: no such file; give a cluster YAML such as cluster_configs/gpu.yaml."]
    try:
        docs = [d for d in yaml.safe_load_all(p.read_text()) if d is not None]
    except yaml.YAMLError as exc:
        return [f"{p}: not valid YAML ({' '.join(str(exc).split())}); fix the syntax at that line."]
    except UnicodeDecodeError:
        return [f"{p}: not a text file; give a cluster YAML."]
    if not docs:
        return [f"{p}: empty; a launcher YAML needs cluster_name, provider, ... (see cluster_configs/gpu.yaml)."]
    if any(not isinstance(d, dict) for d in docs):
        bad = next(type(d).__name__ for d in docs if not isinstance(d, dict))
        return [f"{p}: holds a {bad}, not a mapping of keys; a cluster YAML is key: value pairs."]
    if all("apiVersion" in d or "kind" in d for d in docs):
        try:
            problems = [m for d in docs for m in validate_kube(d)]
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            problems = [f"a section has an unexpected shape ({type(exc).__name__}: {_one_line(exc)}); compare it "
                        "with cluster_configs/kuberay/."]
    elif len(docs) > 1:
        problems = ["holds several YAML documents; a launcher YAML (ray up) is one document, a KubeRay "
                    "manifest gives every document an apiVersion and kind."]
    else:
        problems = validate_launcher(docs[0])
    return [f"{p}: {m}" for m in problems]


# ---------------------------------------------------------------------------------------------
# Launcher YAMLs (ray up)


def validate_launcher(config: dict) -> list[str]:
    """Problems with a launcher config: Ray's default-filling and schema first, then rayrl's rules."""
    import ray

    provider = config.get("provider")
    if not isinstance(provider, dict) or not isinstance(provider.get("type"), str):
        return ["provider.type: missing; name the cloud (provider: {type: aws, region: ...}), or give "
                "apiVersion and kind for a KubeRay manifest."]
    from ray.autoscaler._private.providers import _DEFAULT_CONFIGS

    known = sorted(set(_DEFAULT_CONFIGS) | {"external"})
    if provider["type"] not in known:
        near = difflib.get_close_matches(provider["type"], known, n=1, cutoff=0.5)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        return [f"provider.type: {provider['type']!r} is not a provider Ray's launcher knows{hint}; valid: "
                f"{', '.join(known)}."]
    if provider["type"] == "local" and (written := sorted(LOCAL_BUILT_KEYS & set(config))):
        return [f"{key}: not allowed with provider local (Ray builds the single on-premise node type itself); "
                "remove it and list the machines in provider.head_ip and provider.worker_ips." for key in written]
    problems, prepared = _ray_checks(config)
    if prepared is None:
        return problems
    checks = (lambda: _filled_keys(config, prepared), lambda: _image_problems(config, ray.__version__),
              lambda: _auth_problems(config), lambda: _start_flag_problems(config), lambda: _gpu_problems(config),
              lambda: _worker_count_problems(config, prepared), lambda: _security_problems(config),
              lambda: _setup_problems(config))
    schema_failed = bool(problems)
    for check in checks:
        try:
            problems += check()
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            if not schema_failed:  # a shape Ray's schema allows but rayrl's rules do not expect
                problems.append(f"a section has an unexpected shape ({type(exc).__name__}: {_one_line(exc)}); "
                                "compare it with cluster_configs/gpu.yaml.")
    return problems


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Swallow what Ray's launcher code prints and logs while it reads a config."""
    previous = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        logging.disable(previous)


@functools.lru_cache(maxsize=1)
def _ray_schema() -> dict:
    import ray.autoscaler

    return json.loads((Path(ray.autoscaler.__file__).parent / "ray-schema.json").read_text())


def _ray_checks(config: dict) -> tuple[list[str], dict | None]:
    """Ray's prepare_config, then Ray's schema (every error) and Ray's validate_config."""
    import jsonschema
    from ray.autoscaler._private.util import prepare_config, validate_config

    try:
        with _quiet():
            prepared = prepare_config(copy.deepcopy(config))
    except Exception as exc:  # Ray raises KeyError, AssertionError, click exceptions ... here
        return [f"Ray's launcher cannot read it ({type(exc).__name__}: {_one_line(exc)}); fix the key it "
                "names (compare with cluster_configs/gpu.yaml)."], None
    if (where := _non_string_key(prepared)) is not None:  # Ray's schema check raises TypeError on them
        return [f"{where}: a key that is not a string; YAML reads unquoted 0:, 1.5: or true: as numbers and "
                "booleans, quote it."], None
    errors = sorted(jsonschema.Draft7Validator(_ray_schema()).iter_errors(prepared),
                    key=lambda e: [str(p) for p in e.path])
    problems = [f"{_dotted(e.absolute_path) or 'top level'}: {_one_line(e.message)} (Ray's cluster schema); "
                "fix or remove it." for e in errors]
    if not problems:
        try:
            with _quiet():
                validate_config(prepared)
        except Exception as exc:
            problems.append(f"Ray's launcher rejects it: {_one_line(exc)}")
    return problems, prepared


def _non_string_key(node: Any, path: tuple = ()) -> str | None:
    """Dotted path of the first mapping key that is not a string, else None."""
    if isinstance(node, dict):
        for key, value in node.items():
            if not isinstance(key, str):
                return _dotted((*path, key))
            if (found := _non_string_key(value, (*path, key))) is not None:
                return found
    elif isinstance(node, list):
        for i, value in enumerate(node):
            if (found := _non_string_key(value, (*path, i))) is not None:
                return found
    return None


def _filled_keys(config: dict, prepared: dict) -> list[str]:
    """Keys Ray's defaults would fill in: every key the launcher reads must be written out."""
    local = config["provider"]["type"] == "local"
    unknown = [k for k in config if k not in _ray_schema()["properties"]]
    problems = []
    for key in prepared:
        if key not in config and not (local and key in LOCAL_BUILT_KEYS):
            near = difflib.get_close_matches(key, unknown, n=1, cutoff=0.7)
            hint = f" (is {near[0]!r} a misspelling of it?)" if near else ""
            problems.append(f"{key}: missing{hint}, so Ray's launcher silently fills it from its "
                            f"{config['provider']['type']} defaults with {_short(prepared[key])}; write the key "
                            "explicitly (an empty value if you want none).")
    if local:
        return problems
    for name, node in prepared.get("available_node_types", {}).items():
        raw = (config.get("available_node_types") or {}).get(name) or {}
        for key in node:
            if key not in raw:
                problems.append(f"available_node_types.{name}.{key}: missing, so Ray fills it with "
                                f"{_short(node[key])}; write it explicitly.")
    return problems


def _image_problems(config: dict, ray_version: str) -> list[str]:
    docker = config.get("docker") or {}
    images = {f"docker.{k}": docker[k] for k in ("image", "head_image", "worker_image") if docker.get(k)}
    for name, node in (config.get("available_node_types") or {}).items():
        image = ((node or {}).get("docker") or {}).get("worker_image")
        if image:
            images[f"available_node_types.{name}.docker.worker_image"] = image
    if "docker.image" not in images and not {"docker.head_image", "docker.worker_image"} <= set(images):
        return [f"docker.image: not set, so nodes run whatever Ray their machine image has; set it to "
                f"rayproject/ray:{ray_version}-py{sys.version_info.major}{sys.version_info.minor}-gpu."]
    return [m for key, image in images.items() if (m := _image_version_problem(key, image, ray_version))]


def _image_version_problem(key: str, image: Any, ray_version: str) -> str | None:
    found = image_ray_version(str(image))
    if found == ray_version:
        return None
    if found is None:
        return (f"{key}: {image!r} does not say which Ray it runs; use a tag that starts with the Ray version "
                f"(rayproject/ray:{ray_version}-py311-gpu) or contains ray{ray_version}.")
    return (f"{key}: {image!r} runs Ray {found} but this machine has Ray {ray_version} (pyproject.toml); pin "
            f"the tag to {ray_version}.")


def image_ray_version(image: str) -> str | None:
    """The Ray version an image tag names: 'rayproject/ray:2.60.0-py311-gpu' -> '2.60.0'.

    Ray's own images (ray, ray-ml, ray-llm) start the tag with it; other images must say
    ``ray2.60.0`` somewhere in the tag (e.g. 'acme/rayrl:0.1.0-ray2.60.0-gpu').
    """
    last = image.rsplit("/", 1)[-1]
    if "@" in last or ":" not in last:
        return None
    repo, tag = last.split(":", 1)
    match = re.search(r"ray-?(\d+\.\d+\.\d+)(?![\d.])", tag)
    if match is None and repo in ("ray", "ray-ml", "ray-llm"):   # rayproject images: the tag starts with it
        match = re.match(r"(\d+\.\d+\.\d+)(?![\d.])", tag)
    return match.group(1) if match else None


def _commands(config: dict, key: str) -> list[str]:
    value = config.get(key) or []
    return [str(c) for c in value] if isinstance(value, list) else [str(value)]


def _auth_problems(config: dict) -> list[str]:
    problems = []
    run_options = " ".join(str(o) for o in ((config.get("docker") or {}).get("run_options") or []))
    in_container = re.search(r"(-e|--env)[ =]RAY_AUTH_MODE=token\b", run_options) is not None
    token_paths = set()
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        starts = [c for c in _commands(config, key) if "ray start" in c]
        if not starts:
            problems.append(f"{key}: no `ray start` command; add one (see cluster_configs/gpu.yaml).")
        elif not in_container and not all(re.search(r"\bRAY_AUTH_MODE=token\b", c) for c in starts):
            problems.append(f"{key}: `ray start` runs without token authentication, so anyone who reaches "
                            "the cluster can run code on it; set RAY_AUTH_MODE=token in the same command "
                            "(export RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH=$HOME/.ray/auth_token; ray start ...).")
        for c in starts:
            token_paths.update(_normalise_home(m) for m in re.findall(r"RAY_AUTH_TOKEN_PATH=(\S+?);?(?:\s|$)", c))
    if "RAY_AUTH_TOKEN=" in json.dumps(config, default=str):
        problems.append("RAY_AUTH_TOKEN: the token is written into the cluster YAML; remove it and mount the "
                        f"token file instead (file_mounts: {{{TOKEN_DEFAULT_PATH}: {TOKEN_DEFAULT_PATH}}}).")
    mounts = {_normalise_home(str(k)) for k in (config.get("file_mounts") or {})}
    for path in sorted(token_paths or {TOKEN_DEFAULT_PATH}):
        if path not in mounts:
            problems.append(f"file_mounts: no entry puts the token file at {path}, where the nodes read it; add "
                            f"`{path}: ~/.ray/auth_token` (your local token file, from `ray get-auth-token "
                            "--generate`).")
    return problems


def _normalise_home(path: str) -> str:
    path = path.strip("'\"")
    for home in ("$HOME/", "${HOME}/"):
        if path.startswith(home):
            return "~/" + path[len(home):]
    return path


def _start_flag_problems(config: dict) -> list[str]:
    problems = []
    head = " ".join(_commands(config, "head_start_ray_commands"))
    host = re.search(r"--dashboard-host[= ](\S+)", head)
    if host and host.group(1).strip("'\";") not in _LOCALHOST:
        problems.append(f"head_start_ray_commands: --dashboard-host={host.group(1)} exposes the dashboard (and "
                        "its job API) on the network; bind it to 127.0.0.1 and reach it with `ray dashboard "
                        "CLUSTER.yaml` (an SSH tunnel).")
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        text = " ".join(_commands(config, key))
        port = re.search(r"--metrics-export-port[= ](\d+)", text)
        if "ray start" in text and (port is None or int(port.group(1)) != METRICS_PORT):
            problems.append(f"{key}: `ray start` lacks --metrics-export-port={METRICS_PORT}, the fixed port "
                            "Prometheus scrapes on every node; add it.")
    return problems


def _gpu_problems(config: dict) -> list[str]:
    provider = config["provider"]["type"]
    if provider == "local":
        workers = " ".join(_commands(config, "worker_start_ray_commands"))
        if re.search(r"--num-gpus[= ]0(?![\d.])", workers):
            return ["worker_start_ray_commands: --num-gpus=0 hides the machines' GPUs from Ray, so learners "
                    "have nowhere to run; drop the flag (Ray detects each machine's GPUs)."]
        return []
    node_types = config.get("available_node_types") or {}
    learners = {n: t for n, t in node_types.items()
                if ((t or {}).get("labels") or {}).get(LEARNER_LABEL[0]) == LEARNER_LABEL[1]}
    if not learners:
        return [f"available_node_types: no node type is labelled {LEARNER_LABEL[0]}: {LEARNER_LABEL[1]}, so "
                "nothing says where learners run; add `labels: {rayrl.io/role: learner}` to the GPU node types."]
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
        return (f"{where}.resources.GPU: {declared} on a node type labelled for learners; learners need GPUs, "
                "declare the node's GPU count.")
    if not implied:
        return (f"{where}: labelled for learners but {hardware} has no GPUs; use a GPU machine "
                "(e.g. p5.48xlarge, a3-highgpu-8g) or drop the learner label.")
    if declared is None and provider != "aws":  # only the AWS provider reads GPU counts from the cloud
        return f"{where}.resources: no GPU count; {provider} does not detect it, declare resources: {{GPU: N}}."
    return None


def _worker_count_problems(config: dict, prepared: dict) -> list[str]:
    problems = []
    if config["provider"]["type"] == "local":
        low, high = config.get("min_workers"), config.get("max_workers")
        if isinstance(low, int) and isinstance(high, int) and low > high:
            problems.append(f"min_workers: {low} is above max_workers ({high}); lower it or raise max_workers.")
        return problems
    for name, node in prepared.get("available_node_types", {}).items():
        low, high = node.get("min_workers", 0), node.get("max_workers", 0)
        if isinstance(low, int) and isinstance(high, int) and low > high:
            problems.append(f"available_node_types.{name}.min_workers: {low} is above its max_workers ({high}); "
                            "lower min_workers or raise max_workers.")
    return problems


def _security_problems(config: dict) -> list[str]:
    if config["provider"]["type"] != "aws":
        return []
    problems = []
    group = config["provider"].get("security_group") or {}
    own = all("SecurityGroupIds" in ((n or {}).get("node_config") or {})
              for n in (config.get("available_node_types") or {}).values())
    if not group.get("GroupName") and not own:
        problems.append("provider.security_group.GroupName: not set, so Ray creates a group named after the "
                        "cluster with SSH open to the world; name a group you created (docs/cluster.md) that "
                        "admits only the cluster itself and your admin CIDR.")
    for rule in group.get("IpPermissions") or []:
        ranges = [r.get("CidrIp") for r in rule.get("IpRanges") or []] + \
                 [r.get("CidrIpv6") for r in rule.get("Ipv6Ranges") or []]
        if any(r in ("0.0.0.0/0", "::/0") for r in ranges):
            problems.append(f"provider.security_group.IpPermissions: port {rule.get('FromPort')} is open to the "
                            "whole internet; restrict CidrIp to your admin CIDR.")
    return problems


def _setup_problems(config: dict) -> list[str]:
    version = importlib.metadata.version("rayrl")
    text = " ".join(c for k in ("setup_commands", "head_setup_commands", "worker_setup_commands")
                    for c in _commands(config, k))
    if f"rayrl-{version}-" in text or f"rayrl=={version}" in text:
        return []
    return [f"setup_commands: no command installs rayrl {version} (the version of this checkout), so nodes would "
            f"run another rayrl or none; add `pip install $HOME/rayrl-dist/rayrl-{version}-py3-none-any.whl` with "
            "file_mounts {~/rayrl-dist: ./dist} (build it with `pip wheel --no-deps -w dist .`)."]


# ---------------------------------------------------------------------------------------------
# KubeRay manifests


def validate_kube(doc: dict) -> list[str]:
    """Problems with one Kubernetes document: a RayCluster, a RayJob or a Volcano Queue."""
    kind, api = doc.get("kind"), doc.get("apiVersion")
    name = (doc.get("metadata") or {}).get("name") or "(unnamed)"
    if kind not in KUBE_KINDS:
        return [f"kind: {kind!r} is not one rayrl checks; use RayCluster, RayJob (apiVersion ray.io/v1) or Queue "
                "(scheduling.volcano.sh/v1beta1)."]
    where = f"{kind} {name}"
    if api != KUBE_KINDS[kind]:
        return [f"{where}: apiVersion: {api!r}; {kind} needs apiVersion {KUBE_KINDS[kind]}."]
    spec = doc.get("spec")
    if not isinstance(spec, dict):
        return [f"{where}: spec: missing or not a mapping; see cluster_configs/kuberay/."]
    if kind == "RayCluster":
        return [f"{where}: {m}" for m in _raycluster_problems(spec, "spec")]
    if kind == "RayJob":
        problems = [] if str(spec.get("entrypoint") or "").strip() else \
            ["spec.entrypoint: missing; give the command the job runs (python experiments/sweep.py ...)."]
        cluster = spec.get("rayClusterSpec")
        if not isinstance(cluster, dict):
            problems.append("spec.rayClusterSpec: missing; the RayJob needs the cluster it creates.")
        else:
            problems += _raycluster_problems(cluster, "spec.rayClusterSpec")
        return [f"{where}: {m}" for m in problems]
    return [] if isinstance(spec.get("capability"), dict) else \
        [f"{where}: spec.capability: missing; give the queue's cpu, memory and nvidia.com/gpu cap."]


def _raycluster_problems(spec: dict, at: str) -> list[str]:
    import ray

    problems = []
    version = str(spec.get("rayVersion", ""))
    if version != ray.__version__:
        problems.append(f"{at}.rayVersion: {version or '(missing)'!s} but this machine has Ray {ray.__version__} "
                        f"(pyproject.toml); set rayVersion: '{ray.__version__}'.")
    if ((spec.get("authOptions") or {}).get("mode")) != "token":
        problems.append(f"{at}.authOptions.mode: not token, so the cluster accepts unauthenticated jobs; set "
                        "authOptions: {mode: token} (KubeRay >= 1.5.1).")
    head = spec.get("headGroupSpec") or {}
    if head.get("serviceType", "ClusterIP") != "ClusterIP":
        problems.append(f"{at}.headGroupSpec.serviceType: {head['serviceType']} exposes the dashboard outside the "
                        "cluster; use ClusterIP and `kubectl port-forward`.")
    groups = [(f"{at}.headGroupSpec", head)] + [
        (f"{at}.workerGroupSpecs[{i}]", g or {}) for i, g in enumerate(spec.get("workerGroupSpecs") or [])]
    gpu_groups = 0
    for where, group in groups:
        containers = ((group.get("template") or {}).get("spec") or {}).get("containers") or []
        if not containers:
            problems.append(f"{where}.template.spec.containers: empty; the first container runs Ray.")
            continue
        if (m := _image_version_problem(f"{where}.template.spec.containers[0].image",
                                        containers[0].get("image", ""), ray.__version__)):
            problems.append(m)
        for j, c in enumerate(containers):
            res = c.get("resources") or {}
            limit = (res.get("limits") or {}).get("nvidia.com/gpu")
            request = (res.get("requests") or {}).get("nvidia.com/gpu")
            if request is not None and str(request) != str(limit):
                problems.append(f"{where}.template.spec.containers[{j}].resources.limits.nvidia.com/gpu: "
                                f"{limit} while requests ask {request}; Kubernetes needs GPU limits equal to requests.")
            gpu_groups += where != f"{at}.headGroupSpec" and _positive(limit)
            if any(e.get("name") == "RAY_AUTH_TOKEN" and "value" in e for e in c.get("env") or []):
                problems.append(f"{where}.template.spec.containers[{j}].env.RAY_AUTH_TOKEN: the token is written "
                                "into the manifest; use authOptions (a Secret) instead.")
        low, high = group.get("minReplicas"), group.get("maxReplicas")
        if isinstance(low, int) and isinstance(high, int) and low > high:
            problems.append(f"{where}.minReplicas: {low} is above maxReplicas ({high}).")
    if not gpu_groups:
        problems.append(f"{at}.workerGroupSpecs: no group has resources.limits nvidia.com/gpu, so learners have no "
                        "GPUs; add a GPU worker group (limits: {nvidia.com/gpu: '8'}).")
    return problems


def _positive(value: Any) -> bool:
    try:
        return float(str(value)) > 0
    except ValueError:
        return False


# ---------------------------------------------------------------------------------------------
# A fake multinode cluster with the node types of a launcher YAML


def fake_multinode_config(launcher: dict, *, gpu_stand_in: str = "rayrl_fake_gpu", cpus_per_node: int = 1,
                          max_workers_per_type: int = 2, idle_timeout_minutes: float = 0.25,
                          head_cpus: int = 1, gcs_address: str | None = None) -> dict:
    """Ray's fake_multinode provider config whose worker types mirror the launcher's learner types.

    Each worker type keeps its name, labels and GPU count, with the GPUs replaced by the custom
    resource ``gpu_stand_in`` (so no CUDA is needed) and the CPUs scaled to ``cpus_per_node``. The
    result is written out in full because the pip wheel lacks Ray's fake_multinode defaults file.
    Start it with `RAY_FAKE_CLUSTER=1 ray start --head --autoscaling-config=FILE`.
    """
    workers = {}
    for name, node in (launcher.get("available_node_types") or {}).items():
        node = node or {}
        if name == launcher.get("head_node_type") or \
                (node.get("labels") or {}).get(LEARNER_LABEL[0]) != LEARNER_LABEL[1]:
            continue
        gpus = int((node.get("resources") or {}).get("GPU", 1))
        workers[name] = {
            "resources": {"CPU": cpus_per_node, gpu_stand_in: gpus, "object_store_memory": 150 * 1024 ** 2},
            "labels": dict(node.get("labels") or {}),
            "node_config": {},
            "min_workers": 0,
            "max_workers": min(int(node.get("max_workers", max_workers_per_type)), max_workers_per_type),
        }
    provider = {"type": "fake_multinode", "use_node_id_as_ip": True, "disable_node_updaters": True,
                "disable_launch_config_check": True}
    if gcs_address:
        provider["gcs_address"] = gcs_address
    return {
        "cluster_name": f"{launcher.get('cluster_name', 'rayrl')}-fake",
        "max_workers": max_workers_per_type * max(len(workers), 1),
        "upscaling_speed": launcher.get("upscaling_speed", 1.0),
        "idle_timeout_minutes": idle_timeout_minutes,
        "provider": provider,
        "auth": {}, "docker": {},
        "head_node_type": "ray.head.default",   # the name the fake provider gives its head
        "available_node_types": {"ray.head.default": {"resources": {"CPU": head_cpus}, "node_config": {},
                                                      "min_workers": 0, "max_workers": 0}, **workers},
        "file_mounts": {}, "cluster_synced_files": [], "file_mounts_sync_continuously": False,
        "rsync_exclude": [], "rsync_filter": [], "initialization_commands": [], "setup_commands": [],
        "head_setup_commands": [], "worker_setup_commands": [], "head_start_ray_commands": [],
        "worker_start_ray_commands": [],
    }


# ---------------------------------------------------------------------------------------------
# The command line


def _dotted(path: Sequence[Any]) -> str:
    return ".".join(str(p) for p in path)


def _one_line(value: Any) -> str:
    return " ".join(str(value).split())


def _short(value: Any, limit: int = 110) -> str:
    text = _one_line(yaml.safe_dump(value, default_flow_style=True, width=10_000).strip().removesuffix("..."))
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _expand(paths: Sequence[str]) -> Iterator[Path]:
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            yield from sorted(q for q in p.rglob("*") if q.suffix in (".yaml", ".yml") and q.is_file())
        else:
            yield p


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rayrl cluster", description="Check cluster configs offline, before they cost GPU-hours. Nothing "
        "is started and no cloud is contacted.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    validate = sub.add_parser(
        "validate", help="validate launcher YAMLs (ray up) and KubeRay manifests",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=textwrap.dedent("""\
            Validate cluster YAMLs; prints one OK line per valid file, exits 2 if any file is invalid.

            Launcher YAMLs (ray up): Ray's own schema after Ray's own default-filling, then rayrl's
            rules: no key left for Ray's defaults to fill, node types labelled rayrl.io/role: learner
            have GPUs, the Docker image runs the installed Ray, token auth on (token from a mounted
            file), dashboard on 127.0.0.1, --metrics-export-port=8080, min_workers <= max_workers,
            rayrl installed at this checkout's version.
            KubeRay manifests (RayCluster, RayJob, Volcano Queue): kind and apiVersion, rayVersion
            and image tags equal the installed Ray, authOptions.mode token, a GPU worker group with
            nvidia.com/gpu limits, ClusterIP head service."""),
        epilog="example: rayrl cluster validate cluster_configs/gpu.yaml cluster_configs/kuberay/")
    validate.add_argument("files", nargs="+", metavar="FILE",
                          help="cluster YAML, or a folder whose *.yaml files are all checked")
    return parser


def main(argv: list[str] | None = None) -> int:
    """`rayrl cluster ARGS`: exit 0 when every file is valid, 2 otherwise (or on bad usage)."""
    args = build_parser().parse_args(argv)
    status = EXIT_OK
    files = list(_expand(args.files))
    if not files:
        print("rayrl cluster validate: no YAML files found in " + ", ".join(args.files), file=sys.stderr)
        return EXIT_INVALID
    for path in files:
        problems = validate_file(path)
        if problems:
            status = EXIT_INVALID
            for problem in problems:
                print(f"INVALID {problem}", file=sys.stderr)
        else:
            print(f"OK {path}")
    return status


if __name__ == "__main__":
    sys.exit(main())
