"""rayrl's learner inside real RLlib training on CartPole (local Ray, CPU, one learner in-process).

The learner runs in the driver (resources.learners: 0), so the loss hooks below, named as
'module:function', are importable by it.
"""

from __future__ import annotations

import math

import pytest
import torch

from rayrl.rllib import algo as rayrl_algo
from rayrl.rllib import learner as L
from rayrl.spec import from_dict

MID = "default_policy"
HERE = __name__


def nan_loss_at_3(loss: torch.Tensor, *, module_id: str, step: int) -> torch.Tensor:
    return loss * float("nan") if step == 3 else loss


def nan_always(loss: torch.Tensor, *, module_id: str, step: int) -> torch.Tensor:
    return loss * float("nan")


def build(settings: dict | None = None, **sections):
    data = {"seed": 1, "env": {"envs_per_runner": 4}, "resources": {"env_runners": 0}, **sections}
    config = rayrl_algo.build_config(from_dict(data))
    if settings:
        config.learners(learner_config_dict=settings)
    return config.build_algo()


def module_weights(algorithm) -> dict[str, torch.Tensor]:
    learner = algorithm.learner_group._learner
    return {k: v.detach().clone() for k, v in learner.module[MID].unwrapped().state_dict().items()}


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["bf16", "fp16"])
def test_cartpole_return_rises_in_low_precision(ray_local, mode):
    algorithm = build(
        {"fp16_growth_interval": 5},  # 24 steps per iteration: the scale can grow within one
        algo={"train_batch_per_learner": 1000, "minibatch_size": 250, "epochs": 6, "lr": 1e-3},
        precision={"mode": mode},
    )
    returns, scales, overflows = [], [], []
    try:
        for _ in range(10):
            result = algorithm.train()
            returns.append(result["env_runners"]["episode_return_mean"])
            scales.append(result["rayrl"]["loss_scale"])
            overflows.append(result["learners"][MID].get(L.OVERFLOW_STEPS, 0.0))
            assert result["rayrl"]["precision"] == mode
            assert result["rayrl"]["nonfinite_steps"] == 0
            assert math.isfinite(result["rayrl"]["grad_norm"])
            if returns[-1] >= returns[0] + 60 and len(returns) >= 3:
                break
    finally:
        algorithm.stop()
    assert max(returns[1:]) >= returns[0] + 60, returns  # random CartPole play returns ~20
    if mode == "bf16":
        assert all(math.isnan(s) for s in scales)  # bf16 needs no scaler: none is reported
        return
    # fp16: the dynamic loss scale is reported every iteration and moves both ways.
    assert all(math.isfinite(s) and s > 0 and math.log2(s).is_integer() for s in scales), scales
    assert len(set(scales)) >= 2, scales
    assert any(b > a for a, b in zip(scales, scales[1:])) or scales[0] > 2.0**16, scales  # grew
    assert overflows[-1] > 0, overflows  # backed off at least once (lifetime count of overflows)
    assert overflows == sorted(overflows)  # a lifetime count never falls


@pytest.mark.slow
def test_one_nonfinite_step_is_skipped_counted_for_life_and_training_goes_on(ray_local):
    # Minibatches of 100 from ~200-step batches: 2-3 optimizer steps per iteration; the hook
    # poisons the learner's 4th minibatch (step 3), which falls in the second iteration.
    algorithm = build(
        {"loss_hook": f"{HERE}:nan_loss_at_3"},
        algo={"train_batch_per_learner": 200, "minibatch_size": 100, "epochs": 1},
    )
    try:
        counts, moved, steps, minibatches = [], [], [], []
        for _ in range(4):
            before = module_weights(algorithm)
            result = algorithm.train()
            after = module_weights(algorithm)
            counts.append(result["rayrl"]["nonfinite_steps"])
            moved.append(max(float((after[k] - before[k]).abs().max()) for k in after))
            steps.append(result["learners"][MID][L.OPTIMIZER_STEPS])
            minibatches.append(result["learners"][MID]["num_module_steps_trained"] // 100)
    finally:
        algorithm.stop()
    assert minibatches[0] <= 3 < sum(minibatches[:2])  # so step 3 is in the second iteration
    assert counts == [0, 1, 1, 1]  # a lifetime count, as keys.NONFINITE_STEPS promises
    assert steps == [minibatches[0], minibatches[1] - 1, *minibatches[2:]]  # only that step skipped
    assert all(m > 0 for m in moved)  # every iteration still learned


@pytest.mark.slow
@pytest.mark.parametrize("name", ["PPO", "APPO"])
def test_consecutive_nonfinite_steps_fail_the_run_with_the_causes(ray_local, name):
    # APPO learns in a learner thread: the failure must surface from train(), not hang it.
    algorithm = build(
        {"loss_hook": f"{HERE}:nan_always"},
        algo={"name": name, "train_batch_per_learner": 200, "minibatch_size": 100, "epochs": 1},
        resources={"env_runners": 0 if name == "PPO" else 1},
        precision={"max_nonfinite_steps": 3},
    )
    start = module_weights(algorithm)
    try:
        with pytest.raises(Exception) as info:
            for _ in range(6):
                algorithm.train()
        end = module_weights(algorithm)
    finally:
        algorithm.stop()
    msg = str(info.value)
    assert "3 consecutive optimizer steps" in msg and "learning rate is too high" in msg, msg
    assert "reward scale" in msg and "gradient clipping" in msg and "last good checkpoint" in msg
    assert all(torch.equal(start[k], end[k]) for k in start)


@pytest.mark.slow
def test_fp16_loss_scale_survives_an_algorithm_checkpoint(ray_local, tmp_path):
    sections = dict(
        algo={"train_batch_per_learner": 200, "minibatch_size": 50, "epochs": 2}, precision={"mode": "fp16"}
    )
    algorithm = build({"fp16_init_scale": 8.0, "fp16_growth_interval": 1}, **sections)
    try:
        scale = algorithm.train()["rayrl"]["loss_scale"]
        algorithm.save_to_path(str(tmp_path))
    finally:
        algorithm.stop()
    assert scale > 8.0  # grew from its start, so a restore to the default 65536 would be visible
    restored = build(**sections)  # default init scale 65536
    try:
        restored.restore_from_path(str(tmp_path))
        assert restored.learner_group._learner._rayrl_scaler(MID).get_scale() == scale
    finally:
        restored.stop()
