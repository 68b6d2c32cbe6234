"""Hardware sampling, the gauges, and (slow) the figures in Ray's Prometheus export."""

from __future__ import annotations

import math
import re
import time
import urllib.request
from collections import namedtuple
from types import SimpleNamespace

import pytest
from conftest import free_port

from rayrl.observe import hardware, keys, metrics
from rayrl.observe.cost import TrialResources
from rayrl.tune.tuner import trial_dirname

# ---------------------------------------------------------------------------------------------
# Fakes for psutil and NVML: the sampler's arithmetic without depending on this machine

CpuTimes = namedtuple("CpuTimes", "user nice system idle iowait irq softirq steal guest guest_nice")
Nic = namedtuple("Nic", "bytes_sent bytes_recv")
IfStats = namedtuple("IfStats", "isup duplex speed mtu flags")


class FakePsutil:
    def __init__(self):
        self.cpu = CpuTimes(100, 0, 0, 100, 0, 0, 0, 0, 0, 0)
        self.nics = {"eth0": Nic(0, 0), "lo": Nic(0, 0), "wlan0": Nic(0, 0)}
        self.stats = {
            "eth0": IfStats(True, 2, 1000, 1500, "up"),
            "lo": IfStats(True, 0, 0, 65536, "up,loopback"),
            "wlan0": IfStats(True, 0, 0, 1500, "up"),
        }  # speed unknown

    def cpu_times(self):
        return self.cpu

    def virtual_memory(self):
        return SimpleNamespace(percent=42.0)

    def net_io_counters(self, pernic=False):
        return dict(self.nics)

    def net_if_stats(self):
        return dict(self.stats)


class FakeNvml:
    def __init__(self, util=(90, 50), mem=((30, 100), (80, 100))):
        self.util, self.mem, self.inits = util, mem, 0

    def nvmlInit(self):
        self.inits += 1

    def nvmlDeviceGetCount(self):
        return len(self.util)

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetUtilizationRates(self, h):
        return SimpleNamespace(gpu=self.util[h])

    def nvmlDeviceGetMemoryInfo(self, h):
        used, total = self.mem[h]
        return SimpleNamespace(used=used, total=total)


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_sampler_arithmetic_with_fake_hardware():
    ps, clock, nvml = FakePsutil(), Clock(), FakeNvml()
    s = hardware.HardwareSampler(nvml=nvml, psutil_module=ps, clock=clock)
    # 2 s later: 300 of 400 new CPU-seconds busy; eth0 (1 Gbit/s) sent 50 MB, received 10 MB.
    ps.cpu = CpuTimes(400, 0, 0, 200, 0, 0, 0, 0, 0, 0)
    ps.nics = {"eth0": Nic(50_000_000, 10_000_000), "lo": Nic(10**12, 10**12), "wlan0": Nic(10**9, 0)}
    clock.t = 2.0
    out = s.sample()
    assert set(out) == set(hardware.HARDWARE_FIELDS)
    assert out["cpu_util"] == pytest.approx(0.75)
    assert out["mem_util"] == pytest.approx(0.42)
    assert out["net_util"] == pytest.approx(25_000_000 * 8 / 1e9)  # 0.2 of the link; lo, unknown speed ignored
    assert out["gpu_util"] == pytest.approx(0.70)  # mean of 90% and 50%
    assert out["gpu_mem_util"] == pytest.approx(0.80)  # the fuller GPU
    s.sample()
    assert nvml.inits == 1  # NVML opened once per sampler


def test_sampler_reports_nan_when_unknown():
    ps = FakePsutil()
    ps.stats = {"wlan0": IfStats(True, 0, 0, 1500, "up")}
    broken = FakeNvml()
    broken.nvmlInit = lambda: (_ for _ in ()).throw(RuntimeError("NVML Shared Library Not Found"))
    out = hardware.HardwareSampler(nvml=broken, psutil_module=ps, clock=Clock()).sample()
    assert math.isnan(out["net_util"]) and math.isnan(out["gpu_util"]) and math.isnan(out["gpu_mem_util"])
    assert math.isnan(out["cpu_util"])  # no CPU time passed


