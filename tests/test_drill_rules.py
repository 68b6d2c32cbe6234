"""The drills' judgements on a Tune run's events, without Ray: when training counts as back after a
kill, and when a retry went on from the latest checkpoint. Each case is a race seen on 2 cores (a
result or a save the killed actor finished just before the kill, reaching the driver after it)."""

from __future__ import annotations

from rayrl.faults.drills import back_after_node_loss, resumed_from_latest
from rayrl.faults.harness import Monitor

T_KILL = 10.0


def monitor(*events: tuple[float, str, dict]) -> Monitor:
    m = Monitor(60)
    m.events = list(events)
    return m


def result(iteration: int, *, healthy: int = 2, restarts: int = 0, since: int | None = None, newer: bool = False):
    return {
        "iteration": iteration,
        "env_steps": 512.0 * iteration,
        "healthy": healthy,
        "restarts": restarts,
        "since_restore": since,
        "newer_than_registered": newer,
    }


def test_a_result_sent_before_the_kill_is_not_training_back_after_a_retry():
    before = result(3)
    m = monitor(
        (9.0, "result", before),
        (10.02, "result", result(4)),  # the trial actor's last result, arriving after the kill
        (10.5, "recover", {"from_iteration": 3}),
        (15.0, "result", result(4, since=1)),
    )
    assert back_after_node_loss(m, T_KILL, before, runners=2) == 15.0


def test_lost_runners_restarted_in_place_are_back_at_the_first_healthy_result_after_the_restart():
    before = result(3)
    m = monitor(
        (10.1, "result", result(4, healthy=1)),  # one runner lost, not yet restarted
        (12.0, "result", result(5, restarts=1)),
    )
    assert back_after_node_loss(m, T_KILL, before, runners=2) == 12.0
    assert back_after_node_loss(monitor((10.1, "result", result(4, healthy=1))), T_KILL, before, 2) is None


def test_a_retry_from_tunes_latest_checkpoint_goes_on_from_the_latest():
    m = monitor((8.0, "checkpoint", {"iteration": 2}), (9.0, "checkpoint", {"iteration": 3}))
    first = result(4, since=1)
    assert resumed_from_latest(m, T_KILL, registered=3, resumed_from=3, first=first)


def test_an_older_checkpoint_than_one_registered_before_the_kill_is_not_the_latest():
    m = monitor((8.0, "checkpoint", {"iteration": 2}), (9.0, "checkpoint", {"iteration": 3}))
    assert not resumed_from_latest(m, T_KILL, registered=3, resumed_from=2, first=result(3, since=1))
    assert not resumed_from_latest(m, T_KILL, registered=2, resumed_from=2, first=result(3, since=1))


def test_a_newer_checkpoint_than_tune_registered_counts_only_where_the_trainable_says_it_restored_one():
    # the kill cut off the reply of a save that had finished: Tune registered 2, storage holds 3
    m = monitor((8.0, "checkpoint", {"iteration": 2}))
    assert resumed_from_latest(m, T_KILL, registered=2, resumed_from=3, first=result(4, since=1, newer=True))
    assert not resumed_from_latest(m, T_KILL, registered=2, resumed_from=3, first=result(4, since=1))


def test_starting_over_is_not_a_resume():
    m = monitor((8.0, "checkpoint", {"iteration": 2}))
    assert not resumed_from_latest(m, T_KILL, registered=2, resumed_from=0, first=result(1, since=1))
    assert not resumed_from_latest(m, T_KILL, registered=2, resumed_from=None, first={})
