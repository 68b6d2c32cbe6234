"""The spec's ``model`` section -> RLlib's DefaultModelConfig (and the observation filter).

RLlib builds the network from this (MLP, CNN for image observations, LSTM, Gaussian heads for
continuous actions); rayrl only names the few knobs a user needs and fills the CNN default for
preprocessed Atari frames, so a spec never has to know RLlib's catalog.
"""

from __future__ import annotations

import functools
from typing import Any

from rayrl.spec import ModelSpec

#: The classic Atari CNN for 84x84 frames: RLlib's get_filter_config layers, with "valid" padding on
#: the last so it ends in 1x1x256 as the DQN-era net did (RLlib's new-stack CNN pads "same" unless told,
#: which would leave 11x11x256 = 31k features and ~20x the compute).
ATARI_CONV_FILTERS = [[16, [8, 8], 4], [32, [4, 4], 2], [256, [11, 11], 1, "valid"]]


def model_config(model: ModelSpec, *, atari: bool = False) -> dict[str, Any]:
    """DefaultModelConfig keys for ``model`` (``atari``: the env is a preprocessed ALE env)."""
    filters = model.conv_filters if model.conv_filters is not None else (ATARI_CONV_FILTERS if atari else None)
    out: dict[str, Any] = {
        "fcnet_hiddens": list(model.hidden),
        "fcnet_activation": model.activation,
        "conv_activation": model.conv_activation,
        "vf_share_layers": model.vf_share_layers,
        "use_lstm": model.lstm,
        "lstm_cell_size": model.lstm_cell_size,
        "max_seq_len": model.max_seq_len,
        "free_log_std": model.free_log_std,
    }
    if model.init != "default":
        out["rayrl_init"] = model.init
    if model.log_std_init is not None:
        out["rayrl_log_std_init"] = model.log_std_init
    if filters is not None:
        layers: list[list[Any]] = [list(layer) for layer in filters]  # [channels, [kh, kw], stride(, padding)]
        out["conv_filters"] = [[int(c), [int(k) for k in kernel], int(s), *pad] for c, kernel, s, *pad in layers]
    return out


def obs_filter(env: Any = None, spaces: Any = None, device: Any = None, *, clip: float = 10.0) -> Any:
    """The env-to-module connector piece for ``model.normalize_obs``: a running mean/std filter.

    RLlib checkpoints its state and merges it across env runners after every iteration.
    """
    from ray.rllib.connectors.env_to_module.mean_std_filter import MeanStdFilter

    return MeanStdFilter(multi_agent=False, clip_by_value=clip if clip > 0 else None)


def obs_filter_factory(clip: float) -> Any:
    """``obs_filter`` with ``model.obs_clip`` bound (a partial, so env runner actors unpickle it)."""
    return functools.partial(obs_filter, clip=clip)


def module_spec(spec: Any) -> Any:
    """rayrl's PPO module when the spec asks for its initialisation; else None (RLlib's default)."""
    m = spec.model
    if spec.algo.name != "PPO" or (m.init == "default" and m.log_std_init is None):
        return None
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    from rayrl.rllib.modules import RayrlPPOTorchRLModule

    return RLModuleSpec(module_class=RayrlPPOTorchRLModule)
