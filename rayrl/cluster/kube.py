"""KubeRay manifests (`kubectl apply`): RayCluster, RayJob and Volcano Queue documents.

KubeRay accepts manifests whose mistakes show only once pods (and GPU-hours) are spent, so these
are the Kubernetes counterparts of the launcher rules: the kind and apiVersion KubeRay serves,
rayVersion and image tags equal to the installed Ray, token auth, a GPU worker group whose
nvidia.com/gpu limits equal its requests, and a head service that stays inside the cluster.
Nothing here reaches Kubernetes.
"""

from __future__ import annotations

from typing import Any

from rayrl.cluster import exposure
from rayrl.cluster.common import image_version_problem

KUBE_KINDS = {
    "RayCluster": "ray.io/v1",
    "RayJob": "ray.io/v1",
    "Queue": "scheduling.volcano.sh/v1beta1",
    "PriorityClass": "scheduling.k8s.io/v1",
    "NetworkPolicy": "networking.k8s.io/v1",
}
#: Kubernetes reserves priorities above this for system classes.
MAX_USER_PRIORITY = 1_000_000_000
PREEMPTION_POLICIES = ("PreemptLowerPriority", "Never")


def validate_kube(doc: dict) -> list[str]:
    """Problems with one Kubernetes document: a RayCluster, a RayJob or a Volcano Queue."""
    kind, api = doc.get("kind"), doc.get("apiVersion")
    name = (doc.get("metadata") or {}).get("name") or "(unnamed)"
    if kind not in KUBE_KINDS:
        return [
            f"kind: {kind!r} is not one rayrl checks; use RayCluster, RayJob (apiVersion ray.io/v1), Queue "
            "(scheduling.volcano.sh/v1beta1) or PriorityClass (scheduling.k8s.io/v1)."
        ]
    where = f"{kind} {name}"
    if api != KUBE_KINDS[kind]:
        return [f"{where}: apiVersion: {api!r}; {kind} needs apiVersion {KUBE_KINDS[kind]}."]
    if kind == "PriorityClass":
        return [f"{where}: {m}" for m in _priority_class_problems(doc)]
    spec = doc.get("spec")
    if not isinstance(spec, dict):
        return [f"{where}: spec: missing or not a mapping; see cluster_configs/kuberay/."]
    if kind == "RayCluster":
        return [f"{where}: {m}" for m in _raycluster_problems(spec, "spec", name)]
    if kind == "NetworkPolicy":
        return [f"{where}: {m}" for m in exposure.network_policy_problems(doc)]
    if kind == "RayJob":
        problems = (
            []
            if str(spec.get("entrypoint") or "").strip()
            else ["spec.entrypoint: missing; give the command the job runs (python experiments/sweep.py ...)."]
        )
        if not (isinstance(spec.get("backoffLimit"), int) and spec["backoffLimit"] >= 1):
            problems.append(
                f"spec.backoffLimit: {spec.get('backoffLimit')!r}; a lost head or submitter ends the "
                "sweep for good; set backoffLimit: 2 or more (the sweep resumes from its storage)."
            )
        cluster = spec.get("rayClusterSpec")
        if not isinstance(cluster, dict):
            problems.append("spec.rayClusterSpec: missing; the RayJob needs the cluster it creates.")
        else:
            problems += _raycluster_problems(cluster, "spec.rayClusterSpec", name)
            if spec.get("submissionMode", "K8sJobMode") == "K8sJobMode":
                problems += exposure.pod_label_problems(
                    "spec.submitterPodTemplate", spec.get("submitterPodTemplate") or {}, name
                )
        return [f"{where}: {m}" for m in problems]
    return [f"{where}: {m}" for m in _queue_problems(spec)]


def _queue_problems(spec: dict) -> list[str]:
    """A Volcano Queue: a cap, and a whole positive weight (its fair share against the other queues)."""
    problems = (
        []
        if isinstance(spec.get("capability"), dict)
        else ["spec.capability: missing; give the queue's cpu, memory and nvidia.com/gpu cap."]
    )
    weight = spec.get("weight", 1)
    if not isinstance(weight, int) or isinstance(weight, bool) or weight < 1:
        problems.append(
            f"spec.weight: {weight!r}; a queue's fair share is a whole number >= 1 (e.g. production 4, sweeps 1)."
        )
    return problems


