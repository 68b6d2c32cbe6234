"""rayrl.storage.tunestate: the kept copy of Tune's experiment state (no Ray)."""

import json
import os

from rayrl.storage import tunestate


def _state(folder, name="experiment_state-2026-12-01_08-00-00.json", body=None):
    path = folder / name
    path.write_text(json.dumps(body or {"trial_data": ["t1"], "runner_data": {"n": 1}}))
    return path


def test_keep_copies_a_whole_state_and_only_when_it_changed(tmp_path):
    state, seen = _state(tmp_path), {}
    tunestate.keep(tmp_path, seen)
    copy = tunestate.good_copy(state)
    assert json.loads(copy.read_text()) == json.loads(state.read_text())
    assert sorted(p.name for p in tmp_path.glob(tunestate.PATTERN)) == [state.name]  # Tune's glob misses it
    copy.write_text("sentinel")
    tunestate.keep(tmp_path, seen)  # unchanged state: no new copy
    assert copy.read_text() == "sentinel"


def test_a_torn_state_is_not_kept_and_the_last_whole_copy_stays(tmp_path):
    state, seen = _state(tmp_path), {}
    tunestate.keep(tmp_path, seen)
    whole = state.read_text()
    state.write_text(whole[: len(whole) // 2])
    os.utime(state, (1, 1))
    tunestate.keep(tmp_path, seen)
    assert tunestate.good_copy(state).read_text() == whole


def test_repair_puts_the_copy_back_and_keeps_the_torn_file(tmp_path):
    state, seen = _state(tmp_path), {}
    tunestate.keep(tmp_path, seen)
    whole = state.read_text()
    state.write_text(whole[:7])
    said = tunestate.repair(tmp_path)
    assert said and "cut short" in said
    assert state.read_text() == whole
    assert (tmp_path / (state.name + ".torn")).read_text() == whole[:7]
    assert tunestate.repair(tmp_path) is None  # whole now: nothing to do


def test_repair_without_a_copy_changes_nothing(tmp_path):
    state = _state(tmp_path)
    state.write_text('{"trial_da')
    assert tunestate.repair(tmp_path) is None
    assert state.read_text() == '{"trial_da' and sorted(p.name for p in tmp_path.iterdir()) == [state.name]
    assert tunestate.repair(tmp_path / "missing") is None
