"""Atari on CPU, end to end at RL Zoo's Atari PPO settings: EnvPool + the fast runner vs RLlib's runner vs SB3.

Every contender trains PPO on ``ALE/Breakout-v5`` (no sticky actions) with RL Zoo's Atari settings
(hyperparams/ppo.yml ``atari``: 8 envs x 128 steps, 4 epochs of 256-sample minibatches, lr 2.5e-4 and
clip 0.1 both annealed linearly to 0 over the run, entropy 0.01, value coefficient 0.5, gradient
norm 0.5, gamma 0.99, lambda 0.95) and the same network (the Nature CNN: 32 8x8/4, 64 4x4/2,
64 3x3/1, a 512 layer, shared by policy and value), for ``--env-steps`` env steps:

* ``rayrl_envpool``: rayrl's spec with ``env.runner: fast`` and ``env.backend: envpool`` (EnvPool's
  C++ Atari env, set up as RLlib's preprocessing is: rayrl.sampling.backends);
* ``rayrl_rllib_runner``: the same spec on RLlib's own env runner and ale-py (RLlib's Atari wrapper);
* ``sb3_zoo``: Stable-Baselines3 PPO with Zoo's settings on its AtariWrapper (DummyVecEnv, 8 envs).

Both preprocess alike: 84x84 grayscale, 4 stacked frames, frameskip 4 max-pooled, up to 30 no-ops
and FIRE at reset, each life one episode, rewards clipped to their sign. The reported return is the
same measure for all: the mean clipped return per life of the last 20 lives (RLlib's episode; SB3's
Monitor sits above its AtariWrapper here, so it sees the same episodes). Env steps/s is end to end
(sampling, learning, everything a ``train()`` or ``learn()`` does), after the build; rayrl's run
in-process with a driver-timed ``train()`` loop, as benchmarks/throughput.py does.

Runs alternate contenders, the order rotated seed by seed. Killed, it continues: each finished run
is kept in ``--work``/runs.json and skipped on the next start.

    python -m benchmarks.atari --work bench-atari --out atari.json              # 100k steps, 3 seeds
    python -m benchmarks.atari --work /tmp/a --env-steps 4096 --seeds 1 --out a.json  # a smoke run
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks import common as C

CONFIG = C.ROOT / "experiments" / "configs" / "atari_breakout_ppo_cpu.yaml"
ENV_ID = "ALE/Breakout-v5"
CONTENDERS = ("rayrl_envpool", "rayrl_rllib_runner", "sb3_zoo")
SEED_BASE = 9300  #: seeds no tuning saw
#: The Nature CNN as rayrl conv_filters: the last "conv" (512 filters of 7x7 on a 7x7 map) is its dense layer.
NATURE_CNN = [[32, [8, 8], 4, "valid"], [64, [4, 4], 2, "valid"], [64, [3, 3], 1, "valid"], [512, [7, 7], 1, "valid"]]
#: RL Zoo's Atari PPO settings (hyperparams/ppo.yml), as rayrl spec overrides.
ZOO_ATARI = {
    "env.envs_per_runner": 8,
    "algo.train_batch_per_learner": 8 * 128,
    "algo.minibatch_size": 256,
    "algo.epochs": 4,
    "algo.lr": 2.5e-4,
    "algo.lr_final": 0.0,
    "algo.clip": 0.1,
    "algo.clip_final": 1e-4,  # rayrl needs > 0; SB3 anneals to 0 at the last step
    "algo.entropy_coeff": 0.01,
    "algo.vf_loss_coeff": 0.5,
    "algo.grad_clip": 0.5,
    "algo.gamma": 0.99,
    "algo.gae_lambda": 0.95,
    "model.conv_filters": NATURE_CNN,
    "model.conv_activation": "relu",
    "model.vf_share_layers": True,
    "resources.env_runners": 1,
    "resources.learners": 0,
    "evaluation.interval": 0,
}
WINDOW = 20  #: lives in the reported mean return


def spec_for(contender: str, env_steps: int, seed: int) -> Any:
    """rayrl's spec for a rayrl contender at Zoo's settings."""
    runner = {"rayrl_envpool": ["env.runner=fast", "env.backend=envpool"], "rayrl_rllib_runner": ["env.runner=rllib"]}
    overrides = [f"{k}={json.dumps(v)}" for k, v in ZOO_ATARI.items()]
    overrides += [f"stop.env_steps={env_steps}", f"seed={seed}"]  # the config: no sticky actions, frameskip 4
    return C.load_spec(CONFIG, [*overrides, *runner[contender]])


def run_rayrl(contender: str, env_steps: int, seed: int, progress: Callable[[dict], None]) -> dict[str, Any]:
    """Build and train one rayrl contender in this process (Ray already up); its figures."""
    from rayrl.observe import keys
    from rayrl.rllib.algo import build_config

    spec = spec_for(contender, env_steps, seed)
    t0 = time.perf_counter()
    algo = build_config(spec).build_algo()
    build_s = time.perf_counter() - t0
    out: dict[str, Any] = {"build_s": build_s, "return": math.nan, "iter_sps": []}
    try:
        start, steps, last = time.perf_counter(), 0.0, 0.0
        while steps < env_steps:
            t = time.perf_counter()
            result = algo.train()
            steps = float(keys.lookup(result, keys.ENV_STEPS, 0) or 0)
            out["iter_sps"].append((steps - last) / max(time.perf_counter() - t, 1e-9))
            last = steps
            ret = keys.lookup(result, keys.EPISODE_RETURN)
            out["return"] = float(ret) if ret is not None else math.nan
            progress({"env_steps": steps, "wall_s": time.perf_counter() - start, "return": out["return"]})
        out["wall_s"] = time.perf_counter() - start
        out["env_steps"] = steps
    finally:
        algo.stop()
    return out


def sb3_model(seed: int) -> Any:
    """SB3 PPO at Zoo's Atari settings, Monitor above the AtariWrapper (per-life clipped returns)."""
    try:
        import ale_py
        import gymnasium as gym
        from stable_baselines3 import PPO
        from stable_baselines3.common.atari_wrappers import AtariWrapper
        from stable_baselines3.common.monitor import Monitor
        from stable_baselines3.common.vec_env import DummyVecEnv, VecFrameStack
    except ImportError as exc:
        raise SystemExit(f"sb3_zoo needs stable-baselines3 and ale-py ({exc}): pip install -e '.[bench]'") from None

    gym.register_envs(ale_py)

    def make() -> Any:
        env = gym.make(ENV_ID, frameskip=1, repeat_action_probability=0.0)
        return Monitor(AtariWrapper(env, frame_skip=4))  # noop 30, max-pool, life = episode, FIRE, 84 gray, clip

    env = VecFrameStack(DummyVecEnv([make for _ in range(8)]), n_stack=4)

    def linear(start: float) -> Callable[[float], float]:
        return lambda progress_remaining: progress_remaining * start

    return PPO(
        "CnnPolicy",
        env,
        n_steps=128,
        n_epochs=4,
        batch_size=256,
        learning_rate=linear(2.5e-4),
        clip_range=linear(0.1),
        vf_coef=0.5,
        ent_coef=0.01,
        seed=seed,
        device="cpu",
        verbose=0,
    )


