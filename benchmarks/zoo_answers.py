"""RL Zoo's side of benchmarks/tuners.py: its command, its answer, that answer in SB3 and as a rayrl spec.

The answer of ``rl_zoo3.train --optimize`` is its study's best trial (highest last evaluation), read
from the study's journal file (``--storage FILE.log``), else from the report CSV RL Zoo writes. It is
kept as JSON: SB3 PPO keyword arguments over RL Zoo's defaults for the env (hyperparams/ppo.yml, as
RL Zoo's ExperimentManager lays the sampled values over them), with ``n_envs``, ``normalize`` and the
activation by name. ``sb3_model`` builds it as RL Zoo would train it; ``rayrl_overrides`` says what of
it a rayrl spec can express and lists what it cannot.
"""

from __future__ import annotations

import csv
import json
import math
import sys
from pathlib import Path
from typing import Any

from benchmarks import zoo_optimize

SPACES = {"zoo_optimize": "zoo", "zoo_optimize_batch_lr": "batch_lr"}  #: tuner -> zoo_optimize --space
ACTIVATIONS = {"Tanh": "tanh", "ReLU": "relu", "ELU": "elu", "LeakyReLU": "leaky_relu"}
RAYRL_ACTIVATIONS = ("tanh", "relu", "elu")
#: SB3 PPO defaults a Zoo entry leaves out, which a rayrl spec must then say
SB3_DEFAULTS = {"batch_size": 64, "vf_coef": 0.5, "max_grad_norm": 0.5, "ent_coef": 0.0, "clip_range": 0.2}
#: keys of a Zoo entry that are not SB3 keyword arguments
NOT_KWARGS = ("n_envs", "n_timesteps", "policy", "normalize")


def defaults(env_id: str) -> dict[str, Any] | None:
    """RL Zoo's PPO entry for ``env_id`` (hyperparams/ppo.yml of the installed rl_zoo3), or None."""
    try:
        import rl_zoo3
    except ImportError:
        return None
    import yaml

    entries = yaml.safe_load((Path(rl_zoo3.__file__).parent / "hyperparams" / "ppo.yml").read_text())
    entry = entries.get(env_id)
    return dict(entry) if isinstance(entry, dict) else None


def unsupported(env_id: str) -> str | None:
    """Why the Zoo tuners cannot run on ``env_id`` (None: they can)."""
    try:
        import rl_zoo3  # noqa: F401
    except ImportError:
        return "rl_zoo3 is not installed (pip install -e '.[bench]')"
    entry = defaults(env_id)
    if entry is None:
        return f"RL Zoo has no PPO entry for {env_id} in its hyperparams/ppo.yml"
    odd = sorted(k for k, v in entry.items() if k in ("env_wrapper", "frame_stack", "callback") or k.endswith("_class"))
    if odd or isinstance(entry.get("policy_kwargs"), str):
        return f"RL Zoo's PPO entry for {env_id} needs wrappers or evaluated kwargs ({odd or 'policy_kwargs'})"
    return None


def rollout(entry: dict[str, Any]) -> tuple[int, int]:
    """RL Zoo's default (rollout batch = n_steps x n_envs, minibatch) for an entry (SB3's defaults filled in)."""
    n_envs = int(entry.get("n_envs", 1))
    return int(entry.get("n_steps", 2048)) * n_envs, int(entry.get("batch_size", SB3_DEFAULTS["batch_size"]))


def command(
    tuner: str,
    env_id: str,
    *,
    n_trials: int,
    n_timesteps: int,
    n_evaluations: int,
    seed: int,
    folder: Path,
    budget: int,
    lr_range: tuple[float, float],
    batches: list[int],
) -> list[str]:
    """The subprocess that runs one Zoo tuner: RL Zoo's own CLI through the counting wrapper."""
    space = SPACES[tuner]
    ours = ["--count", str(folder / "count.jsonl"), "--budget", str(budget), "--space", space]
    if space == "batch_lr":
        base_batch, base_minibatch = rollout(defaults(env_id) or {})
        ours += [
            "--lr-min",
            repr(lr_range[0]),
            "--lr-max",
            repr(lr_range[1]),
            "--batches",
            ",".join(map(str, batches)),
            "--base-batch",
            str(base_batch),
            "--base-minibatch",
            str(base_minibatch),
        ]
    zoo = [
        "--algo", "ppo", "--env", env_id, "--optimize",
        "--n-trials", str(n_trials), "--max-total-trials", str(n_trials),
        "--n-timesteps", str(n_timesteps), "--n-evaluations", str(n_evaluations),
        "--sampler", "tpe", "--pruner", "median", "--n-jobs", "1", "--seed", str(seed),
        "--storage", str(folder / "study.log"), "--study-name", study_name(tuner, env_id, seed),
        "-f", str(folder / "logs"), "--no-optim-plots", "--device", "cpu", "--num-threads", "1",
    ]  # fmt: skip
    return [sys.executable, "-m", "benchmarks.zoo_optimize", *ours, "--", *zoo]