def test_sampler_on_this_machine_gives_fractions_or_nan():
    sampler = hardware.HardwareSampler()
    time.sleep(0.1)  # rates need an interval
    out = sampler.sample()
    assert 0.0 <= out["cpu_util"] <= 1.0 and 0.0 < out["mem_util"] < 1.0
    for key in ("gpu_util", "gpu_mem_util", "net_util"):
        assert math.isnan(out[key]) or 0.0 <= out[key] <= 1.0


def test_network_utilisation_stays_a_fraction():
    """A virtual NIC moving more than its reported speed reads saturated (1.0), never above; a counter
    reset (NIC re-created) gives no rate that interval, never a negative one."""
    ps, clock = FakePsutil(), Clock()
    ps.stats = {"veth0": IfStats(True, 2, 100, 1500, "up"), "eth0": IfStats(True, 2, 1000, 1500, "up")}
    ps.nics = {"veth0": Nic(0, 0), "eth0": Nic(10**9, 10**9)}
    s = hardware.HardwareSampler(nvml=FakeNvml(), psutil_module=ps, clock=clock)
    # 1 s: veth0 (100 Mbit/s) received 50 MB = 400 Mbit; eth0's counters went back to 0 and on to 5 MB.
    ps.nics = {"veth0": Nic(0, 50_000_000), "eth0": Nic(5_000_000, 5_000_000)}
    clock.t = 1.0
    assert s.sample()["net_util"] == 1.0
    ps.stats = {"eth0": IfStats(True, 2, 1000, 1500, "up")}
    ps.nics = {"veth0": Nic(0, 50_000_000), "eth0": Nic(0, 0)}  # reset again: 5 MB -> 0
    clock.t = 2.0
    assert math.isnan(s.sample()["net_util"])


def test_visible_gpus_follow_cuda_visible_devices():
    assert hardware.visible_gpus(4, {}) == [0, 1, 2, 3]
    assert hardware.visible_gpus(4, {"CUDA_VISIBLE_DEVICES": "2,3"}) == [2, 3]
    assert hardware.visible_gpus(4, {"CUDA_VISIBLE_DEVICES": ""}) == []
    assert hardware.visible_gpus(2, {"CUDA_VISIBLE_DEVICES": "GPU-1f2e"}) == [0, 1]


class FakeGauge:
    def __init__(self, name, description="", tag_keys=()):
        self.name, self.tag_keys, self.values, self.tags = name, tag_keys, [], {}

    def set_default_tags(self, tags):
        self.tags = tags
        return self

    def set(self, value):
        assert isinstance(value, float)
        self.values.append(value)


def test_publisher_sets_finite_numbers_tagged_by_experiment_and_trial():
    made = []
    p = metrics.Publisher("exp", "t1", gauge=lambda *a, **k: made.append(FakeGauge(*a, **k)) or made[-1])
    result = {
        "env_runners": {"episode_return_mean": 37.5},
        "rayrl": {
            "env_steps_per_s": 1234.0,
            "global_batch": 512,
            "nonfinite_steps": 0.0,
            "loss_scale": math.nan,
            "cpu_util": 0.5,
            "backend": "none",
        },
    }
    published = p.publish(result)
    assert published == {
        keys.ENV_STEPS_PER_S: 1234.0,
        keys.GLOBAL_BATCH: 512.0,
        keys.EPISODE_RETURN: 37.5,
        keys.NONFINITE_STEPS: 0.0,
        keys.CPU_UTIL: 0.5,
    }
    by_name = {g.name: g for g in made}
    assert len(by_name) == len(metrics.GAUGES) and all(g.tags == {"experiment": "exp", "trial": "t1"} for g in made)
    assert by_name["rayrl_env_steps_per_s"].values == [1234.0] and by_name["rayrl_loss_scale"].values == []


def fake_algorithm(trial_info=None, learner_config_dict=None, trial_resources=None):
    config = SimpleNamespace(
        num_learners=0,
        num_cpus_per_learner="auto",
        num_gpus_per_learner=0,
        num_cpus_for_main_process=1,
        num_env_runners=2,
        num_cpus_per_env_runner=1,
        learner_config_dict=learner_config_dict or {},
    )
    return SimpleNamespace(config=config, _trial_info=trial_info, trial_id="default", trial_resources=trial_resources)


