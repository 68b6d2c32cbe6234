"""The one model of what a trial holds (rayrl.tune.resources), checked against RLlib's own placement group.

Cost, the gauges, the concurrency and the misfit check all read this model; if it drifted from what
RLlib asks Ray for, confirm.csv's ``usd`` would price resources the trial does not hold.
"""

from __future__ import annotations

import pytest

from rayrl import spec as S
from rayrl.observe.cost import TrialResources
from rayrl.rllib.algo import algorithm_class, build_config
from rayrl.spec import ResourcesSpec
from rayrl.tune import resources

SPECS = [
    {},
    {"resources": {"env_runners": 0}, "evaluation": {"env_runners": 0}},
    {"resources": {"env_runners": 3, "cpus_per_env_runner": 2}},
    {"resources": {"env_runners": 2, "learners": 2, "cpus_per_learner": 1}},
    {"resources": {"env_runners": 1, "learners": 0, "cpus_per_learner": 3}},
    {"evaluation": {"interval": 2, "env_runners": 2}, "resources": {"env_runners": 1}},
    {"evaluation": {"interval": 0, "env_runners": 2}, "resources": {"env_runners": 1}},  # evaluation off
    {"algo": {"name": "IMPALA"}, "resources": {"env_runners": 2, "learners": 1, "cpus_per_learner": 2}},
]


@pytest.mark.parametrize("data", SPECS, ids=lambda d: str(d) or "defaults")
def test_the_model_equals_rllibs_placement_group(data):
    spec = S.from_dict(data)
    request = algorithm_class(spec.algo.name).default_resource_request(build_config(spec)).required_resources
    assert resources.of_spec(spec) == TrialResources(
        gpus=float(request.get("GPU", 0.0)), cpus=float(request.get("CPU", 0.0))
    )


def test_gpu_learners_are_counted_where_they_run():
    # A local learner on the trial's process with one GPU, 2 env runners of 1 CPU.
    assert resources.trial_resources(ResourcesSpec(env_runners=2, learners=0, gpus_per_learner=1.0)) == TrialResources(
        gpus=1.0, cpus=3.0
    )
    # 4 remote GPU learners with 2 CPUs each, 8 env runners, plus the trial's own CPU.
    assert resources.trial_resources(
        {"env_runners": 8, "learners": 4, "gpus_per_learner": 1.0, "cpus_per_learner": 2.0}
    ) == TrialResources(gpus=4.0, cpus=17.0)
    assert resources.trial_resources({}) == TrialResources(gpus=0.0, cpus=2.0)  # spec defaults
    assert resources.trial_resources({}, evaluation_env_runners=2) == TrialResources(gpus=0.0, cpus=4.0)


@pytest.mark.parametrize(
    "cluster,held,configured,expected",
    [
        ({"CPU": 2.0}, TrialResources(0.0, 2.0), 0, 1),
        ({"CPU": 2.0}, TrialResources(0.0, 1.0), 0, 2),
        ({"CPU": 64.0, "GPU": 8.0}, TrialResources(2.0, 5.0), 0, 4),  # GPUs are the limit
        ({"CPU": 8.0, "GPU": 8.0}, TrialResources(1.0, 5.0), 0, 1),  # CPUs are the limit
        ({"CPU": 1.0}, TrialResources(0.0, 4.0), 0, 1),  # never below one
        ({"CPU": 64.0}, TrialResources(0.0, 1.0), 3, 3),  # the spec's explicit number wins
    ],
)
def test_max_concurrent_trials(cluster, held, configured, expected):
    assert resources.max_concurrent_trials(cluster, held, configured) == expected


def test_a_trial_larger_than_a_fixed_cluster_is_named_with_its_shortfall():
    assert resources.trial_misfit({"CPU": 2.0}, TrialResources(0.0, 2.0)) is None
    assert resources.trial_misfit({"CPU": 8.0, "GPU": 1.0}, TrialResources(1.0, 3.0)) is None
    why = resources.trial_misfit({"CPU": 2.0}, TrialResources(0.0, 4.0))
    assert why and "4 CPUs (the cluster has 2)" in why and "evaluation.env_runners" in why and "--num-cpus" in why
    why = resources.trial_misfit({"CPU": 16.0}, TrialResources(4.0, 5.0))
    assert why and "4 GPUs (the cluster has 0)" in why and "CPUs" not in why.split(":")[0]


def test_summary_names_the_figures_the_report_prices_with():
    assert resources.as_summary(TrialResources(gpus=1.0, cpus=3.0)) == {"cpus_per_trial": 3.0, "gpus_per_trial": 1.0}