def study_name(tuner: str, env_id: str, seed: int) -> str:
    return f"{tuner}-{env_id}-seed{seed}"


# ---- the study's answer -----------------------------------------------------------------------


def read_study(storage: Path, name: str) -> dict[str, Any] | None:
    """The best trial of a Zoo study in a journal file: params, user attrs, value, and trial counts."""
    import optuna

    if not storage.exists():
        return None
    backend = optuna.storages.journal.JournalFileBackend(str(storage))
    study = optuna.load_study(study_name=name, storage=optuna.storages.JournalStorage(backend))
    states = [t.state.name for t in study.trials]
    done = [t for t in study.trials if t.state.name == "COMPLETE" and t.value is not None]
    if not done:
        return None
    best = max(done, key=lambda t: float(t.value))
    return {
        "params": dict(best.params),
        "user_attrs": dict(best.user_attrs),
        "value": float(best.value),
        "trial": best.number,
        "trials": len(states),
        "complete": states.count("COMPLETE"),
        "pruned": states.count("PRUNED"),
        "source": str(storage),
    }


def read_report(logs: Path) -> dict[str, Any] | None:
    """The same from RL Zoo's report CSV (logs/ppo/report_*.csv, optuna's trials_dataframe), the newest."""
    reports = sorted(logs.glob("ppo/report_*.csv"))
    if not reports:
        return None
    with reports[-1].open() as f:
        rows = list(csv.DictReader(f))
    done = [r for r in rows if r.get("state") == "COMPLETE" and r.get("value") not in ("", None)]
    if not done:
        return None
    best = max(done, key=lambda r: float(r["value"]))
    return {
        "params": {k[len("params_") :]: _scalar(v) for k, v in best.items() if k.startswith("params_") and v != ""},
        "user_attrs": {
            k[len("user_attrs_") :]: _scalar(v) for k, v in best.items() if k.startswith("user_attrs_") and v != ""
        },
        "value": float(best["value"]),
        "trial": int(best["number"]),
        "trials": len(rows),
        "complete": len(done),
        "pruned": sum(r.get("state") == "PRUNED" for r in rows),
        "source": str(reports[-1]),
    }


def _scalar(text: str) -> Any:
    """A CSV cell as int, float or str (pandas writes 6.0 for an int column that has gaps)."""
    try:
        value = float(text)
    except ValueError:
        return text
    return int(value) if value.is_integer() else value


def answer(space: str, best: dict[str, Any], env_id: str) -> dict[str, Any]:
    """The SB3 settings of a study's best trial over RL Zoo's defaults for ``env_id`` (JSON-able)."""
    entry = defaults(env_id) or {}
    out = {k: v for k, v in entry.items() if k != "n_timesteps"}
    out.setdefault("n_envs", 1)
    if space == "batch_lr":
        attrs = best["user_attrs"]
        out.update(
            learning_rate=float(best["params"][zoo_optimize.LR]),
            n_steps=int(attrs["n_steps"]),
            batch_size=int(attrs["batch_size"]),
        )
        return out
    from rl_zoo3.hyperparams_opt import convert_onpolicy_params

    sampled = convert_onpolicy_params(dict(best["params"]))
    kwargs = dict(sampled.pop("policy_kwargs"))
    kwargs["activation_fn"] = ACTIVATIONS[kwargs["activation_fn"].__name__]
    policy_kwargs = dict(out.get("policy_kwargs") or {})
    policy_kwargs.update(kwargs)
    out.update(sampled, policy_kwargs=policy_kwargs)
    return out


def within(answer: dict[str, Any], lr_range: tuple[float, float], batches: list[int]) -> bool:
    """Whether a batch x lr answer lies in the space it was searched in."""
    lr, batch = float(answer["learning_rate"]), int(answer["n_steps"]) * int(answer["n_envs"])
    return lr_range[0] * (1 - 1e-9) <= lr <= lr_range[1] * (1 + 1e-9) and batch in batches


# ---- judging the answer -----------------------------------------------------------------------


def schedule(value: Any) -> Any:
    """RL Zoo's ``lin_X`` strings as SB3 schedules (linear from X to 0 over the run); numbers as they are."""
    if isinstance(value, str) and value.startswith("lin_"):
        start = float(value[len("lin_") :])
        return lambda progress_remaining: progress_remaining * start
    return value


def has_schedule(answer: dict[str, Any]) -> bool:
    return any(isinstance(v, str) and v.startswith("lin_") for v in answer.values())