def test_trial_tags_inside_and_outside_tune():
    info = SimpleNamespace(experiment_name="phase2", trial_id="a1b2_00003")
    assert metrics.trial_tags(fake_algorithm(info)) == ("phase2", "a1b2_00003")
    tuned = fake_algorithm(info)
    tuned._storage = SimpleNamespace(storage_fs_path="/data/runs/my-sweep", experiment_dir_name="phase2")
    assert metrics.trial_tags(tuned) == ("my-sweep/phase2", "a1b2_00003")
    # What an RLlib Algorithm sees inside Tune: no trial info (RLlib drops it), a StorageContext.
    for dirname, trial in [
        ("PPO_CartPole-v1_79b25a53_3_disable_action_flattening=False,lr=0.0001_2026-11-30_14-12-06", "79b25a53"),
        ("PPO_CartPole-v1_db9e2_00000_0_2026-11-30_14-25-14", "db9e2_00000"),
        ("APPO_rayrl_ale_ALE_Pong-v5_0badcafe_12_2026-11-30_14-25-14", "0badcafe"),
        # rayrl's own trial folders (what rayrl train and the sweep run)
        (trial_dirname(SimpleNamespace(trainable_name="PPO", trial_id="79b25a53")), "79b25a53"),
        (trial_dirname(SimpleNamespace(trainable_name="IMPALA", trial_id="db9e2_00000")), "db9e2_00000"),
    ]:
        algo = fake_algorithm()
        algo._storage = SimpleNamespace(
            storage_fs_path="/runs/cartpole", experiment_dir_name="tune", trial_dir_name=dirname
        )
        assert metrics.trial_tags(algo) == ("cartpole/tune", trial)
    assert metrics.trial_tags(fake_algorithm()) == ("none", "none")


def test_observer_adds_hardware_learner_rate_and_cost_then_publishes():
    prices = {"gpu_hour_usd": 3.0, "cpu_hour_usd": 0.5, "spot_discount": 0.0}
    algo = fake_algorithm(
        learner_config_dict={"cost": prices},
        trial_resources=SimpleNamespace(required_resources={"CPU": 4.0, "GPU": 1.0}),
    )
    sampled = dict.fromkeys(hardware.HARDWARE_FIELDS, 0.5)
    sets = []
    pub = SimpleNamespace(publish=lambda r: sets.append(r))
    obs = metrics.TrialObserver(algo, sampler=SimpleNamespace(sample=lambda: sampled), publisher=pub)
    assert obs.resources == TrialResources(gpus=1.0, cpus=4.0)
    # 1 GPU + 4 CPUs = $5/h; one hour for 1M env steps -> $5 per million.
    result = {
        "rayrl": {"env_steps_per_s": 1.0},
        keys.ENV_STEPS: 1_000_000,
        keys.TIME_TOTAL: 3600.0,
        "learners": {"__all_modules__": {"num_module_steps_trained_throughput": 9000.0}},
    }
    obs.observe(result)
    assert result["rayrl"]["cpu_util"] == 0.5 and result["rayrl"]["net_util"] == 0.5
    assert result["rayrl"]["learner_samples_per_s"] == 9000.0
    assert result["rayrl"][metrics.COST_PER_M_SAMPLES.split("/")[1]] == pytest.approx(5.0)
    assert sets == [result]


@pytest.mark.parametrize(
    "resources",
    [
        {"env_runners": 2},
        {"env_runners": 0, "gpus_per_learner": 1.0},  # a GPU learner in the trial's process
        {"env_runners": 8, "learners": 4, "gpus_per_learner": 1.0, "cpus_per_learner": 2, "cpus_per_env_runner": 2},
        {"env_runners": 3, "learners": 2, "cpus_per_learner": 1.5, "cpus_per_env_runner": 0.5},
    ],
)
def test_a_trials_resources_have_one_model(resources):
    """Outside Tune the gauge's cost (RLlib's request for the algorithm's config) and the run folder's
    cost (rayrl.tune.resources, from the spec) agree."""
    from rayrl.rllib.algo import algorithm_class, build_config
    from rayrl.spec import from_dict
    from rayrl.tune.resources import of_spec

    spec = from_dict({"resources": resources})
    cls = algorithm_class(spec.algo.name)
    algorithm = cls.__new__(cls)  # an Algorithm's type and config, not a started one
    algorithm.config, algorithm._trial_info = build_config(spec), None
    assert metrics.algorithm_resources(algorithm) == of_spec(spec)


