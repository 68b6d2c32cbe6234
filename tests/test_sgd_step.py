"""benchmarks/sgd_step.py: its bare torch step computes RLlib's PPO loss (so the comparison is at equal
loss), takes the learner's optimizer settings, and its quick mode runs end to end."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from conftest import ROOT, subprocess_env
from ray.rllib.algorithms.ppo.torch.ppo_torch_learner import PPOTorchLearner

from benchmarks import sgd_step
from tests.test_benchmarks import run_quick
from tests.test_lean_loss import _batch, _learner, _loss_and_grads
from tests.test_learner_unit import MID


@pytest.mark.parametrize(
    ("env_id", "kl_loss", "entropy"),
    [("CartPole-v1", False, 0.0), ("CartPole-v1", True, 0.01), ("Pendulum-v1", True, 0.01)],
    ids=["categorical", "categorical-kl-entropy", "gaussian-kl-entropy"],
)
def test_the_bare_step_computes_rllibs_loss_and_gradients(env_id, kl_loss, entropy):
    learner = _learner(env_id, kl_loss, entropy)
    learner.module[MID].unwrapped().train()
    batch = _batch(learner, 64, continuous=env_id == "Pendulum-v1")
    bare = sgd_step.Bare(learner, MID)
    bare.module.zero_grad(set_to_none=True)
    loss = bare.loss({k: batch[k] for k in sgd_step._USED})
    loss.backward()
    mine = [p.grad for p in bare.module.parameters() if p.grad is not None]
    ref = _loss_and_grads(learner, batch, lambda **kw: PPOTorchLearner.compute_loss_for_module(learner, **kw))
    assert float(loss) == pytest.approx(ref[0], rel=1e-5, abs=1e-6)
    assert len(mine) == len(ref[1]) > 0
    for a, b in zip(mine, ref[1], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_the_bare_step_takes_the_learners_optimizer_settings_and_leaves_its_module_alone():
    learner = _learner("CartPole-v1", False, 0.0)
    (_, opt), *_ = learner.get_optimizers_for_module(MID)
    opt.param_groups[0]["eps"] = 1e-5  # as a recipe's algo.adam_eps sets it
    bare = sgd_step.Bare(learner, MID)
    mine = bare.optimizer.param_groups[0]
    for key in ("lr", "eps", "betas", "fused", "foreach"):
        assert mine[key] == opt.param_groups[0][key], key
    before = [p.detach().clone() for p in learner.module[MID].parameters()]
    batch = _batch(learner, 64, continuous=False)
    bare.step({k: batch[k] for k in sgd_step._USED})
    assert all(torch.equal(a, b) for a, b in zip(before, learner.module[MID].parameters(), strict=True))
    assert any(not torch.equal(a, b) for a, b in zip(before, bare.module.parameters(), strict=True))


def test_one_bare_step_moves_the_weights_as_the_learners_own_step_clip_included():
    learner = _learner("CartPole-v1", False, 0.0)
    bare = sgd_step.Bare(learner, MID)
    batch = _batch(learner, 64, continuous=False)
    batch["advantages"] = batch["advantages"] * 100  # large advantages: a gradient norm the clip cuts
    _, grads = _loss_and_grads(learner, batch, learner.compute_loss_for_module)
    norm = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])))
    assert norm > 2 * bare.grad_clip == 2 * learner.rayrl.grad_clip  # the clip acts on this batch
    learner.module[MID].unwrapped().train()
    learner._rayrl_in_train_mode = True
    learner._rayrl_minibatch({MID: batch}, quiet=True)  # the learner's step: loss, guard, clip, Adam
    bare.step({k: batch[k] for k in sgd_step._USED})
    for a, b in zip(learner.module[MID].parameters(), bare.module.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_bad_rounds_exit_2_naming_the_flag():
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.sgd_step", "--rounds", "0"],
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert proc.returncode == 2 and "--rounds (0)" in proc.stderr


@pytest.mark.slow
def test_quick_mode_times_both_sides_on_rl_zoos_cartpole_batch(tmp_path):
    report, printed = run_quick("sgd_step", tmp_path / "step.json")
    # RL Zoo's CartPole: 8 envs x 32 steps, one 256-row minibatch, 20 epochs, no KL term
    assert report["minibatch_size"] == 256 and report["epochs"] == 20
    assert report["minibatches_per_update"] == 20 and report["rows"] >= 256
    assert report["kl_term"] is False and report["fused"] is True
    assert len(report["rounds"]) == 2 and [r["first"] for r in report["rounds"]] == ["rayrl", "bare"]
    for r in report["rounds"]:
        assert 0.05 < r["rayrl_ms"] < 100 and 0.05 < r["bare_ms"] < 100
        assert r["ratio"] == pytest.approx(r["rayrl_ms"] / r["bare_ms"])
    assert "rayrl / bare" in printed
