"""PPO's loss terms in closed form, for the two action distributions RLlib's default PPO module uses.

RLlib's ``PPOTorchLearner.compute_loss_for_module`` builds two ``torch.distributions`` objects per
minibatch (the current and the sampling-time policy) and asks them for log-probabilities, the KL and
the entropy; at small minibatches of a small MLP that object plumbing costs as much as the forward
pass itself. The functions here compute the same quantities from the logits directly (log-softmax for
``TorchCategorical``, the normal's formulas for ``TorchDiagGaussian``), with the same loss, so a
learner can take them where the distribution classes are exactly those two and fall back to RLlib's
loss otherwise. ``tests/test_lean_loss.py`` checks loss and gradients against RLlib's.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)

#: (logp of the actions, KL(prev || current), entropy), one value per row.
Terms = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def categorical_terms(
    logits: torch.Tensor, prev_logits: torch.Tensor, actions: torch.Tensor, *, kl: bool = True, entropy: bool = True
) -> Terms:
    """What ``torch.distributions.Categorical`` gives for these logits, without building one.

    ``kl`` / ``entropy`` False: that term is a zero the loss does not use (a quiet minibatch with
    no KL penalty or a zero entropy coefficient), and its graph is not built.
    """
    logp_all = torch.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)
    kl_value = ent = logits.new_zeros(())
    if kl:
        prev_logp_all = torch.log_softmax(prev_logits, dim=-1)
        prev_p = prev_logp_all.exp()
        # torch's KL sets the terms of impossible actions (p = 0) to 0; so does the where.
        kl_value = torch.where(prev_p > 0, prev_p * (prev_logp_all - logp_all), 0.0).sum(-1)
    if entropy:
        logp_finite = logp_all.clamp(min=torch.finfo(logp_all.dtype).min)  # Categorical.entropy's clamp
        ent = -(logp_finite * logp_all.exp()).sum(-1)
    return logp, kl_value, ent


def diag_gaussian_terms(
    logits: torch.Tensor, prev_logits: torch.Tensor, actions: torch.Tensor, *, kl: bool = True, entropy: bool = True
) -> Terms:
    """What RLlib's ``TorchDiagGaussian`` (loc and log std halves of the logits) gives, summed over dims
    (``kl`` / ``entropy`` as in ``categorical_terms``)."""
    loc, log_std = logits.chunk(2, dim=-1)
    scale = log_std.exp()
    logp = (-((actions - loc) ** 2) / (2.0 * scale**2) - log_std - _HALF_LOG_2PI).sum(-1)
    kl_value = ent = logits.new_zeros(())
    if kl:
        prev_loc, prev_log_std = prev_logits.chunk(2, dim=-1)
        var_ratio = (prev_log_std.exp() / scale) ** 2
        mean_term = ((prev_loc - loc) / scale) ** 2
        kl_value = (0.5 * (var_ratio + mean_term - 1.0 - var_ratio.log())).sum(-1)
    if entropy:
        ent = (0.5 + _HALF_LOG_2PI + log_std).sum(-1)
    return logp, kl_value, ent


def terms_for(train_cls: type, exploration_cls: type) -> Callable[..., Terms] | None:
    """The closed form for a module's (train, exploration) distribution classes; None: use RLlib's."""
    from ray.rllib.core.distribution.torch.torch_distribution import TorchCategorical, TorchDiagGaussian

    if train_cls is TorchCategorical and exploration_cls is TorchCategorical:
        return categorical_terms
    if train_cls is TorchDiagGaussian and exploration_cls is TorchDiagGaussian:
        return diag_gaussian_terms
    return None


def ppo_loss(
    terms: Terms,
    *,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    values: torch.Tensor | None,
    value_targets: torch.Tensor,
    clip_param: float,
    vf_clip_param: float,
    vf_loss_coeff: float,
    entropy_coeff: Any,
    kl_coeff: Any | None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """RLlib's PPO loss (unmasked rows) from the terms; returns (total, the pieces RLlib logs).

    ``values`` None: no critic (``use_critic`` off); ``kl_coeff`` None: no KL term (``use_kl_loss`` off).
    """
    logp, kl, entropy = terms
    ratio = torch.exp(logp - old_logp)
    surrogate = torch.min(advantages * ratio, advantages * torch.clamp(ratio, 1 - clip_param, 1 + clip_param))
    if values is not None:
        vf_loss = torch.pow(values - value_targets, 2.0)
        vf_loss_clipped = torch.clamp(vf_loss, 0, vf_clip_param)
    else:
        vf_loss = vf_loss_clipped = torch.zeros((), device=surrogate.device)
    total = torch.mean(-surrogate + vf_loss_coeff * vf_loss_clipped - entropy_coeff * entropy)
    if kl_coeff is not None:
        mean_kl = kl.mean()
        total = total + kl_coeff * mean_kl
    else:
        mean_kl = torch.zeros((), device=surrogate.device)
    pieces = {
        "surrogate": surrogate,
        "vf_loss": vf_loss,
        "vf_loss_clipped": vf_loss_clipped,
        "entropy": entropy,
        "mean_kl": mean_kl,
    }
    return total, pieces
