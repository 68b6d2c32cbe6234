"""Env steps per second, side by side: the bare loop, sampling alone, and end to end (PPO, the env of --config).

Three measurements in one run, each contender's order rotated round by round so load from other
jobs on a shared machine hits all alike; figures are medians over every measured sample. The env
of ``--config`` (CartPole-v1 by default; e.g. Hopper-v5 with experiments/configs/mujoco_hopper_ppo.yaml)
picks the peers, as in time_to_reward.py.

* **the limit** (no Ray, no learning, one core): gymnasium's vectorised env stepped by the forward
  pass of the same policy network and sampled actions (Box actions unsquashed/clipped as the
  runners do): ``limit`` at rayrl's env count, ``limit_best`` at the best of a few env counts. The
  env is gymnasium's numpy-vectorised one where the env registers a vector entry point (CartPole),
  else a SyncVectorEnv (MuJoCo); ``limit_vectorization_mode`` says which. No observation filter.
* **sampling alone** (in-process, one core, the same config, weights and env): RLlib's
  SingleAgentEnvRunner on the same env as the fast runner (``rllib_runner``: the numpy-vectorised
  env, or a SyncVectorEnv where there is none), on its default SyncVectorEnv (``rllib_runner_sync``),
  and rayrl's fast runner (``fast_runner``).
* **end to end** (driver-timed ``train()``, or SB3's ``learn()``): the contenders of
  ``contenders.py``: ``rllib_same_settings``, ``rllib_tuned_example`` (CartPole-v1 only: RLlib ships
  no tuned example for other envs; left out elsewhere, ``left_out`` says why, its figure is null),
  ``sb3_zoo`` (RL Zoo's tuned settings for the env: CartPole-v1, Hopper-v4/v5), ``sb3_same_settings``
  (SB3 at the spec's settings: ``same_settings_gaps`` lists what SB3 cannot take), ``rayrl_rllib_runner``
  (``env.runner: rllib``), ``rayrl`` (``env.runner: fast``, whatever the spec says) and
  ``rayrl_sample_ahead`` (the same with ``algo.sample_ahead: true`` on at least one remote runner: the
  same settings, but each batch trained one update after the weights that sampled it). RLlib's
  tuned example and ``sb3_zoo`` use their own settings: their ratios to rayrl compare settings, not
  platforms; ``rllib_same_settings`` and ``sb3_same_settings`` are the platform comparisons. A spec's
  evaluation section (Hopper's) runs as configured, in rayrl's and rllib_same_settings' iterations alike.

Whether rayrl's fast path actually runs is reported (``rayrl_fast_path``): the fast runner falls back
to RLlib's own loop for what it does not handle (e.g. env-to-module connectors other than the single
MeanStdFilter ``model.normalize_obs: true`` adds, which the fast loop applies itself). A contender
that raises is recorded under ``failed`` (its figures null) and the run goes on.

rayrl's settings are the spec's (``--config``) at its batch, or at ``--batch``, or at the knee of a
sweep's ladder (``--doubling``), or of a ladder run here as a sweep's phase 1 does (``--ladder``).

    python -m benchmarks.throughput --out t.json             # 3 rounds, about 5 minutes on 2 cores
    python -m benchmarks.throughput --quick                  # 1 round, short samples: a smoke test
    python -m benchmarks.throughput --ladder --out t.json    # the doubling ladder first (+3 minutes)
    python -m benchmarks.throughput --batch 256 --set algo.minibatch_size=256 --set algo.epochs=20 --out t256.json
    python -m benchmarks.throughput --config experiments/configs/mujoco_hopper_ppo.yaml --out t_hopper.json
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import common as C
from benchmarks import contenders as K

SAMPLING = ("rllib_runner", "rllib_runner_sync", "fast_runner")
END_TO_END = (
    "rllib_same_settings",
    "rllib_tuned_example",
    "sb3_zoo",
    "sb3_same_settings",
    "rayrl_rllib_runner",
    "rayrl",
    "rayrl_sample_ahead",
)
GOALS = {"fast_over_rllib_runner": 2.0, "fast_over_limit": 0.70, "rayrl_over_rllib_same_settings": 1.6}
#: At small batches (<= 256) the per-iteration cost decides: rayrl against SB3 and stock RLlib at its settings.
SMALL_BATCH = 256
SMALL_BATCH_GOALS = {"rayrl_over_sb3_same_settings": 1.5, "rayrl_over_rllib_same_settings": 2.0}
#: the issue's end-to-end goal on the MuJoCo config is lower (a MuJoCo step costs more, so sampling is less of it)
E2E_GOAL_BY_ENV = {"Hopper-v5": 1.3, "Hopper-v4": 1.3}


def goals_for(env_id: str, batch: int | None = None) -> dict[str, float]:
    """The goals for ``env_id``: CartPole's, with the end-to-end ratio lowered to 1.3 on MuJoCo; at a batch of
    at most SMALL_BATCH, the small-batch goals against SB3 and stock RLlib at the same settings."""
    out = {
        **GOALS,
        "rayrl_over_rllib_same_settings": E2E_GOAL_BY_ENV.get(env_id, GOALS["rayrl_over_rllib_same_settings"]),
    }
    if batch is not None and batch <= SMALL_BATCH:
        out.update(SMALL_BATCH_GOALS)
    return out


def end_to_end_peers(env_id: str, skip: list[str] | tuple[str, ...] = ()) -> tuple[list[str], dict[str, str]]:
    """The end-to-end contenders run on ``env_id`` (in END_TO_END's order, minus ``--skip``) and those left out
    there with why (time_to_reward's ``left_out``: sb3_zoo and rllib_tuned_example are env-specific)."""
    why = {name: reason for name, reason in K.left_out(env_id).items() if name in END_TO_END}
    return [c for c in END_TO_END if c not in why and c not in skip], why


def vector_mode(env_id: str) -> str:
    """gymnasium's vectorization mode for the bare loop: the env's numpy-vectorised implementation where it
    registers one (the condition of rayrl.sampling.backends.gymnasium_vector, which the fast runner steps),
    else ``sync`` (what the fast runner then leaves to RLlib: a SyncVectorEnv over gym.make; MuJoCo)."""
    import gymnasium as gym

    if env_id in gym.registry and gym.spec(env_id).vector_entry_point is not None:
        return "vector_entry_point"
    return "sync"


def env_actions(act_space: Any, normalize: bool, clip: bool) -> Callable[[Any], Any]:
    """Sampled actions as the env takes them, as rayrl's fast runner (``_env_actions``) and RLlib's
    NormalizeAndClipActions do: Box actions unsquashed (``normalize_actions``) or clipped (``clip_actions``)."""
    from gymnasium import spaces
    from ray.rllib.utils.spaces.space_utils import clip_action, unsquash_action

    if isinstance(act_space, spaces.Box):
        if normalize:
            return lambda a: unsquash_action(a, act_space)
        if clip:
            return lambda a: clip_action(a, act_space)
    return lambda a: a


def fast_path(reason: str | None, normalize_obs: bool, error: str | None = None) -> dict[str, Any]:
    """The report's ``rayrl_fast_path``: did the fast runner take its fast path (``fast_off_reason`` None), or
    fall back to RLlib's loop, and why; ``error`` if its sampling raised."""
    out: dict[str, Any] = {
        "active": reason is None,
        "fast_off_reason": reason,
        "error": error,
        "source": "FastEnvRunner.fast_off_reason of the in-process fast_runner, built from "
        "rayrl's config with env.runner fast (the same config its env runners get)",
    }
    if reason is None and error:
        note = f"the fast path is taken (fast_off_reason is None) but its sampling raised: {error}"
    elif reason is None:
        note = "the fast path is active: fast_runner and rayrl (env.runner fast) sample with rayrl's loop"
    else:
        note = (
            f"the fast path is OFF ({reason}): fast_runner and rayrl sample with RLlib's own loop, so "
            f"their speed-up over RLlib is ~1x by construction"
        )
        if normalize_obs and "connector" in reason:
            note += (
                "; the fast loop applies model.normalize_obs's MeanStdFilter itself, so another custom "
                "env-to-module connector is set"
            )
        if error:
            note += f"; its sampling raised: {error}"
    out["note"] = note
    return out


def error_text(exc: BaseException, limit: int = 300) -> str:
    """An exception in one line: its type and the last line of its message (Ray wraps remote errors)."""
    lines = [x.strip() for x in str(exc).strip().splitlines() if x.strip()]
    text = f"{type(exc).__name__}: {lines[-1] if lines else ''}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def rollout_limit(spec: Any, num_envs: int, seconds: float, seed: int = 0, chunk_s: float = 0.5) -> list[float]:
    """Env steps/s of the vectorised env (``vector_mode``) stepped by the policy's forward pass and the same
    action sampling as the runners (RLlib's distribution class, Box actions unsquashed/clipped), nothing else;
    one core; one figure a chunk."""
    import gymnasium as gym
    import numpy as np
    import torch

    env = gym.make_vec(spec.env.id, num_envs=num_envs, vectorization_mode=vector_mode(spec.env.id), **spec.env.config)
    config = K.rayrl(spec, "rllib")
    module = config.get_rl_module_spec(
        spaces={"default_policy": (env.single_observation_space, env.single_action_space)}
    ).build()
    module.eval()  # once: forward_exploration would switch modes twice a call
    dist_cls = module.get_exploration_action_dist_cls()
    to_env = env_actions(env.single_action_space, config.normalize_actions, config.clip_actions)
    torch.manual_seed(seed)
    out: list[float] = []
    try:
        obs, _ = env.reset(seed=seed)
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            steps, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < chunk_s:
                with torch.no_grad():
                    # float32 as RLlib's tensors are (MuJoCo observations are float64; CartPole's are float32)
                    batch = {"obs": torch.from_numpy(np.asarray(obs, dtype=np.float32))}
                    logits = module._forward_exploration(batch)["action_dist_inputs"]
                    actions = dist_cls.from_logits(logits).sample().numpy()
                obs, _, _, _, _ = env.step(to_env(actions))
                steps += num_envs
            out.append(steps / (time.perf_counter() - t0))
    finally:
        env.close()
    return out


def sampling_modes(env_id: str) -> dict[str, str]:
    """The vectorization mode of each sampling-alone runner: rllib_runner on the fast runner's env (the
    numpy-vectorised one, or SyncVectorEnv where the env has none), rllib_runner_sync on RLlib's default."""
    mode = vector_mode(env_id)
    return {"rllib_runner": mode, "rllib_runner_sync": "sync", "fast_runner": mode}


def sampling_runners(spec: Any) -> dict[str, Any]:
    """RLlib's runner (the fast runner's env and SyncVectorEnv) and the fast runner, in-process, equal weights.
    The fast runner's ``fast_off_reason`` says whether it samples with its fast path."""
    from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner

    from rayrl.sampling.fast_runner import FastEnvRunner

    def make(cls: type, runner: str, mode: str) -> Any:
        config = K.rayrl(spec, runner).env_runners(gym_env_vectorize_mode=mode)
        return cls(config=config, worker_index=1)

    runners = {
        "rllib_runner": make(SingleAgentEnvRunner, "rllib", vector_mode(spec.env.id)),
        "rllib_runner_sync": make(SingleAgentEnvRunner, "rllib", "sync"),
        "fast_runner": make(FastEnvRunner, "fast", "sync"),
    }
    state = runners["rllib_runner"].module.get_state()
    for r in runners.values():
        r.module.set_state(state)
    return runners


def sample_sps(env_runner: Any, steps: int, seconds: float) -> list[float]:
    """Env steps/s of ``sample(num_timesteps=steps)`` calls for about ``seconds``; one figure a call."""
    out: list[float] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end or not out:
        t0 = time.perf_counter()
        n = sum(len(e) for e in env_runner.sample(num_timesteps=steps, explore=True))
        out.append(n / (time.perf_counter() - t0))
    return out


def end_to_end(name: str, spec: Any, args: argparse.Namespace) -> tuple[list[float], dict]:
    """Per-iteration env steps/s of one contender (built, warmed up, timed, stopped)."""
    if name == "sb3_zoo":
        env_id = spec.env.id
        model = K.sb3_zoo(seed=spec.seed, env_id=env_id)
        # 4 rollouts + updates a sample (CartPole: 8 envs x 32 steps x 4; Hopper: 1 x 512 x 4)
        chunk = model.n_envs * model.n_steps * 4
        horizon = K.zoo_timesteps(env_id)
        K.sb3_learn(model, chunk * args.warmup, horizon=horizon)
        sps = []
        for _ in range(args.iters):
            r = K.sb3_learn(model, chunk, horizon=horizon)
            sps.append(r["env_steps"] / r["wall_s"])
        return sps, {}
    if name == "sb3_same_settings":
        model = K.sb3_same_settings(spec)
        chunk = model.n_envs * model.n_steps * max(1, math.ceil(2048 / (model.n_envs * model.n_steps)))
        K.sb3_learn(model, chunk * args.warmup, horizon=10**9)
        sps = []
        for _ in range(args.iters):
            r = K.sb3_learn(model, chunk, horizon=10**9)
            sps.append(r["env_steps"] / r["wall_s"])
        return sps, {}
    config = {
        "rllib_same_settings": lambda: K.rllib_same_settings(spec),
        "rllib_tuned_example": lambda: K.rllib_tuned_example(seed=spec.seed),
        "rayrl_rllib_runner": lambda: K.rayrl(spec, "rllib"),
        "rayrl": lambda: K.rayrl(spec, "fast"),
        "rayrl_sample_ahead": lambda: K.rayrl_sample_ahead(spec, "fast"),
    }[name]()
    timed = C.run_iterations(config, warmup=args.warmup, iters=args.iters)
    check_sampled(name, timed.sps)
    return timed.sps, timer_medians(timed.timers)


def check_sampled(name: str, sps: list[float]) -> None:
    """Raise when no timed iteration sampled an env step: RLlib takes a runner that raised out of service and
    ``train()`` goes on with 0 env steps, which is a failure, not a figure of 0 env steps/s."""
    if sps and not any(x > 0 for x in sps):
        raise RuntimeError(
            f"{name}: 0 env steps in {len(sps)} timed iterations: its env runners failed (RLlib "
            f"took them out of service; their error is in the log above)"
        )


def timer_medians(timers: list[dict]) -> dict[str, float]:
    names = ("env_runner_sampling_timer", "learner_update_timer", "training_iteration")
    return {n: C.median([t.get(n, float("nan")) for t in timers]) for n in names if timers}


def rounds(
    names: tuple[str, ...], n: int, measure: Callable[[str, int], list[float]], failed: dict[str, str] | None = None
) -> dict[str, list[list[float]]]:
    """``n`` rounds of every contender, the order rotated each round; per contender, per round samples.
    With ``failed``, a contender that raises is recorded there (type and message) and not run again."""
    out: dict[str, list[list[float]]] = {c: [] for c in names}
    for rnd in range(n):
        k = rnd % len(names)
        for name in names[k:] + names[:k]:
            if failed is not None and name in failed:
                continue
            try:
                sps = measure(name, rnd)
            except Exception as exc:  # noqa: BLE001 - one contender's failure is a finding, not the run's end
                if failed is None:
                    raise
                failed[name] = error_text(exc)
                C.say(f"[round {rnd + 1}/{n}] {name:<20} FAILED: {failed[name]}")
                continue
            out[name].append(sps)
            C.say(f"[round {rnd + 1}/{n}] {name:<20} {C.median(sps):>10,.0f} env steps/s ({len(sps)} samples)")
    return out


def knee_spec(spec: Any, args: argparse.Namespace) -> tuple[Any, str, list[dict]]:
    if args.batch:
        return C.spec_at_batch(spec, args.batch), f"--batch {args.batch}", []
    if args.doubling:
        knee, ladder = C.read_knee(args.doubling)
        return C.spec_at_batch(spec, knee), f"knee of {args.doubling}", ladder
    if args.ladder:
        from rayrl import runfolder, runtime
        from rayrl.sweep import phases

        storage = args.ladder_storage or Path(tempfile.mkdtemp(prefix="rayrl-bench-ladder-"))
        rows, _ = phases.ladder(spec, runtime.resolve(str(storage), "throughput-ladder"))
        knee = runfolder.knee(rows)
        if knee is None:
            raise SystemExit(f"the ladder's first rung failed; see {storage}")
        return C.spec_at_batch(spec, knee), f"knee of the doubling ladder run in {storage}", C.ladder_dicts(rows)
    return spec, "the spec's batch", []


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="1 round, short samples: a smoke test")
    p.add_argument("--out", type=Path, help="also write the figures as JSON here")
    p.add_argument(
        "--config",
        type=Path,
        default=C.DEFAULT_CONFIG,
        help="rayrl spec; its env id picks the peers "
        "(sb3_zoo: CartPole-v1, Hopper-v4/v5; rllib_tuned_example: CartPole-v1 only, left out elsewhere) "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="K=V",
        help="override a spec field, e.g. --set env.envs_per_runner=32",
    )
    p.add_argument("--batch", type=int, help="rayrl's train batch (default: the spec's)")
    p.add_argument("--doubling", type=Path, help="take the knee of a sweep's doubling.csv, summary.json or run folder")
    p.add_argument("--ladder", action="store_true", help="run the doubling ladder (a sweep's phase 1) for the knee")
    p.add_argument("--ladder-storage", type=Path, help="where the ladder's run folder goes (default: a temp dir)")
    p.add_argument("--rounds", type=int, help="side-by-side rounds (default 3; quick 1)")
    p.add_argument("--warmup", type=int, help="untimed end-to-end iterations after each build (default 1; quick 1)")
    p.add_argument("--iters", type=int, help="timed end-to-end iterations a round (default 4; quick 2)")
    p.add_argument("--limit-seconds", type=float, help="seconds of bare-loop stepping a round (default 3; quick 2)")
    p.add_argument(
        "--limit-envs",
        type=int,
        nargs="+",
        help="env counts tried for limit_best (default 8 32 128 512; "
        "quick 8 64); a SyncVectorEnv where the env has no numpy-vectorised version (MuJoCo)",
    )
    p.add_argument("--sample-seconds", type=float, help="seconds of runner sampling a round (default 4; quick 2)")
    p.add_argument("--skip", nargs="+", default=[], choices=END_TO_END, help="end-to-end contenders to leave out")
    C.add_torch_threads(p)
    args = p.parse_args(argv)
    q = args.quick
    args.rounds = C.mode_default(args.rounds, 1, 3, q)
    args.warmup = C.mode_default(args.warmup, 1, 1, q)
    args.iters = C.mode_default(args.iters, 2, 4, q)
    args.limit_seconds = C.mode_default(args.limit_seconds, 2.0, 3.0, q)
    args.sample_seconds = C.mode_default(args.sample_seconds, 2.0, 4.0, q)
    args.limit_envs = C.mode_default(args.limit_envs, [8, 64], [8, 32, 128, 512], q)
    for name in ("rounds", "iters", "batch"):
        value = getattr(args, name)
        if value is not None and value < 1:
            p.error(f"--{name} must be >= 1, got {value}")
    if args.warmup < 0 or args.limit_seconds <= 0 or args.sample_seconds <= 0 or min(args.limit_envs) < 1:
        p.error("--warmup must be >= 0, --limit-seconds and --sample-seconds > 0, --limit-envs >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    C.quiet()
    import torch

    torch.set_num_threads(args.torch_threads)
    spec = C.load_spec(args.config, args.overrides)
    started = time.monotonic()
    envs = spec.env.envs_per_runner
    env_id = spec.env.id
    peers, left_out = end_to_end_peers(env_id, args.skip)
    for name, why in left_out.items():
        C.say(f"{name} left out on {env_id}: {why}")
    failed: dict[str, str] = {}
    with C.local_ray(torch_threads=args.torch_threads):
        spec, source, ladder = knee_spec(spec, args)
        C.say(f"rayrl's settings: batch {spec.algo.train_batch_per_learner} ({source}), {envs} envs a runner")
        # The bare loop at rayrl's env count is a sampling contender (rotated with the runners, so the ratios
        # compare neighbouring measurements on a busy machine); the other env counts only find limit_best.
        own = f"limit_{envs}"

        def limit_sps(name: str, rnd: int) -> list[float]:
            return rollout_limit(spec, int(name.split("_")[1]), args.limit_seconds, seed=rnd)

        limit = rounds(tuple(f"limit_{n}" for n in sorted(set(args.limit_envs) - {envs})), args.rounds, limit_sps)
        runners = sampling_runners(spec)
        fast_reason = runners["fast_runner"].fast_off_reason
        C.say(
            f"rayrl fast runner on {env_id}: fast path "
            + ("active" if fast_reason is None else f"OFF, RLlib's loop is used ({fast_reason})")
        )
        batch = spec.algo.train_batch_per_learner
        sampling = rounds(
            (own, *SAMPLING),
            args.rounds,
            lambda name, rnd: (
                limit_sps(name, rnd) if name == own else sample_sps(runners[name], batch, args.sample_seconds)
            ),
            failed,
        )
        limit[own] = sampling.pop(own)
        for r in runners.values():
            r.stop()
        timers: dict[str, dict] = {}

        def e2e(name: str, rnd: int) -> list[float]:
            sps, timers[name] = end_to_end(name, spec, args)
            return sps

        e2e_runs = rounds(tuple(peers), args.rounds, e2e, failed)
    report = figures(limit, sampling, e2e_runs, envs, spec.env.id, batch)
    if "sb3_same_settings" in e2e_runs:
        report["same_settings_gaps"] = K.same_settings_gaps(spec)
    for name in left_out:
        report[f"{name}_sps"] = None
    report.update(
        {
            "env_id": env_id,
            "left_out": left_out,
            "failed": failed,
            "limit_vectorization_mode": vector_mode(env_id),
            "sampling_vectorization_modes": sampling_modes(env_id),
            "rayrl_fast_path": fast_path(
                fast_reason, spec.model.normalize_obs, failed.get("fast_runner") or failed.get("rayrl")
            ),
            "timers_median_s": timers,
            "knee_source": source,
            "ladder": ladder,
            "rayrl_spec": {
                "batch": batch,
                "minibatch": spec.algo.minibatch_size,
                "epochs": spec.algo.epochs,
                "env_runners": spec.resources.env_runners,
                "envs_per_runner": envs,
                "hidden": spec.model.hidden,
                "normalize_obs": spec.model.normalize_obs,
                "evaluation_interval": spec.evaluation.interval,
            },
            "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "machine": C.machine(),
            "wall_s": round(time.monotonic() - started, 1),
        }
    )
    print_report(report)
    C.write_json(args.out, report)
    return 0


def figures(
    limit: dict, sampling: dict, e2e: dict, envs: int, env_id: str = "CartPole-v1", batch: int | None = None
) -> dict[str, Any]:
    """The JSON's figures: medians over all samples, ratios, goals; per-round medians kept."""
    med = {name: C.median([x for rnd in runs for x in rnd]) for name, runs in {**limit, **sampling, **e2e}.items()}
    best_name = max(limit, key=lambda n: med[n])
    out: dict[str, Any] = {
        "limit_sps": med[f"limit_{envs}"],
        "limit_envs": envs,
        "limit_best_sps": med[best_name],
        "limit_best_envs": int(best_name.split("_")[1]),
        **{f"{name}_sps": med[name] for name in (*SAMPLING, *e2e)},
    }
    r = C.ratio
    out["fast_over_rllib_runner"] = r(med["fast_runner"], med["rllib_runner"])
    out["fast_over_rllib_runner_sync"] = r(med["fast_runner"], med["rllib_runner_sync"])
    out["fast_over_limit"] = r(med["fast_runner"], out["limit_sps"])
    out["rllib_runner_over_limit"] = r(med["rllib_runner"], out["limit_sps"])
    if "rayrl" in e2e and "rllib_same_settings" in e2e:
        out["rayrl_over_rllib_same_settings"] = r(med["rayrl"], med["rllib_same_settings"])
        out["rayrl_rllib_runner_over_rllib_same_settings"] = r(
            med.get("rayrl_rllib_runner", float("nan")), med["rllib_same_settings"]
        )
    if "rayrl" in e2e and "sb3_same_settings" in e2e:
        out["rayrl_over_sb3_same_settings"] = r(med["rayrl"], med["sb3_same_settings"])
    # Sampling ahead trains each batch one update late: the same settings, one update of policy lag.
    for other in ("sb3_same_settings", "rllib_same_settings", "rayrl"):
        if "rayrl_sample_ahead" in e2e and other in e2e:
            out[f"rayrl_sample_ahead_over_{other}"] = r(med["rayrl_sample_ahead"], med[other])
    # Different settings: a comparison of configurations, never a platform result.
    for other in ("rllib_tuned_example", "sb3_zoo"):
        if other in e2e and "rayrl" in e2e:
            out[f"rayrl_over_{other}_different_settings"] = r(med["rayrl"], med[other])
    out["round_ratios_fast_over_rllib_runner"] = [
        r(C.median(f), C.median(g)) for f, g in zip(sampling["fast_runner"], sampling["rllib_runner"])
    ]
    out["goals"] = {
        k: {"goal": g, "value": out.get(k), "met": bool(out.get(k) is not None and out[k] >= g)}
        for k, g in goals_for(env_id, batch).items()
    }
    out["round_medians"] = {name: [C.median(x) for x in runs] for name, runs in {**limit, **sampling, **e2e}.items()}
    return out


def print_report(report: dict) -> None:
    lim = report["limit_sps"]
    rows = [
        [f"bare loop, {report['limit_envs']} envs", lim, 1.0, ""],
        [
            f"bare loop, best ({report['limit_best_envs']} envs)",
            report["limit_best_sps"],
            C.ratio(report["limit_best_sps"], lim),
            "",
        ],
    ]
    same_env = (
        "same numpy env"
        if report.get("limit_vectorization_mode", "vector_entry_point") == "vector_entry_point"
        else "same SyncVectorEnv"
    )
    labels = {
        "rllib_runner": f"RLlib SingleAgentEnvRunner ({same_env})",
        "rllib_runner_sync": "RLlib SingleAgentEnvRunner (SyncVectorEnv, its default)",
        "fast_runner": "rayrl fast runner",
        "rllib_same_settings": "stock RLlib, rayrl's settings",
        "rllib_tuned_example": "RLlib tuned example (its settings)",
        "sb3_zoo": "SB3 + RL Zoo (its settings)",
        "sb3_same_settings": "SB3, rayrl's settings",
        "rayrl_rllib_runner": "rayrl, env.runner rllib",
        "rayrl": "rayrl, env.runner fast",
        "rayrl_sample_ahead": "rayrl, fast, algo.sample_ahead (1 runner)",
    }
    for name in (*SAMPLING, *END_TO_END):
        if f"{name}_sps" in report:
            kind = "sampling" if name in SAMPLING else "end to end"
            if name in report.get("left_out", {}):
                kind = "left out"
            elif name in report.get("failed", {}):
                kind = "FAILED"
            sps = report[f"{name}_sps"]
            sps = float("nan") if sps is None else sps
            rows.append([labels[name], sps, C.ratio(sps, lim), kind])
    C.say("\nenv steps/s (median over all samples of all rounds):")
    C.say(C.table(["contender", "env steps/s", "x bare loop", "what"], rows))
    for k, g in report["goals"].items():
        v = g["value"]
        C.say(
            f"{k} = {v:.2f} (goal >= {g['goal']}: {'met' if g['met'] else 'MISSED'})"
            if v is not None and math.isfinite(v)
            else f"{k}: not measured"
        )
    for name, why in report.get("left_out", {}).items():
        C.say(f"{name}: left out on {report['env_id']}: {why}")
    for name, why in report.get("failed", {}).items():
        C.say(f"{name}: FAILED: {why}")
    if "rayrl_fast_path" in report:
        C.say(f"rayrl / fast_runner on {report['env_id']}: {report['rayrl_fast_path']['note']}")
    C.say(
        "fast / RLlib runner within each round: "
        + ", ".join(f"{x:.2f}" for x in report["round_ratios_fast_over_rllib_runner"])
    )
    m = report["machine"]
    C.say(
        f"machine: {m['nproc']} x {m['cpu_model']}, load {m['load_avg_1m']}; {m['date']}; "
        f"ray {m['ray']}, torch {m['torch']}; {report['wall_s']:.0f} s"
    )


if __name__ == "__main__":
    sys.exit(main())
