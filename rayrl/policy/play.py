"""`rayrl play RUN_DIR`: play a run's trained policy for N episodes, print the returns, record videos.

The RLModule is loaded from the checkpoint alone (no Ray cluster, no Algorithm); actions are
picked with the module's own action distributions, as RLlib's env runners pick them.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rayrl.args import Parser, fail
from rayrl.errors import EXIT_USAGE, SpecError
from rayrl.policy.checkpoints import find_checkpoint


def make_env(env: dict, video_dir: Path | None) -> Any:
    """The run's env (gymnasium id, ALE id or factory), rendering to frames when videos are recorded."""
    import gymnasium as gym

    from rayrl.spec import resolve_factory

    env_id, config = env.get("id", "CartPole-v1"), dict(env.get("config") or {})
    if ":" in env_id:
        made = resolve_factory(env_id)(config)
    else:
        if env_id.startswith("ALE/"):
            import ale_py

            gym.register_envs(ale_py)
        made = gym.make(env_id, **({"render_mode": "rgb_array"} if video_dir else {}), **config)
    if video_dir is None:
        return made
    return gym.wrappers.RecordVideo(
        made, str(video_dir), episode_trigger=lambda _: True, name_prefix="play", disable_logger=True
    )


def play(module: Any, env: Any, episodes: int, deterministic: bool, seed: int) -> list[float]:
    """Returns of ``episodes`` episodes, env seeded seed, seed + 1, ..."""
    import numpy as np
    import torch
    from ray.rllib.utils.spaces.space_utils import unsquash_action

    dist_cls = module.get_inference_action_dist_cls() if deterministic else module.get_exploration_action_dist_cls()
    returns = []
    for episode in range(episodes):
        obs, _ = env.reset(seed=seed + episode)
        total, done = 0.0, False
        while not done:
            with torch.no_grad():
                batch = {"obs": torch.as_tensor(np.asarray(obs), dtype=torch.float32)[None]}
                out = (module.forward_inference if deterministic else module.forward_exploration)(batch)
                dist = dist_cls.from_logits(out["action_dist_inputs"])
                action = (dist.to_deterministic() if deterministic else dist).sample()[0].numpy()
            obs, reward, terminated, truncated, _ = env.step(unsquash_action(action, env.action_space))
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    env.close()
    return returns


def build_parser() -> argparse.ArgumentParser:

    p = Parser(
        prog="rayrl play",
        description="Play the best (or --trial) trial's policy from a run folder for "
        "N episodes; print each return, the mean and the spread, and write RUN_DIR/play.json (read by "
        "`rayrl report`). --video needs moviepy: pip install 'rayrl[export]'.",
    )
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run folder, {storage}/{name}")
    p.add_argument(
        "--trial",
        default=None,
        help="trial id (default: the sweep's best trial, or the one trial of a `rayrl train` run)",
    )
    p.add_argument("--episodes", type=int, default=5, help="episodes to play (default: 5)")
    p.add_argument("--video", default=None, metavar="DIR", help="record every episode as an mp4 into DIR")
    p.add_argument(
        "--deterministic", action="store_true", help="the most likely action (default: sample, as in training)"
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the first episode's env (default: 0)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    import yaml

    from rayrl import runtime

    args = build_parser().parse_args(argv)
    run_dir = Path(args.run_dir)
    try:
        if args.episodes < 1:
            raise SpecError(f"--episodes: {args.episodes} is not a positive number of episodes; give 1 or more.")
        trial, checkpoint = find_checkpoint(run_dir, args.trial)
        video_dir = None
        if args.video:
            from rayrl.extras import require

            require("moviepy", "export", "rayrl play --video")
            video_dir = Path(args.video).resolve()
            if video_dir.exists() and not video_dir.is_dir():
                raise SpecError(f"--video: {str(video_dir)!r} is a file; give a folder for the videos.")
        spec_path = run_dir / "spec.yaml"
        spec = (yaml.safe_load(spec_path.read_text()) or {}) if spec_path.is_file() else {}
        env = make_env(spec.get("env") or {}, video_dir)
    except SpecError as exc:
        fail(str(exc))
        return EXIT_USAGE
    from rayrl.policy.checkpoints import load_module

    returns = play(load_module(checkpoint), env, args.episodes, args.deterministic, args.seed)
    for i, ret in enumerate(returns, 1):
        print(f"episode {i}: return {ret:.1f}")
    mean = statistics.fmean(returns)
    spread = statistics.stdev(returns) if len(returns) > 1 else 0.0
    print(
        f"rayrl play: trial {trial} ({checkpoint.name}), {len(returns)} episodes: mean {mean:.1f}, "
        f"std {spread:.1f}, min {min(returns):.1f}, max {max(returns):.1f}"
    )
    videos = sorted(str(p) for p in video_dir.glob("*.mp4")) if video_dir else []
    runtime.write_json(
        run_dir / "play.json",
        {
            "trial_id": trial,
            "checkpoint": str(checkpoint),
            "deterministic": args.deterministic,
            "seed": args.seed,
            "returns": returns,
            "mean": mean,
            "std": spread,
            "videos": videos,
        },
    )
    if videos:
        print(f"rayrl play: {len(videos)} videos in {video_dir}")
    return 0


def report_lines(run_dir: Path) -> list[str]:
    """report.md's "Policy" section from play.json: the returns, and a link to each recorded video."""
    import json
    import os

    path = Path(run_dir) / "play.json"
    if not path.is_file():
        return ["No play.json: run `rayrl play RUN_DIR --video DIR` to play the trained policy and record it.", ""]
    try:
        data = json.loads(path.read_text())
        returns = [float(r) for r in data["returns"]]
    except (ValueError, KeyError, TypeError):
        return [f"{path}: damaged (no list of returns); run `rayrl play RUN_DIR` again.", ""]
    mode = "deterministic" if data.get("deterministic") else "sampled"
    out = [
        f"Trial {data.get('trial_id')}, {len(returns)} episodes ({mode} actions): mean return "
        f"{statistics.fmean(returns):.1f}, std {data.get('std', 0.0):.1f}; returns "
        f"{', '.join(f'{r:.0f}' for r in returns)}.",
        "",
    ]
    videos = [v for v in data.get("videos") or [] if Path(v).is_file()]
    out += [f"- video: [{Path(v).name}]({os.path.relpath(v, run_dir)})" for v in videos]
    return out + ([""] if videos else [])
