"""PPO's RLModule with rayrl's initialisation: ``model.init`` and ``model.log_std_init``.

RLlib's default PPO module initialises with torch's defaults and starts a free log std at 0; the
MuJoCo recipes people compare against (CleanRL, SB3) use orthogonal weights with a small policy
output and, in RL Zoo, a log std of -2. The module applies them in ``setup`` so every copy (the
learners', each env runner's, an exported one) starts from the same weights; the seed decides them.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from ray.rllib.algorithms.ppo.torch.default_ppo_torch_rl_module import DefaultPPOTorchRLModule

#: CleanRL's gains: hidden layers sqrt(2), the policy's output 0.01, the value's 1.
GAINS = {"hidden": math.sqrt(2.0), "pi": 0.01, "vf": 1.0}


class RayrlPPOTorchRLModule(DefaultPPOTorchRLModule):
    """DefaultPPOTorchRLModule, then ``rayrl_init`` and ``rayrl_log_std_init`` from the model config."""

    def setup(self) -> None:
        super().setup()
        cfg: dict[str, Any] = self.model_config if isinstance(self.model_config, dict) else {}
        if cfg.get("rayrl_init", "default") == "orthogonal":
            orthogonal(self)
        if cfg.get("rayrl_log_std_init") is not None:
            set_log_std(self, float(cfg["rayrl_log_std_init"]))


def _linears(module: torch.nn.Module) -> list[torch.nn.Module]:
    return [m for m in module.modules() if isinstance(m, (torch.nn.Linear, torch.nn.Conv2d))]


def orthogonal(module: Any) -> None:
    """Orthogonal weights, zero biases; the last layer of each head gets its own gain."""
    for part, last_gain in (
        (module.encoder, None),
        (module.pi, GAINS["pi"]),
        (getattr(module, "vf", None), GAINS["vf"]),
    ):
        if part is None:
            continue
        layers = _linears(part)
        for i, layer in enumerate(layers):
            gain = last_gain if last_gain is not None and i == len(layers) - 1 else GAINS["hidden"]
            torch.nn.init.orthogonal_(layer.weight, gain)
            if layer.bias is not None:
                torch.nn.init.zeros_(layer.bias)


def set_log_std(module: Any, value: float) -> None:
    """The Gaussian's initial log std: the free parameter, else the bias of the log-std outputs."""
    pi = module.pi
    with torch.no_grad():
        if isinstance(getattr(pi, "log_std", None), torch.nn.Parameter):
            pi.log_std.fill_(value)
            return
        last = _linears(pi)[-1]
        half = last.out_features // 2
        if last.bias is None or last.out_features % 2:
            raise ValueError("model.log_std_init: the policy head has no log-std outputs to initialise")
        last.bias[half:].fill_(value)
