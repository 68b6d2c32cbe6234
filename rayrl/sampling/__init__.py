"""Sampling: env backends and the fast env runner for stateless policies.

``episodes`` cuts a rollout's preallocated arrays into RLlib episodes (pure numpy, no Ray);
``backends`` makes the vectorised env (gymnasium or EnvPool); ``fast_runner`` is the RLlib
``env_runner_cls`` that steps it in a tight loop. ``env.runner`` and ``env.backend`` in the spec
choose them (see :func:`runner_class`).
"""

from __future__ import annotations


def runner_class(runner: str, backend: str) -> type | None:
    """The RLlib ``env_runner_cls`` for a spec's ``env.runner``/``env.backend``; None keeps RLlib's own."""
    if runner == "rllib":
        return None
    from rayrl.sampling import fast_runner

    return fast_runner.EnvPoolFastEnvRunner if backend == "envpool" else fast_runner.FastEnvRunner
