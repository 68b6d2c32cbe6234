"""rayrl.sampling: the fast env runner hands the learner exactly what RLlib's runner would.

Both runners are built in-process on the same config, seed and weights, so the same torch RNG
stream draws the same actions: the episodes (observations, actions, rewards, log-probs, where
they are cut, terminated vs truncated) and the advantages and value targets PPO's GAE connector
computes from them (which bootstrap from the last observation of truncated and cut episodes)
must be equal, not just close in distribution. ``max_episode_steps: 30`` makes truncations common.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from rayrl import spec as spec_mod
from rayrl.sampling import episodes as E

SHORT = ["env.config={max_episode_steps: 30}"]


def load(overrides):
    return spec_mod.from_dict(spec_mod.apply_overrides({}, list(overrides)))


def config(*overrides: str):
    from rayrl.rllib.algo import build_config

    torch.set_num_threads(1)
    return build_config(load([*SHORT, *overrides]))


def runner(cls, cfg):
    return cls(config=cfg, worker_index=1)


def gae_for(cfg, env_runner):
    """PPO's learner connector with its GAE piece: episodes -> advantages, value targets (and the batch)."""
    from ray.rllib.connectors.learner import GeneralAdvantageEstimation
    from ray.rllib.utils.metrics.metrics_logger import MetricsLogger

    env = env_runner.env
    torch.manual_seed(123)  # one value function for both runners' episodes
    module = cfg.get_multi_rl_module_spec(env=env.unwrapped, spaces=env_runner.get_spaces()).build()
    pipe = cfg.build_learner_connector(
        input_observation_space=env.single_observation_space, input_action_space=env.single_action_space
    )
    pipe.append(GeneralAdvantageEstimation(gamma=cfg.gamma, lambda_=cfg.lambda_))

    def run(eps):
        eps = sorted(copy.deepcopy(eps), key=lambda e: (e.t_started, len(e), e.get_observations(0)[0]))
        batch = pipe(rl_module=module, batch={}, episodes=eps, shared_data={}, metrics=MetricsLogger())
        return {k: v.numpy() for k, v in batch["default_policy"].items()}

    return run


def by_key(eps):
    return {(e.t_started, len(e), tuple(np.round(e.get_observations(0), 6))): e for e in eps}


# ---- pure: cutting a rollout into episodes --------------------------------------------------------


def rollout(T, n=2):
    r = E.Rollout(n, (1,), np.float32, (), np.int64, {"action_logp": ((), np.float32)}, capacity=1)
    r.ensure(T)  # grown from 1: earlier steps survive a regrow (none here)
    r["obs"][: T + 1, :, 0] = np.arange(T + 1)[:, None] * 10 + np.arange(n)
    r["actions"][:T] = 1
    r["rewards"][:T] = 1.0
    r.t = T
    return r


def test_build_cuts_at_ends_skips_autoreset_steps_and_continues_chunks():
    space = None
    r = rollout(5)
    r["terminated"][1, 0] = True  # env 0: steps 0-1 end it; step 2 resets; steps 3-4 a new episode
    r["truncated"][4, 1] = True  # env 1: ends on the last step; the next rollout's step 0 resets it
    carry = [E.Carry(), E.Carry()]
    first_ids = [c.id_ for c in carry]
    done, ongoing = E.build(r, carry, space, space)
    assert [(len(e), e.is_terminated, e.is_truncated, e.id_ == first_ids[k]) for k, e in zip((0, 1), done)] == [
        (2, True, False, True),
        (5, False, True, True),
    ]
    assert list(done[0].get_observations()[:, 0]) == [0, 10, 20]  # the final obs kept (bootstrapping)
    (chunk,) = ongoing
    assert list(chunk.get_observations()[:, 0]) == [30, 40, 50] and chunk.t_started == 0 and not chunk.is_done
    assert chunk.id_ == carry[0].id_ != first_ids[0] and carry[0].t == 2
    assert carry[1].pending_reset and carry[1].id_ != first_ids[1]
    # Next rollout: env 0's chunk continues (same id, t_started 2); env 1's step 0 is only a reset.
    r2 = rollout(3)
    done2, ongoing2 = E.build(r2, carry, space, space)
    assert done2 == []
    c0, c1 = ongoing2
    assert (c0.id_, c0.t_started, len(c0)) == (chunk.id_, 2, 3)
    assert (c1.t_started, len(c1), c1.get_observations(0)[0]) == (0, 2, 11)  # from the obs after the reset


