"""The shipped cluster configs validate, and `rayrl cluster validate` rejects broken ones by key.

Broken variants are built from the shipped files (load, mutate one thing, write to tmp_path), so
each test shows that the validator notices exactly that mistake in an otherwise valid file.
Nothing here starts Ray or reaches a cloud.
"""

from __future__ import annotations

import copy
import importlib.metadata
import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import ray
import yaml
from fake_multinode import fake_multinode_config

from rayrl.cluster import cli as cluster
from rayrl.cluster.common import image_ray_version

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "cluster_configs"
SHIPPED = sorted(CONFIGS.rglob("*.yaml"))
LAUNCHER = ["gpu.yaml", "gcp-gpu.yaml", "local.yaml"]
# GPU HBM (GB) and network bandwidth (Gbps) of the AWS instance types gpu.yaml may use for learners.
AWS_GPU_SPECS = {
    "p4de.24xlarge": (80, 400),
    "p5.48xlarge": (80, 3200),
    "p5e.48xlarge": (141, 3200),
    "p5en.48xlarge": (141, 3200),
}


def load(name: str) -> dict:
    return yaml.safe_load((CONFIGS / name).read_text())


def write(tmp_path: Path, data: object, name: str = "variant.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rayrl.cli", "cluster", *args], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


# ---------------------------------------------------------------------------------------------
# The shipped files


def test_all_expected_files_are_shipped() -> None:
    names = {p.relative_to(CONFIGS).as_posix() for p in SHIPPED}
    assert {
        "gpu.yaml",
        "gcp-gpu.yaml",
        "local.yaml",
        "kuberay/raycluster.yaml",
        "kuberay/rayjob.yaml",
        "kuberay/volcano-queue.yaml",
    } <= names


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.relative_to(CONFIGS).as_posix())
def test_shipped_yaml_is_valid(path: Path) -> None:
    assert cluster.validate_file(path) == []


def test_gpu_yaml_learner_workers_have_80gb_and_200gbps_and_a_spot_type() -> None:
    c = load("gpu.yaml")
    workers = {n: t for n, t in c["available_node_types"].items() if n != c["head_node_type"]}
    assert workers and all(t["labels"]["rayrl.io/role"] == "learner" for t in workers.values())
    for name, node in workers.items():
        hbm, gbps = AWS_GPU_SPECS[node["node_config"]["InstanceType"]]
        assert hbm >= 80 and gbps >= 200, name
        assert node["min_workers"] <= node["max_workers"]
    spot = [
        n for n, t in workers.items() if t["node_config"].get("InstanceMarketOptions", {}).get("MarketType") == "spot"
    ]
    assert spot, "gpu.yaml needs a spot worker type"
    head = c["available_node_types"][c["head_node_type"]]
    assert head["resources"]["GPU"] > 0, "gpu.yaml's head is a GPU node type"


def test_gcp_yaml_has_preemptible_gpu_workers() -> None:
    c = load("gcp-gpu.yaml")
    preemptible = [
        t for t in c["available_node_types"].values() if (t["node_config"].get("scheduling") or {}).get("preemptible")
    ]
    assert preemptible and all(t["node_config"]["guestAccelerators"][0]["acceleratorCount"] > 0 for t in preemptible)


@pytest.mark.parametrize("name", LAUNCHER)
def test_launcher_images_pin_installed_ray_and_start_with_token_auth(name: str) -> None:
    c = load(name)
    assert c["docker"]["image"] == f"rayproject/ray:{ray.__version__}-py311-gpu"
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        start = next(cmd for cmd in c[key] if "ray start" in cmd)
        assert "RAY_AUTH_MODE=token" in start and "--metrics-export-port=8080" in start
    assert "--dashboard-host=127.0.0.1" in " ".join(c["head_start_ray_commands"])
    assert "~/.ray/auth_token" in c["file_mounts"]


def test_kuberay_files_use_volcano_queue_and_run_the_sweep() -> None:
    docs = {
        d["kind"]: d
        for f in ("raycluster.yaml", "rayjob.yaml", "volcano-queue.yaml")
        for d in yaml.safe_load_all((CONFIGS / "kuberay" / f).read_text())
    }
    queue = docs["Queue"]["metadata"]["name"]
    for kind in ("RayCluster", "RayJob"):
        assert docs[kind]["metadata"]["labels"]["volcano.sh/queue-name"] == queue
    assert "experiments/sweep.py" in docs["RayJob"]["spec"]["entrypoint"]
    assert docs["RayCluster"]["spec"]["enableInTreeAutoscaling"] is True


