"""Real workloads end to end: a long-episode env, Atari (CPU config, GPU preset on CPU), MuJoCo.

The smoke sweeps run in this process on the module's local Ray (one Ray start for all of them)
through the same load_spec -> sweep.run path as `python experiments/sweep.py --smoke --set ...`,
with budgets cut to a few hundred env steps per iteration so the whole module fits the suite.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import yaml
from conftest import ROOT
from test_sweep import check_run_folder

from rayrl import runtime
from rayrl import spec as S
from rayrl.observe import keys
from rayrl.rllib import algo
from rayrl.sweep.config import load_spec
from rayrl.sweep.run import run as run_sweep

pytestmark = pytest.mark.slow

CONFIGS = ROOT / "experiments" / "configs"
# One rung, two phase-2 trials: the run-folder contract, not a search.
TINY = [
    "search.num_samples=2",
    "search.doubling.start=256",
    "search.doubling.cap=256",
    "search.doubling.warmup_iters=0",
    "search.doubling.measure_iters=1",
    "checkpoint.every=100",
]


def smoke_sweep(tmp_path, config, name: str, *sets: str) -> tuple[dict, pd.DataFrame]:
    spec = load_spec(str(config), [*TINY, *sets], tiny=True)
    summary = run_sweep(spec, runtime.resolve(str(tmp_path), name))
    run = tmp_path / name
    assert check_run_folder(run)["best"] == summary["best"]
    return summary, pd.read_csv(run / "history.csv")


def test_long_episodes_smoke_sweep_judged_by_evaluation(ray_local, tmp_path):
    """Episodes of 300 steps, iterations of 256: the first iterations finish no episode (before the
    fix Tune failed phase 2 on the missing return); evaluation ranks the trials."""
    summary, history = smoke_sweep(
        tmp_path,
        CONFIGS / "cartpole_ppo.yaml",
        "long",
        "env.id=tests.long_env:make",
        "env.config={length: 300}",
        "env.envs_per_runner=2",
        "search.max_env_steps=1800",
        "search.grace_env_steps=600",
        "stop.episode_return=null",
        "evaluation.interval=2",
        "evaluation.episodes=1",
    )
    search = history[history["phase"] == "search"]
    first = search.sort_values("training_iteration").groupby("trial_id").head(1)
    assert first["episode_return_mean"].isna().all()  # iteration 1 of every trial: no episode yet
    assert first["eval_return_mean"].isna().all()  # and no evaluation yet
    assert search["episode_return_mean"].notna().any() and search["eval_return_mean"].notna().any()
    assert summary["return_judged_by"] == "evaluation"
    # The confirmed best is the median over the confirmation's seeds (check_run_folder recomputes it from
    # confirm.csv); each confirmation run's return there is its last evaluation return, not training's.
    runs = pd.read_csv(tmp_path / "long" / "confirm.csv")
    confirm_rows = history[history["phase"] == "confirm"].sort_values("training_iteration")
    for r in runs.itertuples():
        evals = confirm_rows[confirm_rows["trial_id"] == r.trial_id]["eval_return_mean"].dropna()
        assert r.episode_return_mean == pytest.approx(evals.iloc[-1]), (r.trial_id, list(evals))
    best = summary["best"]
    assert best["confirmed"] and 0 <= best["episode_return_mean"] <= 300
    assert yaml.safe_load((tmp_path / "long" / "best_config.yaml").read_text())["evaluation"]["interval"] == 2


def test_atari_cpu_config_smoke_sweep(ray_local, tmp_path):
    _, history = smoke_sweep(
        tmp_path,
        CONFIGS / "atari_breakout_ppo_cpu.yaml",
        "breakout",
        "search.max_env_steps=1024",
        "search.grace_env_steps=512",
        "search.confirm_top_k=1",
    )
    assert history["episode_return_mean"].notna().any()  # each life is an episode: short ones finish


def test_atari_gpu_preset_builds_on_cpu_and_the_cpu_config_restores(ray_local, tmp_path):
    preset = S.load(
        CONFIGS / "atari_pong_appo_gpu.yaml",
        [
            "resources.learners=0",
            "resources.gpus_per_learner=0",
            "resources.env_runners=0",
            "env.envs_per_runner=1",
            "algo.train_batch_per_learner=100",
            "algo.minibatch_size=100",
            "evaluation.interval=0",
        ],
    )
    algorithm = algo.build_config(preset).build_algo()
    try:
        import torch

        convs = [m for m in algorithm.get_module().modules() if isinstance(m, torch.nn.Conv2d)]
        assert [c.in_channels for c in convs][:1] == [4] and convs[0].kernel_size == (8, 8)  # 4 stacked frames
        steps = [keys.lookup(algorithm.train(), keys.ENV_STEPS) for _ in range(2)]
        assert 0 < steps[0] < steps[1]
    finally:
        algorithm.stop()

    cpu = S.load(
        CONFIGS / "atari_breakout_ppo_cpu.yaml",
        ["resources.env_runners=0", "algo.train_batch_per_learner=256", "algo.minibatch_size=128"],
    )
    algorithm = algo.build_config(cpu).build_algo()
    try:
        algorithm.train()
        saved = algorithm.save_to_path(str(tmp_path / "ckpt"))
        weights = algorithm.get_module().get_state()
    finally:
        algorithm.stop()
    from ray.rllib.algorithms.algorithm import Algorithm

    restored = Algorithm.from_checkpoint(saved)
    try:
        again = restored.get_module().get_state()
        assert set(again) == set(weights)
        assert all(np.array_equal(np.asarray(again[k]), np.asarray(weights[k])) for k in weights)
        assert keys.lookup(restored.train(), keys.ENV_STEPS) > 256  # trains on from the restored count
    finally:
        restored.stop()


def test_mujoco_config_smoke_sweep(ray_local, tmp_path):
    summary, history = smoke_sweep(
        tmp_path,
        CONFIGS / "mujoco_hopper_ppo.yaml",
        "hopper",
        "search.max_env_steps=1024",
        "search.grace_env_steps=512",
        "evaluation.interval=2",
        "evaluation.episodes=2",
        # the recipe's 10 epochs of minibatch 64 make each iteration ~1 s: the sweep's plumbing is
        # what this test checks, not learning
        "algo.epochs=2",
        "algo.minibatch_size=256",
    )
    assert summary["return_judged_by"] == "evaluation" and history["eval_return_mean"].notna().any()


def evaluation_return(algorithm) -> float:
    return float(keys.lookup(algorithm.evaluate(), "env_runners/episode_return_mean"))


def test_mujoco_hopper_learns_above_the_untrained_policy(ray_local):
    """PPO's Gaussian policy on Hopper-v5: greedy evaluation return before and after a short budget."""
    spec = S.load(CONFIGS / "mujoco_hopper_ppo.yaml", ["resources.env_runners=0", "evaluation.episodes=5"])
    algorithm = algo.build_config(spec).build_algo()
    try:
        baseline = evaluation_return(algorithm)
        while keys.lookup(algorithm.train(), keys.ENV_STEPS) < BUDGET:
            pass
        trained = evaluation_return(algorithm)
    finally:
        algorithm.stop()
    print(f"hopper: untrained {baseline:.1f}, after {BUDGET} env steps {trained:.1f}")
    assert math.isfinite(baseline) and math.isfinite(trained)
    assert trained >= FACTOR * baseline, f"untrained {baseline:.1f}, after {BUDGET} env steps {trained:.1f}"


#: The recipe's untrained greedy policy (orthogonal init, policy gain 0.01) falls at ~99; after 16k
#: env steps it measured 191 (2026-12-03), so 1.5x is "clearly above" with room for seed noise.
BUDGET, FACTOR = 16_384, 1.5
