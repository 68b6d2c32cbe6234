"""The exposure rules (rayrl.cluster.exposure): each shipped config passes, and reverting any one
hardening step in it makes `rayrl cluster validate` fail naming the key to fix."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from rayrl.cluster import cli as cluster

CONFIGS = Path(__file__).resolve().parents[1] / "cluster_configs"


def _docs(file: str) -> list[dict]:
    return list(yaml.safe_load_all((CONFIGS / file).read_text()))


def _cluster(docs: list[dict]) -> dict:
    doc = next(d for d in docs if d["kind"] in ("RayCluster", "RayJob"))
    return doc["spec"] if doc["kind"] == "RayCluster" else doc["spec"]["rayClusterSpec"]


def _head(docs: list[dict]) -> dict:
    return _cluster(docs)["headGroupSpec"]["template"]["spec"]["containers"][0]


def _policy(docs: list[dict]) -> dict:
    return next(d for d in docs if d["kind"] == "NetworkPolicy")


def _redis_policy(docs: list[dict]) -> dict:
    """The NetworkPolicy of the GCS's Redis: the one that selects pods other than the Ray cluster's."""
    return next(
        d
        for d in docs
        if d["kind"] == "NetworkPolicy" and "rayrl.io/cluster" not in d["spec"]["podSelector"]["matchLabels"]
    )


def _redis_source(docs: list[dict]) -> dict:
    return _redis_policy(docs)["spec"]["ingress"][0]["from"][0]["podSelector"]["matchLabels"]


def _start(key: str, old: str, new: str) -> Callable[[list[dict]], None]:
    def mutate(docs: list[dict]) -> None:
        docs[0][key] = [c.replace(old, new) for c in docs[0][key]]

    return mutate


VARIANTS = [
    # launcher files: core dumps, public IPs
    (
        "core-dumps-on",
        "local.yaml",
        _start("head_start_ray_commands", "ulimit -c 0", "ulimit -c unlimited"),
        "head_start_ray_commands",
    ),
    (
        "worker-ports-left-to-ray",
        "gcp-gpu.yaml",
        _start("worker_start_ray_commands", " --node-manager-port=8077", ""),
        "worker_start_ray_commands",
    ),
    (
        "client-port-left-to-ray",
        "gpu.yaml",
        _start("head_start_ray_commands", " --ray-client-server-port=10001", ""),
        "head_start_ray_commands",
    ),
    (
        "docker-core-limit-missing",
        "gpu.yaml",
        lambda d: d[0]["docker"]["run_options"].remove("--ulimit core=0"),
        "docker.run_options",
    ),
    (
        "gcp-external-ip",
        "gcp-gpu.yaml",
        lambda d: d[0]["available_node_types"]["gpu.a3"]["node_config"]["networkInterfaces"][0].__setitem__(
            "accessConfigs", [{"name": "External NAT", "type": "ONE_TO_ONE_NAT"}]
        ),
        "available_node_types.gpu.a3.node_config.networkInterfaces",
    ),
    (
        "gcp-default-nic",
        "gcp-gpu.yaml",
        lambda d: d[0]["available_node_types"]["head.g2"]["node_config"].pop("networkInterfaces"),
        "available_node_types.head.g2.node_config.networkInterfaces",
    ),
    (
        "gcp-external-ips-used",
        "gcp-gpu.yaml",
        lambda d: d[0]["provider"].pop("use_internal_ips"),
        "provider.use_internal_ips",
    ),
    (
        "aws-public-ip",
        "gpu.yaml",
        lambda d: d[0]["available_node_types"]["gpu.p5"]["node_config"].__setitem__(
            "NetworkInterfaces",
            [
                {
                    **d[0]["available_node_types"]["gpu.p5"]["node_config"]["NetworkInterfaces"][0],
                    "AssociatePublicIpAddress": True,
                }
            ],
        ),
        "available_node_types.gpu.p5.node_config.NetworkInterfaces[0].AssociatePublicIpAddress",
    ),
    (
        "aws-subnet-beside-the-nic",
        "gpu.yaml",
        lambda d: d[0]["available_node_types"]["gpu.p5"]["node_config"].__setitem__("SubnetIds", ["subnet-public"]),
        "available_node_types.gpu.p5.node_config.SubnetIds",
    ),
    (
        "aws-external-ips-used",
        "gpu.yaml",
        lambda d: d[0]["provider"].__setitem__("use_internal_ips", False),
        "provider.use_internal_ips",
    ),
    # KubeRay: NetworkPolicy, pod labels, securityContext, GCS fault tolerance, RayJob retries
    ("no-network-policy", "kuberay/raycluster.yaml", lambda d: d.remove(_policy(d)), "NetworkPolicy"),
    (
        "policy-admits-everyone",
        "kuberay/raycluster.yaml",
        lambda d: _policy(d)["spec"]["ingress"].append({"from": [{"namespaceSelector": {}}]}),
        "spec.ingress[3]",
    ),
    (
        "policy-rule-without-from",
        "kuberay/rayjob.yaml",
        lambda d: _policy(d)["spec"]["ingress"][2].pop("from"),
        "spec.ingress[2]",
    ),
    (
        "policy-selects-other-pods",
        "kuberay/raycluster.yaml",
        lambda d: _policy(d)["spec"]["podSelector"]["matchLabels"].__setitem__("rayrl.io/cluster", "other"),
        "NetworkPolicy",
    ),
    # the GCS's Redis: only the cluster's head reaches it
    ("no-redis-policy", "kuberay/raycluster.yaml", lambda d: d.remove(_redis_policy(d)), "NetworkPolicy"),
    (
        "redis-admits-every-ray-pod",
        "kuberay/rayjob.yaml",
        lambda d: _redis_source(d).pop("ray.io/node-type"),
        "spec.ingress[0]",
    ),
    (
        "redis-admits-a-namespace",
        "kuberay/raycluster.yaml",
        lambda d: _redis_policy(d)["spec"]["ingress"].append(
            {
                "from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "default"}}}],
                "ports": [{"protocol": "TCP", "port": 6379}],
            }
        ),
        "spec.ingress[1]",
    ),
    (
        "redis-admits-another-cluster-only",
        "kuberay/raycluster.yaml",
        lambda d: _redis_source(d).__setitem__("rayrl.io/cluster", "other"),
        "NetworkPolicy",
    ),
    (
        "pod-unlabelled",
        "kuberay/raycluster.yaml",
        lambda d: _cluster(d)["workerGroupSpecs"][0]["template"].pop("metadata"),
        "spec.workerGroupSpecs[0].template.metadata.labels.rayrl.io/cluster",
    ),
    (
        "submitter-unlabelled",
        "kuberay/rayjob.yaml",
        lambda d: d[0]["spec"]["submitterPodTemplate"].pop("metadata"),
        "spec.submitterPodTemplate.metadata.labels.rayrl.io/cluster",
    ),
    (
        "runs-as-root",
        "kuberay/raycluster.yaml",
        lambda d: _head(d)["securityContext"].__setitem__("runAsNonRoot", False),
        "spec.headGroupSpec.template.spec.containers[0].securityContext.runAsNonRoot",
    ),
    (
        "privilege-escalation",
        "kuberay/rayjob.yaml",
        lambda d: _head(d)["securityContext"].pop("allowPrivilegeEscalation"),
        "spec.rayClusterSpec.headGroupSpec.template.spec.containers[0].securityContext.allowPrivilegeEscalation",
    ),
    (
        "writable-root",
        "kuberay/raycluster.yaml",
        lambda d: _cluster(d)["workerGroupSpecs"][1]["template"]["spec"]["containers"][0][
            "securityContext"
        ].__setitem__("readOnlyRootFilesystem", False),
        "spec.workerGroupSpecs[1].template.spec.containers[0].securityContext.readOnlyRootFilesystem",
    ),
    (
        "capabilities-kept",
        "kuberay/raycluster.yaml",
        lambda d: _head(d)["securityContext"].pop("capabilities"),
        "spec.headGroupSpec.template.spec.containers[0].securityContext.capabilities.drop",
    ),
    (
        "no-gcs-fault-tolerance",
        "kuberay/raycluster.yaml",
        lambda d: _cluster(d).pop("gcsFaultToleranceOptions"),
        "spec.gcsFaultToleranceOptions.redisAddress",
    ),
    (
        "redis-password-inline",
        "kuberay/rayjob.yaml",
        lambda d: _cluster(d)["gcsFaultToleranceOptions"].__setitem__("redisPassword", "hunter2"),
        "spec.rayClusterSpec.gcsFaultToleranceOptions.redisPassword",
    ),
    (
        "rayjob-no-retries",
        "kuberay/rayjob.yaml",
        lambda d: d[0]["spec"].__setitem__("backoffLimit", 0),
        "spec.backoffLimit",
    ),
]


@pytest.mark.parametrize("file", sorted({v[1] for v in VARIANTS}))
def test_shipped_config_passes_every_exposure_rule(file: str) -> None:
    assert cluster.validate_file(CONFIGS / file) == []


@pytest.mark.parametrize("file, mutate, key", [v[1:] for v in VARIANTS], ids=[v[0] for v in VARIANTS])
def test_reverting_one_hardening_step_fails_validation_naming_the_key(
    tmp_path: Path, file: str, mutate: Callable, key: str
) -> None:
    docs = _docs(file)
    mutate(docs)
    path = tmp_path / Path(file).name
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    problems = cluster.validate_file(path)
    assert any(f" {key}:" in p or f": {key}" in p for p in problems), problems


@pytest.mark.parametrize("file", ["kuberay/raycluster.yaml", "kuberay/rayjob.yaml"])
def test_a_cluster_whose_redis_any_pod_reaches_is_refused_in_one_paragraph(tmp_path: Path, file: str) -> None:
    docs = _docs(file)
    name = next(d for d in docs if d["kind"] in ("RayCluster", "RayJob"))["metadata"]["name"]
    assert _redis_source(docs) == {"rayrl.io/cluster": name, "ray.io/node-type": "head"}
    assert [p["port"] for p in _redis_policy(docs)["spec"]["ingress"][0]["ports"]] == [6379]
    docs.remove(_redis_policy(docs))
    path = tmp_path / Path(file).name
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    (problem,) = cluster.validate_file(path)
    assert "gcsFaultToleranceOptions.redisAddress" in problem and "port 6379" in problem, problem
    assert f"rayrl.io/cluster: {name}, ray.io/node-type: head" in problem and "rayrl-redis" in problem, problem


def test_validate_help_lists_the_exposure_rules() -> None:
    text = cluster.build_parser()._subparsers._group_actions[0].choices["validate"].format_help()
    for words in (
        "every port",
        "core",
        "external IP",
        "NetworkPolicy",
        "securityContext",
        "gcsFaultToleranceOptions",
        "backoffLimit",
    ):
        assert words in text, words