def test_build_orders_done_episodes_by_when_they_ended():
    r = rollout(4)
    r["terminated"][3, 0] = True
    r["terminated"][0, 1] = True
    done, _ = E.build(r, [E.Carry(), E.Carry()], None, None)
    assert [len(e) for e in done] == [1, 4]


# ---- the runner against RLlib's, in-process ---------------------------------------------------------


def paired_rollouts(ref, fast, rollouts: int, steps: int, atol: float, extras=("action_logp",), extra_atol=1e-6):
    """Both runners from the same torch RNG stream: the same episodes (ends, observations, actions, rewards,
    ``extras``); yields each rollout's (RLlib's, fast) episodes for further checks."""
    for it in range(rollouts):
        torch.manual_seed(it)
        a = ref.sample(num_timesteps=steps, explore=True)
        torch.manual_seed(it)
        b = fast.sample(num_timesteps=steps, explore=True)
        ka, kb = by_key(a), by_key(b)
        assert sorted(ka) == sorted(kb), f"rollout {it}: different episodes"
        for k, x in ka.items():
            y = kb[k]
            assert (x.is_terminated, x.is_truncated, x.t_started) == (y.is_terminated, y.is_truncated, y.t_started)
            for get in ("get_observations", "get_actions", "get_rewards"):
                np.testing.assert_allclose(getattr(x, get)(), getattr(y, get)(), rtol=0, atol=atol, err_msg=get)
            for col in extras:
                np.testing.assert_allclose(
                    x.get_extra_model_outputs(col), y.get_extra_model_outputs(col), atol=extra_atol, err_msg=col
                )
        assert sum(len(e) for e in b) == sum(len(e) for e in a)
        yield a, b


def test_fast_runner_samples_exactly_what_rllibs_runner_samples():
    from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner

    from rayrl.sampling.fast_runner import FastEnvRunner

    cfg = config("env.runner=rllib")
    # The fast runner's gymnasium backend takes CartPole's numpy-vectorised env; so does RLlib's here.
    cfg.env_runners(gym_env_vectorize_mode="vector_entry_point")
    ref = runner(SingleAgentEnvRunner, cfg)
    fast = runner(FastEnvRunner, cfg)
    assert fast.fast_off_reason is None
    fast.module.set_state(ref.module.get_state())
    gae = gae_for(cfg, ref)
    terminated = truncated = cut = 0
    for a, b in paired_rollouts(ref, fast, 3, 512, 1e-6, ("action_logp", "action_dist_inputs", "weights_seq_no")):
        terminated += sum(e.is_terminated for e in b)
        truncated += sum(e.is_truncated for e in b)
        cut += sum(not e.is_done for e in b)
        # Sampled env steps: at least asked for, under one vector step more (RLlib's rule).
        steps = sum(len(e) for e in b)
        assert steps == sum(len(e) for e in a) and 512 <= steps < 512 + 8
        # What PPO learns from: advantages and value targets (bootstrapped at truncations and cuts).
        ga, gb = gae(a), gae(b)
        for col in ("advantages", "value_targets", "obs", "truncateds", "terminateds"):
            np.testing.assert_allclose(ga[col], gb[col], atol=1e-5, err_msg=col)
    assert terminated > 5 and truncated > 5 and cut > 0  # every kind of end was exercised
    assert fast._traced is not None  # the traced forward made these episodes
    ma, mb = ref.get_metrics(), fast.get_metrics()
    for key in ("episode_return_mean", "episode_len_mean", "num_env_steps_sampled_lifetime", "num_episodes"):
        assert float(ma[key].peek() if hasattr(ma[key], "peek") else ma[key]) == pytest.approx(
            float(mb[key].peek() if hasattr(mb[key], "peek") else mb[key])
        ), key


