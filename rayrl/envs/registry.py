"""Env ids -> the name RLlib builds the env from: gymnasium ids, ALE (Atari) ids, user factories.

Atari gets RLlib's own preprocessing (``wrap_atari_for_new_api_stack``) whenever ``env.id`` is an
ALE id, so a spec never has to spell it out: frames max-pooled over the frameskip, grayscale
84x84, scaled to [-1, 1], a stack of the last 4 frames, up to 30 no-ops at reset, FIRE at reset where
the game needs it, each life one episode, and rewards clipped to their sign (-1, 0, 1; RLlib's
``clip_rewards`` is not applied on the new API stack, so the wrapper does it). Episode returns
are therefore sums of clipped rewards per life (for Pong, the score difference). Factories are
registered with Tune's registry under the
names made here, so env runners on any node build the same env.
"""

from __future__ import annotations

from typing import Any

ATARI_DIM = 84  #: frame height and width after preprocessing (RLlib has a default CNN for 84x84)
ATARI_FRAMESTACK = 4  #: frames stacked into one observation
ATARI_FRAMESKIP = 4  #: frames per action (max-pooled over the last two) unless env.config says otherwise
ATARI_PREFIX = "rayrl_atari:"  #: the registered name of an ALE id's preprocessed env


def is_ale(env_id: str) -> bool:
    """True for Atari ids served by ale-py (ALE/Pong-v5, PongNoFrameskip-v4, ...)."""
    if ":" in env_id:
        return False
    if env_id.startswith("ALE/"):
        return True
    import gymnasium

    try:
        import ale_py

        gymnasium.register_envs(ale_py)
    except ImportError:
        return False
    entry = getattr(gymnasium.registry.get(env_id), "entry_point", "")
    return isinstance(entry, str) and entry.startswith("ale_py")


def env_name(env_id: str) -> str:
    """Register what RLlib cannot build by itself and return the name to pass to ``config.environment``."""
    from ray.tune.registry import register_env

    if ":" in env_id:
        from rayrl.spec import resolve_factory

        factory = resolve_factory(env_id)
        name = "rayrl_env:" + env_id
        register_env(name, lambda cfg, f=factory: f(dict(cfg)))
        return name
    if is_ale(env_id):
        name = ATARI_PREFIX + env_id
        register_env(name, lambda cfg, env_id=env_id: make_atari(env_id, dict(cfg)))
        return name
    return env_id


def ale_id_of(name: str) -> str | None:
    """The ALE id behind a name :func:`env_name` registered (None for any other name)."""
    return name.removeprefix(ATARI_PREFIX) if name.startswith(ATARI_PREFIX) else None


def make_atari(env_id: str, env_config: dict) -> Any:
    """An ALE env with RLlib's Atari preprocessing; ``frameskip`` in env_config moves into the wrapper.

    The raw ALE env then steps one frame at a time so the wrapper can max-pool the last two frames
    of each skip (the flicker fix of the DQN paper); other keys go to ``gymnasium.make``.
    """
    import ale_py
    import gymnasium
    from ray.rllib.env.wrappers.atari_wrappers import ClipRewardEnv, wrap_atari_for_new_api_stack

    gymnasium.register_envs(ale_py)
    kwargs = dict(env_config)
    frameskip = int(kwargs.pop("frameskip", ATARI_FRAMESKIP))
    env = gymnasium.make(env_id, frameskip=1, **kwargs)
    env = wrap_atari_for_new_api_stack(env, dim=ATARI_DIM, frameskip=frameskip, framestack=ATARI_FRAMESTACK)
    return ClipRewardEnv(env)
