"""rayrl.rllib.learner without Ray: accumulation, the non-finite guard, precision, settings.

Learners are built with ``AlgorithmConfig.build_learner`` (the real class and code path) and fed
a fixed synthetic PPO batch, so every loss here is deterministic.
"""

from __future__ import annotations

import contextlib
import math

import gymnasium as gym
import numpy as np
import pytest
import torch
from ray.rllib.core.columns import Columns
from ray.rllib.evaluation.postprocessing import Postprocessing
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch

from rayrl.errors import SpecError
from rayrl.rllib import algo
from rayrl.rllib import learner as L
from rayrl.spec import from_dict

MID = "default_policy"
HERE = __name__  # hooks below are named as 'module:function', like a user's would be


# ---- hooks injected through learner_config_dict["loss_hook"] -------------------------------------


def nan_loss_at_2(loss: torch.Tensor, *, module_id: str, step: int) -> torch.Tensor:
    return loss * float("nan") if step == 2 else loss


def inf_loss_at_2(loss: torch.Tensor, *, module_id: str, step: int) -> torch.Tensor:
    return loss * float("inf") if step == 2 else loss


class _NanGrad(torch.autograd.Function):
    """Identity forward (finite loss), NaN backward: exercises the gradient-norm check."""

    @staticmethod
    def forward(ctx, x):  # type: ignore[override]
        return x.clone()

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        return g * float("nan")


def nan_grad_at_2(loss: torch.Tensor, *, module_id: str, step: int) -> torch.Tensor:
    return _NanGrad.apply(loss) if step == 2 else loss


def nan_grad_always(loss: torch.Tensor, *, module_id: str, step: int) -> torch.Tensor:
    return _NanGrad.apply(loss)


def nan_always(loss: torch.Tensor, *, module_id: str, step: int) -> torch.Tensor:
    return loss * float("nan")


def nan_except_2(loss: torch.Tensor, *, module_id: str, step: int) -> torch.Tensor:
    return loss if step == 2 else loss * float("nan")


class SGDPPOLearner(L.RayrlPPOLearner):
    """rayrl's PPO learner with plain SGD, whose step is linear in the gradient.

    Adam is invariant to the gradient's scale, so it would hide a missing 1/K; SGD does not.
    """

    def configure_optimizers_for_module(self, module_id, config=None):
        params = self.get_parameters(self._module[module_id])
        self.register_optimizer(
            module_id=module_id,
            optimizer=torch.optim.SGD(params, lr=config.lr),
            params=params,
            lr_or_lr_schedule=config.lr,
        )


# ---- helpers -----------------------------------------------------------------------------------


def make_learner(precision="fp32", K=1, grad_clip=0.0, lr=0.05, learner_cls=None, kl_loss=True, **settings):
    spec = from_dict(
        {
            "algo": {
                "train_batch_per_learner": 64,
                "minibatch_size": 16,
                "epochs": 1,
                "lr": lr,
                "grad_clip": grad_clip,
            },
            "model": {"hidden": [32, 32]},
            "resources": {"env_runners": 0},
            "precision": {
                "mode": precision,
                "accumulation_steps": K,
                "max_nonfinite_steps": settings.pop("max_nonfinite_steps", 10),
            },
        }
    )
    config = algo.build_config(spec)
    config.learners(learner_config_dict=settings)
    config.training(use_kl_loss=kl_loss)
    if learner_cls is not None:
        config.learners(learner_class=learner_cls)
    return config.build_learner(env=gym.make("CartPole-v1"))


def make_batch(n: int, seed: int = 0) -> MultiAgentBatch:
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(n, 2)).astype(np.float32)
    actions = rng.integers(0, 2, size=n)
    logp = logits[np.arange(n), actions] - np.log(np.exp(logits).sum(1))
    data = {
        Columns.OBS: rng.normal(size=(n, 4)).astype(np.float32),
        Columns.ACTIONS: actions,
        Columns.ACTION_LOGP: logp.astype(np.float32),
        Columns.ACTION_DIST_INPUTS: logits,
        Postprocessing.ADVANTAGES: rng.normal(size=n).astype(np.float32),
        Postprocessing.VALUE_TARGETS: rng.normal(size=n).astype(np.float32),
    }
    return MultiAgentBatch({MID: SampleBatch(data)}, env_steps=n)


