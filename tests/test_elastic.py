"""The elastic policy's rules: thresholds, the 2x cap, cool-down, hysteresis, the gain gate (no Ray)."""

import pytest

from rayrl.scale.elastic import Decision, Policy, Sample, State, decide

P = Policy(cooldown_s=60.0, sustain=3)


def run(utils, state, start=0.0, thr=None, policy=P) -> Decision:
    samples = [
        Sample(t=start + 10.0 * i, util=u, env_steps_per_s=(thr or [1000.0] * len(utils))[i])
        for i, u in enumerate(utils)
    ]
    return decide(samples, state, now=samples[-1].t, policy=policy)


def test_grow_above_85_percent_shrink_below_30_hold_between():
    grow = run([0.9, 0.95, 0.9], State(nodes=4))
    # mean 0.917 -> ceil(4 x 0.917 / 0.575) = 7 nodes: inside 2x.
    assert (grow.action, grow.nodes) == ("grow", 7)
    shrink = run([0.2, 0.25, 0.2], State(nodes=8))
    # mean 0.217 -> ceil(8 x 0.217 / 0.575) = 4 = the 1/2x floor.
    assert (shrink.action, shrink.nodes) == ("shrink", 4)
    assert run([0.5, 0.6, 0.8], State(nodes=4)).action == "hold"
    assert run([0.85, 0.85, 0.85], State(nodes=4)).action == "hold"  # at the threshold: not above it
    assert run([0.30, 0.30, 0.30], State(nodes=4)).action == "hold"


def test_never_more_than_2x_per_step():
    assert run([1.0, 1.0, 1.0], State(nodes=4)).nodes == 7  # ideal 6.96 -> 7 <= 8
    assert run([1.0, 1.0, 1.0], State(nodes=1)).nodes == 2  # ideal 2 = 2x
    saturated = run([1.0] * 3, State(nodes=10), policy=Policy(cooldown_s=60, grow_above=0.5, shrink_below=0.05))
    assert saturated.nodes == 20  # ideal 37 capped at 2x
    assert run([0.0, 0.0, 0.0], State(nodes=16)).nodes == 8  # ideal 1 capped at 1/2x
    assert run([0.0, 0.0, 0.0], State(nodes=1)).action == "hold"  # min_nodes
    assert run([0.9] * 3, State(nodes=4), policy=Policy(cooldown_s=60, max_nodes=5)).nodes == 5


def test_cool_down_after_a_change_and_only_settled_samples_count():
    first = run([0.9, 0.9, 0.9], State(nodes=2))
    assert first.action == "grow" and first.state.changed_at == 20.0
    # 30 s later: still cooling down.
    cooling = decide([Sample(t, 0.95) for t in (30.0, 40.0, 50.0)], first.state, now=50.0, policy=P)
    assert cooling.action == "hold" and "cool-down" in cooling.reason
    # After the cool-down only samples taken after it count: two are not enough.
    two = decide([Sample(t, 0.95) for t in (30.0, 90.0, 100.0)], first.state, now=100.0, policy=P)
    assert two.action == "hold" and "2 settled sample(s), 3 needed" in two.reason


def test_hysteresis_needs_sustained_samples_and_keeps_the_projection_in_the_band():
    assert run([0.9, 0.5, 0.9], State(nodes=4)).action == "hold"  # one dip breaks the streak
    assert run([0.9, 0.9], State(nodes=4)).action == "hold"  # too few samples
    # A shrink aims at the band's middle: 10 nodes at 25% with band 0.28..0.32 -> ceil(10 x 0.25 / 0.30) = 9.
    tight = Policy(cooldown_s=60, grow_above=0.32, shrink_below=0.28)
    d = run([0.25] * 3, State(nodes=10), policy=tight)
    assert d.nodes == 9 and 0.25 * 10 / d.nodes <= tight.grow_above
    # A grow never projects below shrink_below: 10 nodes at 0.5 with band 0.3..0.45 -> at most 16 (0.3125).
    wide = Policy(cooldown_s=60, grow_above=0.45, shrink_below=0.30)
    g = run([0.5] * 3, State(nodes=10), policy=wide)
    assert g.action == "grow" and 0.5 * 10 / g.nodes >= wide.shrink_below and g.nodes == 14  # ceil(5/0.375)
    # One node at 50%: two would project 25% < 30%, the next look would shrink back: hold instead.
    one = run([0.5] * 3, State(nodes=1), policy=wide)
    assert one.action == "hold" and "keeps utilisation above 30%" in one.reason


def test_a_grow_that_gains_under_15_percent_blocks_the_next_grow():
    first = run([0.9] * 3, State(nodes=2), thr=[1000.0] * 3)
    assert first.action == "grow" and first.state.grew_from_throughput == 1000.0
    later = [Sample(100.0 + 10 * i, 0.95, 1100.0) for i in range(3)]  # +10% only
    blocked = decide(later, first.state, now=120.0, policy=P)
    assert blocked.action == "hold" and "gained less than 15%" in blocked.reason
    paid = [Sample(100.0 + 10 * i, 0.95, 1800.0) for i in range(3)]  # +80%
    assert decide(paid, first.state, now=120.0, policy=P).action == "grow"
    # Low utilisation still shrinks a blocked cluster.
    low = [Sample(200.0 + 10 * i, 0.1, 1100.0) for i in range(3)]
    assert decide(low, blocked.state, now=220.0, policy=P).action == "shrink"


def test_bad_policy_is_rejected():
    with pytest.raises(ValueError, match="shrink_below"):
        Policy(grow_above=0.3, shrink_below=0.85)
    with pytest.raises(ValueError, match="max_factor"):
        Policy(max_factor=1.0)