@pytest.mark.parametrize("normalize_obs", [False, True])
def test_fast_runner_matches_rllib_on_mujoco_float64_observations_and_box_actions(normalize_obs):
    """Hopper: float64 observations (cast to float32 for the module, as RLlib's connectors do; episodes keep
    float64) and a Gaussian policy over Box actions; both runners on SyncVectorEnv, the same seed. With
    model.normalize_obs the fast loop applies RLlib's own MeanStdFilter piece: same episodes, same stats."""
    pytest.importorskip("mujoco", reason="MuJoCo comes with gymnasium[mujoco] (a core dependency)")
    from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner

    from rayrl.sampling.fast_runner import FastEnvRunner

    cfg = build_hopper(normalize_obs)
    ref = runner(SingleAgentEnvRunner, cfg)
    fast = runner(FastEnvRunner, cfg)
    assert fast.fast_off_reason is None
    assert fast.env.single_observation_space.dtype == np.float64
    fast.module.set_state(ref.module.get_state())
    for _a, b in paired_rollouts(ref, fast, 2, 256, 1e-5, extra_atol=1e-4):
        assert sum(len(e) for e in b) >= 256
    assert fast._traced is not None  # the traced forward made these episodes
    if normalize_obs:  # the filter's running stats (what RLlib merges across runners and checkpoints)
        fa = next(p for p in ref._env_to_module.connectors if type(p).__name__ == "MeanStdFilter")._filters[None]
        fb = fast._obs_filter._filters[None]
        assert fa.running_stats.n == fb.running_stats.n > 512
        np.testing.assert_allclose(fa.running_stats.mean, fb.running_stats.mean, atol=1e-9)
        np.testing.assert_allclose(fa.running_stats.std, fb.running_stats.std, atol=1e-9)
        assert (
            ref._env_to_module.get_state()["MeanStdFilter"][None]["running_stats"][0]["num_pushes"]
            == fast._env_to_module.get_state()["MeanStdFilter"][None]["running_stats"][0]["num_pushes"]
        )


@pytest.mark.parametrize("rows,dims", [(1, 3), (8, 6)])
def test_the_gaussian_draw_is_rllibs_draw_bit_for_bit(rows, dims):
    from ray.rllib.core.distribution.torch.torch_distribution import TorchDiagGaussian

    from rayrl.sampling.fast_runner import diag_gaussian_draw

    inputs = torch.cat([torch.randn(rows, dims) * 3, torch.linspace(-5, 2, rows * dims).reshape(rows, dims)], -1)
    torch.manual_seed(7)
    dist = TorchDiagGaussian.from_logits(inputs)
    want = dist.sample()
    want_logp = dist.logp(want)
    torch.manual_seed(7)
    got, got_logp = diag_gaussian_draw(inputs)
    assert torch.equal(got, want) and torch.equal(got_logp, want_logp) and got_logp.shape == (rows,)


def test_the_traced_policy_follows_weight_syncs_and_is_traced_again_for_new_tensors_or_shapes():
    from ray.rllib.algorithms.ppo.torch.default_ppo_torch_rl_module import DefaultPPOTorchRLModule

    from rayrl.sampling.fast_runner import FastEnvRunner
    from rayrl.sampling.traced import TracedPolicy, traceable

    cfg = config("env.runner=fast")
    mine, other = runner(FastEnvRunner, cfg).module, runner(FastEnvRunner, cfg).module
    with torch.no_grad():
        for p in other.parameters():
            p.add_(torch.randn_like(p))

    def called(x):
        return mine._forward_exploration({"obs": x})["action_dist_inputs"]

    x = torch.randn(8, 4)
    policy = TracedPolicy(mine, x)
    before = policy(x)
    assert torch.equal(before, called(x))
    mine.set_state(other.get_state())  # RLlib's weight sync
    assert torch.equal(policy(x), called(x)) and not torch.equal(policy(x), before)
    assert policy.fits(mine, x) and not policy.fits(mine, torch.randn(4, 4)) and not policy.fits(other, x)
    head = mine.pi.net.mlp[0]
    head.weight = torch.nn.Parameter(head.weight.detach().clone())  # a new tensor, not a copy into it
    assert not policy.fits(mine, x)

    class Custom(type(mine)):  # a user's forward: never traced
        def _forward(self, batch, **kwargs):
            return DefaultPPOTorchRLModule._forward(self, batch, **kwargs)

    assert traceable(mine, "cpu") and not traceable(mine, "cuda:0") and not traceable(object.__new__(Custom), "cpu")


