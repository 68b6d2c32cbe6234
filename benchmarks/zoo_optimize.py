"""RL Zoo's own hyperparameter search (``rl_zoo3.train --optimize``), counted, for benchmarks/tuners.py.

    python -m benchmarks.zoo_optimize --count FILE [--budget B] [--space batch_lr --lr-min L --lr-max H
        --batches 256,512,... --base-batch N --base-minibatch M] -- --algo ppo --env CartPole-v1 --optimize ...

Runs ``rl_zoo3.train.train()`` in this process on the arguments after ``--``, exactly as
``python -m rl_zoo3.train`` would, after patches that change what is measured, not what is searched:

* counting: each ``PPO.learn()`` (one per trial) appends its training env steps, and the env steps of
  the evaluations run inside it, to FILE as a JSON line, so the tuner's cost is what it sampled, not
  an upper bound of n_trials x n_timesteps (a pruned trial stops at an evaluation; a finished one can
  overrun n_timesteps by up to one rollout of n_steps x n_envs);
* ``--budget``: once FILE counts that many training env steps, no further trial starts (the study is
  stopped), so rollout overruns cannot add up to more than one trial past the budget.

``--space batch_lr`` also replaces RL Zoo's PPO sampler (``rl_zoo3.hyperparams_opt.HYPERPARAMS_SAMPLER``,
a dict RL Zoo reads at each trial) with one over the rollout batch (n_steps x n_envs, from
``--batches``) and the learning rate (log-uniform): the search space every other tuner gets, the rest of
the settings RL Zoo's defaults for the env. The minibatch follows the batch by rayrl's rule
(``rayrl.sweep.ladder.minibatch_for``) from RL Zoo's default rollout and batch_size (``--base-*``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

#: the params a batch x lr trial records in the study (user attrs carry what SB3 gets)
BATCH, LR = "batch", "learning_rate"


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """Our flags before ``--``; RL Zoo's after it."""
    if "--" not in argv:
        raise SystemExit("zoo_optimize: give RL Zoo's train arguments after '--'")
    cut = argv.index("--")
    p = argparse.ArgumentParser(prog="python -m benchmarks.zoo_optimize", description=__doc__.split("\n\n")[0])
    p.add_argument("--count", type=Path, required=True, help="JSON lines: env steps of each trial")
    p.add_argument("--budget", type=int, default=0, help="training env steps after which no trial starts (0: none)")
    p.add_argument("--space", choices=("zoo", "batch_lr"), default="zoo")
    p.add_argument("--lr-min", type=float, default=1e-5)
    p.add_argument("--lr-max", type=float, default=1e-3)
    p.add_argument("--batches", default="", help="comma-separated rollout batch sizes (batch_lr)")
    p.add_argument("--base-batch", type=int, default=0, help="RL Zoo's default rollout, n_steps x n_envs (batch_lr)")
    p.add_argument("--base-minibatch", type=int, default=64, help="RL Zoo's default batch_size (batch_lr)")
    args = p.parse_args(argv[:cut])
    if args.space == "batch_lr" and not (args.batches and args.base_batch > 0):
        p.error("--space batch_lr needs --batches and --base-batch")
    return args, argv[cut + 1 :]


def counted(path: Path) -> dict[str, int]:
    """The env steps FILE has counted so far: training, evaluation, and the number of learn() calls."""
    out = {"train_env_steps": 0, "eval_env_steps": 0, "trials": 0}
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:  # a line cut short by a kill
            continue
        out["train_env_steps"] += int(row.get("train_env_steps", 0))
        out["eval_env_steps"] += int(row.get("eval_env_steps", 0))
        out["trials"] += 1
    return out


class BatchLrSampler:
    """RL Zoo's sampler signature over batch x lr only; SB3's n_steps and batch_size as user attrs."""

    def __init__(self, lr_min: float, lr_max: float, batches: list[int], base_batch: int, base_minibatch: int):
        self.lr_min, self.lr_max, self.batches = lr_min, lr_max, batches
        self.base_batch, self.base_minibatch = base_batch, base_minibatch

    def __call__(self, trial: Any, n_actions: int, n_envs: int, additional_args: dict) -> dict[str, Any]:
        from rayrl.sweep.ladder import minibatch_for

        lr = trial.suggest_float(LR, self.lr_min, self.lr_max, log=True)
        batch = int(trial.suggest_categorical(BATCH, self.batches))
        n_steps = max(1, batch // n_envs)
        minibatch = minibatch_for(n_steps * n_envs, self.base_batch, self.base_minibatch)
        trial.set_user_attr("n_steps", n_steps)
        trial.set_user_attr("batch_size", minibatch)
        return {"learning_rate": lr, "n_steps": n_steps, "batch_size": minibatch}


def patch(args: argparse.Namespace) -> None:
    """Counting, the budget and (batch_lr) the sampler, applied to the classes RL Zoo uses."""
    import optuna
    import stable_baselines3.common.callbacks as sb3_callbacks
    from rl_zoo3 import hyperparams_opt
    from rl_zoo3.exp_manager import ExperimentManager
    from stable_baselines3 import PPO

    evals = [0]
    evaluate: Any = sb3_callbacks.evaluate_policy

    def counting_evaluate(*a: Any, **k: Any) -> Any:
        out = evaluate(*a, **k)
        if k.get("return_episode_rewards"):  # EvalCallback's call: (returns, lengths)
            evals[0] += int(sum(out[1]))
        return out

    learn = PPO.learn

    def counting_learn(self: Any, *a: Any, **k: Any) -> Any:
        evals[0] = 0
        try:
            return learn(self, *a, **k)
        finally:
            row = {"train_env_steps": int(self.num_timesteps), "eval_env_steps": evals[0]}
            with args.count.open("a") as f:
                f.write(json.dumps(row) + "\n")

    objective = ExperimentManager.objective

    def budgeted_objective(self: Any, trial: Any) -> float:
        if args.budget and counted(args.count)["train_env_steps"] >= args.budget:
            trial.study.stop()
            raise optuna.TrialPruned("the benchmark's env-step budget is spent")
        return objective(self, trial)

    sb3_callbacks.evaluate_policy = counting_evaluate
    PPO.learn = counting_learn  # type: ignore[method-assign]
    ExperimentManager.objective = budgeted_objective  # type: ignore[method-assign]
    if args.space == "batch_lr":
        batches = [int(b) for b in args.batches.split(",")]
        sampler = BatchLrSampler(args.lr_min, args.lr_max, batches, args.base_batch, args.base_minibatch)
        hyperparams_opt.HYPERPARAMS_SAMPLER["ppo"] = sampler


def main(argv: list[str] | None = None) -> int:
    args, zoo_args = parse(list(sys.argv[1:] if argv is None else argv))
    args.count.parent.mkdir(parents=True, exist_ok=True)
    patch(args)
    from rl_zoo3.train import train

    sys.argv = ["rl_zoo3.train", *zoo_args]
    train()
    return 0


if __name__ == "__main__":
    sys.exit(main())
