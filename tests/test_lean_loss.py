"""rayrl.rllib.lean_loss without Ray: the closed-form PPO loss is RLlib's loss.

The reference is what RLlib computes: ``torch.distributions`` for the terms, and
``PPOTorchLearner.compute_loss_for_module`` itself for the loss, its gradients and the figures it
logs, on learners built with ``AlgorithmConfig.build_learner`` (the real classes).
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from ray.rllib.algorithms.ppo.torch.ppo_torch_learner import PPOTorchLearner
from ray.rllib.core.columns import Columns
from ray.rllib.core.distribution.torch.torch_distribution import TorchCategorical, TorchDiagGaussian
from ray.rllib.evaluation.postprocessing import Postprocessing

from rayrl.rllib import algo, lean_loss
from rayrl.spec import from_dict
from tests.test_learner_unit import MID

LOGGED = ("policy_loss", "vf_loss", "vf_loss_unclipped", "vf_explained_var", "entropy", "mean_kl_loss")


def _reference(dist_cls, logits, prev_logits, actions):
    cur, prev = dist_cls.from_logits(logits), dist_cls.from_logits(prev_logits)
    return cur.logp(actions), prev.kl(cur), cur.entropy()


def _check_terms(fn, dist_cls, logits, prev_logits, actions):
    mine_in = logits.clone().requires_grad_(True)
    ref_in = logits.clone().requires_grad_(True)
    mine = fn(mine_in, prev_logits, actions)
    ref = _reference(dist_cls, ref_in, prev_logits, actions)
    for name, a, b in zip(("logp", "kl", "entropy"), mine, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)
    weights = torch.randn(3, logits.shape[0], generator=torch.Generator().manual_seed(1))
    sum(w @ t for w, t in zip(weights, mine, strict=True)).backward()
    sum(w @ t for w, t in zip(weights, ref, strict=True)).backward()
    torch.testing.assert_close(mine_in.grad, ref_in.grad, rtol=1e-5, atol=1e-6)


def test_categorical_terms_are_torchs_including_an_impossible_action():
    g = torch.Generator().manual_seed(0)
    logits, prev = torch.randn(64, 5, generator=g) * 3, torch.randn(64, 5, generator=g) * 3
    prev[0, 2] = -float("inf")  # an action the sampling policy could not take: KL term 0, as torch's
    actions = torch.randint(0, 5, (64,), generator=g)
    actions[0] = 1
    _check_terms(lean_loss.categorical_terms, TorchCategorical, logits, prev, actions)


def test_diag_gaussian_terms_are_rllibs():
    g = torch.Generator().manual_seed(0)
    logits, prev = torch.randn(64, 6, generator=g), torch.randn(64, 6, generator=g)  # 3 dims: loc, log std
    actions = torch.randn(64, 3, generator=g) * 2
    _check_terms(lean_loss.diag_gaussian_terms, TorchDiagGaussian, logits, prev, actions)


def test_only_rllibs_two_default_distributions_take_the_closed_form():
    assert lean_loss.terms_for(TorchCategorical, TorchCategorical) is lean_loss.categorical_terms
    assert lean_loss.terms_for(TorchDiagGaussian, TorchDiagGaussian) is lean_loss.diag_gaussian_terms
    assert lean_loss.terms_for(TorchCategorical, TorchDiagGaussian) is None

    class Custom(TorchCategorical):
        pass

    assert lean_loss.terms_for(Custom, Custom) is None  # a subclass may change the maths: RLlib's own


def _learner(env_id: str, kl_loss: bool, entropy: float):
    spec = from_dict(
        {
            "env": {"id": env_id},
            "algo": {"train_batch_per_learner": 64, "minibatch_size": 64, "entropy_coeff": entropy},
            "model": {"hidden": [32, 32]},
            "resources": {"env_runners": 0},
        }
    )
    config = algo.build_config(spec)
    config.training(use_kl_loss=kl_loss, vf_clip_param=0.5)  # a clip some rows hit
    return config.build_learner(env=gym.make(env_id))


def _batch(learner, n: int, continuous: bool) -> dict:
    g = torch.Generator().manual_seed(3)
    if continuous:
        logits, actions = torch.randn(n, 2, generator=g), torch.randn(n, 1, generator=g)
        logp = TorchDiagGaussian.from_logits(logits).logp(actions)
    else:
        logits, actions = torch.randn(n, 2, generator=g), torch.randint(0, 2, (n,), generator=g)
        logp = TorchCategorical.from_logits(logits).logp(actions)
    obs_dim = 3 if continuous else 4
    return {
        Columns.OBS: torch.randn(n, obs_dim, generator=g),
        Columns.ACTIONS: actions,
        Columns.ACTION_LOGP: logp + 0.3 * torch.randn(n, generator=g),  # ratios off 1: the clip acts
        Columns.ACTION_DIST_INPUTS: logits,
        Postprocessing.ADVANTAGES: torch.randn(n, generator=g),
        Postprocessing.VALUE_TARGETS: torch.randn(n, generator=g) * 2,
    }


def _loss_and_grads(learner, batch, loss_fn):
    module = learner.module[MID].unwrapped()
    module.zero_grad(set_to_none=True)
    fwd = module.forward_train(batch)
    loss = loss_fn(module_id=MID, config=learner.config.get_config_for_module(MID), batch=batch, fwd_out=fwd)
    loss.backward()
    return float(loss), [p.grad.clone() for p in module.parameters() if p.grad is not None]


def _loss_grads_logged(learner, batch, loss_fn):
    loss, grads = _loss_and_grads(learner, batch, loss_fn)
    return loss, grads, {k: float(learner.metrics.peek((MID, k))) for k in LOGGED}


@pytest.mark.parametrize(
    ("env_id", "kl_loss", "entropy"),
    [("CartPole-v1", True, 0.01), ("CartPole-v1", False, 0.0), ("Pendulum-v1", True, 0.01)],
    ids=["categorical-kl", "categorical-no-kl", "gaussian-kl"],
)
def test_rayrls_ppo_loss_is_rllibs_loss_gradients_and_figures(env_id, kl_loss, entropy):
    learner = _learner(env_id, kl_loss, entropy)
    assert learner._rayrl_lean_terms(MID, {}) is not None  # the closed form is the one taken
    batch = _batch(learner, 64, continuous=env_id == "Pendulum-v1")
    mine = _loss_grads_logged(learner, batch, learner.compute_loss_for_module)
    ref = _loss_grads_logged(learner, batch, lambda **kw: PPOTorchLearner.compute_loss_for_module(learner, **kw))
    assert mine[0] == pytest.approx(ref[0], rel=1e-5, abs=1e-6)
    assert len(mine[1]) == len(ref[1]) > 0
    for a, b in zip(mine[1], ref[1], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    assert mine[2] == pytest.approx(ref[2], rel=1e-5, abs=1e-6)
    if kl_loss:
        assert ref[2]["mean_kl_loss"] > 0  # the KL term was in play
    assert np.isfinite(mine[0])


def test_a_masked_batch_takes_rllibs_loss():
    learner = _learner("CartPole-v1", True, 0.0)
    assert learner._rayrl_lean_terms(MID, {Columns.LOSS_MASK: torch.ones(4, dtype=torch.bool)}) is None


@pytest.mark.parametrize(
    ("env_id", "kl_loss", "entropy", "built"),
    [
        ("CartPole-v1", False, 0.0, {"kl": False, "entropy": False}),
        ("CartPole-v1", True, 0.0, {"kl": True, "entropy": False}),
        ("Pendulum-v1", False, 0.01, {"kl": False, "entropy": True}),
    ],
    ids=["categorical-bare", "categorical-kl", "gaussian-entropy"],
)
def test_a_quiet_minibatch_builds_only_the_terms_its_loss_uses_and_keeps_rllibs_gradients(
    env_id, kl_loss, entropy, built
):
    from rayrl.rllib.lean_update import _MUTED

    learner = _learner(env_id, kl_loss, entropy)
    closed_form = learner._rayrl_lean_terms(MID, {})
    seen: list[dict] = []

    def spy(*args, **kwargs):
        seen.append(kwargs)
        return closed_form(*args, **kwargs)

    learner._rayrl_terms[MID] = spy
    batch = _batch(learner, 64, continuous=env_id == "Pendulum-v1")
    metrics, learner.metrics = learner.metrics, _MUTED  # what the lean loop does for all but the last
    try:
        mine = _loss_and_grads(learner, batch, learner.compute_loss_for_module)
    finally:
        learner.metrics = metrics
    ref = _loss_and_grads(learner, batch, lambda **kw: PPOTorchLearner.compute_loss_for_module(learner, **kw))
    assert seen == [built]
    assert mine[0] == pytest.approx(ref[0], rel=1e-5, abs=1e-6)
    for a, b in zip(mine[1], ref[1], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    _loss_and_grads(learner, batch, learner.compute_loss_for_module)  # figures kept: every term built
    assert seen[-1] == {"kl": True, "entropy": True}