def weights(learner) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in learner.module[MID].unwrapped().state_dict().items()}


def same_start(a, b) -> None:
    b.module[MID].unwrapped().load_state_dict(a.module[MID].unwrapped().state_dict())


def max_diff(w1, w2) -> float:
    return max(float((w1[k] - w2[k]).abs().max()) for k in w1)


def stat(result: dict, key: str, default: float = 0.0) -> float:
    s = result.get(MID, {}).get(key)
    return default if s is None else float(s.peek())


def update(learner, batch, minibatch):
    return learner.update(batch=batch, minibatch_size=minibatch, num_epochs=1, timesteps={})


def adam_state(learner) -> dict:
    opt = learner.get_optimizer(MID)
    return {
        i: {k: v.clone() if torch.is_tensor(v) else v for k, v in s.items()} for i, s in enumerate(opt.state.values())
    }


# ---- gradient accumulation ---------------------------------------------------------------------


@pytest.mark.parametrize("learner_cls", [SGDPPOLearner, None], ids=["sgd", "adam"])
def test_k2_accumulation_equals_one_step_on_double_minibatch(learner_cls):
    m = 16
    batch = make_batch(2 * m)
    acc = make_learner(K=2, learner_cls=learner_cls)
    big = make_learner(K=1, learner_cls=learner_cls)
    two = make_learner(K=1, learner_cls=learner_cls)  # negative control: two steps of m
    same_start(acc, big), same_start(acc, two)
    start = weights(acc)

    r_acc = update(acc, batch, m)
    r_big = update(big, batch, 2 * m)
    r_two = update(two, batch, m)

    assert stat(r_acc, L.OPTIMIZER_STEPS) == 1 and stat(r_big, L.OPTIMIZER_STEPS) == 1
    assert stat(r_two, L.OPTIMIZER_STEPS) == 2
    # Same gradient (pre-clip norm) and the same update, within float tolerance.
    assert stat(r_acc, L.GRAD_NORM) == pytest.approx(stat(r_big, L.GRAD_NORM), rel=1e-5)
    # Adam divides by sqrt(v) ~ |g| on its first step, which magnifies float noise in tiny
    # gradient entries; SGD's step is linear in the gradient, so its tolerance is tighter.
    tol = 1e-6 if learner_cls is SGDPPOLearner else 1e-5
    assert max_diff(weights(acc), weights(big)) < tol
    moved = max_diff(weights(big), start)
    assert moved > 1e-3
    # The control moved differently: the comparison above can fail.
    assert max_diff(weights(two), weights(big)) > 1e-2 * moved


def test_partial_group_at_end_of_batch_is_stepped_as_a_mean():
    # K=3 but only 2 minibatches in the batch: one step at the end, equal to the 2m step.
    m = 16
    batch = make_batch(2 * m, seed=1)
    acc, big = make_learner(K=3, learner_cls=SGDPPOLearner), make_learner(K=1, learner_cls=SGDPPOLearner)
    same_start(acc, big)
    r_acc, r_big = update(acc, batch, m), update(big, batch, 2 * m)
    assert stat(r_acc, L.OPTIMIZER_STEPS) == 1
    assert stat(r_acc, L.GRAD_NORM) == pytest.approx(stat(r_big, L.GRAD_NORM), rel=1e-5)
    assert max_diff(weights(acc), weights(big)) < 1e-6
    assert acc._rayrl_pending == 0 and all(p.grad is None for p in acc.module[MID].parameters())