def test_docs_commands_match_the_files() -> None:
    text = (ROOT / "docs" / "cluster.md").read_text()
    for path in set(re.findall(r"cluster_configs/[\w./-]+", text)):
        assert (ROOT / path.rstrip(".")).exists(), path
    for cmd in (
        "ray up cluster_configs/gpu.yaml",
        "ray dashboard cluster_configs/gpu.yaml",
        "ray down cluster_configs/gpu.yaml",
        "ray job submit --working-dir . -- python experiments/sweep.py",
        "pip wheel --no-deps -w dist .",
        "--batch-scheduler=volcano",
        "RAY_USE_TLS=1",
    ):
        assert cmd in text, cmd
    gpu = load("gpu.yaml")
    assert f"--group-name {gpu['provider']['security_group']['GroupName']} " in text
    wheel = f"rayrl-{importlib.metadata.version('rayrl')}-py3-none-any.whl"
    assert wheel in " ".join(gpu["setup_commands"]) and wheel in text
    subnet = load("gcp-gpu.yaml")["available_node_types"]["gpu.a3"]["node_config"]["networkInterfaces"][0]["subnetwork"]
    _, region, _, name = subnet.split("/")
    assert f"subnets create {name} --network={name} --region={region}" in text
    (rc,) = [d for d in _kube("raycluster.yaml") if d["kind"] == "RayCluster"]
    (rj,) = [d for d in _kube("rayjob.yaml") if d["kind"] == "RayJob"]
    assert f"svc/{rc['metadata']['name']}-head-svc 8265:8265" in text
    for spec in (rc["spec"], rj["spec"]["rayClusterSpec"]):
        assert f"create secret generic {spec['authOptions']['secretName']} --from-file=auth_token=" in text
    assert f"job/{rj['metadata']['name']}" in text and f"rayjob {rj['metadata']['name']}" in text
    working_dir = yaml.safe_load(rj["spec"]["runtimeEnvYAML"])["working_dir"]
    assert f"aws s3 cp {Path(working_dir).name} {working_dir}" in text


# ---------------------------------------------------------------------------------------------
# Broken variants: each is rejected with the offending key in the message


def _set_start(key: str, old: str, new: str) -> Callable[[dict], None]:
    def mutate(c: dict) -> None:
        c[key] = [cmd.replace(old, new) for cmd in c[key]]

    return mutate


def _node(name: str, key: str, value: object) -> Callable[[dict], None]:
    return lambda c: c["available_node_types"][name].__setitem__(key, value)