def sb3_model(answer: dict[str, Any], env_id: str, seed: int) -> Any:
    """An SB3 PPO with ``answer``'s settings, as RL Zoo trains it (not yet trained)."""
    import torch.nn as nn
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    kwargs = {k: schedule(v) for k, v in answer.items() if k not in NOT_KWARGS}
    policy_kwargs = dict(kwargs.pop("policy_kwargs", None) or {})
    if "activation_fn" in policy_kwargs:
        names = {v: k for k, v in ACTIVATIONS.items()}
        policy_kwargs["activation_fn"] = getattr(nn, names[policy_kwargs["activation_fn"]])
    env = make_vec_env(env_id, n_envs=int(answer.get("n_envs", 1)), seed=seed)
    if answer.get("normalize"):
        env = VecNormalize(env, gamma=float(answer.get("gamma", 0.99)))
    return PPO(
        answer.get("policy", "MlpPolicy"),
        env,
        policy_kwargs=policy_kwargs or None,
        seed=seed,
        device="cpu",
        verbose=0,
        **kwargs,
    )


def rayrl_overrides(answer: dict[str, Any], continuous: bool, horizon: int) -> tuple[list[str], list[str]]:
    """``--set`` overrides that put ``answer`` into a rayrl spec, and what does not map (with why).

    ``horizon``: RL Zoo's n_timesteps for the env, the end of a ``lin_`` schedule (rayrl's stop.env_steps).
    """
    a = {**SB3_DEFAULTS, **answer}
    n_envs = int(a.get("n_envs", 1))
    batch = int(a.get("n_steps", 2048)) * n_envs
    sets: dict[str, Any] = {
        "env.envs_per_runner": n_envs,
        "algo.train_batch_per_learner": batch,
        "algo.minibatch_size": min(int(a["batch_size"]), batch),
        "algo.epochs": int(a.get("n_epochs", 10)),
        "algo.gamma": float(a.get("gamma", 0.99)),
        "algo.gae_lambda": float(a.get("gae_lambda", 0.95)),
        "algo.entropy_coeff": float(a["ent_coef"]),
        "algo.vf_loss_coeff": float(a["vf_coef"]),
        "algo.grad_clip": float(a["max_grad_norm"]),
        "algo.vf_clip": None,  # SB3 does not clip the value loss
        "algo.adam_eps": 1e-5,  # SB3 PPO's Adam
        "model.init": "orthogonal",  # SB3's ortho_init default
        "model.vf_share_layers": False,
        "algo.lr_final": None,
        "algo.clip_final": None,
    }
    for key, final_key, final in (("learning_rate", "algo.lr", 0.0), ("clip_range", "algo.clip", 1e-4)):
        value = a[key] if key in a else 3e-4
        if isinstance(value, str) and value.startswith("lin_"):
            sets[final_key] = float(value[len("lin_") :])
            sets[f"{final_key}_final"] = final  # rayrl's clip_final must be > 0; SB3 ends at 0
            sets["stop.env_steps"] = horizon
        else:
            sets[final_key] = float(value)
    unmapped = []
    pk = dict(a.get("policy_kwargs") or {})
    arch = pk.get("net_arch", [64, 64])
    if isinstance(arch, dict) and arch.get("pi") != arch.get("vf"):
        unmapped.append(f"policy_kwargs.net_arch {arch} (rayrl's policy and value MLPs have the same sizes)")
    else:
        sets["model.hidden"] = list(arch["pi"] if isinstance(arch, dict) else arch)
    activation = pk.get("activation_fn", "tanh")
    if activation in RAYRL_ACTIVATIONS:
        sets["model.activation"] = activation
    else:
        unmapped.append(f"policy_kwargs.activation_fn {activation} (rayrl has {', '.join(RAYRL_ACTIVATIONS)})")
    if continuous:
        sets["model.free_log_std"] = True  # SB3's Gaussian: a state-independent log std
        sets["model.log_std_init"] = float(pk.get("log_std_init", 0.0))
    if a.get("normalize"):
        sets["model.normalize_obs"] = True
        sets["algo.normalize_reward"] = True
    for key in ("use_sde", "sde_sample_freq"):
        if a.get(key):
            unmapped.append(f"{key} {a[key]} (rayrl has no generalized state-dependent exploration)")
    known = {"n_steps", "n_epochs", "gamma", "gae_lambda", "policy_kwargs", "use_sde", "sde_sample_freq"}
    known |= set(SB3_DEFAULTS) | set(NOT_KWARGS) | {"learning_rate"}
    unmapped += [f"{k} {a[k]} (no rayrl field)" for k in sorted(set(a) - known)]
    return [f"{k}={json.dumps(v)}" for k, v in sets.items()], unmapped


def finite(value: Any) -> float | None:
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None