def test_infos_are_left_unmerged_only_inside_the_fast_loop():
    pytest.importorskip("mujoco", reason="MuJoCo comes with gymnasium[mujoco] (a core dependency)")
    import gymnasium as gym

    from rayrl.sampling.fast_runner import without_infos

    venv = gym.vector.SyncVectorEnv([lambda: gym.make("Hopper-v5")] * 2)
    venv.reset(seed=0)
    zero = np.zeros((2, 3), np.float32)
    with without_infos(venv):
        obs, *_, infos = venv.step(zero)
    assert infos == {} and obs.shape == (2, 11)
    assert "x_position" in venv.step(zero)[-1]  # RLlib's loop gets its infos back
    same = gym.vector.SyncVectorEnv([lambda: gym.make("Hopper-v5")], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    same.reset(seed=0)
    with without_infos(same):  # infos carry the final observation there: kept
        assert "x_position" in same.step(zero[:1])[-1]


@pytest.mark.parametrize("rows,actions", [(1, 2), (8, 2), (8, 6)])
def test_the_categorical_draw_is_rllibs_draw_bit_for_bit(rows, actions):
    from ray.rllib.core.distribution.torch.torch_distribution import TorchCategorical

    from rayrl.sampling.fast_runner import categorical_draw

    for seed in range(20):
        inputs = torch.randn(rows, actions) * 3
        torch.manual_seed(seed)
        dist = TorchCategorical.from_logits(inputs)
        want = dist.sample()
        want_logp = dist.logp(want)
        torch.manual_seed(seed)
        got, got_logp = categorical_draw(inputs)
        assert torch.equal(got, want) and torch.equal(got_logp, want_logp) and got.shape == (rows,)


def test_a_policy_the_tracer_cannot_follow_is_called_untraced(monkeypatch, caplog):
    from rayrl.sampling.fast_runner import FastEnvRunner

    fast = runner(FastEnvRunner, config("env.runner=fast"))

    def gone(*args, **kwargs):
        raise RuntimeError("no tracer in this torch")

    monkeypatch.setattr(torch.jit, "trace", gone)
    episodes = fast.sample(num_timesteps=64, explore=True)
    assert sum(len(e) for e in episodes) >= 64 and fast._trace_failed and fast._traced is None
    assert "called untraced (RuntimeError: no tracer in this torch)" in caplog.text


def test_the_unsquash_is_rllibs_bit_for_bit_and_leaves_unbounded_boxes_to_rllib():
    from gymnasium import spaces
    from ray.rllib.utils.spaces.space_utils import unsquash_action

    from rayrl.sampling.fast_runner import unsquash_for

    rng = np.random.default_rng(0)
    for space in (
        spaces.Box(-1.0, 1.0, (3,), np.float32),  # Hopper's
        spaces.Box(np.array([-2.0, 0.0]), np.array([2.0, 0.5]), dtype=np.float64),
    ):
        unsquash = unsquash_for(space)
        for _ in range(20):
            a = (rng.standard_normal((4, *space.shape)) * 1.5).astype(np.float32)  # some beyond [-1, 1]
            want = unsquash_action(a, space)
            got = unsquash(a)
            assert got.dtype == want.dtype and np.array_equal(got, want)
    half = spaces.Box(np.array([-np.inf, 0.0]), np.array([1.0, 1.0]), dtype=np.float32)
    a = np.array([[3.0, 3.0]], np.float32)
    assert np.array_equal(unsquash_for(half)(a), unsquash_action(a, half)) and unsquash_for(half)(a)[0, 0] == 3.0


def build_hopper(normalize_obs: bool):
    """The shipped Hopper config, short episodes, 2 envs."""
    from pathlib import Path

    from rayrl.rllib.algo import build_config

    torch.set_num_threads(1)
    path = Path(__file__).resolve().parents[1] / "experiments" / "configs" / "mujoco_hopper_ppo.yaml"
    return build_config(
        spec_mod.load(
            path,
            [
                "env.envs_per_runner=2",
                "env.runner=fast",
                f"model.normalize_obs={str(normalize_obs).lower()}",
                "evaluation.interval=0",
                "env.config={max_episode_steps: 40}",
            ],
        )
    )


def test_fast_runner_falls_back_to_rllib_for_what_it_does_not_handle():
    from ray.rllib.callbacks.callbacks import RLlibCallback

    from rayrl.sampling.fast_runner import FastEnvRunner

    class PerStep(RLlibCallback):
        steps = 0

        def on_episode_step(self, **kwargs):
            PerStep.steps += 1

    cfg = config().callbacks(PerStep)
    r = runner(FastEnvRunner, cfg)
    assert "on_episode_step" in r.fast_off_reason
    eps = r.sample(num_timesteps=64, explore=True)
    assert sum(len(e) for e in eps) >= 64 and PerStep.steps >= 64  # RLlib's loop ran the hooks
    # Episode-count sampling (evaluation) also takes RLlib's loop; the fast loop resumes after it.
    fast = runner(FastEnvRunner, config())
    fast.sample(num_timesteps=64, explore=True)
    eps = fast.sample(num_episodes=3, explore=False)
    assert len(eps) >= 3 and all(e.is_done for e in eps)
    eps = fast.sample(num_timesteps=64, explore=True)
    assert sum(len(e) for e in eps) >= 64 and all(e.t_started == 0 for e in eps)  # started from a reset


def scalar_action_pendulum(**kwargs):
    """Pendulum with a scalar Box action (shape ()): RLlib's module draws (n, 1) actions for it."""
    import gymnasium as gym

    class Scalar(gym.ActionWrapper):
        def __init__(self, env):
            super().__init__(env)
            self.action_space = gym.spaces.Box(-2.0, 2.0, (), np.float32)

        def action(self, action):
            return np.reshape(action, (1,))

    return Scalar(gym.make("Pendulum-v1", **kwargs))


def test_a_scalar_box_action_takes_rllibs_loop():
    import gymnasium as gym

    from rayrl.sampling.fast_runner import FastEnvRunner

    if "RayrlScalarPendulum-v0" not in gym.registry:
        gym.register("RayrlScalarPendulum-v0", entry_point=scalar_action_pendulum, max_episode_steps=200)
    fast = runner(FastEnvRunner, config("env.id=RayrlScalarPendulum-v0"))
    assert "scalar Box" in fast.fast_off_reason
    assert sum(len(e) for e in fast.sample(num_timesteps=64, explore=True)) >= 64


def test_envpool_backend_samples_cartpole_episodes():
    pytest.importorskip("envpool")
    from rayrl.sampling.fast_runner import EnvPoolFastEnvRunner

    r = runner(EnvPoolFastEnvRunner, config("env.backend=envpool", "env.runner=fast"))
    assert r.fast_off_reason is None and type(r.env.env).__name__ == "EnvPoolVectorEnv"
    done = []
    for _ in range(3):
        eps = r.sample(num_timesteps=512, explore=True)
        assert 512 <= sum(len(e) for e in eps) < 520
        done += [e for e in eps if e.is_done and e.t_started == 0]
    assert len(done) > 20
    for e in done:  # CartPole pays 1 a step; EnvPool truncates at max_episode_steps = 30 as gymnasium does
        assert e.get_return() == len(e) and e.is_truncated == (len(e) == 30) and len(e) <= 30
        assert e.is_terminated != e.is_truncated
    assert any(e.is_truncated for e in done) and any(e.is_terminated for e in done)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["env.runner=turbo"], "env.runner: 'turbo' is not valid"),
        (["env.backend=envpool", "env.runner=rllib"], "EnvPool is stepped by the fast runner only"),
        (["env.backend=envpool", "env.runner=fast", "env.id=HalfCheetah-v2"], "has no env 'HalfCheetah-v2'"),
    ],
)
def test_spec_rejects_runner_and_backend_that_cannot_run(overrides, message):
    if "env.backend=envpool" in overrides and "env.runner=rllib" not in overrides:
        pytest.importorskip("envpool")
    with pytest.raises(spec_mod.SpecError, match=message):
        load(overrides)


