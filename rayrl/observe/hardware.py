"""Hardware sampling (CPU, memory, NVML GPUs, NICs), where the work runs: inside each Learner actor and
on each EnvRunner's node.

The trial's own process holds no GPU when ``learners >= 1`` (Ray gives the GPUs to the Learner
actors), so its NVML reading says nothing about the learners. Here each remote Learner and
EnvRunner keeps its own :class:`HardwareSampler` (made on the first call, so its
rates span one iteration, and its GPUs are the ones Ray made visible to that actor) and returns
a reading tagged with its pid and node. :func:`aggregate` (pure) folds the readings into the
trial's figures: with remote learners the trial's ``gpu_util`` is the learners' mean and
``gpu_mem_util`` their peak, so the report, the doctor and the gauges judge the right devices.
NVML (``nvidia-ml-py``, the ``gpu`` extra) and psutil are imported when first used.
"""

from __future__ import annotations

import math
import os
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rayrl.faults.watchdog import answered_ahead

HARDWARE_FIELDS = ("cpu_util", "mem_util", "gpu_util", "gpu_mem_util", "net_util")


class HardwareSampler:
    """Samples CPU, host memory, GPU (NVML) and network utilisation as fractions 0..1 (NaN if unknown).

    Rates (CPU busy time, NIC bytes) are taken between consecutive :meth:`sample` calls; the
    first interval starts when the sampler is made. ``nvml`` and ``psutil_module`` are for tests.
    """

    def __init__(
        self,
        nvml: Any = None,
        psutil_module: Any = None,
        gpu_indices: list[int] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if psutil_module is None:
            import psutil

            psutil_module = psutil
        self._ps = psutil_module
        self._clock = clock
        self._nvml = nvml
        self._gpu_indices = gpu_indices
        self._gpu_handles: list | None = None  # opened on the first sample
        self._cpu = self._cpu_times()
        self._net = (self._clock(), self._nic_bytes())

    def sample(self) -> dict[str, float]:
        """One reading: {cpu_util, mem_util, gpu_util, gpu_mem_util, net_util}."""
        out = dict.fromkeys(HARDWARE_FIELDS, math.nan)
        out["cpu_util"] = self._cpu_util()
        try:
            out["mem_util"] = float(self._ps.virtual_memory().percent) / 100.0
        except Exception:  # noqa: BLE001 - a missing figure is NaN, never a failed training step
            pass
        out["net_util"] = self._net_util()
        out["gpu_util"], out["gpu_mem_util"] = self._gpu()
        return out

    def _cpu_times(self) -> tuple[float, float] | None:
        try:
            t = self._ps.cpu_times()
        except Exception:  # noqa: BLE001
            return None
        # As psutil.cpu_percent does: guest time is already inside user/nice on Linux.
        total = sum(t) - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0)
        return total - t.idle - getattr(t, "iowait", 0.0), total

    def _cpu_util(self) -> float:
        now, last = self._cpu_times(), self._cpu
        self._cpu = now
        if now is None or last is None or now[1] <= last[1]:
            return math.nan
        return min(max((now[0] - last[0]) / (now[1] - last[1]), 0.0), 1.0)

    def _nic_bytes(self) -> dict[str, tuple[int, int]]:
        try:
            counters = self._ps.net_io_counters(pernic=True)
        except Exception:  # noqa: BLE001
            return {}
        return {nic: (c.bytes_sent, c.bytes_recv) for nic, c in counters.items()}

    def _net_util(self) -> float:
        now, nics = self._clock(), self._nic_bytes()
        last_t, last = self._net
        self._net = (now, nics)
        try:
            stats = self._ps.net_if_stats()
        except Exception:  # noqa: BLE001
            return math.nan
        dt, best = now - last_t, math.nan
        if dt < 0.05:  # too short an interval for an honest rate (e.g. the first sample)
            return math.nan
        for nic, st in stats.items():
            if (
                nic not in nics
                or nic not in last
                or not st.isup
                or not st.speed
                or nic == "lo"
                or "loopback" in str(getattr(st, "flags", ""))
                or dt <= 0
            ):
                continue
            # Full duplex: each direction has the link speed (Mbit/s); judge the busier one.
            rate = max(nics[nic][0] - last[nic][0], nics[nic][1] - last[nic][1]) / dt
            if rate < 0:  # counters reset (NIC re-created): no honest rate this interval
                continue
            # A virtual NIC can move more than the speed it reports: that is a saturated link, 1.0.
            util = min(rate * 8.0 / (st.speed * 1e6), 1.0)
            best = util if math.isnan(best) else max(best, util)
        return best

    def _gpu(self) -> tuple[float, float]:
        handles = self._handles()
        if not handles:
            return math.nan, math.nan
        try:
            util = [self._nvml.nvmlDeviceGetUtilizationRates(h).gpu / 100.0 for h in handles]
            mem = [(m.used / m.total) for m in (self._nvml.nvmlDeviceGetMemoryInfo(h) for h in handles)]
        except Exception:  # noqa: BLE001 - NVMLError, a lost GPU: unknown this time
            return math.nan, math.nan
        return sum(util) / len(util), max(mem)

    def _handles(self) -> list:
        if self._gpu_handles is None:
            self._gpu_handles = self._open_gpus()
        return self._gpu_handles

    def _open_gpus(self) -> list:
        if self._nvml is None:
            try:
                import pynvml  # nvidia-ml-py: the optional `gpu` extra
            except ImportError:
                return []
            self._nvml = pynvml
        try:
            self._nvml.nvmlInit()
            indices = (
                self._gpu_indices if self._gpu_indices is not None else visible_gpus(self._nvml.nvmlDeviceGetCount())
            )
            return [self._nvml.nvmlDeviceGetHandleByIndex(i) for i in indices]
        except Exception:  # noqa: BLE001 - no driver, no GPU
            return []


