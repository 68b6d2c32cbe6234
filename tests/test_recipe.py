"""PPO's recipe pieces (docs/workloads.md): reward normalisation, schedules, init and log std.

The pure parts are checked against hand computations; the RLlib parts on a real algorithm: the
built module's log std and weights, schedules at their final values, raw returns reported while
the learner scales rewards, and the normaliser's state through a checkpoint.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rayrl.errors import SpecError
from rayrl.rllib.returns import ReturnNormalizer
from rayrl.spec import schedule
from rayrl.spec.load import from_dict


def pooled(values: list[float], prior_n: float = 1e-4) -> float:
    """Variance of the values pooled with the prior pseudo-sample (mean 0, variance 1, weight prior_n)."""
    n = prior_n + len(values)
    mean = sum(values) / n
    return (prior_n * 1.0 + sum(v * v for v in values)) / n - mean**2


def test_return_normalizer_matches_a_hand_computation_across_batches():
    norm = ReturnNormalizer(gamma=0.5, clip=0.0)
    # batch 1: episode a goes on (1, 2), episode b ends (4): returns 1, 0.5*1+2 = 2.5, and 4
    out1 = norm([("a", np.array([1.0, 2.0]), False), ("b", np.array([4.0]), True)])
    var1 = pooled([1.0, 2.5, 4.0])
    assert norm.moments.var == pytest.approx(var1, rel=1e-9)
    np.testing.assert_allclose(out1[0], np.array([1.0, 2.0]) / math.sqrt(var1 + 1e-8))
    np.testing.assert_allclose(out1[1], [4.0 / math.sqrt(var1 + 1e-8)])
    assert norm.running == {"a": 2.5}  # b ended: its accumulator is gone
    # batch 2: a continues from 2.5 (0.5*2.5+1 = 2.25) and ends; c starts (3)
    out2 = norm([("a", np.array([1.0]), True), ("c", np.array([3.0]), False)])
    var2 = pooled([1.0, 2.5, 4.0, 2.25, 3.0])
    assert norm.moments.var == pytest.approx(var2, rel=1e-9)
    np.testing.assert_allclose(out2[1], [3.0 / math.sqrt(var2 + 1e-8)])
    assert norm.running == {"c": 3.0}


def test_return_normalizer_clips_and_its_state_round_trips():
    norm = ReturnNormalizer(gamma=0.99, clip=0.5)
    rng = np.random.default_rng(0)
    norm([("a", rng.normal(5, 3, 50), False)])
    copy = ReturnNormalizer(gamma=0.99, clip=0.5)
    copy.set_state(norm.get_state())
    batch = [("a", rng.normal(5, 3, 30), True), ("b", np.array([100.0]), False)]
    ours, theirs = norm(batch), copy(batch)
    for x, y in zip(ours, theirs, strict=True):
        np.testing.assert_array_equal(x, y)
    assert max(abs(v) for arr in ours for v in arr) == pytest.approx(0.5)  # clipped at +-clip


def test_learners_share_one_reduction():
    """With a reduce (DDP's all-reduce), two learners' halves merge to the whole batch's statistics."""
    whole = ReturnNormalizer(gamma=0.9)
    whole([("a", np.array([1.0, 2.0]), True), ("b", np.array([5.0, 1.0]), True)])
    halves = [ReturnNormalizer(gamma=0.9), ReturnNormalizer(gamma=0.9)]
    parts = [[("a", np.array([1.0, 2.0]), True)], [("b", np.array([5.0, 1.0]), True)]]
    sums = [(2.0, 1.0 + 2.9, 1.0 + 2.9**2), (2.0, 5.0 + 5.5, 25.0 + 5.5**2)]
    total = tuple(map(sum, zip(*sums, strict=True)))
    for learner, part in zip(halves, parts, strict=True):
        learner(part, reduce=lambda _, t=total: t)
        assert learner.moments.var == pytest.approx(whole.moments.var)


def test_linear_schedules():
    pts = schedule.points(3e-4, 0.0, 1000)
    assert pts == [[0, 3e-4], [1000, 0.0]]
    assert schedule.value_at(pts, 500) == pytest.approx(1.5e-4)
    assert schedule.value_at(pts, 5000) == 0.0 and schedule.value_at(pts, 0) == 3e-4
    assert schedule.points(0.2, None, 1000) == 0.2 and schedule.first(pts) == 3e-4
    # a searched lr anneals to the same fraction of itself as the spec's lr does
    assert schedule.lr(1e-3, 1e-4, 5e-4, 100) == [[0, 5e-4], [100, pytest.approx(5e-5)]]


RECIPE = {
    "seed": 3,
    "env": {"id": "Pendulum-v1", "envs_per_runner": 2},
    "algo": {
        "train_batch_per_learner": 400,
        "minibatch_size": 100,
        "epochs": 1,
        "lr_final": 0.0,
        "clip": 0.2,
        "clip_final": 0.05,
        "entropy_coeff": 0.01,
        "entropy_final": 0.0,
        "normalize_reward": True,
        "adam_eps": 1e-5,
    },
    "model": {"free_log_std": True, "log_std_init": -1.5, "init": "orthogonal", "normalize_obs": True},
    "resources": {"env_runners": 0},
    "stop": {"env_steps": 800},
}


def build(overrides: dict, runner: str = "rllib"):
    from rayrl.rllib.algo import build_config

    data = {**RECIPE, **overrides}
    data["env"] = {**RECIPE["env"], "runner": runner}
    return build_config(from_dict(data)).build_algo()


@pytest.mark.slow
@pytest.mark.parametrize("runner", ["rllib", "fast"])
def test_recipe_on_a_real_algorithm(ray_local, tmp_path, runner):
    from ray.rllib.algorithms.algorithm import Algorithm

    algo = build({}, runner)
    module = algo.get_module()
    assert module.pi.log_std.detach().tolist() == [-1.5]
    first = next(m for m in module.encoder.modules() if isinstance(m, torch.nn.Linear))
    w = first.weight.detach().numpy()  # 64 x 3: orthogonal columns with gain sqrt(2)
    np.testing.assert_allclose(w.T @ w, 2.0 * np.eye(w.shape[1]), atol=1e-5)
    assert not first.bias.detach().any()

    results = [algo.train() for _ in range(3)]
    learner = algo.learner_group._learner
    norm = learner._rayrl_reward_norm().normalizer
    assert norm.moments.var > 1e3  # the discounted raw returns' variance (hundreds squared)
    # built alone on the same seed, the unnormalised run samples the same first batch: the reported
    # returns are the env's raw ones (torch's global RNG is shared in-process, so one at a time)
    plain = build({"algo": {**RECIPE["algo"], "normalize_reward": False}}, runner)
    baseline = plain.train()
    assert plain.learner_group._learner._rayrl_reward_norm() is None
    assert results[0]["env_runners"]["episode_return_mean"] == baseline["env_runners"]["episode_return_mean"]
    assert results[0]["env_runners"]["episode_return_mean"] < -500  # Pendulum's raw scale, not the scaled one

    last = results[-1]["learners"]["default_policy"]
    assert last["default_optimizer_learning_rate"] == 0.0
    assert last["curr_entropy_coeff"] == 0.0
    assert last["rayrl_clip_param"] == pytest.approx(0.05)
    assert learner._rayrl_clip_config["default_policy"][1].clip_param == pytest.approx(0.05)  # what the loss reads
    assert learner.config.clip_param == pytest.approx(0.2)  # the algorithm's own config untouched
    opt = learner.get_optimizers_for_module("default_policy")[0][1]
    assert opt.param_groups[0]["eps"] == 1e-5

    algo.save_to_path(str(tmp_path / "ckpt"))
    restored = Algorithm.from_checkpoint(str(tmp_path / "ckpt"))
    again = restored.learner_group._learner._rayrl_reward_norm().normalizer
    assert again.get_state() == norm.get_state()
    for a in (algo, plain, restored):
        a.stop()


@pytest.mark.slow
def test_in_process_evaluation_normalises_with_the_training_statistics(ray_local):
    """RLlib skips the connector sync for an evaluation group with no remote runners; rayrl's callback
    does it, so the greedy policy sees observations normalised as in training."""
    from ray.rllib.connectors.env_to_module.mean_std_filter import MeanStdFilter

    from rayrl.rllib.algo import build_config

    spec = from_dict(
        {
            "algo": {"train_batch_per_learner": 256, "minibatch_size": 128, "epochs": 1},
            "model": {"normalize_obs": True},
            "evaluation": {"interval": 1, "episodes": 1, "env_runners": 0},
            "resources": {"env_runners": 0},
        }
    )
    algo = build_config(spec).build_algo()

    def seen(runner) -> float:
        piece = next(c for c in runner._env_to_module.connectors if isinstance(c, MeanStdFilter))
        return piece._filters[None].running_stats.n

    for _ in range(2):
        algo.train()
        # the evaluation filter holds the training steps (and, after them, its own evaluation steps)
        assert seen(algo.eval_env_runner) >= seen(algo.env_runner) > 0
    algo.stop()


@pytest.mark.parametrize(("value", "expected"), [(None, (True, 0.2)), (0.0, (False, None)), (0.5, (True, 0.5))])
def test_kl_coeff_sets_rllibs_kl_penalty_and_zero_turns_it_off(value, expected):
    from rayrl.rllib.algo import build_config

    data = {**RECIPE, "algo": {**RECIPE["algo"], "kl_coeff": value}}
    config = build_config(from_dict(data))
    assert config.use_kl_loss is expected[0]
    if expected[1] is not None:
        assert config.kl_coeff == expected[1]


def test_kl_coeff_is_refused_for_appo_naming_the_field():
    data = {**RECIPE, "algo": {"name": "APPO", "kl_coeff": 0.0}}
    with pytest.raises(SpecError, match=r"algo.kl_coeff: set with algo.name APPO"):
        from_dict(data)