# ---- learning, end to end ---------------------------------------------------------------------------


@pytest.mark.slow
def test_ppo_learns_the_same_with_either_runner(ray_local):
    """Same seed, same settings: RLlib's runner and the fast one sample the same actions, so PPO's
    learning curves agree; and it does learn (well above random play's ~22)."""
    from rayrl.observe import keys
    from rayrl.rllib.algo import build_config

    curves = {}
    for runner in ("rllib", "fast"):
        cfg = build_config(
            load(
                [
                    f"env.runner={runner}",
                    "algo.train_batch_per_learner=1024",
                    "algo.minibatch_size=128",
                    "resources.env_runners=1",
                ]
            )
        )
        cfg.env_runners(gym_env_vectorize_mode="vector_entry_point")  # the env the fast runner takes itself
        algo = cfg.build_algo()
        try:
            curves[runner] = [float(keys.lookup(algo.train(), keys.EPISODE_RETURN)) for _ in range(8)]
            if runner == "fast":  # the remote runner took its own loop, not a silent fall back to RLlib's
                why_not = algo.env_runner_group.foreach_env_runner(
                    lambda r: (type(r).__name__, r.fast_off_reason), local_env_runner=False
                )
                assert why_not == [("FastEnvRunner", why_not[0][1])] and not why_not[0][1], why_not
        finally:
            algo.stop()
    print(curves)
    np.testing.assert_allclose(curves["fast"], curves["rllib"], rtol=0.02)
    assert curves["fast"][-1] >= 60.0