def test_k2_over_four_minibatches_takes_two_steps():
    m = 16
    batch = make_batch(4 * m, seed=2)
    # PPO adapts its KL coefficient after every update() call; without the KL term the two
    # update() calls of the reference see the same loss as the one call of `acc`.
    acc = make_learner(K=2, learner_cls=SGDPPOLearner, kl_loss=False)
    ref = make_learner(K=1, learner_cls=SGDPPOLearner, kl_loss=False)
    same_start(acc, ref)
    r = update(acc, batch, m)
    assert stat(r, L.OPTIMIZER_STEPS) == 2
    # Reference: two single steps on the two halves, one after the other.
    halves = [batch.policy_batches[MID].slice(0, 2 * m), batch.policy_batches[MID].slice(2 * m, 4 * m)]
    for half in halves:
        update(ref, MultiAgentBatch({MID: half}, env_steps=2 * m), 2 * m)
    assert max_diff(weights(acc), weights(ref)) < 1e-6


# ---- gradient clipping -------------------------------------------------------------------------


def test_clipping_bounds_the_update_and_reports_the_preclip_norm():
    batch = make_batch(32, seed=3)
    free, clipped = (
        make_learner(grad_clip=0.0, learner_cls=SGDPPOLearner),
        make_learner(grad_clip=0.1, learner_cls=SGDPPOLearner),
    )
    same_start(free, clipped)
    start = weights(free)
    r_free, r_clip = update(free, batch, 32), update(clipped, batch, 32)
    norm = stat(r_free, L.GRAD_NORM)
    assert norm > 0.1  # the clip is active for this batch
    assert stat(r_clip, L.GRAD_NORM) == pytest.approx(norm, rel=1e-5)  # pre-clip, not post-clip
    delta = lambda w: math.sqrt(sum(float(((w[k] - start[k]) ** 2).sum()) for k in w))  # noqa: E731
    lr = 0.05
    assert delta(weights(free)) == pytest.approx(lr * norm, rel=1e-3)
    assert delta(weights(clipped)) == pytest.approx(lr * 0.1, rel=1e-3)


# ---- the non-finite guard ----------------------------------------------------------------------


@pytest.mark.parametrize("hook", ["nan_loss_at_2", "inf_loss_at_2", "nan_grad_at_2"])
def test_nonfinite_step_is_skipped_counted_and_training_goes_on(hook):
    lrn = make_learner(loss_hook=f"{HERE}:{hook}")
    batch = make_batch(32)
    counts = []
    for _ in range(2):  # steps 0 and 1: normal
        counts.append(stat(update(lrn, batch, 32), L.NONFINITE_STEPS))
    before_w, before_opt = weights(lrn), adam_state(lrn)
    r = update(lrn, batch, 32)  # step 2: injected
    counts.append(stat(r, L.NONFINITE_STEPS))
    assert max_diff(weights(lrn), before_w) == 0.0
    after_opt = adam_state(lrn)
    assert all(
        torch.equal(torch.as_tensor(after_opt[i][k]), torch.as_tensor(before_opt[i][k]))
        for i in before_opt
        for k in before_opt[i]
    )
    assert stat(r, L.OPTIMIZER_STEPS) == 0
    assert lrn._rayrl_streak[MID] == 1
    r = update(lrn, batch, 32)  # step 3: normal again
    counts.append(stat(r, L.NONFINITE_STEPS))
    assert counts == [0, 0, 1, 0]  # per-update counts; their (lifetime) sum is 1
    assert max_diff(weights(lrn), before_w) > 1e-4
    assert lrn._rayrl_streak[MID] == 0
    assert all(math.isfinite(float(v.abs().max())) for v in weights(lrn).values())


def test_n_consecutive_nonfinite_steps_fail_with_the_likely_causes():
    lrn = make_learner(loss_hook=f"{HERE}:nan_always", max_nonfinite_steps=3, grad_clip=0.0)
    batch = make_batch(32)
    start = weights(lrn)
    total = sum(stat(update(lrn, batch, 32), L.NONFINITE_STEPS) for _ in range(2))
    assert total == 2
    with pytest.raises(L.NonFiniteTrainingError) as info:
        update(lrn, batch, 32)
    msg = str(info.value)
    for part in (
        "3 consecutive",
        "'default_policy'",
        "learning rate is too high",
        "lr=0.05",
        "reward scale",
        "clipping",
        "algo.grad_clip=0.0",
        "max_nonfinite_steps=3",
        "restores the last good checkpoint",
    ):
        assert part in msg, part
    assert max_diff(weights(lrn), start) == 0.0