LAUNCHER_VARIANTS = [
    # (id, file, mutation, key that must be named)
    ("setup_commands-missing", "gpu.yaml", lambda c: c.pop("setup_commands"), "setup_commands"),
    (
        "setup_commands-misspelt",
        "gpu.yaml",
        lambda c: c.__setitem__("setup_command", c.pop("setup_commands")),
        "setup_command",
    ),
    ("idle_timeout-missing", "gpu.yaml", lambda c: c.pop("idle_timeout_minutes"), "idle_timeout_minutes"),
    (
        "node-max_workers-missing",
        "gpu.yaml",
        lambda c: c["available_node_types"]["gpu.p5"].pop("max_workers"),
        "available_node_types.gpu.p5.max_workers",
    ),
    (
        "image-other-ray",
        "gpu.yaml",
        lambda c: c["docker"].__setitem__("image", "rayproject/ray:2.59.0-py311-gpu"),
        "docker.image",
    ),
    (
        "image-unpinned",
        "gpu.yaml",
        lambda c: c["docker"].__setitem__("image", "rayproject/ray:latest-gpu"),
        "docker.image",
    ),
    (
        "learner-without-gpu",
        "gpu.yaml",
        lambda c: (
            c["available_node_types"]["gpu.p4de"]["node_config"].__setitem__("InstanceType", "m5.24xlarge"),
            c["available_node_types"]["gpu.p4de"]["resources"].pop("GPU"),
        ),
        "available_node_types.gpu.p4de",
    ),
    (
        "learner-gpu-zero",
        "gpu.yaml",
        lambda c: c["available_node_types"]["gpu.p5"]["resources"].__setitem__("GPU", 0),
        "available_node_types.gpu.p5.resources.GPU",
    ),
    (
        "no-learner-label",
        "gpu.yaml",
        lambda c: [t.pop("labels") for t in c["available_node_types"].values()],
        "available_node_types",
    ),
    ("min-above-max", "gpu.yaml", _node("gpu.p4de", "min_workers", 5), "available_node_types.gpu.p4de.min_workers"),
    (
        "head-no-token-auth",
        "gpu.yaml",
        _set_start("head_start_ray_commands", "export RAY_AUTH_MODE=token ", "export "),
        "head_start_ray_commands",
    ),
    (
        "worker-no-token-auth",
        "gpu.yaml",
        _set_start("worker_start_ray_commands", "export RAY_AUTH_MODE=token ", "export "),
        "worker_start_ray_commands",
    ),
    (
        "token-inline",
        "gpu.yaml",
        _set_start(
            "worker_start_ray_commands", "RAY_AUTH_TOKEN_PATH=$HOME/.ray/auth_token", "RAY_AUTH_TOKEN=0123456789abcdef"
        ),
        "RAY_AUTH_TOKEN",
    ),
    ("token-not-mounted", "gpu.yaml", lambda c: c["file_mounts"].pop("~/.ray/auth_token"), "file_mounts"),
    (
        "dashboard-public",
        "gpu.yaml",
        _set_start("head_start_ray_commands", "127.0.0.1", "0.0.0.0"),
        "head_start_ray_commands",
    ),
    (
        "metrics-port-missing",
        "gpu.yaml",
        _set_start("worker_start_ray_commands", " --metrics-export-port=8080", ""),
        "worker_start_ray_commands",
    ),
    (
        "security-group-unnamed",
        "gpu.yaml",
        lambda c: c["provider"].pop("security_group"),
        "provider.security_group.GroupName",
    ),
    (
        "ssh-open-to-world",
        "gpu.yaml",
        lambda c: c["provider"]["security_group"].__setitem__(
            "IpPermissions",
            [{"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22, "IpRanges": [{"CidrIp": "0.0.0.0/0"}]}],
        ),
        "provider.security_group.IpPermissions",
    ),
    ("rayrl-not-installed", "gpu.yaml", lambda c: c.__setitem__("setup_commands", []), "setup_commands"),
    (
        "schema-negative-gpu",
        "gpu.yaml",
        lambda c: c["available_node_types"]["gpu.p5"]["resources"].__setitem__("GPU", -1),
        "available_node_types.gpu.p5.resources.GPU",
    ),
    ("schema-unknown-node-key", "gpu.yaml", _node("gpu.p5", "min_worker", 1), "available_node_types.gpu.p5"),
    ("provider-missing", "gpu.yaml", lambda c: c.pop("provider"), "provider"),
    (
        "resources-not-a-mapping",
        "gpu.yaml",
        _node("gpu.p5", "resources", "eight GPUs"),
        "available_node_types.gpu.p5.resources",
    ),
    ("labels-not-a-mapping", "gpu.yaml", _node("gpu.p5", "labels", ["learner"]), "available_node_types.gpu.p5.labels"),
    ("provider-unknown", "gpu.yaml", lambda c: c["provider"].__setitem__("type", "awz"), "provider.type"),
    (
        "gcp-gpu-undeclared",
        "gcp-gpu.yaml",
        lambda c: c["available_node_types"]["gpu.a3"]["resources"].pop("GPU"),
        "available_node_types.gpu.a3.resources",
    ),
    (
        "gcp-no-accelerators",
        "gcp-gpu.yaml",
        lambda c: (
            c["available_node_types"]["gpu.a3"]["node_config"].__setitem__("machineType", "n2-standard-64"),
            c["available_node_types"]["gpu.a3"]["node_config"].pop("guestAccelerators"),
        ),
        "available_node_types.gpu.a3",
    ),
    ("local-min-above-max", "local.yaml", lambda c: c.__setitem__("min_workers", 3), "min_workers"),
    (
        "local-gpus-hidden",
        "local.yaml",
        _set_start("worker_start_ray_commands", "ray start", "ray start --num-gpus=0"),
        "worker_start_ray_commands",
    ),
    (
        "local-node-types-written",
        "local.yaml",
        lambda c: c.__setitem__("available_node_types", {"w": {"resources": {}, "node_config": {}}}),
        "available_node_types",
    ),
    ("local-setup-missing", "local.yaml", lambda c: c.pop("worker_setup_commands"), "worker_setup_commands"),
    # Ray's default node identity: every bucket and VM of the account (rayrl/cluster/credentials.py).
    (
        "aws-no-instance-profile",
        "gpu.yaml",
        lambda c: c["available_node_types"]["gpu.p5"]["node_config"].pop("IamInstanceProfile"),
        "available_node_types.gpu.p5.node_config.IamInstanceProfile",
    ),
    (
        "aws-ray-default-role",
        "gpu.yaml",
        lambda c: c["available_node_types"]["head.g6e"]["node_config"].__setitem__(
            "IamInstanceProfile", {"Arn": "arn:aws:iam::123456789012:instance-profile/ray-autoscaler-v1"}
        ),
        "available_node_types.head.g6e.node_config.IamInstanceProfile",
    ),
    (
        "aws-worker-with-the-head-role",
        "gpu.yaml",
        lambda c: c["available_node_types"]["gpu.p4de"]["node_config"].__setitem__(
            "IamInstanceProfile", {"Name": "rayrl-head"}
        ),
        "available_node_types.gpu.p4de.node_config.IamInstanceProfile",
    ),
    (
        "gcp-no-service-account",
        "gcp-gpu.yaml",
        lambda c: c["available_node_types"]["gpu.a3"]["node_config"].pop("serviceAccounts"),
        "available_node_types.gpu.a3.node_config.serviceAccounts",
    ),
    # Public IPs on AWS (rayrl/cluster/exposure.py): every node type's one interface says no, and Ray
    # reaches the nodes over private IPs.
    (
        "aws-default-nic-public-ip",
        "gpu.yaml",
        lambda c: c["available_node_types"]["gpu.p5.spot"]["node_config"].pop("NetworkInterfaces"),
        "available_node_types.gpu.p5.spot.node_config.NetworkInterfaces",
    ),
    (
        "aws-nic-public-ip",
        "gpu.yaml",
        lambda c: c["available_node_types"]["gpu.p4de"]["node_config"].__setitem__(
            "NetworkInterfaces",
            [
                {
                    **c["available_node_types"]["gpu.p4de"]["node_config"]["NetworkInterfaces"][0],
                    "AssociatePublicIpAddress": True,
                }
            ],
        ),
        "available_node_types.gpu.p4de.node_config.NetworkInterfaces[0].AssociatePublicIpAddress",
    ),
    (
        "aws-nic-public-ip-left-to-the-subnet",
        "gpu.yaml",
        lambda c: c["available_node_types"]["head.g6e"]["node_config"].__setitem__(
            "NetworkInterfaces",
            [
                {
                    k: v
                    for k, v in c["available_node_types"]["head.g6e"]["node_config"]["NetworkInterfaces"][0].items()
                    if k != "AssociatePublicIpAddress"
                }
            ],
        ),
        "available_node_types.head.g6e.node_config.NetworkInterfaces[0].AssociatePublicIpAddress",
    ),
    (
        "aws-external-ips-used",
        "gpu.yaml",
        lambda c: c["provider"].pop("use_internal_ips"),
        "provider.use_internal_ips",
    ),
]


@pytest.mark.parametrize("file, mutate, key", [v[1:] for v in LAUNCHER_VARIANTS], ids=[v[0] for v in LAUNCHER_VARIANTS])
def test_broken_launcher_variant_is_rejected_naming_the_key(
    tmp_path: Path, file: str, mutate: Callable, key: str
) -> None:
    data = load(file)
    assert cluster.validate_file(write(tmp_path, data)) == []  # the unmutated copy is fine
    mutate(data)
    problems = cluster.validate_file(write(tmp_path, data))
    assert problems, "the broken variant passed validation"
    assert any(f": {key}" in p for p in problems), problems
    assert all(p.startswith(str(tmp_path / "variant.yaml") + ": ") for p in problems)


def _kube(file: str) -> list[dict]:
    return list(yaml.safe_load_all((CONFIGS / "kuberay" / file).read_text()))


def _cluster_spec(docs: list[dict]) -> dict:
    doc = next(d for d in docs if d["kind"] in ("RayCluster", "RayJob"))
    return doc["spec"] if doc["kind"] == "RayCluster" else doc["spec"]["rayClusterSpec"]


def _gpu_container(docs: list[dict]) -> dict:
    spec = _cluster_spec(docs)
    return next(g for g in spec["workerGroupSpecs"] if g["groupName"] == "gpu-80gb")["template"]["spec"]["containers"][
        0
    ]


KUBE_VARIANTS = [
    (
        "rayVersion-other",
        "raycluster.yaml",
        lambda d: _cluster_spec(d).__setitem__("rayVersion", "2.59.0"),
        "spec.rayVersion",
    ),
    (
        "rayjob-rayVersion-missing",
        "rayjob.yaml",
        lambda d: _cluster_spec(d).pop("rayVersion"),
        "spec.rayClusterSpec.rayVersion",
    ),
    (
        "image-other-ray",
        "raycluster.yaml",
        lambda d: _gpu_container(d).__setitem__("image", "rayproject/ray:2.50.0-gpu"),
        "spec.workerGroupSpecs[1].template.spec.containers[0].image",
    ),
    (
        "no-gpu-limits",
        "raycluster.yaml",
        lambda d: [
            c["resources"][k].pop("nvidia.com/gpu") for c in [_gpu_container(d)] for k in ("limits", "requests")
        ],
        "spec.workerGroupSpecs",
    ),
    (
        "gpu-request-without-limit",
        "rayjob.yaml",
        lambda d: _gpu_container(d)["resources"]["limits"].pop("nvidia.com/gpu"),
        "spec.rayClusterSpec.workerGroupSpecs[1].template.spec.containers[0].resources.limits.nvidia.com/gpu",
    ),
    ("auth-off", "raycluster.yaml", lambda d: _cluster_spec(d).pop("authOptions"), "spec.authOptions.mode"),
    (
        "token-inline",
        "raycluster.yaml",
        lambda d: _gpu_container(d).__setitem__("env", [{"name": "RAY_AUTH_TOKEN", "value": "0123456789abcdef"}]),
        "spec.workerGroupSpecs[1].template.spec.containers[0].env.RAY_AUTH_TOKEN",
    ),
    (
        "head-load-balancer",
        "raycluster.yaml",
        lambda d: _cluster_spec(d)["headGroupSpec"].__setitem__("serviceType", "LoadBalancer"),
        "spec.headGroupSpec.serviceType",
    ),
    ("old-apiVersion", "raycluster.yaml", lambda d: d[0].__setitem__("apiVersion", "ray.io/v1alpha1"), "apiVersion"),
    ("unknown-kind", "volcano-queue.yaml", lambda d: d[0].__setitem__("kind", "PodGroup"), "kind"),
    (
        "replicas-min-above-max",
        "rayjob.yaml",
        lambda d: _cluster_spec(d)["workerGroupSpecs"][0].__setitem__("minReplicas", 20),
        "spec.rayClusterSpec.workerGroupSpecs[0].minReplicas",
    ),
    ("rayjob-no-entrypoint", "rayjob.yaml", lambda d: d[0]["spec"].pop("entrypoint"), "spec.entrypoint"),
    (
        "worker-groups-not-a-list",
        "raycluster.yaml",
        lambda d: _cluster_spec(d).__setitem__("workerGroupSpecs", "gpu"),
        "a section",
    ),
]


@pytest.mark.parametrize("file, mutate, key", [v[1:] for v in KUBE_VARIANTS], ids=[v[0] for v in KUBE_VARIANTS])
def test_broken_kuberay_variant_is_rejected_naming_the_key(
    tmp_path: Path, file: str, mutate: Callable, key: str
) -> None:
    docs = _kube(file)
    mutate(docs)
    path = tmp_path / file
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    problems = cluster.validate_file(path)
    assert problems, "the broken variant passed validation"
    assert any(f" {key}:" in p or f": {key}" in p for p in problems), problems


@pytest.mark.parametrize(
    "text, expected",
    [
        (None, "no such file"),
        ("a: [1, 2\n", "not valid YAML"),
        ("- 1\n- 2\n", "not a mapping"),
        ("", "empty"),
        ("cluster_name: x\n---\ncluster_name: y\n", "several YAML documents"),
    ],
)
def test_unreadable_files_get_a_clear_problem(tmp_path: Path, text: str | None, expected: str) -> None:
    path = tmp_path / "c.yaml"
    if text is not None:
        path.write_text(text)
    (problem,) = cluster.validate_file(path)
    assert problem.startswith(f"{path}: ") and expected in problem


@pytest.mark.parametrize(
    "image, version",
    [
        ("rayproject/ray:2.60.0-py311-gpu", "2.60.0"),
        ("rayproject/ray:2.60.0", "2.60.0"),
        ("ghcr.io/acme/rayrl:0.1.0-ray2.60.0-gpu", "2.60.0"),
        ("rayproject/ray:latest-gpu", None),
        ("rayproject/ray", None),
        ("rayproject/ray@sha256:abc", None),
        ("localhost:5000/ray:2.61.1-cpu", "2.61.1"),
        ("acme/trainer:2.60.0", None),
    ],
)
def test_image_ray_version(image: str, version: str | None) -> None:
    assert image_ray_version(image) == version


# ---------------------------------------------------------------------------------------------
# The command line


def test_cli_all_valid_prints_one_ok_line_per_file_and_exits_0() -> None:
    result = cli("validate", "cluster_configs")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines == [f"OK {p.relative_to(ROOT)}" for p in sorted([*SHIPPED, *CONFIGS.rglob("*.json")])]
    assert result.stderr == ""


def test_cli_invalid_file_exits_2_naming_file_and_key_without_traceback(tmp_path: Path) -> None:
    data = load("gpu.yaml")
    data.pop("setup_commands")
    bad = write(tmp_path, data, "bad.yaml")
    result = cli("validate", "cluster_configs/gpu.yaml", str(bad))
    assert result.returncode == 2
    assert result.stdout.splitlines() == ["OK cluster_configs/gpu.yaml"]
    assert f"INVALID {bad}: setup_commands: missing" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("content", [None, "key: [unclosed\n", "just a string\n"])
def test_cli_unreadable_file_exits_2_without_traceback(tmp_path: Path, content: str | None) -> None:
    path = tmp_path / "c.yaml"
    if content is not None:
        path.write_text(content)
    result = cli("validate", str(path))
    assert result.returncode == 2
    assert str(path) in result.stderr and "Traceback" not in result.stderr


def test_cli_usage() -> None:
    helped = cli("validate", "--help")
    assert helped.returncode == 0 and "launcher yamls" in helped.stdout.lower() and "KubeRay" in helped.stdout
    assert cli().returncode == 2
    missing = cli("validate")
    assert missing.returncode == 2 and "Traceback" not in missing.stderr


# ---------------------------------------------------------------------------------------------
# The fake multinode config used by tests/test_autoscaling.py


def test_fake_multinode_config_mirrors_learner_worker_types() -> None:
    from ray.autoscaler._private.util import validate_config

    launcher = load("gpu.yaml")
    fake = fake_multinode_config(launcher, gpu_stand_in="fake_gpu", max_workers_per_type=2)
    validate_config(copy.deepcopy(fake))  # Ray's schema accepts it as a complete config
    workers = {n: t for n, t in fake["available_node_types"].items() if n != "ray.head.default"}
    assert set(workers) == {n for n in launcher["available_node_types"] if n != launcher["head_node_type"]}
    for name, node in workers.items():
        assert node["resources"]["fake_gpu"] == launcher["available_node_types"][name]["resources"]["GPU"]
        assert "GPU" not in node["resources"] and node["resources"]["CPU"] == 1
        assert node["labels"]["rayrl.io/role"] == "learner"
        assert node["min_workers"] == 0 and 1 <= node["max_workers"] <= 2
    assert fake["provider"]["type"] == "fake_multinode" and fake["head_node_type"] == "ray.head.default"


@pytest.mark.parametrize(
    "mutate, words",
    [
        (
            lambda st: st[0].__setitem__("Resource", "*"),
            ["Statement[0] (RunBucketPrefixOnly).Resource", "every bucket"],
        ),
        (lambda st: st[0].__setitem__("Action", "s3:*"), ["Statement[0] (RunBucketPrefixOnly).Action", "s3:*"]),
        (
            lambda st: st.append({"Effect": "Allow", "Action": "iam:PassRole", "Resource": "*"}),
            ["Statement[2].Resource", "iam:PassRole on every role"],
        ),
    ],
)
def test_a_node_policy_with_wildcards_is_refused(tmp_path: Path, mutate: Callable, words: list[str]) -> None:
    source = ROOT / "cluster_configs" / "iam" / "aws-rayrl-worker.json"
    doc = json.loads(source.read_text())
    assert cluster.validate_file(source) == []
    mutate(doc["Statement"])
    bad = tmp_path / "policy.json"
    bad.write_text(json.dumps(doc))
    problems = cluster.validate_file(bad)
    assert len(problems) == 1 and all(w in problems[0] for w in words), problems
