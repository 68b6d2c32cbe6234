"""The tracking section, run names and tracked metrics, and the export/play CLIs' bad input: no Ray."""

from __future__ import annotations

import math
import subprocess
import sys
from types import SimpleNamespace

import pytest
from conftest import ROOT, subprocess_env

from rayrl import spec as S
from rayrl.extras import require
from rayrl.observe import keys
from rayrl.track.naming import rayrl_metrics, run_name, trial_params


def test_tracking_defaults_and_values():
    spec = S.from_dict(
        {
            "tracking": {
                "mlflow": {"enabled": True, "tracking_uri": "http://127.0.0.1:5000"},
                "wandb": {"enabled": True, "mode": "offline", "project": "p"},
            }
        }
    )
    assert spec.tracking.tensorboard is True
    assert spec.tracking.mlflow.tracking_uri == "http://127.0.0.1:5000"
    assert (spec.tracking.wandb.mode, spec.tracking.wandb.project) == ("offline", "p")
    assert S.Spec().tracking.mlflow.enabled is False and S.Spec().tracking.wandb.enabled is False


@pytest.mark.parametrize(
    "data,words",
    [
        ({"tensorboard": "yes"}, ["tracking.tensorboard", "'yes'", "true or false"]),
        (
            {"mlflow": {"tracking_uri": "https://me:secret@mlflow.example:443"}},
            ["tracking.mlflow.tracking_uri", "MLFLOW_TRACKING_PASSWORD"],
        ),
        ({"wandb": {"mode": "offlne"}}, ["tracking.wandb.mode", "did you mean 'offline'", "online, offline"]),
        ({"mlflo": {}}, ["tracking.mlflo", "did you mean 'mlflow'"]),
    ],
)
def test_bad_tracking_section_names_field_and_fix(data, words):
    with pytest.raises(S.SpecError) as err:
        S.from_dict({"tracking": data})
    assert all(w in str(err.value) for w in words), str(err.value)


def test_missing_extra_names_the_pip_command():
    with pytest.raises(S.SpecError) as err:
        require("rayrl_no_such_module", "tracking", "tracking.mlflow.enabled")
    assert "pip install 'rayrl[tracking]'" in str(err.value) and "tracking.mlflow.enabled" in str(err.value)
    require("yaml", "tracking", "x")  # an installed module passes


def test_run_name_says_phase_batch_lr():
    trial = SimpleNamespace(
        trial_id="ab12c_00003", config={"train_batch_size_per_learner": 4096, "lr": 6e-4, "rayrl_lr": 3e-4}
    )
    assert run_name(trial, "search") == "search_b4096_lr3.0e-04_ab12c_00003"
    trial.config = {"train_batch_size_per_learner": 2048, "lr": 1e-3}
    assert run_name(trial, "ladder") == "ladder_b2048_lr1.0e-03_ab12c_00003"
    assert run_name(trial, "train").startswith("train_b2048_")


def test_rayrl_metrics_keeps_rayrl_keys_finite_numbers():
    result = {
        keys.ITERATION: 3,
        keys.TIME_TOTAL: 12.5,
        "num_env_steps_sampled_lifetime": 3072,
        "env_runners": {"episode_return_mean": 41.5, "num_episodes": 7},
        "rayrl": {"env_steps_per_s": 812.0, "backend": "none", "loss_scale": math.nan, "num_learners": 0},
        "learners": {"default_policy": {"total_loss": 1.0}},
    }
    assert rayrl_metrics(result) == {
        "rayrl/env_steps": 3072.0,
        "rayrl/episode_return_mean": 41.5,
        "rayrl/iteration": 3.0,
        "rayrl/time_total_s": 12.5,
        "rayrl/env_steps_per_s": 812.0,
        "rayrl/num_learners": 0.0,
    }
    flat = {"rayrl/env_steps_per_s": 5.0, "env_runners/episode_return_mean": 9.0}  # Tune's flattened form
    assert rayrl_metrics(flat) == {"rayrl/episode_return_mean": 9.0, "rayrl/env_steps_per_s": 5.0}


def test_trial_params_are_the_trials_spec_values():
    spec = S.from_dict(
        {
            "algo": {"lr": 3e-4, "train_batch_per_learner": 2048, "minibatch_size": 256},
            "tracking": {"mlflow": {"tracking_uri": "http://127.0.0.1:5000"}},
        }
    )
    params = trial_params(
        spec,
        {
            "train_batch_size_per_learner": 4096,
            "minibatch_size": 512,
            "lr": 9e-4,
            "rayrl_lr": 4.5e-4,
            "num_envs_per_env_runner": 99,
        },
    )
    assert params["algo.train_batch_per_learner"] == 4096 and params["algo.minibatch_size"] == 512
    assert params["algo.lr"] == 4.5e-4 and params["env.id"] == "CartPole-v1"
    assert params["model.hidden"] == [64, 64] and params["search.doubling.start"] == 2048
    assert "tracking.mlflow.tracking_uri" not in params and "num_envs_per_env_runner" not in params
    scaled = S.from_dict({"algo": {"lr": 1e-4}, "resources": {"learners": 4, "lr_scaling": "linear"}})
    params = trial_params(scaled, {"lr": 8e-4, "entropy_coeff": 0.004})  # a PBT member: its own draws, scaled lr
    assert params["algo.lr"] == pytest.approx(2e-4) and params["algo.entropy_coeff"] == 0.004