def test_observer_invents_no_cost_without_prices_and_survives_a_broken_publisher():
    algo = fake_algorithm(trial_resources=SimpleNamespace(required_resources={"CPU": 3.0}))
    assert metrics.algorithm_resources(algo) == TrialResources(gpus=0.0, cpus=3.0)  # Tune's placement group

    class Broken:
        calls = 0

        def publish(self, result):
            Broken.calls += 1
            raise RuntimeError("no metrics agent")

    obs = metrics.TrialObserver(algo, sampler=SimpleNamespace(sample=dict), publisher=Broken())
    result = {keys.ENV_STEPS: 100, keys.TIME_TOTAL: 1.0}
    obs.observe(result)
    obs.observe(result)
    assert "cost_per_million_samples" not in result["rayrl"] and Broken.calls == 1


def test_the_callback_keeps_one_observer_per_trial_made_at_algorithm_init(monkeypatch):
    from rayrl.rllib.callback import RayrlCallback

    made = []

    class Obs:
        def __init__(self, algorithm):
            made.append(algorithm)

        def observe(self, result):
            result["rayrl"]["seen"] = len(made)

    monkeypatch.setattr(metrics, "TrialObserver", Obs)
    config = SimpleNamespace(
        learner_config_dict={}, num_learners=0, train_batch_size_per_learner=100, minibatch_size=50, lr=1e-3
    )
    algorithm = SimpleNamespace(config=config, learner_group=None)
    callback = RayrlCallback()
    callback.on_algorithm_init(algorithm=algorithm)
    assert made == [algorithm]  # before any result: the first hardware interval starts here
    for steps in (100, 200):
        result = {keys.ENV_STEPS: steps, "time_this_iter_s": 1.0}
        callback.on_train_result(algorithm=algorithm, result=result)
        assert result["rayrl"]["seen"] == 1 and result["rayrl"]["global_batch"] == 100


# ---------------------------------------------------------------------------------------------
# Ray's Prometheus export, end to end


def _scrape(
    port: int, names: tuple[str, ...], timeout_s: float, tags: dict[str, str] | None = None
) -> dict[str, list[tuple[dict, float]]]:
    """Poll the export until every name has a sample (with ``tags``, if given): exports lag seconds."""
    deadline, found = time.monotonic() + timeout_s, {}
    line = re.compile(r"^(ray_rayrl_\w+)\{(.*)\} (\S+)$")
    while time.monotonic() < deadline:
        try:
            body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        except OSError:
            body = ""
        found = {}
        for text in body.splitlines():
            m = line.match(text)
            if m:
                labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
                found.setdefault(m.group(1), []).append((labels, float(m.group(3))))
        if all(any(tags is None or tags.items() <= t.items() for t, _ in found.get(n, [])) for n in names):
            return found
        time.sleep(1.0)
    return found


@pytest.fixture(scope="module")
def metrics_port():
    """A local Ray exporting metrics on a free port, shut down after this module's slow tests."""
    import ray

    port = free_port()
    ray.init(address="local", num_cpus=1, _metrics_export_port=port, include_dashboard=False, log_to_driver=False)
    yield port
    ray.shutdown()


def small_config(priced: bool = True):
    from rayrl import spec
    from rayrl.rllib import algo

    config = algo.build_config(
        spec.from_dict(
            {"algo": {"train_batch_per_learner": 512, "minibatch_size": 128}, "resources": {"env_runners": 0}}
        )
    )
    if priced:  # the spec's prices, as learner_settings would carry them: cost is computed in-process
        config.learners(
            learner_config_dict={**config.learner_config_dict, "cost": {"gpu_hour_usd": 3.0, "cpu_hour_usd": 0.05}}
        )
    return config


