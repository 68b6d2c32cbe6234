"""algo.sample_ahead: PPO's runners sample the next batch while the learner trains this one.

The fast tests check the spec's rules and the thread rule without Ray; the slow one runs PPO with a
remote runner and checks, by counts, that sampling really runs one batch ahead of learning, that each
batch is trained exactly one update later than in PPO's own order, and that the run still learns.
"""

from __future__ import annotations

import pytest

from rayrl import spec as spec_mod
from rayrl.errors import SpecError
from rayrl.rllib.sample_ahead import learner_threads


def _spec(*overrides: str):
    return spec_mod.from_dict(spec_mod.apply_overrides({}, list(overrides)))


def test_sample_ahead_needs_a_remote_runner():
    with pytest.raises(SpecError) as err:
        _spec("algo.sample_ahead=true", "resources.env_runners=0")
    text = str(err.value)
    assert "algo.sample_ahead" in text and "resources.env_runners: 0" in text and ">= 1" in text


@pytest.mark.parametrize("algo", ["APPO", "IMPALA"])
def test_sample_ahead_is_for_ppo_only(algo):
    with pytest.raises(SpecError) as err:
        _spec("algo.sample_ahead=true", "resources.env_runners=1", f"algo.name={algo}")
    assert f"algo.name {algo}" in str(err.value) and "algo.sample_ahead: false" in str(err.value)


def test_sample_ahead_is_off_by_default_and_on_when_asked():
    assert _spec().algo.sample_ahead is False
    assert _spec("algo.sample_ahead=true", "resources.env_runners=1").algo.sample_ahead is True


def test_sample_ahead_is_not_a_search_dimension():
    with pytest.raises(SpecError) as err:
        _spec("search.space={algo.sample_ahead: {choices: [true, false]}}")
    assert "algo.sample_ahead" in str(err.value)


@pytest.mark.parametrize(
    ("assigned", "fallback", "current", "expected"),
    [
        (None, 1, 2, 1),  # a driver on a 2-core machine: one thread, the other core samples
        (1.0, 1, 2, 1),  # a Tune trial given one CPU
        (4.0, 1, 16, 4),  # a trial given four CPUs
        (8.0, 1, 2, 2),  # never more threads than torch has
        (0.5, 1, 2, 1),  # a fractional CPU still gets a thread
    ],
)
def test_a_local_learner_uses_the_cpus_its_process_was_given(assigned, fallback, current, expected):
    assert learner_threads(assigned, fallback, current) == expected


def _lag(result) -> float:
    """How many updates the learner's weights were ahead of the weights that sampled its batch."""
    from rayrl.observe import keys

    return float(keys.lookup(result, "learners/default_policy/diff_num_grad_updates_vs_sampler_policy"))


@pytest.mark.slow
def test_runners_sample_one_batch_ahead_and_the_run_learns(ray_local):
    import torch

    from rayrl.observe import keys
    from rayrl.rllib.algo import build_config

    base = [
        "resources.env_runners=1",
        "algo.train_batch_per_learner=512",
        "algo.minibatch_size=128",
        "algo.epochs=4",
        "algo.lr=0.001",
        "checkpoint.hung_runner_s=30",
    ]

    def count_samples(runner) -> None:  # nested: pickled by value for the runner's process
        original = runner.sample
        runner.rayrl_test_samples = 0

        def counted(*args, **kwargs):
            runner.rayrl_test_samples += 1
            return original(*args, **kwargs)

        runner.sample = counted

    def samples(algo) -> int:  # the runner's sample() calls so far (waits for a sample in flight)
        return int(
            sum(algo.env_runner_group.foreach_env_runner(lambda w: w.rayrl_test_samples, local_env_runner=False))
        )

    lags = {}
    for ahead in (False, True):
        threads = torch.get_num_threads()
        algo = build_config(_spec(*base, f"algo.sample_ahead={str(ahead).lower()}")).build_algo()
        try:
            algo.env_runner_group.foreach_env_runner(count_samples, local_env_runner=False)
            results = [algo.train() for _ in range(4)]
            if ahead:
                # The fifth batch was asked for before the fourth update ran (and has been sampled).
                assert samples(algo) == 5
                # The hung-runner watchdog and the hardware reading take the sample's answer, not a ping.
                assert algo.rayrl_answered == {1}
                assert results[-1]["rayrl"]["env_runner_hardware"], "no runner reading while sampling ahead"
            else:
                assert samples(algo) == 4
            lags[ahead] = _lag(results[-1])
            if ahead:
                for _ in range(60):
                    ret = keys.lookup(algo.train(), keys.EPISODE_RETURN)
                    if ret is not None and ret >= 150:
                        break
                assert ret is not None and ret >= 150, f"sampling ahead did not learn CartPole: return {ret}"
        finally:
            algo.stop()
        assert torch.get_num_threads() == threads  # the learner's thread setting is undone at stop
    # Each batch is trained exactly one update later than in PPO's sample-then-learn order.
    assert lags[True] == lags[False] + 1
