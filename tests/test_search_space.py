"""search.space: fields beyond batch x lr, validated with the spec, mapped onto RLlib by the one adapter,
carried through the search, the confirmation and best_config.yaml."""

from __future__ import annotations

import subprocess
import sys

import optuna
import pandas as pd
import pytest
import yaml
from conftest import ROOT, subprocess_env

from rayrl import spec as S
from rayrl.errors import SpecError
from rayrl.spec import space
from rayrl.sweep import confirm as rules
from rayrl.sweep import ladder
from rayrl.sweep.search import Phase2Space, config_delta, with_values

CONFIG = ROOT / "experiments" / "configs" / "cartpole_ppo.yaml"
SPACE = (
    "search.space={algo.gamma: {low: 0.9, high: 0.999}, algo.epochs: {choices: [4, 10, 20]}, "
    "model.hidden: {choices: [[32, 32], [64, 64, 64]]}, algo.minibatch_size: {choices: [128, 4096]}, "
    "algo.entropy_coeff: {low: 1.0e-4, high: 1.0e-2, log: true}}"
)


def spec_with(*overrides: str) -> S.Spec:
    return S.load(CONFIG, list(overrides))


@pytest.mark.parametrize(
    "entry, message",
    [
        ("{algo.gama: {low: 0.9, high: 0.99}}", "search.space.algo.gama: not a field the search can vary; did you"),
        ("{algo.lr: {low: 1.0e-4, high: 1.0e-3}}", "search.lr_min..search.lr_max"),
        ("{algo.train_batch_per_learner: {choices: [256, 512]}}", "comes from the ladder"),
        ("{algo.gamma: {low: 0.9, high: 1.5}}", "search.space.algo.gamma.high: 1.5 is out of range; it must be <= 1.0"),
        ("{algo.gamma: {low: 0.99, high: 0.9}}", "low 0.99 is not below high 0.9"),
        ("{algo.epochs: {choices: [4, 0]}}", "search.space.algo.epochs.choices[1]: 0 is out of range"),
        ("{algo.epochs: {choices: []}}", "is not a non-empty list"),
        ("{algo.epochs: {choices: [4, 4]}}", "4 is listed twice"),
        ("{algo.entropy_coeff: {low: 0, high: 0.01, log: true}}", "log: true needs low > 0"),
        ("{model.activation: {low: 1, high: 2}}", "is not a number (str); give choices"),
        ("{algo.gamma: 0.9}", "is not a range; give {low: L, high: H}"),
        ("{algo.gamma: {low: 0.9, hi: 0.99}}", "unknown key(s) hi; valid keys: low, high, log, choices"),
        ("{algo.gamma: {low: 0.9}}", "give both low and high"),
        ("{model.activation: {choices: [tanh, gelu]}}", "'gelu' is not valid"),
        ("{model.hidden: {choices: [[64, 0]]}}", "must list positive integers"),
        ("{env.envs_per_runner: {choices: [4, 8]}}", "not a field the search can vary"),
    ],
)
def test_a_bad_space_entry_is_one_paragraph_naming_the_field(entry, message):
    with pytest.raises(SpecError) as err:
        spec_with(f"search.space={entry}")
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_bad_space_exits_2_before_any_ray_work(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "experiments" / "sweep.py"), "--smoke", "--storage", str(tmp_path)]
        + ["--set", "search.space={algo.gama: {low: 0.9, high: 0.99}}"],
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "search.space.algo.gama" in proc.stderr and "did you mean 'algo.gamma'" in proc.stderr
    assert not any(tmp_path.iterdir())  # nothing written


def test_each_searched_field_reaches_rllibs_config_under_its_own_key():
    spec = spec_with(SPACE)
    # build_config with and without the values, compared: the adapter's own mapping, nothing restated
    assert config_delta(spec, {"algo.gamma": 0.95}, 2048) == {"gamma": 0.95}
    assert config_delta(spec, {"algo.epochs": 10}, 2048) == {"num_epochs": 10}
    assert config_delta(spec, {"algo.entropy_coeff": 0.003}, 2048) == {"entropy_coeff": 0.003}
    hidden = config_delta(spec, {"model.hidden": [32, 32]}, 2048)
    assert list(hidden) == ["_model_config"] and hidden["_model_config"]["fcnet_hiddens"] == [32, 32]
    assert config_delta(spec, {}, 512) == {}
    # a searched minibatch is at most the batch
    assert with_values(spec, {"algo.minibatch_size": 4096}, 256).algo.minibatch_size == 256
    assert with_values(spec, {}, 512).algo.minibatch_size == ladder.minibatch_for(512, 2048, 256)  # the ladder's rule


