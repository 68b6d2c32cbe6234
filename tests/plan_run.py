"""A small `rayrl train` run folder with known timers, for the capacity plan's tests.

Written by hand so every figure the plan derives can be computed on paper: the trial sampled
1000 env steps in 0.5 s with 2 env runners (1000 env steps/s per runner) and updated in 1.0 s;
the first iteration is a slow warm-up (5.0 s and 3.0 s) that the plan must ignore; RLlib's timers
are written as RLlib writes them, exponential moving averages with coefficient 0.01.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import yaml

from rayrl import runfolder
from rayrl.observe import keys

TRIAL = "abc12345"
SAMPLE_S, LEARN_S, WARMUP_SAMPLE_S, WARMUP_LEARN_S = 0.5, 1.0, 5.0, 3.0
TARGET_RETURN, STEPS_AT_TARGET = 100.0, 3000


def ema(values: list[float], coeff: float = 0.01) -> list[float]:
    out = [values[0]]
    for v in values[1:]:
        out.append((1 - coeff) * out[-1] + coeff * v)
    return out


def write_run(root: Path, cost: dict | None = None, iterations: int = 5) -> Path:
    root.mkdir(parents=True)
    spec = {
        "name": root.name,
        "env": {"id": "CartPole-v1"},
        "algo": {
            "name": "PPO",
            "train_batch_per_learner": 1000,
            "minibatch_size": 250,
            "epochs": 2,
            "hidden": [64, 64],
        },
        "resources": {"env_runners": 2, "learners": 0},
        "stop": {"episode_return": TARGET_RETURN},
        "cost": cost or {"gpu_hour_usd": 2.0, "cpu_hour_usd": 0.5, "spot_discount": 0.0},
    }
    (root / "spec.yaml").write_text(yaml.safe_dump(spec))
    (root / "summary.json").write_text(json.dumps({"kind": "train", "status": "finished"}))
    with open(root / "history.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=runfolder.HISTORY_COLUMNS)
        w.writeheader()
        for i in range(1, iterations + 1):
            w.writerow(
                {
                    "trial_id": TRIAL,
                    "phase": "train",
                    "batch_size": 1000,
                    "lr": 3e-4,
                    keys.ITERATION: i,
                    "env_steps": 1000 * i,
                    "episode_return_mean": 40.0 * i,
                    "env_steps_per_s": 600.0,
                    "num_learners": 0,
                    "backend": "none",
                    "precision": "fp32",
                }
            )
    trial_dir = root / "tune" / f"PPO_{TRIAL}"
    trial_dir.mkdir(parents=True)
    sample = ema([WARMUP_SAMPLE_S] + [SAMPLE_S] * (iterations - 1))
    learn = ema([WARMUP_LEARN_S] + [LEARN_S] * (iterations - 1))
    with open(trial_dir / "progress.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(
            [
                keys.ITERATION,
                "timers/env_runner_sampling_timer",
                "timers/learner_update_timer",
                "env_runners/num_env_steps_sampled",
                "rayrl/global_batch",
                "rayrl/effective_minibatch",
            ]
        )
        for i in range(iterations):
            w.writerow([i + 1, repr(sample[i]), repr(learn[i]), 1000, 1000, 250])
    return root


#: The cluster of the hand-computed cases (docs in tests/test_scale_model.py).
CLUSTER = {
    "name": "hand",
    "gpus_per_node": 2,
    "cpus_per_node": 8,
    "cpus_per_cpu_node": 4,
    "intra_node_busbw_gbs": 100.0,
    "intra_node_latency_us": 10.0,
    "inter_node_busbw_gbs": 10.0,
    "inter_node_latency_us": 0.0,
}
