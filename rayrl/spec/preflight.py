"""Checks that look outside the spec: is the env registered, the factory importable, the extra installed.

Imported packages (gymnasium, ale_py, envpool, the tracking extras) are imported only here and
only when a spec names them.
"""

from __future__ import annotations

import difflib
import importlib
from typing import Any

from rayrl.errors import SpecError
from rayrl.extras import require
from rayrl.spec.schema import EnvSpec, TrackingSpec


def check_tracking(t: TrackingSpec) -> None:
    """Credentials stay out of the spec (and so out of the run folder); enabled tools must be installed."""
    from urllib.parse import urlsplit

    uri = t.mlflow.tracking_uri
    if uri and "@" in urlsplit(uri).netloc:
        raise SpecError(
            "tracking.mlflow.tracking_uri: the URI carries a user or password; credentials never go "
            "in the spec (it is copied to the run folder): give the URI without them and set "
            "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN)."
        )
    if t.mlflow.enabled:
        require("mlflow", "tracking", "tracking.mlflow.enabled")
    if t.wandb.enabled:
        require("wandb", "tracking", "tracking.wandb.enabled")
    if t.tensorboard:
        require("tensorboardX", "tracking", "tracking.tensorboard")


def check_backend(env: EnvSpec, runner: str) -> None:
    """envpool only with the fast runner (``runner``: env.runner resolved), installed, and for an id
    EnvPool implements."""
    if env.backend != "envpool":
        return
    if runner != "fast":
        raise SpecError(
            f"env.backend: 'envpool' with env.runner {env.runner!r} (runs {runner!r}); EnvPool is stepped by "
            "the fast runner only: set env.runner: fast or env.backend: gymnasium."
        )
    missing = envpool_missing()
    if missing:
        raise SpecError(
            f"env.backend: 'envpool' cannot be imported here ({missing}); pip install envpool, or "
            "set env.backend: gymnasium."
        )
    if envpool_id(env.id) not in envpool_ids():
        near = difflib.get_close_matches(envpool_id(env.id), envpool_ids(), n=1, cutoff=0.6)
        hint = f"did you mean {near[0]!r}? " if near else ""
        raise SpecError(
            f"env.backend: 'envpool' has no env {env.id!r}; {hint}give an id EnvPool implements "
            "(envpool.list_all_envs(); an ALE id such as ALE/Breakout-v5 maps to Breakout-v5) or set "
            "env.backend: gymnasium."
        )


def check_conv_filters(filters: list | None) -> None:
    """Each CNN layer is [out_channels, [kernel_h, kernel_w], stride(, padding)]: positive integers, same|valid."""
    if filters is None:
        return
    for i, layer in enumerate(filters):
        ok = (
            isinstance(layer, (list, tuple))
            and len(layer) in (3, 4)
            and isinstance(layer[1], (list, tuple))
            and len(layer[1]) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (layer[0], *layer[1], layer[2]))
            and (len(layer) == 3 or layer[3] in ("same", "valid"))
        )
        if not ok:
            raise SpecError(
                f"model.conv_filters[{i}]: {layer!r} is not a layer; each layer is [out_channels, "
                "[kernel_h, kernel_w], stride] of positive integers with an optional padding, same "
                "or valid, e.g. [16, [8, 8], 4] or [256, [11, 11], 1, valid]; null takes the default "
                "for the image size."
            )


def check_env(env_id: str) -> None:
    """Fail early on an env id that neither gymnasium nor an import path can resolve."""
    if ":" in env_id:
        resolve_factory(env_id)
        return
    import gymnasium

    if env_id not in gymnasium.registry:  # ALE ids (ALE/Pong-v5, PongNoFrameskip-v4) appear once ale-py registers
        try:
            import ale_py

            gymnasium.register_envs(ale_py)
        except ImportError as exc:
            if env_id.startswith("ALE/"):
                raise SpecError(f"env.id: {env_id!r} needs the ale-py package ({exc}); pip install ale-py.") from None
    if env_id not in gymnasium.registry:
        near = difflib.get_close_matches(env_id, list(gymnasium.registry), n=1, cutoff=0.6)
        hint = f"did you mean {near[0]!r}? " if near else ""
        raise SpecError(
            f"env.id: {env_id!r} is not a registered gymnasium env; {hint}give a gymnasium id "
            "(e.g. CartPole-v1) or a factory as 'package.module:function'."
        )


def resolve_factory(target: str) -> Any:
    """Import 'package.module:function'; the function builds the env from env_config."""
    return import_callable(target, "env.id", "'package.module:function' importable on every node, or a gymnasium id")


def import_callable(target: str, field_name: str, expected: str) -> Any:
    """Import 'package.module:function' named by a user, or raise SpecError naming the field."""
    module, _, name = str(target).partition(":")
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError, TypeError) as exc:  # TypeError: a relative '.mod'
        raise SpecError(f"{field_name}: {target!r} cannot be imported ({exc}); give {expected}.") from None
    if not callable(fn):
        raise SpecError(f"{field_name}: {target!r} is not callable; give {expected}.")
    return fn


def envpool_id(env_id: str) -> str:
    """EnvPool's id for a spec's env id: an ALE id ``ALE/Breakout-v5`` is EnvPool's ``Breakout-v5``."""
    return env_id.removeprefix("ALE/")


def envpool_missing() -> str | None:
    """Why EnvPool cannot be used here (None when it can)."""
    try:
        import envpool  # noqa: F401
    except Exception as exc:  # ImportError, or a wheel built for another numpy/glibc
        return f"{type(exc).__name__}: {exc}"
    return None


def envpool_ids() -> list[str]:
    import envpool

    return list(envpool.list_all_envs())
