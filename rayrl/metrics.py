"""Application metrics: hardware sampling into every result, and Ray gauges for Prometheus.

Each trial process (the RLlib Algorithm, a Tune Trainable) samples its node's hardware once per
iteration into ``result["rayrl"]`` (so the figures land in history.csv) and sets ``ray.util.metrics``
gauges tagged by experiment and trial (so they appear in Ray's Prometheus export as ``ray_rayrl_*``
and in the dashboard's Metrics view). State (counters for rates, the gauges) lives in objects
held by the trial's callback, never in module globals. NVML (``nvidia-ml-py``, the ``gpu`` extra)
and psutil are imported when first used.
"""

from __future__ import annotations

import logging
import math
import os
import re
import time
from pathlib import PurePosixPath
from typing import Any, Callable, Mapping

from rayrl import cost, keys

logger = logging.getLogger(__name__)

COST_PER_M_SAMPLES = "rayrl/cost_per_million_samples"  #: USD per million env steps, so far (if priced)

#: (Prometheus name without Ray's ``ray_`` prefix, result key, description)
GAUGES: tuple[tuple[str, str, str], ...] = (
    ("rayrl_env_steps_per_s", keys.ENV_STEPS_PER_S, "End-to-end env steps per second (sampling + learning)"),
    ("rayrl_learner_samples_per_s", keys.LEARNER_SAMPLES_PER_S, "Samples the learners trained on per second, "
     "epochs included"),
    ("rayrl_batch_size", keys.GLOBAL_BATCH, "Global train batch: per-learner batch x learners, env steps"),
    ("rayrl_episode_return", keys.EPISODE_RETURN, "Mean return of recent episodes"),
    ("rayrl_nonfinite_steps", keys.NONFINITE_STEPS, "Non-finite (NaN/Inf) learner steps skipped, lifetime"),
    ("rayrl_loss_scale", keys.LOSS_SCALE, "fp16 dynamic loss scale"),
    ("rayrl_cost_per_million_samples", COST_PER_M_SAMPLES, "USD per million env steps trained on, so far"),
    ("rayrl_cpu_util", keys.CPU_UTIL, "Node CPU utilisation, fraction"),
    ("rayrl_mem_util", keys.MEM_UTIL, "Node host memory in use, fraction"),
    ("rayrl_gpu_util", keys.GPU_UTIL, "Mean utilisation of the trial's GPUs (its remote learners' when it has "
     "them), fraction"),
    ("rayrl_gpu_mem_util", keys.GPU_MEM_UTIL, "Peak memory in use on the trial's GPUs (its remote learners' "
     "when it has them), fraction"),
    ("rayrl_env_runner_gpu_util", "rayrl/env_runner_gpu_util", "Mean GPU utilisation on the env runners' "
     "nodes, fraction"),
    ("rayrl_net_util", keys.NET_UTIL, "Busiest NIC's throughput over its link speed, fraction"),
)
TAG_KEYS = ("experiment", "trial")
HARDWARE_FIELDS = ("cpu_util", "mem_util", "gpu_util", "gpu_mem_util", "net_util")