def run_sb3(env_steps: int, seed: int, progress: Callable[[dict], None]) -> dict[str, Any]:
    from benchmarks import contenders as K

    t0 = time.perf_counter()
    model = sb3_model(seed)
    build_s = time.perf_counter() - t0
    out = K.sb3_learn(model, env_steps, window=WINDOW, horizon=env_steps, progress=progress)
    return {**out, "build_s": build_s}


def summarize(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per contender: median and spread of end-to-end env steps/s and of the return at the end."""
    out: dict[str, Any] = {}
    for name in CONTENDERS:
        mine = [r for r in runs if r["contender"] == name]
        sps = [r["env_steps"] / r["wall_s"] for r in mine if r.get("wall_s")]
        rets = [r["return"] for r in mine if not math.isnan(r.get("return", math.nan))]
        out[name] = {
            "runs": len(mine),
            "sps_median": C.median(sps),
            "sps_min": min(sps, default=math.nan),
            "sps_max": max(sps, default=math.nan),
            "return_median": C.median(rets),
            "return_min": min(rets, default=math.nan),
            "return_max": max(rets, default=math.nan),
            "wall_s_median": C.median([r["wall_s"] for r in mine if r.get("wall_s")]),
        }
    base = out["rayrl_envpool"]["sps_median"]
    out["ratios"] = {
        "rayrl_envpool_over_rllib_runner": C.ratio(base, out["rayrl_rllib_runner"]["sps_median"]),
        "rayrl_envpool_over_sb3_zoo": C.ratio(base, out["sb3_zoo"]["sps_median"]),
    }
    return out


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.atari",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Contenders: " + ", ".join(CONTENDERS) + ". Resumable: finished runs are read back from --work.",
    )
    p.add_argument("--work", type=Path, required=True, help="folder for runs.json (kept: a rerun skips finished runs)")
    p.add_argument("--out", type=Path, default=None, help="JSON file for the summary (printed either way)")
    p.add_argument("--env-steps", type=int, default=100_000, help="env steps per run (default 100000)")
    p.add_argument("--seeds", type=int, default=3, help="seeds per contender, from --seed-base (default 3)")
    p.add_argument("--seed-base", type=int, default=SEED_BASE, help=f"first seed (default {SEED_BASE}, unseen)")
    p.add_argument(
        "--contenders", default=",".join(CONTENDERS), help="comma-separated subset of: " + ", ".join(CONTENDERS)
    )
    C.add_torch_threads(p)
    args = p.parse_args(argv)
    bad = [c for c in args.contenders.split(",") if c not in CONTENDERS]
    if bad:
        p.error(
            f"--contenders: {bad[0]!r} is not a contender; give a comma-separated subset of {', '.join(CONTENDERS)}"
        )
    if args.env_steps < 1024 or args.seeds < 1:
        p.error(
            f"--env-steps {args.env_steps} / --seeds {args.seeds}: give at least 1024 env steps (one batch) and 1 seed"
        )
    return args


def schedule(contenders: Sequence[str], seeds: Sequence[int]) -> list[tuple[str, int]]:
    """(contender, seed) in run order: all contenders per seed, the order rotated seed by seed."""
    order: list[tuple[str, int]] = []
    for i, seed in enumerate(seeds):
        k = i % len(contenders)
        order += [(c, seed) for c in [*contenders[k:], *contenders[:k]]]
    return order


def _progress_printer(name: str, seed: int, every_s: float = 30.0) -> Callable[[dict], None]:
    """A progress callback that prints one line every ``every_s`` seconds, never one per iteration."""
    last = [0.0]

    def progress(p: dict) -> None:
        if time.monotonic() - last[0] > every_s:
            last[0] = time.monotonic()
            C.say(f"  {name} seed {seed}: {p['env_steps']:.0f} steps, {p['wall_s']:.0f} s, return {p['return']:.2f}")

    return progress


def main(argv: list[str] | None = None) -> int:
    import torch

    args = parse(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    book = args.work / "runs.json"
    runs: list[dict[str, Any]] = json.loads(book.read_text()) if book.exists() else []
    done = {(r["contender"], r["seed"], r["budget"]) for r in runs}
    contenders = args.contenders.split(",")
    todo = [
        (c, s)
        for c, s in schedule(contenders, range(args.seed_base, args.seed_base + args.seeds))
        if (c, s, args.env_steps) not in done
    ]
    C.say(f"atari: {len(todo)} runs to go ({len(runs)} kept in {book}), {args.env_steps} env steps each")
    if todo:
        torch.set_num_threads(args.torch_threads)
        with C.local_ray(num_cpus=2, torch_threads=args.torch_threads):
            for contender, seed in todo:
                progress = _progress_printer(contender, seed)
                C.say(f"{contender} seed {seed}")
                fig = (
                    run_sb3(args.env_steps, seed, progress)
                    if contender == "sb3_zoo"
                    else run_rayrl(contender, args.env_steps, seed, progress)
                )
                runs.append({"contender": contender, "seed": seed, "budget": args.env_steps, **fig})
                book.write_text(json.dumps(C.jsonable(runs), indent=1))
                C.say(f"  done: {fig['env_steps'] / fig['wall_s']:.0f} env steps/s, return {fig['return']:.2f}")
    mine = [r for r in runs if r["budget"] == args.env_steps and r["contender"] in contenders]
    report = {
        "machine": C.machine(),
        "env_id": ENV_ID,
        "settings": ZOO_ATARI,
        "env_steps": args.env_steps,
        "seeds": sorted({r["seed"] for r in mine}),
        "summary": summarize(mine),
        "runs": mine,
    }
    rows = [
        [
            n,
            s["runs"],
            f"{s['sps_median']:.0f} ({s['sps_min']:.0f}-{s['sps_max']:.0f})",
            f"{s['return_median']:.2f} ({s['return_min']:.2f}-{s['return_max']:.2f})",
            f"{s['wall_s_median']:.0f}",
        ]
        for n, s in report["summary"].items()
        if n != "ratios"
    ]
    print(C.table(["contender", "runs", "env steps/s median (range)", "return/life (range)", "wall s"], rows))
    print(json.dumps(report["summary"]["ratios"]))
    C.write_json(args.out, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
