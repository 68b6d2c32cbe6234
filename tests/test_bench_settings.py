"""benchmarks/contenders.py: SB3 at rayrl's settings and rayrl at RL Zoo's settings are the same
algorithm as their counterpart (every number mapped, the same network), so ratios between them are
platform results."""

from __future__ import annotations

import gymnasium as gym
import pytest

from benchmarks import common as C
from benchmarks import contenders as K

pytest.importorskip("stable_baselines3")


def _rayrl_params(config, env_id):
    env = gym.make(env_id)
    module = config.get_rl_module_spec(env=env, spaces={"default_policy": (env.observation_space, env.action_space)})
    return sum(p.numel() for p in module.build().parameters())


def test_sb3_same_settings_takes_every_number_of_the_spec():
    spec = C.load_spec(C.DEFAULT_CONFIG, ["algo.train_batch_per_learner=256", "algo.epochs=20", "algo.clip=0.25"])
    model = K.sb3_same_settings(spec, seed=3)
    a = spec.algo
    assert (model.n_envs, model.n_steps, model.batch_size, model.n_epochs) == (8, 32, a.minibatch_size, 20)
    assert (model.gamma, model.gae_lambda, model.ent_coef, model.vf_coef) == (
        a.gamma,
        a.gae_lambda,
        a.entropy_coeff,
        a.vf_loss_coeff,
    )
    assert model.max_grad_norm == a.grad_clip and model.clip_range(1.0) == 0.25 and model.learning_rate == a.lr
    assert model.policy.optimizer.defaults["eps"] == a.adam_eps and not model.policy.ortho_init
    # the same network: separate 64x64 tanh policy and value MLPs, a linear head each
    assert sum(p.numel() for p in model.policy.parameters()) == _rayrl_params(K.rayrl(spec, "fast"), "CartPole-v1")
    assert K.same_settings_gaps(spec) == [
        "algo.vf_clip 10.0 (RLlib clips the value loss; SB3 has no such clip)",
        "algo.kl_coeff RLlib's 0.2 (RLlib's PPO adds an adaptive KL penalty; SB3 has none: set 0)",
    ]
    equal = C.load_spec(C.DEFAULT_CONFIG, ["algo.train_batch_per_learner=256", "algo.vf_clip=null", "algo.kl_coeff=0"])
    assert K.same_settings_gaps(equal) == []
    assert K.rllib_same_settings(equal).use_kl_loss is False  # stock RLlib gets the same setting


def test_rayrl_zoo_settings_is_sb3_zoos_cartpole_algorithm():
    spec = C.load_spec(C.DEFAULT_CONFIG)
    config = K.rayrl_zoo_settings(spec, seed=3)
    zoo = K.sb3_zoo(seed=3)
    assert config.train_batch_size_per_learner == zoo.n_envs * zoo.n_steps == 256
    assert (config.minibatch_size, config.num_epochs) == (zoo.batch_size, zoo.n_epochs)
    assert (config.gamma, config.lambda_, config.num_envs_per_env_runner) == (zoo.gamma, zoo.gae_lambda, zoo.n_envs)
    assert config.lr[0] == [0, 1e-3] and config.lr[-1] == [K.ZOO_TIMESTEPS, 0.0]  # annealed over Zoo's horizon
    assert config.learner_config_dict["grad_clip"] == zoo.max_grad_norm and config.vf_loss_coeff == zoo.vf_coef
    assert config.learner_config_dict["adam_eps"] == 1e-5 and config.seed == 3
    assert config.use_kl_loss is False  # SB3 has no KL penalty; RLlib's PPO would add one
    assert _rayrl_params(config, "CartPole-v1") == sum(p.numel() for p in zoo.policy.parameters())


def test_zoo_settings_refuse_an_env_they_have_none_for():
    with pytest.raises(ValueError, match="wired for CartPole-v1, Hopper-v5, Hopper-v4 only, not 'Pendulum-v1'"):
        K.zoo_overrides("Pendulum-v1")


@pytest.mark.parametrize("every", [0, 2048])
def test_stock_rllib_same_settings_reports_as_often_as_rayrl(every):
    """algo.report_env_steps is RLlib's min_sample_timesteps_per_iteration: stock RLlib gets the same, so
    the end-to-end ratio compares equal reporting (one report per update, or per ``every`` env steps)."""
    spec = C.load_spec(C.DEFAULT_CONFIG, ["algo.train_batch_per_learner=256", f"algo.report_env_steps={every}"])
    stock, ours = K.rllib_same_settings(spec), K.rayrl(spec, "fast")
    assert stock.min_sample_timesteps_per_iteration == ours.min_sample_timesteps_per_iteration
    assert (stock.min_sample_timesteps_per_iteration or 0) == every