def visible_gpus(count: int, env: Mapping[str, str] | None = None) -> list[int]:
    """The physical GPU indices this process may use: CUDA_VISIBLE_DEVICES (as Ray sets it), else all."""
    env = os.environ if env is None else env
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return list(range(count))
    ids = [v.strip() for v in visible.split(",") if v.strip()]
    if not all(v.isdigit() for v in ids):  # UUIDs or MIG names: cannot map, use all
        return list(range(count))
    return [int(v) for v in ids if int(v) < count]


#: rayrl result keys (inside result["rayrl"]) this module writes
LEARNERS_KEY, RUNNERS_KEY = "learner_hardware", "env_runner_hardware"
TIMEOUT_S = 10.0
HARDWARE_TAG = "rayrl_hardware"  #: the tag of a reading asked for without waiting


def sample_here(worker: Any, *_: Any) -> dict[str, Any]:
    """One reading in this process (a Learner or EnvRunner), with its pid and host."""
    sampler = getattr(worker, "_rayrl_hw_sampler", None)
    if sampler is None:
        sampler = HardwareSampler()
        worker._rayrl_hw_sampler = sampler
    return {"pid": os.getpid(), "host": socket.gethostname(), **sampler.sample()}


def collect(algorithm: Any) -> tuple[list[dict], list[dict]]:
    """Readings from every remote Learner and remote EnvRunner; [] where there are none or calls fail."""
    learners: list[dict] = []
    group = getattr(algorithm, "learner_group", None)
    if group is not None and not group.is_local:
        try:
            learners = [r.get() for r in group.foreach_learner(sample_here, timeout_seconds=TIMEOUT_S) if r.ok]
        except Exception:  # noqa: BLE001 - a lost learner is the fault tolerance's business, not the metrics'
            learners = []
    runners: list[dict] = []
    runner_group = getattr(algorithm, "env_runner_group", None)
    if runner_group is not None and runner_group.num_remote_env_runners() > 0:
        try:
            runners = _runner_readings(algorithm, runner_group)
        except Exception:  # noqa: BLE001
            runners = []
    return learners, runners


def _runner_readings(algorithm: Any, runner_group: Any) -> list[dict]:
    """Each remote runner's reading. A runner that samples ahead (rayrl.rllib.sample_ahead) is busy
    with the next sample, so a blocking call would wait for it: its reading is asked for without
    waiting and the latest one that arrived is reported (one iteration old at most)."""
    if answered_ahead(algorithm) is None:
        return list(runner_group.foreach_env_runner(sample_here, local_env_runner=False, timeout_seconds=TIMEOUT_S))
    ready = runner_group.foreach_env_runner_async_fetch_ready(sample_here, tag=HARDWARE_TAG, timeout_seconds=0.0)
    if ready:
        algorithm.rayrl_runner_readings = list(ready)
    return list(algorithm.rayrl_runner_readings)


def aggregate(section: dict, learners: Sequence[dict], runners: Sequence[dict]) -> dict:
    """Add the readings to a result's rayrl section; the learners' GPU figures replace the trial's."""
    # Keyed by actor index, not a list: loggers flatten dicts (TensorBoard cannot take a list).
    section[LEARNERS_KEY] = {str(i): dict(r) for i, r in enumerate(learners)}
    section[RUNNERS_KEY] = {str(i): dict(r) for i, r in enumerate(runners)}
    for prefix, rows in (("learner", learners), ("env_runner", runners)):
        section[f"{prefix}_gpu_util"] = _mean(r.get("gpu_util") for r in rows)
        section[f"{prefix}_gpu_mem_util"] = _max(r.get("gpu_mem_util") for r in rows)
        section[f"{prefix}_cpu_util"] = _mean(r.get("cpu_util") for r in rows)
    if learners:
        section["gpu_util"] = section["learner_gpu_util"]
        section["gpu_mem_util"] = section["learner_gpu_mem_util"]
    return section


def _finite(values: Any) -> list[float]:
    out = []
    for v in values:
        try:
            f = float(v)
        except (TypeError, ValueError):
            continue
        if math.isfinite(f):
            out.append(f)
    return out


def _mean(values: Any) -> float:
    vals = _finite(values)
    return sum(vals) / len(vals) if vals else math.nan


def _max(values: Any) -> float:
    vals = _finite(values)
    return max(vals) if vals else math.nan
