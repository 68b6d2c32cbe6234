"""Workloads without Ray: the model mapping, ALE detection and preprocessing, evaluation config, returns."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rayrl import spec as S
from rayrl.envs import registry
from rayrl.observe import keys
from rayrl.rllib import algo, callback, models


def test_model_section_maps_onto_default_model_config():
    spec = S.from_dict(
        {
            "model": {
                "hidden": [128, 32],
                "activation": "relu",
                "lstm": True,
                "lstm_cell_size": 64,
                "max_seq_len": 16,
                "vf_share_layers": True,
                "free_log_std": True,
                "conv_filters": [[8, [3, 3], 1]],
            }
        }
    )
    cfg = algo.build_config(spec).model_config
    assert cfg["fcnet_hiddens"] == [128, 32] and cfg["fcnet_activation"] == "relu"
    assert cfg["use_lstm"] is True and cfg["lstm_cell_size"] == 64 and cfg["max_seq_len"] == 16
    assert cfg["vf_share_layers"] is True and cfg["free_log_std"] is True
    assert cfg["conv_filters"] == [[8, [3, 3], 1]]


def test_defaults_keep_the_old_mlp_and_atari_gets_the_84x84_cnn():
    plain = models.model_config(S.ModelSpec())
    assert plain["fcnet_hiddens"] == [64, 64] and plain["fcnet_activation"] == "tanh"
    assert plain["vf_share_layers"] is False and "conv_filters" not in plain
    atari = algo.build_config(S.from_dict({"env": {"id": "ALE/Pong-v5"}})).model_config
    assert atari["conv_filters"] == models.ATARI_CONV_FILTERS
    from ray.rllib.core.models.configs import CNNEncoderConfig

    cnn = CNNEncoderConfig(input_dims=[84, 84, 4], cnn_filter_specifiers=atari["conv_filters"])
    assert list(cnn.output_dims) == [256]  # ends in 1x1x256: "valid" on the last layer (same: 11x11x256)


@pytest.mark.parametrize(
    "env_id,ale",
    [("ALE/Pong-v5", True), ("PongNoFrameskip-v4", True), ("CartPole-v1", False), ("tests.long_env:make", False)],
)
def test_ale_ids_are_detected(env_id, ale):
    assert registry.is_ale(env_id) is ale
    name = algo.env_name(S.from_dict({"env": {"id": env_id}}))
    assert name.startswith("rayrl_atari:") is ale


def test_atari_preprocessing_84x84_framestack_and_clipped_rewards():
    env = registry.make_atari("ALE/SpaceInvaders-v5", {"repeat_action_probability": 0.0})  # aliens score 5-30
    obs, _ = env.reset(seed=0)
    env.action_space.seed(0)  # the same random play every run: an unseeded one can score nothing in 300 steps
    assert obs.shape == (84, 84, 4) and obs.dtype == np.float32
    assert -1.0 <= obs.min() and obs.max() <= 1.0
    assert env.unwrapped._frameskip == 1  # the wrapper skips (and max-pools) 4 frames per action
    rewards = []
    for _ in range(300):
        obs, r, term, trunc, _ = env.step(env.action_space.sample())
        rewards.append(r)
        if term or trunc:
            env.reset()
    assert set(rewards) <= {-1.0, 0.0, 1.0} and 1.0 in rewards and obs.shape == (84, 84, 4)


def test_evaluation_and_obs_filter_reach_the_algorithm_config():
    off = algo.build_config(S.from_dict({}))
    assert off.evaluation_interval in (None, 0) and off._env_to_module_connector is None
    spec = S.from_dict(
        {
            "evaluation": {"interval": 3, "episodes": 7, "deterministic": True, "env_runners": 1},
            "model": {"normalize_obs": True},
        }
    )
    cfg = algo.build_config(spec)
    assert cfg.evaluation_interval == 3 and cfg.evaluation_duration == 7
    assert cfg.evaluation_duration_unit == "episodes" and cfg.evaluation_num_env_runners == 1
    assert cfg.evaluation_config["explore"] is False
    from ray.rllib.connectors.env_to_module.mean_std_filter import MeanStdFilter

    assert isinstance(cfg._env_to_module_connector(None, None, None), MeanStdFilter)


def test_judged_return_follows_the_evaluation_section():
    assert S.from_dict({}).judged_by == "training"
    assert S.from_dict({"evaluation": {"interval": 2}}).judged_by == "evaluation"
    assert S.from_dict({"evaluation": {"interval": 2, "judge": "training"}}).judged_by == "training"
    assert S.from_dict({"evaluation": {"interval": 0, "judge": "evaluation"}}).judged_by == "training"
    assert keys.return_key("evaluation") == keys.EVAL_RETURN and keys.return_key("training") == keys.TRAIN_RETURN
    from rayrl.tune.stoppers import stop_criteria

    stop = stop_criteria(S.from_dict({"evaluation": {"interval": 2}, "stop": {"episode_return": 100}}))
    assert stop[keys.EVAL_RETURN] == 100 and keys.EPISODE_RETURN not in stop


def test_returns_are_in_every_result_nan_then_last_known():
    cb = callback.RayrlCallback()
    first = cb._known_returns({"env_runners": {}})
    assert math.isnan(first["train_return"]) and math.isnan(first["eval_return"])
    assert cb._known_returns({"env_runners": {"episode_return_mean": 12.5}})["train_return"] == 12.5
    later = cb._known_returns({"env_runners": {}, "evaluation": {"env_runners": {"episode_return_mean": 40.0}}})
    assert later == {"train_return": 12.5, "eval_return": 40.0}  # no episode this iteration: last known
    assert cb._known_returns({"env_runners": {"episode_return_mean": math.nan}})["train_return"] == 12.5
    # with remote learners RLlib reports a numpy float32, which is no Python float
    import numpy as np

    assert cb._known_returns({"env_runners": {"episode_return_mean": np.float32(30.5)}})["train_return"] == 30.5


def test_an_old_spec_with_algo_hidden_is_told_where_it_went():
    with pytest.raises(S.SpecError, match=r"algo.hidden: unknown key; it moved to model.hidden"):
        S.from_dict({"algo": {"hidden": [64, 64]}})


@pytest.mark.parametrize(
    "judge,name,measured,verdict",
    [
        ("evaluation", "evaluation return (final)", "300.0", "fail"),
        ("training", "episode return (final)", "450.0", "pass"),
    ],
)
def test_report_reward_part_judges_the_return_the_spec_names(tmp_path, judge, name, measured, verdict):
    import pandas as pd
    from test_report import SPEC, history_rows, write_run

    from rayrl.judge import evaluation, folder, report

    rows = history_rows("train0", "train", 4096, 3e-4, 20, 1400.0, 450.0)
    for row in rows:  # training return climbs to 450; evaluation (every 2nd iteration) stays at 300
        row["eval_return_mean"] = 300.0 if row["training_iteration"] >= 2 else math.nan
    spec = {**SPEC, "evaluation": {"interval": 2, "judge": judge}}
    run = folder.load(write_run(tmp_path / judge, "train", history=pd.DataFrame(rows), spec=spec))
    checks = {c.name: c for c in evaluation.evaluate(run)}
    assert checks[name].measured == measured and checks[name].verdict.lower() == verdict
    assert f"| return judged by | {judge} (history.csv " in report.render(run, list(checks.values()), [])