def test_a_good_step_resets_the_consecutive_count():
    # Bad, bad, good, bad, bad with N=3: never 3 in a row, so no failure; 4 skipped in all.
    lrn = make_learner(loss_hook=f"{HERE}:nan_except_2", max_nonfinite_steps=3)
    batch = make_batch(32)
    total = sum(stat(update(lrn, batch, 32), L.NONFINITE_STEPS) for _ in range(5))
    assert total == 4 and lrn._rayrl_streak[MID] == 2


def test_fp16_overflow_is_the_scalers_business_until_the_scale_reaches_one():
    # NaN gradients with a finite loss under fp16: at scale 16, 8, 4, 2 they count as overflows
    # (scale backs off); at scale 1 they are real, and N=3 of them fail the trial.
    lrn = make_learner("fp16", loss_hook=f"{HERE}:nan_grad_always", max_nonfinite_steps=3, fp16_init_scale=16.0)
    batch = make_batch(32)
    start = weights(lrn)
    overflow, nonfinite, scales = 0.0, 0.0, []
    for _ in range(6):
        r = update(lrn, batch, 32)
        overflow += stat(r, L.OVERFLOW_STEPS)
        nonfinite += stat(r, L.NONFINITE_STEPS)
        scales.append(stat(r, L.LOSS_SCALE))
    assert overflow == 4 and nonfinite == 2
    assert scales == [8.0, 4.0, 2.0, 1.0, 1.0, 1.0]
    with pytest.raises(L.NonFiniteTrainingError, match="try bf16"):
        update(lrn, batch, 32)
    assert max_diff(weights(lrn), start) == 0.0


# ---- precision ---------------------------------------------------------------------------------