def _priority_class_problems(doc: dict) -> list[str]:
    """A PriorityClass: an integer value below the system range, never the cluster's default."""
    problems = []
    value = doc.get("value")
    if not isinstance(value, int) or isinstance(value, bool) or not -(2**31) <= value <= MAX_USER_PRIORITY:
        problems.append(
            f"value: {value!r}; a PriorityClass needs an integer value <= {MAX_USER_PRIORITY:,} "
            "(higher values are reserved for system classes)."
        )
    if doc.get("globalDefault") is True:
        problems.append(
            "globalDefault: true would give every pod in the cluster this class; set false and name the "
            "class in the job's ray.io/priority-class-name label."
        )
    policy = doc.get("preemptionPolicy", "PreemptLowerPriority")
    if policy not in PREEMPTION_POLICIES:
        problems.append(f"preemptionPolicy: {policy!r}; use {' or '.join(PREEMPTION_POLICIES)}.")
    return problems


def _raycluster_problems(spec: dict, at: str, name: str) -> list[str]:
    """Problems with the RayCluster spec at key path ``at``: a RayCluster's spec or a RayJob's rayClusterSpec."""
    import ray

    problems = []
    version = str(spec.get("rayVersion", ""))
    if version != ray.__version__:
        problems.append(
            f"{at}.rayVersion: {version or '(missing)'!s} but this machine has Ray {ray.__version__} "
            f"(pyproject.toml); set rayVersion: '{ray.__version__}'."
        )
    if ((spec.get("authOptions") or {}).get("mode")) != "token":
        problems.append(
            f"{at}.authOptions.mode: not token, so the cluster accepts unauthenticated jobs; set "
            "authOptions: {mode: token} (KubeRay >= 1.5.1)."
        )
    head = spec.get("headGroupSpec") or {}
    if head.get("serviceType", "ClusterIP") != "ClusterIP":
        problems.append(
            f"{at}.headGroupSpec.serviceType: {head['serviceType']} exposes the dashboard outside the "
            "cluster; use ClusterIP and `kubectl port-forward`."
        )
    groups = [(f"{at}.headGroupSpec", head)] + [
        (f"{at}.workerGroupSpecs[{i}]", g or {}) for i, g in enumerate(spec.get("workerGroupSpecs") or [])
    ]
    gpu_groups = 0
    for where, group in groups:
        problems += exposure.pod_label_problems(f"{where}.template", group.get("template") or {}, name)
        containers = ((group.get("template") or {}).get("spec") or {}).get("containers") or []
        if not containers:
            problems.append(f"{where}.template.spec.containers: empty; the first container runs Ray.")
            continue
        if m := image_version_problem(
            f"{where}.template.spec.containers[0].image", containers[0].get("image", ""), ray.__version__
        ):
            problems.append(m)
        for j, c in enumerate(containers):
            problems += exposure.container_context_problems(f"{where}.template.spec.containers[{j}]", c)
            res = c.get("resources") or {}
            limit = (res.get("limits") or {}).get("nvidia.com/gpu")
            request = (res.get("requests") or {}).get("nvidia.com/gpu")
            if request is not None and str(request) != str(limit):
                problems.append(
                    f"{where}.template.spec.containers[{j}].resources.limits.nvidia.com/gpu: "
                    f"{limit} while requests ask {request}; Kubernetes needs GPU limits equal to requests."
                )
            gpu_groups += where != f"{at}.headGroupSpec" and _positive(limit)
            if any(e.get("name") == "RAY_AUTH_TOKEN" and "value" in e for e in c.get("env") or []):
                problems.append(
                    f"{where}.template.spec.containers[{j}].env.RAY_AUTH_TOKEN: the token is written "
                    "into the manifest; use authOptions (a Secret) instead."
                )
        low, high = group.get("minReplicas"), group.get("maxReplicas")
        if isinstance(low, int) and isinstance(high, int) and low > high:
            problems.append(f"{where}.minReplicas: {low} is above maxReplicas ({high}).")
    problems += exposure.gcs_ft_problems(spec, at)
    if not gpu_groups:
        problems.append(
            f"{at}.workerGroupSpecs: no group has resources.limits nvidia.com/gpu, so learners have no "
            "GPUs; add a GPU worker group (limits: {nvidia.com/gpu: '8'})."
        )
    return problems


def _positive(value: Any) -> bool:
    try:
        return float(str(value)) > 0
    except ValueError:
        return False
