"""benchmarks/atari.py: every contender runs Zoo's Atari settings on the same network; the run order
rotates; bad flags are refused before any run."""

from __future__ import annotations

import pytest

from benchmarks import atari as A


def test_schedule_alternates_contenders_and_rotates_the_order_seed_by_seed():
    order = A.schedule(["a", "b", "c"], [1, 2, 3])
    assert order == [("a", 1), ("b", 1), ("c", 1), ("b", 2), ("c", 2), ("a", 2), ("c", 3), ("a", 3), ("b", 3)]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--contenders", "rayrl_envpool,cleanrl"], "'cleanrl' is not a contender"),
        (["--env-steps", "100"], "at least 1024 env steps"),
    ],
)
def test_bad_flags_are_refused(tmp_path, capsys, argv, message):
    with pytest.raises(SystemExit) as exc:
        A.parse(["--work", str(tmp_path), *argv])
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_rayrl_and_sb3_train_the_same_nature_cnn_at_zoos_settings():
    """Equal settings: rayrl's module (either runner) has exactly SB3's CnnPolicy parameter count
    (Nature CNN, one 512 layer shared by policy and value), and the spec carries Zoo's numbers."""
    pytest.importorskip("stable_baselines3")
    pytest.importorskip("ale_py")
    from rayrl.envs.registry import make_atari
    from rayrl.rllib.algo import build_config

    counts = {}
    for contender in ("rayrl_envpool", "rayrl_rllib_runner"):
        spec = A.spec_for(contender, 50_000, 1)
        assert (spec.algo.train_batch_per_learner, spec.algo.minibatch_size, spec.algo.epochs) == (1024, 256, 4)
        assert (spec.algo.lr, spec.algo.clip, spec.algo.entropy_coeff, spec.env.envs_per_runner) == (
            2.5e-4,
            0.1,
            0.01,
            8,
        )
        env = make_atari(A.ENV_ID, dict(spec.env.config))
        cfg = build_config(spec)
        module = cfg.get_rl_module_spec(env=env, spaces={"default_policy": (env.observation_space, env.action_space)})
        built = module.build()
        counts[contender] = sum(p.numel() for p in built.parameters())
    sb3 = A.sb3_model(1)
    assert counts["rayrl_envpool"] == counts["rayrl_rllib_runner"] == sum(p.numel() for p in sb3.policy.parameters())
