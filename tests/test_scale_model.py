"""The scaling model, the schedule and the measurement helpers against hand-computed cases (no Ray).

The base case (see tests/plan_run.py): PPO, 1000 env steps per learner per iteration, minibatch
250 x 2 epochs = 8 optimizer steps, 2 env runners sampling 1000 env steps/s each, 1.0 s of
update per iteration, a 1 GB gradient; 2 GPUs and 8 CPUs per node; 100 GB/s and 10 us inside a
node, 10 GB/s and 0 us across nodes; $2 per GPU-hour, $0.5 per CPU-hour.
"""

import math

import pytest
from plan_run import CLUSTER

from rayrl.errors import SpecError
from rayrl.scale import cluster, measure, model, schedule
from rayrl.spec import CostSpec

PRICES = CostSpec(gpu_hour_usd=2.0, cpu_hour_usd=0.5, spot_discount=0.0)
HAND = cluster.from_dict(CLUSTER)


def base(**kw) -> model.Measured:
    fields = dict(
        algo="PPO",
        batch_per_learner=1000,
        minibatch=250,
        epochs=2,
        learners=0,
        env_runners=2,
        sample_s=0.5,
        learn_s=1.0,
        grad_bytes=1e9,
    )
    return model.Measured(**{**fields, **kw})


def test_ring_and_tree_allreduce_terms():
    # Ring, 4 ranks, 1 GB at 100 GB/s, 10 us: 2*3/4 * 10 ms + 2*3 * 10 us.
    assert model.ring_allreduce_s(1e9, 4, 100.0, 10.0) == pytest.approx(0.015 + 6e-5)
    # Tree: 2 * 10 ms + 2*log2(4) * 10 us.
    assert model.tree_allreduce_s(1e9, 4, 100.0, 10.0) == pytest.approx(0.02 + 4e-5)
    assert model.ring_allreduce_s(1e9, 1, 100.0, 10.0) == 0.0
    # Big message: ring wins (half the bandwidth term); tiny message at 1024 ranks: tree wins (log latency).
    assert model.allreduce_s(1e9, 2, HAND) == (pytest.approx(0.01 + 2e-5), "ring")
    wide = cluster.from_dict({**CLUSTER, "inter_node_latency_us": 10.0})
    t, algo = model.allreduce_s(1e3, 1024, wide)
    assert algo == "tree" and t == pytest.approx(2e3 / 1e10 + 2 * 10 * 1e-5)
    assert model.allreduce_s(1e9, 4, HAND) == (pytest.approx(0.15), "ring")  # across nodes: 10 GB/s


def test_predict_sync_ppo_by_hand():
    m = base()
    assert m.runner_steps_per_s == pytest.approx(1000.0) and m.optimizer_steps == 8
    one, two, four = (model.predict(m, HAND, PRICES, n) for n in (1, 2, 4))
    # n=1: no all-reduce; 1 runner feeds 1000 steps in 1 s; sample 1 s + learn 1 s -> 500 steps/s.
    assert (one.env_runners, one.sample_s, one.learner_s) == (1, pytest.approx(1.0), pytest.approx(1.0))
    assert one.env_steps_per_s == pytest.approx(500.0) and one.efficiency == pytest.approx(1.0)
    assert (one.nodes, one.usd_per_hour) == (1, pytest.approx(4.0))  # the whole 2-GPU node is held
    assert one.usd_per_million_samples == pytest.approx(4.0 / (500 * 3600) * 1e6)
    # n=2, one node: learn 1 + 8 x 10.02 ms; ceil(2000 / 1080.16) = 2 runners sample 2000 in 1 s.
    assert two.learner_s == pytest.approx(1.08016) and two.env_runners == 2
    assert two.env_steps_per_s == pytest.approx(2000 / 2.08016)
    assert two.efficiency == pytest.approx(2000 / 2.08016 / 1000)
    # n=4, two nodes, 10 GB/s: 8 x 150 ms of all-reduce; 2 runners take 2 s.
    assert four.learner_s == pytest.approx(2.2) and four.env_runners == 2 and four.nodes == 2
    assert four.env_steps_per_s == pytest.approx(4000 / 4.2) and four.usd_per_hour == pytest.approx(8.0)
    # APPO overlaps: the slower side (learn 2.2 s) sets the pace.
    assert model.predict(base(algo="APPO"), HAND, PRICES, 4).env_steps_per_s == pytest.approx(4000 / 2.2)


def test_env_runners_that_do_not_fit_add_cpu_nodes_at_the_cpu_price():
    tight = cluster.from_dict({**CLUSTER, "cpus_per_node": 2})
    p = model.predict(base(), tight, PRICES, 2)
    # 1 driver + 2 runners + 2 learners = 5 CPUs, 2 on the GPU node: 3 more -> one 4-CPU node.
    assert (p.gpu_nodes, p.cpu_nodes, p.nodes) == (1, 1, 2)
    assert p.usd_per_hour == pytest.approx(2 * 2.0 + 4 * 0.5)
    spot = model.predict(base(), tight, CostSpec(gpu_hour_usd=2.0, cpu_hour_usd=0.5, spot_discount=0.5), 2)
    assert spot.usd_per_hour == pytest.approx(3.0)


