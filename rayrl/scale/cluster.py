"""The cluster a capacity plan is for: accelerators per node, interconnect, prices.

A description is a small YAML file (``rayrl plan --cluster FILE``) or one of the presets below,
validated field by field as the experiment spec is (:func:`rayrl.spec.build_section`), so a bad
value gets one paragraph naming the field, the value and what is valid. Bandwidths are NCCL
*bus* bandwidth as nccl-tests prints it (``busbw``, GB/s), the figure to paste from a measured
``all_reduce_perf`` run; latencies are per all-reduce step, microseconds. The presets' figures
are public orders of magnitude (see docs/scale.md), not measurements of your cluster.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from rayrl.errors import SpecError
from rayrl.spec import build_section, doc


@dataclass(frozen=True)
class ClusterSpec:
    name: str = doc("custom", "a label for the plan's header")
    gpu: str = doc("H100", "accelerator type (a label)")
    gpus_per_node: int = doc(8, "accelerators (learners) per node", min=1)
    cpus_per_node: int = doc(96, "CPUs per accelerator node, for env runners and learners", min=1)
    cpus_per_cpu_node: int = doc(96, "CPUs per CPU-only node, added when env runners do not fit", min=1)
    intra_node_busbw_gbs: float = doc(450.0, "all-reduce bus bandwidth inside a node (NVLink), GB/s", gt=0.0)
    intra_node_latency_us: float = doc(5.0, "latency per all-reduce step inside a node, us", ge=0.0)
    inter_node_busbw_gbs: float = doc(50.0, "all-reduce bus bandwidth across nodes (InfiniBand/EFA/RoCE), GB/s", gt=0.0)
    inter_node_latency_us: float = doc(10.0, "latency per all-reduce step across nodes, us", ge=0.0)
    gpu_hour_usd: float | None = doc(
        None,
        "price of one accelerator-hour (node price / accelerators), USD; null: the run's cost.gpu_hour_usd",
        ge=0.0,
    )
    cpu_hour_usd: float | None = doc(
        None, "price of one CPU-hour on CPU-only nodes, USD; null: the run's cost.cpu_hour_usd", ge=0.0
    )
    spot_discount: float | None = doc(
        None, "fraction off on spot capacity; null: the run's cost.spot_discount", ge=0.0, lt=1.0
    )


#: Public orders of magnitude per node type (docs/scale.md cites them); prices come from the run.
PRESETS: dict[str, ClusterSpec] = {
    # 8x H100 SXM with NVLink 4 / NVSwitch; 8x 400 Gb/s InfiniBand NDR (50 GB/s per GPU).
    "h100-ib": ClusterSpec(
        name="h100-ib",
        gpu="H100",
        gpus_per_node=8,
        cpus_per_node=192,
        intra_node_busbw_gbs=450.0,
        inter_node_busbw_gbs=50.0,
    ),
    # 8x A100 SXM with NVLink 3; 8x 200 Gb/s InfiniBand HDR (25 GB/s per GPU).
    "a100-ib": ClusterSpec(
        name="a100-ib",
        gpu="A100",
        gpus_per_node=8,
        cpus_per_node=96,
        intra_node_busbw_gbs=230.0,
        inter_node_busbw_gbs=25.0,
    ),
    # AWS p5.48xlarge: 8x H100, EFA 3200 Gb/s per node (400 GB/s, 50 GB/s per GPU).
    "aws-p5": ClusterSpec(
        name="aws-p5",
        gpu="H100",
        gpus_per_node=8,
        cpus_per_node=192,
        intra_node_busbw_gbs=450.0,
        inter_node_busbw_gbs=50.0,
        inter_node_latency_us=20.0,
    ),
    # GCP a3-highgpu-8g: 8x H100, 1000 Gb/s GPUDirect-TCPX per node (12.5 GB/s per GPU).
    "gcp-a3": ClusterSpec(
        name="gcp-a3",
        gpu="H100",
        gpus_per_node=8,
        cpus_per_node=208,
        intra_node_busbw_gbs=450.0,
        inter_node_busbw_gbs=12.5,
        inter_node_latency_us=25.0,
    ),
    # PCIe cards on 25 Gb/s Ethernet: the commodity floor.
    "pcie-ethernet": ClusterSpec(
        name="pcie-ethernet",
        gpu="L4",
        gpus_per_node=4,
        cpus_per_node=48,
        intra_node_busbw_gbs=20.0,
        inter_node_busbw_gbs=3.0,
        inter_node_latency_us=30.0,
    ),
}
DEFAULT_PRESET = "h100-ib"


def load(source: str | None) -> ClusterSpec:
    """A preset name, a YAML file (optionally ``preset: NAME`` plus overrides), or the default preset."""
    if source is None:
        return PRESETS[DEFAULT_PRESET]
    if source in PRESETS:
        return PRESETS[source]
    path = Path(source)
    if not path.is_file():
        raise SpecError(
            f"--cluster: {source!r} is neither a file nor a preset; give a YAML cluster description "
            f"(fields: `rayrl plan --help`) or one of {', '.join(PRESETS)}."
        )
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise SpecError(f"--cluster: {path} is not valid YAML ({' '.join(str(exc).split())[:200]}).") from None
    if not isinstance(data, dict):
        raise SpecError(f"--cluster: {path} holds {type(data).__name__}; expected a mapping of cluster fields.")
    return from_dict(data, str(path))


def from_dict(data: dict[str, Any], where: str = "cluster") -> ClusterSpec:
    """Validate a description; ``preset`` names the base whose fields the others override."""
    data = dict(data)
    base_name = data.pop("preset", None)
    if base_name is not None and base_name not in PRESETS:
        raise SpecError(f"{where}: preset {base_name!r} is unknown; valid presets: {', '.join(PRESETS)}.")
    base = PRESETS[base_name] if base_name else ClusterSpec()
    given = build_section(ClusterSpec, data, where)
    return replace(base, **{k: getattr(given, k) for k in data})
