"""The doubling Searcher's protocol with Tune, and the phase-2 setup, without running trials."""

from __future__ import annotations

import pytest
from ray.tune.search import Searcher

from rayrl import spec as S
from rayrl.observe import keys
from rayrl.sweep.search import DoublingSearcher, Phase2Space

SPEC = S.from_dict({"search": {"doubling": {"start": 2048, "cap": 16384, "warmup_iters": 1, "measure_iters": 3}}})


def feed(searcher: DoublingSearcher, trial_id: str, sps: list[float]) -> None:
    """Tune's calls for one trial: results for all but the last iteration, then complete with the last."""
    for i, value in enumerate(sps[:-1], start=1):
        searcher.on_trial_result(trial_id, {keys.ITERATION: i, "rayrl": {"env_steps_per_s": value}})
    searcher.on_trial_complete(trial_id, {keys.ITERATION: len(sps), "rayrl": {"env_steps_per_s": sps[-1]}})


def test_one_rung_at_a_time_with_constant_minibatches_per_epoch():
    s = DoublingSearcher(SPEC)
    first = s.suggest("t1")
    assert first == {"train_batch_size_per_learner": 2048, "minibatch_size": 256}
    assert s.suggest("t2") is None  # waits for the first rung's figure
    feed(s, "t1", [10.0, 1000.0, 1100.0, 900.0])  # median of the 3 after warm-up: 1000
    second = s.suggest("t2")
    assert second == {"train_batch_size_per_learner": 4096, "minibatch_size": 512}
    feed(s, "t2", [10.0, 1100.0, 1050.0, 1080.0])  # median 1080: +8% < 15%
    assert s.suggest("t3") == Searcher.FINISHED
    rows = s.rows()
    assert [(r.batch_size, r.decision) for r in rows] == [(2048, "expand"), (4096, "stop")]
    assert rows[0].env_steps_per_s == pytest.approx(1000.0)
    assert rows[1].gain == pytest.approx(0.08)


def test_an_errored_rung_ends_the_ladder():
    s = DoublingSearcher(SPEC)
    s.suggest("t1")
    feed(s, "t1", [1.0, 2.0, 3.0, 4.0])
    s.suggest("t2")
    s.on_trial_complete("t2", None, error=True)
    assert s.suggest("t3") == Searcher.FINISHED
    assert s.rows()[-1].decision == "failed"


def test_state_survives_save_and_restore_and_a_running_rung_is_measured_again(tmp_path):
    s = DoublingSearcher(SPEC)
    s.suggest("t1")
    feed(s, "t1", [1.0, 100.0, 100.0, 100.0])
    s.suggest("t2")  # running when the driver dies
    s.save(str(tmp_path / "state.pkl"))
    restored = DoublingSearcher(SPEC)
    restored.restore(str(tmp_path / "state.pkl"))
    assert [r.batch_size for r in restored.rungs] == [2048]
    assert restored.suggest("t3") == {"train_batch_size_per_learner": 4096, "minibatch_size": 512}


class FakeOptunaTrial:
    def suggest_float(self, name, low, high, log=False):
        assert log and name == "rayrl_lr"
        return low

    def suggest_categorical(self, name, choices):
        return choices[-1]


def test_phase2_space_scales_lr_by_the_declared_rule_and_minibatch_by_batch():
    spec = S.from_dict({"resources": {"learners": 4, "lr_scaling": "sqrt"}})
    config = Phase2Space(spec, [2048, 4096])(FakeOptunaTrial())
    assert config["lr"] == pytest.approx(spec.search.lr_min * 2)
    assert config["train_batch_size_per_learner"] == 4096 and config["minibatch_size"] == 512