def test_phase2_space_proposes_every_field_and_records_what_the_trial_trains_with():
    spec = spec_with(SPACE)
    ask = Phase2Space(spec, [256, 512, 2048])
    study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=3))
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    seen_hidden = set()
    for _ in range(12):
        out = ask(study.ask())
        batch = out["train_batch_size_per_learner"]
        assert 0.9 <= out["rayrl_algo.gamma"] <= 0.999 and out["gamma"] == out["rayrl_algo.gamma"]
        assert out["rayrl_algo.epochs"] in (4, 10, 20) and out["num_epochs"] == out["rayrl_algo.epochs"]
        assert 1e-4 <= out["entropy_coeff"] <= 1e-2
        assert out["rayrl_model.hidden"] in ([32, 32], [64, 64, 64])  # a list again, not Optuna's JSON
        assert out["_model_config"]["fcnet_hiddens"] == out["rayrl_model.hidden"]
        assert out["minibatch_size"] == out["rayrl_algo.minibatch_size"] == min(out["rayrl_algo.minibatch_size"], batch)
        seen_hidden.add(tuple(out["rayrl_model.hidden"]))
    assert len(seen_hidden) == 2


def test_columns_cells_and_the_confirmations_candidates_follow_the_space():
    assert space.columns(["algo.gamma", "algo.epochs"]) == {"algo.gamma": "gamma", "algo.epochs": "epochs"}
    # a shared short name, or a standard column's, keeps the dotted name
    assert space.columns(["algo.vf_clip", "model.obs_clip", "algo.clip"]) == {
        "algo.vf_clip": "vf_clip",
        "model.obs_clip": "obs_clip",
        "algo.clip": "clip",
    }
    assert space.columns(["algo.lr_final"]) == {"algo.lr_final": "lr_final"}
    assert space.parse_cell(space.cell([64, 64])) == [64, 64] and space.parse_cell("0.97") == 0.97
    assert space.parse_cell("") is None and space.parse_cell(10) == 10

    def row(tid, batch, lr, steps, gamma):
        row = {"trial_id": tid, "batch_size": batch, "lr": lr, "env_steps": steps, "episode_return_mean": 480.0}
        return row | {"status": "reached_target", "gamma": gamma}

    trials = [row("a", 256, 1e-3, 10_000, 0.95), row("b", 256, 1e-3, 11_000, 0.99), row("c", 256, 1e-3, 12_000, 0.95)]
    assert [t["trial_id"] for t in rules.top_configs(trials, 3)] == ["a"]  # batch x lr alone: one config
    assert [t["trial_id"] for t in rules.top_configs(trials, 3, ["gamma"])] == ["a", "b"]
    picked = rules.top_configs(trials, 3, ["gamma"])
    with_own = rules.with_baseline(picked, 2048, 3e-4, {"gamma": 0.99})
    assert with_own[-1] == {"trial_id": rules.BASELINE_ID, "batch_size": 2048, "lr": 3e-4, "gamma": 0.99}
    assert rules.with_baseline(picked, 256, 1e-3, {"gamma": 0.99}) == picked  # "b" is the spec's own config


@pytest.mark.slow
def test_a_smoke_sweep_searches_gamma_and_ships_the_winners_value(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "experiments" / "sweep.py"), "--smoke", "--storage", str(tmp_path)]
        + ["--name", "space", "--num-cpus", "2", "--set", "search.space={algo.gamma: {low: 0.9, high: 0.999}}"],
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    run = tmp_path / "space"
    trials = pd.read_csv(run / "trials.csv")
    assert list(trials.columns)[-1] == "gamma" and trials["gamma"].between(0.9, 0.999).all()
    assert trials["gamma"].nunique() == len(trials)  # each trial drew its own
    # what each search trial trained with: RLlib's gamma in Tune's params.json is the recorded value
    for params in (run / "phase2").glob("*/params.json"):
        config = yaml.safe_load(params.read_text())
        assert config["gamma"] == pytest.approx(config["rayrl_algo.gamma"])
    confirm = pd.read_csv(run / "confirm.csv")
    assert "gamma" in confirm.columns
    spec = S.load(run / "spec.yaml")
    summary = yaml.safe_load((run / "summary.json").read_text())
    best = S.load(run / "best_config.yaml")
    winner = confirm[confirm["candidate"] == summary["confirm"]["chosen"]]
    assert best.algo.gamma == pytest.approx(float(winner["gamma"].iloc[0]))
    if summary["best"]["trial_id"] == rules.BASELINE_ID:
        assert best.algo.gamma == spec.algo.gamma
    else:
        searched = trials[trials["trial_id"] == summary["best"]["trial_id"]]
        assert best.algo.gamma == pytest.approx(float(searched["gamma"].iloc[0]))
    # the confirmation ran each candidate's own gamma
    for params in (run / "confirm").glob("*/params.json"):
        config = yaml.safe_load(params.read_text())
        cand = confirm[confirm["trial_id"] == config_trial_id(params)]
        if len(cand):
            assert config["gamma"] == pytest.approx(float(cand["gamma"].iloc[0]))


def config_trial_id(params) -> str:
    """Tune's trial id of a trial folder (its result.json carries it)."""
    import json

    first = (params.parent / "result.json").read_text().splitlines()[0]
    return json.loads(first)["trial_id"]
