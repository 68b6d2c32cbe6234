"""An RLlib ``env_runner_cls`` for stateless policies: a tight loop, bulk episodes at the end.

RLlib's SingleAgentEnvRunner runs two connector pipelines, unbatches every step into per-env
Python objects and appends to N episode objects each step; on CartPole that is ~70% of its
sampling time (docs/benchmarks.md). This runner keeps everything RLlib's has (the env, the
module, weight sync, state, metrics, checkpoints) and replaces only ``_sample`` for timestep
sampling: one batched forward pass and one action-distribution sample per vector step into
preallocated arrays, cut into SingleAgentEpisodes once per rollout (:mod:`rayrl.sampling.episodes`),
so the learner side (GAE, PPO's loss, rayrl's learner) is unchanged.

It samples exactly what RLlib's runner samples from the default connectors: the module's
action-distribution inputs, the action drawn from ``get_exploration_action_dist_cls()`` (or the
inference class, deterministic, when not exploring), its log-probability, and Box actions
unsquashed/clipped for the env as RLlib's ``NormalizeAndClipActions`` does. Anything else falls
back to RLlib's loop (logged once): a recurrent module, custom connectors, per-episode callbacks,
non-Box observations, episode-count or random-action sampling.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from gymnasium.wrappers.vector import DictInfoToList
from ray.rllib.callbacks.callbacks import RLlibCallback
from ray.rllib.callbacks.utils import make_callback
from ray.rllib.core.columns import Columns
from ray.rllib.core.distribution.torch.torch_distribution import TorchCategorical, TorchDiagGaussian
from ray.rllib.env.env_context import EnvContext
from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner
from ray.rllib.utils.metrics import WEIGHTS_SEQ_NO
from ray.rllib.utils.spaces.space_utils import clip_action, unsquash_action
from ray.tune.registry import ENV_CREATOR, _global_registry

from rayrl.envs import registry
from rayrl.sampling import backends, episodes, traced

logger = logging.getLogger(__name__)

EPISODE_HOOKS = ("on_episode_created", "on_episode_start", "on_episode_step", "on_episode_end")


class FastEnvRunner(SingleAgentEnvRunner):
    """SingleAgentEnvRunner with a fast ``_sample`` for stateless policies; gymnasium backend."""

    backend = "gymnasium"
    env: Any  # RLlib's vector env (set by make_env)

    def __init__(self, *, config: Any, **kwargs: Any) -> None:
        self._fast_obs: np.ndarray | None = None
        self._carry: list[episodes.Carry] = []
        self._rollout: episodes.Rollout | None = None
        self._fast_ran = False
        self._traced: traced.TracedPolicy | None = None
        self._trace_failed = False
        super().__init__(config=config, **kwargs)
        self._obs_filter, self._obs_filter_of = self._find_obs_filter(), getattr(self, "_env_to_module", None)
        self.fast_off_reason = self._why_not_fast()
        if self.fast_off_reason and self.env is not None:
            logger.warning("rayrl fast runner: RLlib's sampling loop is used: %s", self.fast_off_reason)

    # ---- the env ------------------------------------------------------------------------------

    def make_env(self) -> None:
        """The backend's vector env, or RLlib's own (factories, envs with no vectorised version)."""
        env = self._backend_env()
        if env is None:
            super().make_env()
        else:
            if self.env is not None:
                self.env.close()
            self.env = DictInfoToList(env)  # RLlib's fallback loop expects list infos
            self.num_envs = env.num_envs
            self._needs_initial_reset = True
            make_callback(
                "on_environment_created",
                callbacks_objects=self._callbacks,
                callbacks_functions=self.config.callbacks_on_environment_created,
                kwargs=dict(
                    env_runner=self,
                    metrics_logger=self.metrics,
                    env=env,
                    env_context=EnvContext(
                        dict(self.config.env_config), worker_index=self.worker_index, num_workers=self.num_workers
                    ),
                ),
            )
        self._fast_obs = None

    def _backend_env(self) -> Any:
        env_id, cfg, n = self.config.env, dict(self.config.env_config), self.config.num_envs_per_env_runner
        if self.backend == "envpool" and isinstance(env_id, str) and (ale := registry.ale_id_of(env_id)):
            env_id = ale  # EnvPool does the Atari preprocessing itself
        if not isinstance(env_id, str) or _global_registry.contains(ENV_CREATOR, env_id):
            if self.backend == "envpool":
                raise ValueError(f"env.backend envpool needs an EnvPool id, not a factory ({env_id!r})")
            return None
        if self.backend == "envpool":
            seed = self._seed if self._seed is not None else (self.worker_index or 0)  # runners differ
            return backends.EnvPoolVectorEnv(env_id, n, cfg, seed=seed)
        return backends.gymnasium_vector(env_id, n, cfg)

    def _find_obs_filter(self) -> Any:
        """The env-to-module pipeline's MeanStdFilter (``model.normalize_obs``) when it is the only custom
        piece: the fast loop applies that very object (its running stats, RLlib's state sync and
        checkpoints), observation by observation in env order, as RLlib's connector does."""
        from ray.rllib.connectors.env_to_module.mean_std_filter import MeanStdFilter

        factory = self.config._env_to_module_connector
        if factory is None or getattr(self, "_env_to_module", None) is None or self.env is None:
            return None
        try:
            made = factory(self.env, None, None)
        except Exception:  # noqa: BLE001 - an unknown factory: RLlib's loop
            return None
        made = made if isinstance(made, (list, tuple)) else [made]
        if len(made) != 1 or type(made[0]) is not MeanStdFilter:
            return None
        pieces = [p for p in self._env_to_module.connectors if type(p) is MeanStdFilter]
        if len(pieces) != 1 or pieces[0]._multi_agent:
            return None
        return pieces[0]

    def _filtered(self, obs: np.ndarray) -> np.ndarray:
        """``obs`` through the MeanStdFilter, one env at a time (each pushed, then normalised, as RLlib's
        connector does episode by episode), so the stats and values match RLlib's loop exactly."""
        piece = self._obs_filter
        if piece is None:
            return obs
        if piece._filters is None:
            piece._init_new_filters()
        flt, update = piece._filters[None], piece._update_stats
        return np.stack([flt(o, update=update) for o in obs]).astype(obs.dtype, copy=False)

    def _why_not_fast(self) -> str | None:
        c = self.config
        if self.module is None:
            return "no RLModule"
        if self.module.is_stateful():
            return "the module is recurrent (stateful)"
        if c._module_to_env_connector is not None:
            return "custom module-to-env connectors"
        if c._env_to_module_connector is not None and self._obs_filter is None:
            return "custom env-to-module connectors (other than one MeanStdFilter)"
        for cb in self._callbacks:
            hooked = [h for h in EPISODE_HOOKS if getattr(type(cb), h) is not getattr(RLlibCallback, h)]
            if hooked:
                return f"callback {type(cb).__name__} implements {', '.join(hooked)}"
        if any(getattr(c, f"callbacks_{h}", None) for h in EPISODE_HOOKS):
            return "per-episode callback functions"
        if self.env is None:
            return None
        obs, act = self.env.single_observation_space, self.env.single_action_space
        if not isinstance(obs, spaces.Box):
            return f"observation space {obs} is not a Box"
        if not isinstance(act, (spaces.Discrete, spaces.Box)):
            return f"action space {act} is neither Discrete nor Box"
        if isinstance(act, spaces.Box) and act.shape == ():
            return f"action space {act} is a scalar Box (the module draws shape (1,) actions)"
        return None

    # ---- sampling -----------------------------------------------------------------------------

    def _sample(
        self,
        *,
        num_timesteps: int | None = None,
        num_episodes: int | None = None,
        explore: bool,
        random_actions: bool = False,
        force_reset: bool = False,
    ) -> list:
        if num_timesteps is None or random_actions or self.fast_off_reason:
            if self._fast_ran:  # RLlib's loop keeps its own episodes: start it from a reset
                self._needs_initial_reset, self._fast_ran, self._fast_obs = True, False, None
            return super()._sample(
                num_timesteps=num_timesteps,
                num_episodes=num_episodes,
                explore=explore,
                random_actions=random_actions,
                force_reset=force_reset,
            )
        self._fast_ran = True
        return self._fast_sample(num_timesteps, explore, force_reset)

    def _fast_sample(self, num_timesteps: int, explore: bool, force_reset: bool) -> list:
        if self._obs_filter is not None and self._env_to_module is not self._obs_filter_of:
            # RLlib rebuilt its env-to-module pipeline (a recreated env): filter with the new piece
            self._obs_filter, self._obs_filter_of = self._find_obs_filter(), self._env_to_module
        venv = self.env.env if isinstance(self.env, DictInfoToList) else self.env
        n = self.num_envs
        if force_reset or self._fast_obs is None:
            obs, _ = venv.reset(seed=self._seed if self._needs_initial_reset else None)
            obs = self._filtered(obs)
            self._needs_initial_reset = False
            self._fast_obs, self._carry = obs, [episodes.Carry() for _ in range(n)]
            self._ongoing_episodes_for_metrics.clear()
        module, device = self.module, self._device
        dist_cls = module.get_exploration_action_dist_cls() if explore else module.get_inference_action_dist_cls()
        draw = DRAWS.get(dist_cls) if explore else None  # RLlib's draw without torch.distributions
        r = self._rollout_for(math.ceil(num_timesteps / n) + 1, explore)
        act_space = self.env.single_action_space
        to_env = self._env_actions(act_space)
        runners = self.config.num_env_runners or 1
        t_global = (self.num_env_steps_sampled_lifetime // runners) * runners
        prev_done = np.array([c.pending_reset for c in self._carry])
        obs_buf, act_buf, logp_buf, dist_buf = _buffers(r)
        obs, ts, t = self._fast_obs, 0, 0
        # forward_exploration/inference switch the module to eval and back on every call (two walks
        # over its submodules); do it once per rollout and call what they call.
        was_training = module.training
        module.eval()
        try:
            policy = self._policy(module, obs_tensor(obs, device))  # traced in eval mode, as it runs
            with torch.no_grad(), without_infos(venv):
                while ts < num_timesteps:
                    if t >= r.capacity:
                        r.ensure(t + 1)
                        obs_buf, act_buf, logp_buf, dist_buf = _buffers(r)
                    obs_buf[t] = obs
                    r.times[t] = time.perf_counter()
                    if policy is not None:
                        inputs = policy(obs_tensor(obs_buf[t], device))
                    else:
                        batch = {Columns.OBS: obs_tensor(obs_buf[t], device)}
                        if explore:
                            out = module._forward_exploration(batch, t=t_global + ts * runners)
                        else:
                            out = module._forward_inference(batch)
                        inputs = out[Columns.ACTION_DIST_INPUTS]
                    if draw is not None:
                        actions, logp = draw(inputs)
                    else:
                        dist = dist_cls.from_logits(inputs)
                        if not explore:
                            dist = dist.to_deterministic()
                        actions = dist.sample()
                        logp = dist.logp(actions)
                    logp_buf[t] = logp.cpu().numpy()
                    dist_buf[t] = inputs.cpu().numpy()
                    act_buf[t] = actions.cpu().numpy()
                    obs, rew, term, trunc, _ = venv.step(to_env(act_buf[t]))
                    obs = self._filtered(obs)
                    r["rewards"][t], r["terminated"][t], r["truncated"][t] = rew, term, trunc
                    ts += n - int(prev_done.sum())  # an autoreset step is not an env step
                    prev_done = term | trunc
                    t += 1
        finally:
            if was_training:
                module.train()
        r.t = t
        obs_buf[t] = obs
        r.times[t] = time.perf_counter()
        r["extra:" + WEIGHTS_SEQ_NO][:t] = self._weights_seq_no
        self._fast_obs = obs
        obs_space = (
            self.env.single_observation_space if self._obs_filter is None else self._obs_filter.observation_space
        )
        done, ongoing = episodes.build(r, self._carry, obs_space, act_space)
        self._done_episodes_for_metrics.extend(done)
        for ep in ongoing:
            self._ongoing_episodes_for_metrics[ep.id_].append(ep)
        self._log_env_steps(metric=self._metrics_num_env_steps_sampled, num_steps=ts)
        self._increase_sampled_metrics(ts, len(done))
        return done + ongoing

    def _policy(self, module: Any, example: torch.Tensor) -> traced.TracedPolicy | None:
        """RLlib's default PPO forward traced for this batch shape (rayrl.sampling.traced), or None:
        call the module."""
        if self._trace_failed or not traced.traceable(module, self._device):
            return None
        if self._traced is None or not self._traced.fits(module, example):
            try:
                self._traced = traced.TracedPolicy(module, example)
            except Exception as e:  # noqa: BLE001 - a module the tracer cannot follow: call it
                logger.warning("rayrl fast runner: the policy is called untraced (%s: %s)", type(e).__name__, e)
                self._trace_failed, self._traced = True, None
        return self._traced

    def _rollout_for(self, capacity: int, explore: bool) -> episodes.Rollout:
        """The preallocated arrays (kept between rollouts); shapes from one forward pass."""
        if self._rollout is None:
            obs_space, act_space = self.env.single_observation_space, self.env.single_action_space
            with torch.no_grad():
                probe = self.module.forward_inference(
                    {Columns.OBS: obs_tensor(np.asarray(self._fast_obs), self._device)}
                )
            dist_shape = tuple(probe[Columns.ACTION_DIST_INPUTS].shape[1:])
            discrete = isinstance(act_space, spaces.Discrete)
            self._rollout = episodes.Rollout(
                self.num_envs,
                obs_space.shape,
                obs_space.dtype,
                () if discrete else act_space.shape,
                np.int64 if discrete else np.float32,
                {
                    Columns.ACTION_LOGP: ((), np.float32),
                    Columns.ACTION_DIST_INPUTS: (dist_shape, np.float32),
                    WEIGHTS_SEQ_NO: ((), np.int64),
                },
                capacity,
            )
        self._rollout.ensure(capacity)
        return self._rollout

    def _env_actions(self, act_space: Any) -> Any:
        """Actions as the env takes them (RLlib's NormalizeAndClipActions for Box spaces)."""
        if isinstance(act_space, spaces.Box):
            if self.config.normalize_actions:
                return unsquash_for(act_space)
            if self.config.clip_actions:
                return lambda a: clip_action(a, act_space)
        return lambda a: a


@contextlib.contextmanager
def without_infos(venv: Any) -> Iterator[None]:
    """Gymnasium's SyncVectorEnv without its per-step info merging, which the fast loop discards
    (one array per info key per step). Only in NEXT_STEP autoreset mode,
    where infos carry nothing the loop needs; RLlib's own loop keeps them."""
    if not isinstance(venv, SyncVectorEnv) or venv.autoreset_mode != AutoresetMode.NEXT_STEP:
        yield
        return
    venv._add_info = _keep_infos
    try:
        yield
    finally:
        del venv._add_info


def _keep_infos(infos: dict, env_info: dict, env_num: int) -> dict:
    return infos


def unsquash_for(space: spaces.Box) -> Any:
    """RLlib's ``unsquash_action`` for one Box, its bounds read once instead of at every step (RLlib's
    walks the space tree and tests the bounds on each call)."""
    floating = space.dtype in (np.float32, np.float64)
    if not (floating and np.all(space.bounded_below) and np.all(space.bounded_above)):
        return lambda a: unsquash_action(a, space)
    low, high, span = space.low, space.high, space.high - space.low
    return lambda a: np.clip(low + (a + 1.0) * span / 2.0, low, high)  # RLlib's expression, same order


_HALF_LOG_2PI = math.log(math.sqrt(2 * math.pi))  # the constant torch's Normal.log_prob subtracts


def diag_gaussian_draw(inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """An action and its log-probability from RLlib's TorchDiagGaussian over ``inputs`` (mean, log std),
    computed as ``torch.distributions.Normal`` computes them (the same random draw, the same
    bits) without building the distribution objects (docs/sampling.md)."""
    loc, log_std = inputs.chunk(2, dim=-1)
    scale = log_std.exp()
    actions = torch.normal(loc, scale)
    logp = -((actions - loc) ** 2) / (2 * scale**2) - scale.log() - _HALF_LOG_2PI
    return actions, logp.sum(-1)


def categorical_draw(inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """An action and its log-probability from RLlib's TorchCategorical over ``inputs`` (logits),
    computed as ``torch.distributions.Categorical`` computes them (normalised logits, softmax,
    one multinomial draw per row: the same random draw, the same bits)."""
    logits = inputs - inputs.logsumexp(dim=-1, keepdim=True)
    probs = torch.softmax(logits, dim=-1)
    actions = torch.multinomial(probs.reshape(-1, probs.shape[-1]), 1, True).T.reshape(probs.shape[:-1])
    return actions, logits.gather(-1, actions.unsqueeze(-1)).squeeze(-1)


#: The exploration draws computed in closed form, by RLlib's distribution class.
DRAWS = {TorchDiagGaussian: diag_gaussian_draw, TorchCategorical: categorical_draw}


def obs_tensor(obs: np.ndarray, device: Any) -> torch.Tensor:
    """Observations for the module, float64 as float32 (MuJoCo's Box is float64): what RLlib's
    connectors hand it (convert_to_torch_tensor casts doubles to floats); episodes keep the env's dtype."""
    x = torch.from_numpy(obs)
    return (x.float() if x.dtype == torch.float64 else x).to(device)


def _buffers(r: episodes.Rollout) -> tuple[np.ndarray, ...]:
    return r["obs"], r["actions"], r["extra:" + Columns.ACTION_LOGP], r["extra:" + Columns.ACTION_DIST_INPUTS]


class EnvPoolFastEnvRunner(FastEnvRunner):
    """The fast runner on EnvPool's implementation of the env id."""

    backend = "envpool"
