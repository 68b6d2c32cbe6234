"""Per-report work (RLlib's result assembly and metrics reduction, rayrl's callback) is paid once per
``algo.report_env_steps`` sampled, not once per update: at a small batch several PPO updates share one
report. Calls are counted, not timed."""

from __future__ import annotations

import pytest

from rayrl import spec as spec_mod
from rayrl.observe import keys
from rayrl.rllib import callback as callback_mod
from rayrl.rllib.algo import build_config


def _counts(monkeypatch, overrides, reports=3):
    """(training steps, result assemblies, rayrl callbacks, env steps per report) over ``reports`` train() calls."""
    spec = spec_mod.from_dict(spec_mod.apply_overrides({}, ["resources.env_runners=0", *overrides]))
    seen = {"callback": 0}
    original = callback_mod.RayrlCallback.on_train_result

    def counted(self, *args, **kwargs):
        seen["callback"] += 1
        return original(self, *args, **kwargs)

    monkeypatch.setattr(callback_mod.RayrlCallback, "on_train_result", counted)
    algo = build_config(spec).build_algo()
    calls = {"step": 0, "compile": 0}
    step, compile_results = algo.training_step, algo._compile_iteration_results

    def training_step():
        calls["step"] += 1
        return step()

    def compiled(**kwargs):
        calls["compile"] += 1
        return compile_results(**kwargs)

    algo.training_step, algo._compile_iteration_results = training_step, compiled
    try:
        per_report = []
        last = 0.0
        for _ in range(reports):
            result = algo.train()
            now = float(keys.lookup(result, keys.ENV_STEPS))
            per_report.append(now - last)
            last = now
    finally:
        algo.stop()
    return calls["step"], calls["compile"], seen["callback"], per_report


@pytest.mark.slow
def test_small_batches_share_one_report_across_updates(ray_local, monkeypatch):
    small = [
        "algo.train_batch_per_learner=256",
        "algo.minibatch_size=128",
        "algo.epochs=1",
        "algo.report_env_steps=2048",
    ]
    steps, compiles, callbacks, per_report = _counts(monkeypatch, small)
    assert compiles == callbacks == 3
    assert steps >= 3 * 8  # 2048 / 256 updates per report
    assert all(2048 <= s < 2048 + 300 for s in per_report), per_report
    # The default batch (2048) is one update per report, as before.
    steps, compiles, callbacks, _ = _counts(monkeypatch, ["algo.epochs=1", "algo.report_env_steps=2048"], reports=2)
    assert steps == compiles == callbacks == 2
    # report_env_steps 0 (the default) is one report per update, whatever the batch.
    steps, compiles, callbacks, _ = _counts(monkeypatch, small[:3], reports=2)
    assert steps == compiles == callbacks == 2
