"""TensorBoardTracker without Ray: rayrl's curves whole, Tune's whole result only sampled (driver cost)."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from rayrl.track import callbacks


class _Trial:
    """What Tune's TBX logger reads of a trial: its local folder."""

    def __init__(self, path: Path) -> None:
        self.local_path = str(path)
        self.evaluated_params = {"lr": 1e-3}

    def init_local_path(self) -> None:
        Path(self.local_path).mkdir(parents=True, exist_ok=True)


def _scalars(folder: Path) -> dict[str, list[int]]:
    """Tag -> steps written, from every event file in ``folder`` (TFRecord: length, crc, Event, crc)."""
    from tensorboardX.proto import event_pb2

    out: dict[str, list[int]] = {}
    for path in sorted(folder.glob("events.out.tfevents.*")):
        data, i = path.read_bytes(), 0
        while i < len(data):
            (n,) = struct.unpack("<Q", data[i : i + 8])
            event = event_pb2.Event.FromString(data[i + 12 : i + 12 + n])
            i += 12 + n + 4
            for value in event.summary.value:
                out.setdefault(value.tag, []).append(event.step)
    return out


def _result(i: int) -> dict:
    return {
        "training_iteration": i,
        "num_env_steps_sampled_lifetime": 256 * i,
        "env_runners": {"episode_return_mean": 10.0 + i, "num_episodes": 3},
        "rayrl": {"env_steps": 256 * i, "env_steps_per_s": 1000.0 + i},
    }


def test_rayrl_scalars_every_result_tune_keys_first_every_interval_and_last(tmp_path, monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(callbacks.time, "monotonic", lambda: clock[0])
    tracker = callbacks.TensorBoardTracker()
    trial = _Trial(tmp_path / "t0")
    # 12 results 1 s apart: Tune's keys at the first (t=100), at t=110 (the 11th) and the last (t=111)
    for i in range(1, 13):
        tracker.log_trial_result(i, trial, _result(i))
        clock[0] += 1.0
    tracker.log_trial_end(trial)
    scalars = _scalars(tmp_path / "t0")
    assert scalars["rayrl/env_steps_per_s"] == [256 * i for i in range(1, 13)]
    tune_steps = scalars["ray/tune/env_runners/episode_return_mean"]
    assert tune_steps == [1, 11, 12]  # Tune's own step: the iteration
    assert callbacks.TUNE_KEYS_EVERY_S == pytest.approx(10.0)


def test_a_trial_whose_last_result_was_written_is_not_written_twice(tmp_path, monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(callbacks.time, "monotonic", lambda: clock[0])
    tracker = callbacks.TensorBoardTracker()
    trial = _Trial(tmp_path / "t1")
    tracker.log_trial_result(1, trial, _result(1))
    clock[0] += 20.0
    tracker.log_trial_result(2, trial, _result(2))
    tracker.log_trial_end(trial)
    assert _scalars(tmp_path / "t1")["ray/tune/env_runners/episode_return_mean"] == [1, 2]


def test_a_tracker_pickled_by_an_older_rayrl_restores_and_logs(tmp_path):
    """Tune restores callbacks from the run's tuner.pkl: one written before the sampling had none of its state."""
    import pickle

    old = callbacks.TensorBoardTracker()
    del old._tune_keys_at, old._unwritten  # what an older rayrl pickled
    tracker = pickle.loads(pickle.dumps(old))
    trial = _Trial(tmp_path / "t2")
    tracker.log_trial_result(1, trial, _result(1))
    tracker.log_trial_end(trial)
    assert _scalars(tmp_path / "t2")["rayrl/env_steps_per_s"] == [256]