@pytest.mark.parametrize("mode,dtype", [("fp32", torch.float32), ("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_forward_runs_in_the_chosen_precision(mode, dtype):
    lrn = make_learner(mode)
    seen = []
    first_linear = next(m for m in lrn.module[MID].unwrapped().modules() if isinstance(m, torch.nn.Linear))
    first_linear.register_forward_hook(lambda mod, inp, out: seen.append(out.dtype))
    r = update(lrn, make_batch(32), 32)
    assert seen and set(seen) == {dtype}
    assert all(p.dtype == torch.float32 for p in lrn.module[MID].parameters())  # master weights fp32
    assert stat(r, L.OPTIMIZER_STEPS) + stat(r, L.OVERFLOW_STEPS) == 1
    assert math.isnan(stat(r, L.LOSS_SCALE, math.nan)) == (mode != "fp16")


def test_fp16_loss_scale_grows_after_good_steps_and_survives_a_checkpoint():
    lrn = make_learner("fp16", fp16_init_scale=4.0, fp16_growth_interval=2)
    batch = make_batch(32)
    scales = [stat(update(lrn, batch, 32), L.LOSS_SCALE) for _ in range(4)]
    assert scales == [4.0, 8.0, 8.0, 16.0]
    state = lrn.get_state()
    other = make_learner("fp16")
    other.set_state(state)
    assert other._rayrl_scaler(MID).get_scale() == 16.0


def test_check_precision_names_the_device_problem(monkeypatch):
    assert L.check_precision("fp32", "cpu") is None
    assert L.check_precision("bf16", "cpu") is torch.bfloat16
    assert L.check_precision("fp16", "cpu") is torch.float16
    monkeypatch.setattr(torch.amp.autocast_mode, "is_autocast_available", lambda device_type: False)
    with pytest.raises(
        SpecError,
        match=r"precision.mode: 'bf16' is not supported on this learner's device "
        r"\(cpu\): torch has no autocast",
    ):
        L.check_precision("bf16", "cpu")


def test_check_precision_refuses_a_silent_fp32_fallback(monkeypatch):
    # A device whose autocast leaves matmuls in fp32 must be refused, not trained in fp32.
    monkeypatch.setattr(torch, "autocast", lambda *a, **k: contextlib.nullcontext())
    with pytest.raises(SpecError, match="ran a matmul in torch.float32, not torch.bfloat16"):
        L.check_precision("bf16", "cpu")


# ---- settings ----------------------------------------------------------------------------------


def test_learner_settings_carry_the_spec():
    spec = from_dict(
        {
            "algo": {"grad_clip": 0.5},
            "resources": {"env_runners": 0},
            "precision": {"mode": "bf16", "accumulation_steps": 4, "max_nonfinite_steps": 7},
        }
    )
    s = L.learner_settings(spec)
    assert s["precision"] == "bf16" and s["accumulation_steps"] == 4
    assert s["grad_clip"] == 0.5 and s["max_nonfinite_steps"] == 7
    assert L.LearnerSettings.from_config(s) == L.LearnerSettings(
        precision="bf16", accumulation_steps=4, grad_clip=0.5, max_nonfinite_steps=7
    )
    assert algo.build_config(spec).learner_config_dict["grad_clip"] == 0.5
    # Unset recipe fields add no keys: an older sweep's saved param_space must still match on restore.
    assert not {"adam_eps", "clip_schedule", "reward_norm"} & set(s)
    recipe = from_dict(
        {
            "algo": {"adam_eps": 1e-5, "clip": 0.2, "clip_final": 0.1, "normalize_reward": True},
            "stop": {"env_steps": 1000},
        }
    )
    r = L.learner_settings(recipe)
    assert r["adam_eps"] == 1e-5 and r["clip_schedule"] == [[0, 0.2], [1000, 0.1]]
    assert r["reward_norm"] == {"gamma": recipe.algo.gamma, "clip": recipe.algo.reward_clip}


@pytest.mark.parametrize(
    "bad,match",
    [
        ({"precision": "fp8"}, r"\['precision'\].*'fp8' is not valid; valid: fp32, bf16, fp16"),
        ({"accumulation_steps": 0}, r"\['accumulation_steps'\]: 0 .* integer >= 1"),
        ({"accumulation_steps": 2.5}, r"\['accumulation_steps'\]: 2.5"),
        ({"grad_clip": -1.0}, r"\['grad_clip'\]: -1.0 .* >= 0"),
        ({"max_nonfinite_steps": 0}, r"\['max_nonfinite_steps'\]: 0"),
        ({"loss_hook": "no_such_module_xyz:f"}, r"\['loss_hook'\]: 'no_such_module_xyz:f' cannot be imported"),
    ],
)
def test_bad_settings_raise_spec_errors_naming_the_key(bad, match):
    with pytest.raises(SpecError, match=match):
        L.LearnerSettings.from_config(bad)


def test_learner_class_per_algorithm_and_unknown_name():
    assert L.learner_class("PPO") is L.RayrlPPOLearner
    assert issubclass(L.learner_class("APPO"), L.APPOTorchLearner)
    assert issubclass(L.learner_class("IMPALA"), L.IMPALATorchLearner)
    with pytest.raises(SpecError, match="'DQN' has no rayrl learner; valid: PPO, APPO, IMPALA"):
        L.learner_class("DQN")


# ---- the benchmark's smoke mode ----------------------------------------------------------------


def test_precision_benchmark_quick_mode_prints_and_writes_figures(tmp_path, capsys):
    import json

    from benchmarks import precision as bench

    out = tmp_path / "precision.json"
    assert (
        bench.main(
            ["--quick", "--rounds", "1", "--warmup", "0", "--batch", "256", "--out", str(out), "--devices", "cpu"]
        )
        == 0
    )
    printed = capsys.readouterr().out
    report = json.loads(out.read_text())
    res = report["results"]["cpu"]
    assert set(res) == {"fp32", "bf16", "fp16"}
    assert res["fp32"]["ratio_vs_fp32"] == 1.0
    for mode, r in res.items():
        assert r["samples_per_s"] > 0
        assert r["samples_per_s"] == pytest.approx(256 / r["median_update_s"])
        assert r["ratio_vs_fp32"] == pytest.approx(r["samples_per_s"] / res["fp32"]["samples_per_s"])
        assert r["best_samples_per_s"] == pytest.approx(256 / r["min_update_s"])
        assert f"cpu     {mode}" in printed
    assert report["settings"]["hidden"] == [64, 64] and report["settings"]["batch"] == 256