@pytest.mark.parametrize(
    "argv,words",
    [
        (["export", "/no/such/run"], ["RUN_DIR", "/no/such/run", "not a run folder"]),
        (["export", "{tmp}", "--format", "tf"], ["--format", "invalid choice", "onnx"]),
        (["play", "{tmp}", "--episodes", "0"], ["--episodes", "0", "1 or more"]),
        (["play", "{tmp}"], ["RUN_DIR", "pick one with --trial"]),
    ],
)
def test_export_play_bad_input_exits_2_with_one_paragraph(tmp_path, argv, words):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    proc = subprocess.run(
        [sys.executable, "-m", "rayrl.cli", *argv],
        env=subprocess_env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert all(w in proc.stderr for w in words), proc.stderr
    assert "Traceback" not in proc.stderr and "\n\n" not in proc.stderr.strip()


def test_report_links_the_played_videos(tmp_path):
    import json

    from rayrl.policy.play import report_lines

    assert "rayrl play" in report_lines(tmp_path)[0]  # no play.json yet: says how to make one
    (tmp_path / "video").mkdir()
    (tmp_path / "video" / "play-episode-0.mp4").write_bytes(b"\0" * 10)
    (tmp_path / "play.json").write_text(
        json.dumps(
            {
                "trial_id": "abc_00000",
                "returns": [500.0, 480.0],
                "std": 14.1,
                "deterministic": True,
                "videos": [str(tmp_path / "video" / "play-episode-0.mp4"), str(tmp_path / "gone.mp4")],
            }
        )
    )
    lines = report_lines(tmp_path)
    assert lines[0].startswith("Trial abc_00000, 2 episodes (deterministic actions): mean return 490.0, std 14.1")
    assert "- video: [play-episode-0.mp4](video/play-episode-0.mp4)" in lines
    assert not any("gone.mp4" in line for line in lines)  # a deleted video is not linked


@pytest.mark.parametrize("program", ["export", "play"])
def test_export_and_play_are_documented_and_have_help(program):
    from test_readme import _commands_in_code_blocks

    assert program in {c[1] for c in _commands_in_code_blocks() if c[0] == "rayrl"}
    top = subprocess.run(
        [sys.executable, "-m", "rayrl.cli", "--help"], capture_output=True, text=True, env=subprocess_env(), timeout=120
    )
    assert program in top.stdout
    proc = subprocess.run(
        [sys.executable, "-m", "rayrl.cli", program, "--help"],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        timeout=120,
    )
    assert proc.returncode == 0 and f"usage: rayrl {program}" in proc.stdout and "RUN_DIR" in proc.stdout


def test_population_explore_stays_in_the_spec_ranges():
    from rayrl.train.population import Clamp, bounds

    spec = S.from_dict({"population": {"size": 4, "entropy_max": 0.01}, "search": {"lr_min": 1e-4, "lr_max": 1e-3}})
    clamp = Clamp(bounds(spec))
    assert clamp({"lr": 1.2e-3, "entropy_coeff": 0.012, "gamma": 0.99}) == {
        "lr": 1e-3,
        "entropy_coeff": 0.01,
        "gamma": 0.99,
    }
    assert clamp({"lr": 0.8e-4, "entropy_coeff": 0.005}) == {"lr": 1e-4, "entropy_coeff": 0.005}
    with pytest.raises(S.SpecError, match="population.size: 1 is not a population"):
        S.from_dict({"population": {"size": 1}})


def test_an_exploited_paused_trial_loses_the_stop_tune_cached_for_its_dropped_save():
    """ray-project/ray#57906: Tune caches a STOP when PBT pauses a trial mid-save; left there, it ends
    the trial at its next save (a CI run's population lost a member that way). Only that STOP goes."""
    from ray.tune.experiment import Trial
    from ray.tune.schedulers import TrialScheduler

    from rayrl.train.population import drop_stale_stop

    def scheduler_view(decisions: dict) -> SimpleNamespace:  # what PBT is handed: a wrapper of the controller
        return SimpleNamespace(_tune_controller=SimpleNamespace(_cached_trial_decisions=decisions))

    paused = SimpleNamespace(trial_id="a", status=Trial.PAUSED)
    decisions = {"a": TrialScheduler.STOP, "b": TrialScheduler.STOP}
    assert drop_stale_stop(scheduler_view(decisions), paused) and decisions == {"b": TrialScheduler.STOP}
    for trial, decision in [
        (paused, TrialScheduler.PAUSE),  # a pause still owed after a save is kept
        (SimpleNamespace(trial_id="a", status=Trial.RUNNING), TrialScheduler.STOP),  # a real stop is kept
    ]:
        decisions = {"a": decision}
        assert not drop_stale_stop(scheduler_view(decisions), trial) and decisions == {"a": decision}
    assert not drop_stale_stop(SimpleNamespace(), paused)  # a Tune without the attribute: left alone


def test_a_population_run_is_judged_by_its_best_member(tmp_path):
    import pandas as pd
    from test_report import history_rows, write_run

    from rayrl.judge.folder import load, subject_history

    rows = history_rows("m0", "train", 512, 3e-4, 6, 900.0, 100.0) + history_rows(
        "m1", "train", 512, 6e-4, 6, 800.0, 300.0
    )
    run = load(
        write_run(
            tmp_path / "pbt",
            kind="train",
            history=pd.DataFrame(rows),
            summary={
                "kind": "train",
                "env_steps": 3072,
                "wall_s": 60.0,
                "population": {"size": 2, "best_trial_id": "m1"},
            },
        )
    )
    judged = subject_history(run)
    assert list(judged["trial_id"].unique()) == ["m1"] and list(judged[keys.ITERATION]) == [1, 2, 3, 4, 5, 6]
