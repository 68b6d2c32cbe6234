"""rayrl.rllib.lean_update without Ray: the lean PPO loop learns what RLlib's loop learns.

Learners are built with ``AlgorithmConfig.build_learner`` (the real classes) and fed a synthetic
PPO batch with padded rows, the shape RLlib's learner connector hands over (its one-step
elongation adds a ``loss_mask``-false row to every episode chunk).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from ray.rllib.core.columns import Columns
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch

from rayrl.rllib.lean_update import lean_columns, minibatch_indices, update_plan
from tests.test_learner_unit import MID, make_batch, make_learner, max_diff, same_start, stat, weights


def padded_batch(n: int, pad: int, seed: int = 0) -> MultiAgentBatch:
    """``n`` real rows plus ``pad`` padded rows (garbage values, ``loss_mask`` false), shuffled in."""
    real = make_batch(n + pad, seed).policy_batches[MID]
    data = {k: np.asarray(v) for k, v in real.items()}
    mask = np.ones(n + pad, dtype=bool)
    mask[np.random.default_rng(seed).choice(n + pad, pad, replace=False)] = False
    data[Columns.OBS][~mask] = 1e3  # a padded row that leaked into a mean would move the weights a lot
    data[Columns.LOSS_MASK] = mask
    return MultiAgentBatch({MID: SampleBatch(data)}, env_steps=n)


def lean_and_rllib(**kwargs):
    lean = make_learner(**kwargs)
    rllib = make_learner(**kwargs)
    rllib.rayrl = dataclasses.replace(rllib.rayrl, lean_update=False)
    same_start(lean, rllib)
    return lean, rllib


def test_full_batch_epochs_match_rllibs_loop_with_padding_dropped():
    # RLlib's cyclic iterator runs epochs + 1 full-batch minibatches for `minibatch_size=None`, so
    # the reference is three one-epoch updates (no KL loss: its coefficient moves between updates).
    lean, rllib = lean_and_rllib(lr=0.01, kl_loss=False)
    start = weights(lean)
    r_lean = lean.update(batch=padded_batch(48, 16), minibatch_size=None, num_epochs=3, timesteps={})
    for _ in range(3):
        r_rllib = rllib.update(batch=padded_batch(48, 16), minibatch_size=None, num_epochs=1, timesteps={})
    assert max_diff(weights(lean), start) > 1e-3  # it learned something
    assert max_diff(weights(lean), weights(rllib)) < 1e-5
    for key in ("policy_loss", "vf_loss", "entropy"):
        assert stat(r_lean, key) == pytest.approx(stat(r_rllib, key), rel=1e-4, abs=1e-6), key
    assert stat(r_lean, "rayrl_optimizer_steps") == 3


def test_twenty_epochs_of_one_minibatch_are_twenty_steps_over_the_real_rows():
    learner = make_learner()
    result = learner.update(batch=padded_batch(64, 8), minibatch_size=64, num_epochs=20, timesteps={})
    assert stat(result, "rayrl_optimizer_steps") == 20
    assert stat(result, "num_module_steps_trained") == 20 * 64  # the 8 padded rows never trained
    assert stat(result, "module_train_batch_size_mean") == 64


def test_loss_metrics_are_logged_once_per_update_not_per_minibatch():
    def count_loss_logs(learner) -> int:
        real, calls = learner.metrics.log_dict, []

        def spy(stats, *args, **kwargs):
            if "policy_loss" in stats:
                calls.append(1)
            return real(stats, *args, **kwargs)

        learner.metrics.log_dict = spy
        learner.update(batch=make_batch(64), minibatch_size=16, num_epochs=5, timesteps={})
        return len(calls)

    lean, rllib = lean_and_rllib()
    assert count_loss_logs(lean) == 1
    assert count_loss_logs(rllib) == 20  # RLlib's loop: once per minibatch (5 epochs x 4)


def test_quiet_minibatches_still_count_every_step_and_keep_the_last_norm():
    lean, rllib = lean_and_rllib(grad_clip=1.0)
    r_lean = lean.update(batch=make_batch(64), minibatch_size=16, num_epochs=2, timesteps={})
    r_rllib = rllib.update(batch=make_batch(64), minibatch_size=16, num_epochs=2, timesteps={})
    assert stat(r_lean, "rayrl_optimizer_steps") == stat(r_rllib, "rayrl_optimizer_steps") == 8
    assert stat(r_lean, "rayrl_grad_norm") > 0
    assert stat(r_lean, "num_module_steps_trained") == stat(r_rllib, "num_module_steps_trained") == 128


@pytest.mark.parametrize("n,size,parts", [(256, 256, 1), (264, 256, 1), (512, 32, 16), (100, 30, 3), (10, None, 1)])
def test_each_epoch_uses_every_row_once_in_near_equal_minibatches(n, size, parts):
    np.random.seed(0)
    plan = list(minibatch_indices(n, size, epochs=3, shuffle=True))
    assert len(plan) == 3 * parts
    for epoch in range(3):
        rows = np.concatenate(plan[epoch * parts : (epoch + 1) * parts])
        assert sorted(rows.tolist()) == list(range(n))
    sizes = [len(p) for p in plan]
    assert max(sizes) - min(sizes) <= 1
    assert plan[0].tolist() != plan[parts].tolist() or n < 3  # shuffled anew each epoch


def test_the_update_plan_reads_rllibs_kwargs_and_shuffles_only_several_epochs():
    np.random.seed(0)
    one = list(update_plan(64, {"num_epochs": 1, "minibatch_size": 16, "shuffle_batch_per_epoch": True}))
    assert [p.tolist() for p in one] == [list(range(i, i + 16)) for i in range(0, 64, 16)]  # RLlib's order
    several = list(update_plan(64, {"num_epochs": 2, "minibatch_size": 16, "shuffle_batch_per_epoch": True}))
    assert len(several) == 8 and np.concatenate(several[:4]).tolist() != list(range(64))
    kept = list(update_plan(64, {"num_epochs": 2, "minibatch_size": 32, "shuffle_batch_per_epoch": False}))
    assert [p.tolist() for p in kept] == [list(range(32)), list(range(32, 64))] * 2
    assert len(list(update_plan(64, {}))) == 1  # RLlib's defaults absent: one pass, one minibatch


def test_lean_columns_drop_padding_and_refuse_what_they_cannot_slice():
    mask = torch.tensor([True, False, True])
    cols = lean_columns({"obs": torch.arange(6.0).reshape(3, 2), Columns.LOSS_MASK: mask})
    assert cols is not None and Columns.LOSS_MASK not in cols
    assert cols["obs"].tolist() == [[0.0, 1.0], [4.0, 5.0]]
    assert lean_columns({"obs": torch.zeros(3, 2), "infos": np.zeros(3)}) is None
    assert lean_columns({"obs": torch.zeros(3, 2), "x": torch.zeros(2)}) is None