def test_envpool_backend_runs_an_ale_spec_with_rllibs_atari_frames():
    """An ALE spec on the envpool backend: the same observation space RLlib's Atari wrapper gives (84x84,
    4 frames channels-last, [-1, 1]), so the same CNN; lives are episodes and rewards are clipped."""
    pytest.importorskip("envpool")
    pytest.importorskip("ale_py")
    from rayrl.envs.registry import make_atari
    from rayrl.sampling.fast_runner import EnvPoolFastEnvRunner

    spec = spec_mod.load(
        "experiments/configs/atari_breakout_ppo_cpu.yaml",
        ["env.backend=envpool", "env.runner=fast", "env.envs_per_runner=2"],
    )
    from rayrl.rllib.algo import build_config

    torch.set_num_threads(1)
    r = runner(EnvPoolFastEnvRunner, build_config(spec))
    assert r.fast_off_reason is None and type(r.env.env).__name__ == "EnvPoolVectorEnv"
    assert r.env.single_observation_space == make_atari("ALE/Breakout-v5", dict(spec.env.config)).observation_space
    eps = r.sample(num_timesteps=600, explore=True)
    obs = np.concatenate([e.get_observations() for e in eps])
    assert obs.shape[1:] == (84, 84, 4) and obs.dtype == np.float32 and obs.min() == -1.0 and obs.max() <= 1.0
    assert np.abs(obs[:, :, :, 0] - obs[:, :, :, 3]).max() > 0  # a stack of different frames, not one repeated
    done = [e for e in eps if e.is_done and e.t_started == 0]
    assert len(done) >= 5  # a random Breakout player loses a life every ~30 steps: each life is an episode
    rewards = np.concatenate([e.get_rewards() for e in eps])
    assert set(np.unique(rewards)) <= {0.0, 1.0} and rewards.sum() > 0  # clipped to their sign, and some scored
