"""A fake multinode cluster with the node types of a launcher YAML.

Autoscaling only shows when nodes come and go, and GPU nodes are too dear to watch it on.
`fake_multinode_config` turns a launcher YAML into Ray's `fake_multinode` provider config, so
the autoscaling behaviour of the real node types can be tried on one machine
(tests/test_autoscaling.py).
"""

from __future__ import annotations

from rayrl.cluster.common import LEARNER_LABEL


def fake_multinode_config(
    launcher: dict,
    *,
    gpu_stand_in: str = "rayrl_fake_gpu",
    cpus_per_node: int = 1,
    max_workers_per_type: int = 2,
    idle_timeout_minutes: float = 0.25,
    head_cpus: int = 1,
    gcs_address: str | None = None,
) -> dict:
    """Ray's fake_multinode provider config whose worker types mirror the launcher's learner types.

    Each worker type keeps its name, labels and GPU count, with the GPUs replaced by the custom
    resource ``gpu_stand_in`` (so no CUDA is needed) and the CPUs scaled to ``cpus_per_node``. The
    result is written out in full because the pip wheel lacks Ray's fake_multinode defaults file.
    Start it with `RAY_FAKE_CLUSTER=1 ray start --head --autoscaling-config=FILE`.
    """
    workers = {}
    for name, node in (launcher.get("available_node_types") or {}).items():
        node = node or {}
        if (
            name == launcher.get("head_node_type")
            or (node.get("labels") or {}).get(LEARNER_LABEL[0]) != LEARNER_LABEL[1]
        ):
            continue
        gpus = int((node.get("resources") or {}).get("GPU", 1))
        workers[name] = {
            "resources": {"CPU": cpus_per_node, gpu_stand_in: gpus, "object_store_memory": 150 * 1024**2},
            "labels": dict(node.get("labels") or {}),
            "node_config": {},
            "min_workers": 0,
            "max_workers": min(int(node.get("max_workers", max_workers_per_type)), max_workers_per_type),
        }
    provider = {
        "type": "fake_multinode",
        "use_node_id_as_ip": True,
        "disable_node_updaters": True,
        "disable_launch_config_check": True,
    }
    if gcs_address:
        provider["gcs_address"] = gcs_address
    return {
        "cluster_name": f"{launcher.get('cluster_name', 'rayrl')}-fake",
        "max_workers": max_workers_per_type * max(len(workers), 1),
        "upscaling_speed": launcher.get("upscaling_speed", 1.0),
        "idle_timeout_minutes": idle_timeout_minutes,
        "provider": provider,
        "auth": {},
        "docker": {},
        "head_node_type": "ray.head.default",  # the name the fake provider gives its head
        "available_node_types": {
            "ray.head.default": {
                "resources": {"CPU": head_cpus},
                "node_config": {},
                "min_workers": 0,
                "max_workers": 0,
            },
            **workers,
        },
        "file_mounts": {},
        "cluster_synced_files": [],
        "file_mounts_sync_continuously": False,
        "rsync_exclude": [],
        "rsync_filter": [],
        "initialization_commands": [],
        "setup_commands": [],
        "head_setup_commands": [],
        "worker_setup_commands": [],
        "head_start_ray_commands": [],
        "worker_start_ray_commands": [],
    }