@pytest.mark.slow
def test_training_publishes_rayrl_metrics_to_prometheus(metrics_port):
    algorithm = small_config().build_algo()
    try:
        results = [algorithm.train() for _ in range(3)]
    finally:
        algorithm.stop()
    last = results[-1]
    for key in (keys.CPU_UTIL, keys.MEM_UTIL, keys.GPU_UTIL, keys.NET_UTIL, keys.LEARNER_SAMPLES_PER_S):
        assert keys.lookup(last, key) is not None, key
    assert 0.0 < keys.lookup(last, keys.MEM_UTIL) < 1.0 and 0.0 <= keys.lookup(last, keys.CPU_UTIL) <= 1.0
    names = (
        "ray_rayrl_env_steps_per_s",
        "ray_rayrl_batch_size",
        "ray_rayrl_cpu_util",
        "ray_rayrl_mem_util",
        "ray_rayrl_nonfinite_steps",
        "ray_rayrl_learner_samples_per_s",
        "ray_rayrl_episode_return",
        "ray_rayrl_cost_per_million_samples",
    )
    found = _scrape(metrics_port, names, timeout_s=60, tags={"experiment": "none", "trial": "none"})
    missing = [n for n in names if n not in found]
    assert not missing, f"not exported within 60 s: {missing}; got {sorted(found)}"
    mine = {n: [v for tags, v in found[n] if tags.get("experiment") == "none"] for n in names}
    value = lambda n: mine[n][-1]  # noqa: E731
    assert value("ray_rayrl_batch_size") == 512.0
    assert 10.0 < value("ray_rayrl_env_steps_per_s") < 1e6
    assert 0.0 <= value("ray_rayrl_cpu_util") <= 1.0 and 0.0 < value("ray_rayrl_mem_util") < 1.0
    assert value("ray_rayrl_nonfinite_steps") == 0.0
    assert value("ray_rayrl_learner_samples_per_s") > 0.0
    assert 8.0 <= value("ray_rayrl_episode_return") <= 500.0  # CartPole returns
    # 1 CPU at $0.05/hour for well under a minute, over ~1.5k env steps: cents per million at most.
    assert 0.0 < value("ray_rayrl_cost_per_million_samples") < 10.0


@pytest.mark.slow
def test_tune_trials_are_tagged_with_run_experiment_and_trial_id(metrics_port, tmp_path):
    from ray import tune

    from rayrl.rllib.algo import algorithm_class

    tuner = tune.Tuner(
        algorithm_class("PPO"),
        param_space=small_config(priced=False),
        run_config=tune.RunConfig(
            name="phase2", storage_path=str(tmp_path / "my-sweep"), stop={keys.ITERATION: 2}, verbose=0
        ),
    )
    result = tuner.fit()[0]
    assert result.error is None
    trial_id = result.metrics["trial_id"]
    want = {"experiment": "my-sweep/phase2", "trial": trial_id}
    found = _scrape(metrics_port, ("ray_rayrl_batch_size", "ray_rayrl_env_steps_per_s"), timeout_s=60, tags=want)
    tags = [t for t, _ in found.get("ray_rayrl_batch_size", [])]
    assert any(want.items() <= t.items() for t in tags), f"no series tagged {want}: {tags}"


# ---------------------------------------------------------------------------------------------
# Monitoring assets stay in step with the gauges


def test_grafana_dashboard_has_a_panel_per_gauge_with_rays_prefix():
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "monitoring"
    dash = json.loads((root / "grafana" / "rayrl_dashboard.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    for name, _, _ in metrics.GAUGES:
        assert any(f"ray_{name}{{" in e for e in exprs), f"no panel for ray_{name}"
    assert {v["name"] for v in dash["templating"]["list"]} >= {"datasource", "experiment", "trial"}
    assert all('experiment=~"$experiment"' in e and 'trial=~"$trial"' in e for e in exprs)


def test_prometheus_config_reads_rays_service_discovery_file():
    from pathlib import Path

    import yaml

    cfg = yaml.safe_load((Path(__file__).resolve().parents[1] / "monitoring" / "prometheus.yml").read_text())
    (job,) = cfg["scrape_configs"]
    assert job["file_sd_configs"][0]["files"] == ["/tmp/ray/prom_metrics_service_discovery.json"]
