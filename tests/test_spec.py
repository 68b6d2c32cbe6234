"""The experiment spec: defaults, overrides, and at least 15 bad configs via the API and the CLI."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rayrl import spec as S
from rayrl.errors import SpecError

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((ROOT / "experiments" / "configs").glob("*.yaml"))


def test_defaults_are_valid_and_documented():
    spec = S.from_dict({})
    assert spec.algo.name == "PPO"
    assert spec.algo.grad_clip == 1.0
    assert spec.search.doubling.start == 2048 and spec.search.doubling.cap == 16384
    assert spec.search.doubling.min_gain == pytest.approx(0.15)
    rows = S.field_table()
    assert len(rows) > 40
    undocumented = [name for name, _, text in rows if not text]
    assert undocumented == []


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_shipped_configs_load_and_round_trip(path):
    spec = S.load(path)
    assert S.from_dict(S.to_dict(spec)) == spec


def test_shipped_configs_cover_the_three_algorithms_and_a_gpu_preset():
    names = {S.load(p).algo.name for p in CONFIGS}
    assert names >= {"PPO", "APPO", "IMPALA"}
    gpu = [S.load(p) for p in CONFIGS if S.load(p).resources.gpus_per_learner > 0]
    assert any(s.env.id.startswith("ALE/") for s in gpu)


def test_overrides_parse_yaml_values_and_nest():
    data = S.apply_overrides(
        {"algo": {"lr": 1e-3}},
        ["algo.lr=1e-4", "model.hidden=[32, 32]", "search.doubling.cap=8192", "stop.wall_s=null"],
    )
    spec = S.from_dict(data)
    assert spec.algo.lr == pytest.approx(1e-4)
    assert spec.model.hidden == [32, 32]
    assert spec.search.doubling.cap == 8192
    assert spec.stop.wall_s is None


@pytest.mark.parametrize("rule,expected", [("none", 1e-3), ("linear", 4e-3), ("sqrt", 2e-3)])
def test_lr_scaling_rule_is_explicit(rule, expected):
    spec = S.from_dict({"algo": {"lr": 1e-3}, "resources": {"learners": 4, "lr_scaling": rule}})
    assert spec.effective_lr == pytest.approx(expected)
    assert spec.global_batch == 4 * spec.algo.train_batch_per_learner


def test_scaled_lr_single_learner_is_unchanged():
    assert S.scaled_lr(3e-4, 0, "linear") == pytest.approx(3e-4)
    assert S.scaled_lr(3e-4, 9, "sqrt") == pytest.approx(9e-4)
    assert math.isclose(S.scaled_lr(1.0, 2, "sqrt"), math.sqrt(2))


def test_env_factory_import_path(tmp_path, monkeypatch):
    (tmp_path / "my_envs.py").write_text(
        "import gymnasium\ndef make(cfg):\n    return gymnasium.make('CartPole-v1', **cfg)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = S.from_dict({"env": {"id": "my_envs:make", "config": {"max_episode_steps": 50}}})
    env = S.resolve_factory(spec.env.id)(dict(spec.env.config))
    assert env.spec.max_episode_steps == 50


# (data or override list, the field the message must name, a fragment of what is valid)
BAD = [
    ({"algo": {"lrr": 1e-3}}, "algo.lrr", "did you mean 'lr'"),
    ({"algos": {}}, "algos", "did you mean 'algo'"),
    ({"algo": {"lr": 0}}, "algo.lr", "> 0"),
    ({"algo": {"lr": -1e-3}}, "algo.lr", "> 0"),
    ({"algo": {"lr": "fast"}}, "algo.lr", "not a number"),
    ({"algo": {"train_batch_per_learner": 0}}, "algo.train_batch_per_learner", ">= 1"),
    ({"algo": {"train_batch_per_learner": 1.5}}, "algo.train_batch_per_learner", "not an integer"),
    ({"algo": {"minibatch_size": 4096}}, "algo.minibatch_size", "at most the train batch"),
    ({"algo": {"name": "DQNN"}}, "algo.name", "PPO, APPO, IMPALA"),
    ({"algo": {"name": "ppo"}}, "algo.name", "did you mean 'PPO'"),
    ({"algo": {"gamma": 1.5}}, "algo.gamma", "<= 1"),
    ({"model": {"hidden": [64, 0]}}, "model.hidden", "positive integers"),
    ({"algo": {"hidden": [64, 64]}}, "algo.hidden", "valid keys in algo"),
    ({"model": {"activation": "sigmoid"}}, "model.activation", "tanh, relu, silu, elu, linear"),
    ({"model": {"conv_filters": [[16, [8, 8], 4], [32, 4, 2]]}}, "model.conv_filters[1]", "[out_channels, "),
    ({"model": {"conv_filters": [[0, [8, 8], 4]]}}, "model.conv_filters[0]", "positive integers"),
    ({"model": {"conv_filters": [[8, [8, 8], 4, "full"]]}}, "model.conv_filters[0]", "same or valid"),
    ({"model": {"lstm": "yes"}}, "model.lstm", "not true or false"),
    ({"model": {"lstm_cell_size": 0}}, "model.lstm_cell_size", ">= 1"),
    ({"model": {"normalise_obs": True}}, "model.normalise_obs", "did you mean 'normalize_obs'"),
    ({"evaluation": {"interval": -1}}, "evaluation.interval", ">= 0"),
    ({"evaluation": {"episodes": 0}}, "evaluation.episodes", ">= 1"),
    ({"evaluation": {"judge": "eval"}}, "evaluation.judge", "evaluation, training"),
    ({"evaluation": {"deterministic": 1}}, "evaluation.deterministic", "not true or false"),
    ({"algo": {"epochs": True}}, "algo.epochs", "not an integer"),
    ({"env": {"id": "CartPol-v1"}}, "env.id", "did you mean 'CartPole-v1'"),
    ({"env": {"id": "no_such_module_xyz:make"}}, "env.id", "cannot be imported"),
    ({"env": {"envs_per_runner": 0}}, "env.envs_per_runner", ">= 1"),
    ({"resources": {"learners": -1}}, "resources.learners", ">= 0"),
    ({"resources": {"lr_scaling": "cubic"}}, "resources.lr_scaling", "none, linear, sqrt"),
    ({"precision": {"mode": "fp8"}}, "precision.mode", "fp32, bf16, fp16"),
    ({"stop": {"env_steps": None, "episode_return": None, "wall_s": None}}, "stop", "at least one"),
    ({"search": {"lr_min": 1e-2, "lr_max": 1e-3}}, "search.lr_min", "non-empty"),
    ({"search": {"doubling": {"start": 4096, "cap": 2048}}}, "search.doubling.cap", "first rung"),
    ({"search": {"scheduler": "pbt"}}, "search.scheduler", "asha, hyperband"),
    ({"search": {"doubling": {"min_gain": float("nan")}}}, "search.doubling.min_gain", "finite"),
    ({"cost": {"spot_discount": 1.0}}, "cost.spot_discount", "< 1"),
    ({"algo": [1, 2]}, "algo", "not a mapping"),
    ({"checkpoint": {"every": 0}}, "checkpoint.every", ">= 1"),
    ({"model": {"init": "xavier"}}, "model.init", "default, orthogonal"),
    ({"algo": {"reward_clip": -1}}, "algo.reward_clip", ">= 0"),
    ({"algo": {"adam_eps": 0}}, "algo.adam_eps", "> 0"),
    ({"algo": {"lr_final": 0.0}, "stop": {"env_steps": None}}, "algo.lr_final", "set stop.env_steps"),
    ({"algo": {"clip_final": 0.1}, "stop": {"env_steps": None}}, "algo.clip_final", "set stop.env_steps"),
    ({"algo": {"name": "APPO", "normalize_reward": True}}, "algo.normalize_reward", "algo.name: PPO"),
    ({"algo": {"name": "IMPALA"}, "model": {"init": "orthogonal"}}, "model.init", "algo.name: PPO"),
    ({"algo": {"name": "IMPALA", "clip": 0.2}}, "algo.clip", "PPO or APPO"),
]


@pytest.mark.parametrize("data,field,valid", BAD, ids=[b[1] + ":" + str(i) for i, b in enumerate(BAD)])
def test_bad_config_raises_spec_error_naming_the_field(data, field, valid):
    with pytest.raises(SpecError) as info:
        S.from_dict(data)
    message = str(info.value)
    assert message.startswith(field + ":") or f" {field}:" in message or message.startswith(field)
    assert valid in message


@pytest.mark.parametrize(
    "item,fragment",
    [
        ("algo.lr", "section.key=value"),
        ("=3", "section.key=value"),
        ("algo..lr=1", "section.key=value"),
        ("algo.lr.x=1", "is a value"),
    ],
)
def test_bad_override_syntax(item, fragment):
    with pytest.raises(SpecError, match=fragment):
        S.apply_overrides({"algo": {"lr": 1e-3}}, [item])


def test_bad_files(tmp_path):
    with pytest.raises(SpecError, match="does not exist"):
        S.load(tmp_path / "missing.yaml")
    (tmp_path / "broken.yaml").write_text("algo: {lr: [1,\n")
    with pytest.raises(SpecError, match="not valid YAML"):
        S.load(tmp_path / "broken.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(SpecError, match="not a mapping"):
        S.load(tmp_path / "list.yaml")


CLI_BAD = BAD[:15] + BAD[17:20]


@pytest.mark.parametrize("data,field,valid", CLI_BAD, ids=[b[1] + ":" + str(i) for i, b in enumerate(CLI_BAD)])
def test_cli_bad_config_exits_2_with_one_paragraph_and_no_ray(tmp_path, data, field, valid):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(yaml.safe_dump(data))
    proc = subprocess.run(
        [sys.executable, "-m", "rayrl.cli", "train", "--config", str(cfg), "--storage", str(tmp_path / "runs")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert field in proc.stderr and valid.split()[-1] in proc.stderr
    assert "Started a local Ray" not in proc.stderr + proc.stdout
    assert proc.stderr.strip().count("\n\n") == 0  # one paragraph


def test_cli_bad_override_and_unknown_flag(tmp_path):
    cfg = ROOT / "experiments" / "configs" / "cartpole_ppo.yaml"
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "rayrl.cli",
            "train",
            "--config",
            str(cfg),
            "--set",
            "algo.lrr=1",
            "--storage",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and "algo.lrr" in bad.stderr and "Traceback" not in bad.stderr
    flag = subprocess.run(
        [sys.executable, "-m", "rayrl.cli", "train", "--config", str(cfg), "--bogus"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert flag.returncode == 2 and "--bogus" in flag.stderr and "Traceback" not in flag.stderr


def test_cli_unwritable_storage_exits_2(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    cfg = ROOT / "experiments" / "configs" / "cartpole_ppo.yaml"
    proc = subprocess.run(
        [sys.executable, "-m", "rayrl.cli", "train", "--config", str(cfg), "--storage", str(blocker / "runs")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "--storage" in proc.stderr and "Traceback" not in proc.stderr
    assert blocker.read_text() == "not a folder"


def test_cli_spec_lists_fields_and_resolves_a_config():
    out = subprocess.run([sys.executable, "-m", "rayrl.cli", "spec"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "search.doubling.min_gain" in out.stdout
    cfg = ROOT / "experiments" / "configs" / "cartpole_ppo.yaml"
    res = subprocess.run(
        [sys.executable, "-m", "rayrl.cli", "spec", "--config", str(cfg), "--set", "algo.lr=0.001"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0
    assert yaml.safe_load(res.stdout)["algo"]["lr"] == pytest.approx(1e-3)
