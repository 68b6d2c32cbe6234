"""RLlib's default PPO policy forward, traced once for the fast runner's batch of observations.

At one env (MuJoCo at RL Zoo's settings) the module's Python dispatch, a dozen ``nn.Module`` calls
per step, is a large part of the step (docs/benchmarks.md section 14). A TorchScript trace of
``_forward_exploration`` runs the same aten ops on the same parameter tensors without that dispatch,
so it returns the same numbers, and it follows weight syncs, which copy into those tensors in place.

Only RLlib's default PPO module qualifies (its forward is known to be encoder then pi head, with
no data-dependent branch), on CPU, stateless; anything else keeps calling the module.

torch 2.13 marks ``torch.jit.trace`` deprecated (for ``torch.export``, whose module ran this forward
slower than the plain call at batch 1, and ``torch.compile``, whose compile each runner would pay;
docs/sampling.md).
Its warning is silenced here; if a later torch drops or breaks the tracer, the runner logs it once
and calls the module untraced.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from ray.rllib.algorithms.ppo.torch.default_ppo_torch_rl_module import DefaultPPOTorchRLModule
from ray.rllib.core.columns import Columns
from ray.rllib.core.rl_module.torch import TorchRLModule


def traceable(module: Any, device: Any) -> bool:
    """Whether ``module``'s exploration forward is RLlib's default PPO forward on CPU."""
    cls = type(module)
    return (
        isinstance(module, DefaultPPOTorchRLModule)
        and cls._forward is DefaultPPOTorchRLModule._forward
        and cls._forward_exploration is TorchRLModule._forward_exploration
        and cls._forward_inference is TorchRLModule._forward_inference
        and not module.is_stateful()
        and torch.device(device or "cpu").type == "cpu"
    )


class _DistInputs(torch.nn.Module):
    def __init__(self, module: Any) -> None:
        super().__init__()
        self.module = module

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.module._forward_exploration({Columns.OBS: obs})[Columns.ACTION_DIST_INPUTS]


def _tensors(module: torch.nn.Module) -> tuple[tuple[int, int], ...]:
    return tuple((id(t), t.data_ptr()) for t in (*module.parameters(), *module.buffers()))


class TracedPolicy:
    """The action-distribution inputs of ``module`` for observations shaped like ``example``."""

    def __init__(self, module: Any, example: torch.Tensor) -> None:
        self.module, self.shape, self.tensors = module, tuple(example.shape), _tensors(module)
        with torch.no_grad(), warnings.catch_warnings():
            # The pi head repeats log std len(batch) times: the trace keeps this batch size, the
            # only one it is called with (see fits).
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            warnings.filterwarnings("ignore", r"`torch\.jit\.trace", DeprecationWarning)  # its own only
            self.trace = torch.jit.trace(_DistInputs(module), (example,), check_trace=False)

    def fits(self, module: Any, obs: torch.Tensor) -> bool:
        """The same module, parameter tensors and batch shape as when traced (else trace again)."""
        return module is self.module and tuple(obs.shape) == self.shape and _tensors(module) == self.tensors

    def __call__(self, obs: torch.Tensor) -> torch.Tensor:
        return self.trace(obs)