def test_critical_batch_sets_env_steps_and_time_to_target():
    m = base(env_steps_to_target=1e6, critical_batch=1000.0)
    one, two = model.predict(m, HAND, PRICES, 1), model.predict(m, HAND, PRICES, 2)
    # E_min = 1e6 / (1 + 1000/1000) = 5e5; at batch 2000: 5e5 x 3.
    assert one.env_steps_to_target == pytest.approx(1e6) and two.env_steps_to_target == pytest.approx(1.5e6)
    assert one.hours_to_target == pytest.approx(1e6 / 500 / 3600)
    assert two.hours_to_target == pytest.approx(1.5e6 / (2000 / 2.08016) / 3600)
    assert two.usd_to_target == pytest.approx(4.0 * two.hours_to_target)
    assert model.predict(base(), HAND, PRICES, 2).hours_to_target is None  # target never reached: unknown


def test_fit_critical_batch():
    assert model.fit_critical_batch([(1000, 2e6), (2000, 3e6)]) == (pytest.approx(1e6), pytest.approx(1000.0))
    assert model.fit_critical_batch([(1000, 2e6), (1000, 3e6)]) is None  # one batch size
    assert model.fit_critical_batch([(1000, 3e6), (2000, 2e6)]) is None  # larger batch, fewer steps: noise


def test_schedule_doubles_and_stops_below_the_gate():
    pts = [model.predict(base(), HAND, PRICES, n) for n in (1, 2, 4)]
    steps = schedule.schedule(pts)
    assert [(s.from_gpus, s.to_gpus, s.decision) for s in steps] == [(1, 2, "grow"), (2, 4, "stop")]
    assert steps[0].predicted_gain == pytest.approx(2000 / 2.08016 / 500 - 1)
    assert steps[1].predicted_gain == pytest.approx((4000 / 4.2) / (2000 / 2.08016) - 1)
    assert all(s.factor <= 2.0 for s in steps) and steps[0].gain_of == "env_steps_per_s"
    # With a target and a small critical batch the gain is in time to target: 1 -> 2 gains < 1%.
    m = base(env_steps_to_target=1e6, critical_batch=100.0)
    slow = schedule.schedule([model.predict(m, HAND, PRICES, n) for n in (1, 2)])
    assert slow[0].gain_of == "hours_to_target" and slow[0].decision == "stop"
    assert slow[0].predicted_gain == pytest.approx((1e6 / 500) / (1e6 / 11 * 21 / (2000 / 2.08016)) - 1)
    with pytest.raises(ValueError, match="at most x2"):
        schedule.schedule([pts[0], pts[2]])


def test_sizes_go_by_doubling_to_the_asked_size():
    assert model.sizes(1) == [1]
    assert model.sizes(8) == [1, 2, 4, 8]
    assert model.sizes(100_000)[-3:] == [32768, 65536, 100_000]
    assert all(b / a <= 2 for a, b in zip(model.sizes(100_000), model.sizes(100_000)[1:]))


def test_unsmooth_recovers_each_iteration_from_rllibs_ema():
    ema = [1.0, 0.99 * 1.0 + 0.01 * 2.0]
    ema.append(0.99 * ema[-1] + 0.01 * 3.0)
    assert measure.unsmooth(ema) == [pytest.approx(1.0), pytest.approx(2.0), pytest.approx(3.0)]
    assert measure.steady([9.0, 1.0, 2.0, 3.0]) == 2.0  # the warm-up iteration is left out
    assert measure.steady([9.0]) == 9.0


def test_mlp_params_count_policy_and_value_networks():
    # Policy 4-64-64-2 (320 + 4160 + 130) and value 4-64-64-1 (320 + 4160 + 65).
    assert measure.mlp_params(4, 2, [64, 64]) == 9155
    assert measure.space_dims("CartPole-v1") == (4, 2)


def test_cluster_presets_and_file_errors(tmp_path):
    assert cluster.load(None) == cluster.PRESETS[cluster.DEFAULT_PRESET]
    assert cluster.from_dict({"preset": "aws-p5", "gpu_hour_usd": 4}).inter_node_latency_us == 20.0
    with pytest.raises(SpecError, match="cluster.gpus_per_node: 0 is out of range"):
        cluster.from_dict({"gpus_per_node": 0})
    with pytest.raises(SpecError, match="preset 'tpu' is unknown"):
        cluster.from_dict({"preset": "tpu"})
    with pytest.raises(SpecError, match="neither a file nor a preset"):
        cluster.load(str(tmp_path / "nope.yaml"))
    prices = model.prices_for(cluster.from_dict({"gpu_hour_usd": 1.5}), PRICES)
    assert (prices.gpu_hour_usd, prices.cpu_hour_usd) == (1.5, 0.5)
    assert math.isclose(model.prices_for(HAND, PRICES).gpu_hour_usd, 2.0)
