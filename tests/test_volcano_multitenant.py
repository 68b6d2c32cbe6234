"""Multi-tenant Volcano set-up: weighted queues and priority classes, checked by `rayrl cluster validate`,
and named by the doctor's uneven-scheduling finding (no Ray, no Kubernetes)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import yaml

from rayrl.cluster import cli as cluster
from rayrl.judge import doctor
from rayrl.judge.doctor import Evidence

FILE = Path(__file__).resolve().parents[1] / "cluster_configs" / "kuberay" / "volcano-multitenant.yaml"


def docs() -> dict[tuple[str, str], dict]:
    return {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(FILE.read_text())}


def test_production_outweighs_and_outranks_sweeps_and_the_file_validates():
    d = docs()
    prod, sweeps = d[("Queue", "rayrl-production")]["spec"], d[("Queue", "rayrl-sweeps")]["spec"]
    assert prod["weight"] > sweeps["weight"] and sweeps["reclaimable"] and not prod["reclaimable"]
    hi, lo = d[("PriorityClass", "rayrl-production")], d[("PriorityClass", "rayrl-sweep")]
    assert hi["value"] > lo["value"] and lo["preemptionPolicy"] == "Never"
    assert cluster.validate_file(FILE) == []


@pytest.mark.parametrize(
    "kind, name, mutate, key",
    [
        ("Queue", "rayrl-sweeps", lambda d: d["spec"].__setitem__("weight", 0), "spec.weight"),
        ("Queue", "rayrl-sweeps", lambda d: d["spec"].__setitem__("weight", "heavy"), "spec.weight"),
        ("PriorityClass", "rayrl-production", lambda d: d.__setitem__("value", 2_000_000_000), "value"),
        ("PriorityClass", "rayrl-production", lambda d: d.pop("value"), "value"),
        ("PriorityClass", "rayrl-sweep", lambda d: d.__setitem__("globalDefault", True), "globalDefault"),
        ("PriorityClass", "rayrl-sweep", lambda d: d.__setitem__("preemptionPolicy", "Always"), "preemptionPolicy"),
        (
            "PriorityClass",
            "rayrl-sweep",
            lambda d: d.__setitem__("apiVersion", "scheduling.k8s.io/v1beta1"),
            "apiVersion",
        ),
    ],
)
def test_broken_variant_is_rejected_naming_the_key(tmp_path, kind, name, mutate, key):
    all_docs = list(yaml.safe_load_all(FILE.read_text()))
    mutate(next(d for d in all_docs if d["kind"] == kind and d["metadata"]["name"] == name))
    path = tmp_path / "v.yaml"
    path.write_text(yaml.safe_dump_all(all_docs, sort_keys=False))
    problems = cluster.validate_file(path)
    assert any(f"{kind} {name}: {key}:" in p for p in problems), problems


def test_doctor_points_uneven_scheduling_at_the_queues():
    rows = [
        {"trial_id": "t", "phase": "train", "training_iteration": i, "gpu_util": u, "cpu_util": 0.5}
        for i, u in enumerate([0.9, 0.9, 0.2, 0.95, 0.3, 0.9, 0.25, 0.9], start=1)
    ]
    finding = doctor.uneven_scheduling(Evidence(history=pd.DataFrame(rows)))
    assert finding is not None and "cluster_configs/kuberay/volcano-multitenant.yaml" in finding.fix
    assert (Path(__file__).resolve().parents[1] / "cluster_configs/kuberay/volcano-multitenant.yaml").exists()