class HardwareSampler:
    """Samples CPU, host memory, GPU (NVML) and network utilisation as fractions 0..1 (NaN if unknown).

    Rates (CPU busy time, NIC bytes) are taken between consecutive :meth:`sample` calls; the
    first interval starts when the sampler is made. ``nvml`` and ``psutil_module`` are for tests.
    """

    def __init__(self, nvml: Any = None, psutil_module: Any = None, gpu_indices: list[int] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if psutil_module is None:
            import psutil as psutil_module
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
            if nic not in nics or nic not in last or not st.isup or not st.speed or nic == "lo" or \
                    "loopback" in str(getattr(st, "flags", "")) or dt <= 0:
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
            indices = self._gpu_indices if self._gpu_indices is not None else visible_gpus(
                self._nvml.nvmlDeviceGetCount())
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


def hardware_sample() -> dict[str, float]:
    """One reading from a fresh sampler (rates over a short interval): a convenience for scripts."""
    sampler = HardwareSampler()
    time.sleep(0.1)
    return sampler.sample()


class Publisher:
    """The rayrl gauges for one trial, tagged {experiment, trial}; made once per trial process."""

    def __init__(self, experiment: str, trial: str, gauge: Callable[..., Any] | None = None) -> None:
        if gauge is None:
            from ray.util.metrics import Gauge as gauge
        tags = {"experiment": experiment, "trial": trial}
        self._gauges = [(key, gauge(name, description=desc, tag_keys=TAG_KEYS).set_default_tags(tags))
                        for name, key, desc in GAUGES]

    def publish(self, result: dict) -> dict[str, float]:
        """Set every gauge whose value in ``result`` is a finite number; return what was set."""
        published = {}
        for key, g in self._gauges:
            value = _number(keys.lookup(result, key))
            if value is not None:
                g.set(value)
                published[key] = value
        return published


# Tune trial ids: 8 hex digits (searcher trials) or 5 hex digits + "_" + 5 digits (grid/random),
# in rayrl's folder names ("PPO_<id>", rayrl.train.trial_dirname) or Tune's ("PPO_<env>_<id>_<n>_...").
_TRIAL_ID = re.compile(r"_([0-9a-f]{8}|[0-9a-f]{5}_\d{5})(?:_\d+)?(?:_|$)")


def trial_tags(algorithm: Any) -> tuple[str, str]:
    """(experiment, trial) of a Tune trial's Algorithm; "none" for either outside Tune.

    RLlib drops Tune's trial info from the config, so inside a trial ``algorithm.trial_id`` says
    "default"; the trial's StorageContext still names it. The experiment is "RUN/TUNE_EXPERIMENT"
    (e.g. "my-sweep/phase2", "my-run/tune"): the run folder's name (the last part of Tune's
    storage path) and Tune's experiment in it, so two sweeps' phase 2 do not share a tag. The
    trial is Tune's trial id, parsed from the trial folder name ("PPO_<id>" as rayrl names it).
    """
    info = getattr(algorithm, "_trial_info", None)
    storage = getattr(algorithm, "_storage", None)
    experiment = getattr(info, "experiment_name", None) or getattr(storage, "experiment_dir_name", None)
    root = getattr(storage, "storage_fs_path", None)
    if experiment and isinstance(root, str) and PurePosixPath(root).name:
        experiment = f"{PurePosixPath(root).name}/{experiment}"
    trial = getattr(info, "trial_id", None)
    if not trial:
        match = _TRIAL_ID.search(str(getattr(storage, "trial_dir_name", None) or ""))
        trial = match.group(1) if match else getattr(algorithm, "trial_id", None)
    return str(experiment or "none"), str(trial) if trial and trial != "default" else "none"


def algorithm_resources(algorithm: Any) -> cost.TrialResources:
    """GPUs and CPUs the trial holds: Tune's placement group if known, else rayrl.cost's model of the config."""
    pgf = getattr(algorithm, "trial_resources", None)
    required = getattr(pgf, "required_resources", None)
    if isinstance(required, Mapping) and required:
        return cost.TrialResources(gpus=float(required.get("GPU", 0.0)), cpus=float(required.get("CPU", 0.0)))
    c = algorithm.config
    section = {"env_runners": c.num_env_runners, "learners": c.num_learners,
               "gpus_per_learner": c.num_gpus_per_learner, "cpus_per_env_runner": c.num_cpus_per_env_runner}
    if isinstance(c.num_cpus_per_learner, (int, float)):  # "auto" (a local GPU learner): not counted
        section["cpus_per_learner"] = c.num_cpus_per_learner
    return cost.trial_resources(section)


class TrialObserver:
    """Per-trial state: the hardware sampler, the gauges, and the prices if the config carries them.

    Cost per million samples is computed only when ``learner_config_dict["cost"]`` holds the
    spec's prices: resources x time so far x prices / env steps so far. Without prices no cost
    figure is invented.
    """

    def __init__(self, algorithm: Any, sampler: HardwareSampler | None = None,
                 publisher: Publisher | None = None) -> None:
        self.experiment, self.trial = trial_tags(algorithm)
        self._algorithm = algorithm  # its remote learners and env runners sample their own hardware
        self.sampler = sampler or HardwareSampler()
        self._publisher = publisher
        self._publish_failed = False
        prices = (getattr(algorithm.config, "learner_config_dict", None) or {}).get("cost")
        self.prices = cost.prices_from(prices) if prices else None
        self.resources = algorithm_resources(algorithm) if self.prices else None

    def observe(self, result: dict) -> None:
        """Add the hardware sample (and learner rate, cost) to result["rayrl"], then publish."""
        section = result.setdefault("rayrl", {})
        section.update(self.sampler.sample())
        from rayrl import worker_hardware  # imports this module

        worker_hardware.aggregate(section, *worker_hardware.collect(self._algorithm))
        if section.get("learner_samples_per_s") is None:
            rate = _number(keys.lookup(result, "learners/__all_modules__/num_module_steps_trained_throughput"))
            section["learner_samples_per_s"] = math.nan if rate is None else rate
        if self.prices is not None:
            steps = _number(keys.lookup(result, keys.ENV_STEPS))
            wall = _number(result.get(keys.TIME_TOTAL))
            usd = cost.trial_cost(self.resources, wall, self.prices) if wall is not None else math.nan
            section["cost_per_million_samples"] = cost.per_million(cost.cost_per_sample(usd, steps or 0.0))
        self._publish(result)

    def _publish(self, result: dict) -> None:
        if self._publish_failed:
            return
        try:
            if self._publisher is None:
                self._publisher = Publisher(self.experiment, self.trial)
            self._publisher.publish(result)
        except Exception as exc:  # noqa: BLE001 - metrics must never fail a training step
            self._publish_failed = True
            logger.warning("rayrl metrics: publishing to Ray's metrics failed (%s); gauges are off for this "
                           "trial, results still carry the figures.", exc)


def _number(value: Any) -> float | None:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None
