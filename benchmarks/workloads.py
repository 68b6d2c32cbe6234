"""Each shipped config trained with `rayrl train` for a fixed wall budget: env steps/s, return, wall.

Why: a config that only builds says nothing about what a user gets from it. This script runs the
real command (Tune, checkpoints, evaluation as configured) on each config in turn and reads the run
folder's history.csv, so the figures are the platform's, not a hand-rolled loop's.

    python -m benchmarks.workloads --out workloads.json                 # every config, default budgets
    python -m benchmarks.workloads --configs cartpole_ppo --wall-s 60   # one, shorter

The GPU preset runs on CPU with its learners and GPUs set to 0 and one env runner (the same
overrides the workloads test uses); its figures are then CPU figures, said in the table.
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks import common as C

CONFIGS = C.ROOT / "experiments" / "configs"
#: Seconds of training per config, long enough to leave the first iterations' noise behind.
BUDGET_S = {
    "cartpole_ppo": 120,
    "cartpole_appo": 120,
    "cartpole_impala": 120,
    "mujoco_hopper_ppo": 600,
    "atari_breakout_ppo_cpu": 300,
    "atari_pong_appo_gpu": 180,
}
#: Overrides that make a config runnable on a 2-core CPU machine (none for the CPU configs).
CPU_OVERRIDES = {
    "atari_pong_appo_gpu": [
        "resources.learners=0",
        "resources.gpus_per_learner=0",
        "resources.env_runners=1",
        "evaluation.env_runners=0",
    ]
}


def summarize(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One config's figures from its history rows (dicts as read from history.csv).

    Env steps/s is the median over iterations after the first (the first holds start-up); the
    return is the last known training return and the best evaluation return (NaN when none).
    """

    def num(row: dict, key: str) -> float:
        try:
            return float(row.get(key, math.nan))
        except (TypeError, ValueError):
            return math.nan

    if not rows:
        raise ValueError("no history rows: the run reported no iteration")
    sps = [num(r, "env_steps_per_s") for r in rows[1:]] or [num(rows[0], "env_steps_per_s")]
    train = [num(r, "episode_return_mean") for r in rows if not math.isnan(num(r, "episode_return_mean"))]
    evals = [num(r, "eval_return_mean") for r in rows if not math.isnan(num(r, "eval_return_mean"))]
    return {
        "iterations": len(rows),
        "env_steps": num(rows[-1], "env_steps"),
        "wall_s": num(rows[-1], "time_total_s"),
        "env_steps_per_s": C.median(sps),
        "train_return_last": train[-1] if train else math.nan,
        "train_return_best": max(train) if train else math.nan,
        "eval_return_best": max(evals) if evals else math.nan,
    }


def run_config(stem: str, wall_s: float, storage: Path, extra: Sequence[str]) -> dict[str, Any]:
    """`rayrl train` on one config; its history.csv summarized, the command's rc and wall beside."""
    import pandas as pd

    sets = [f"stop.wall_s={wall_s}", *CPU_OVERRIDES.get(stem, []), *extra]
    argv = [
        sys.executable,
        "-m",
        "rayrl.cli",
        "train",
        "--config",
        str(CONFIGS / f"{stem}.yaml"),
        "--name",
        f"wl-{stem}",
        "--storage",
        str(storage),
        "--num-cpus",
        "2",
    ]
    for s in sets:
        argv += ["--set", s]
    C.say(f"[{stem}] {' '.join(argv[2:])}")
    start = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=C.ROOT)
    command_s = time.perf_counter() - start
    history = storage / f"wl-{stem}" / "history.csv"
    if proc.returncode != 0 or not history.exists():
        return {
            "config": stem,
            "rc": proc.returncode,
            "command_s": command_s,
            "overrides": sets,
            "error": (proc.stderr or proc.stdout)[-2000:],
        }
    rows = pd.read_csv(history).to_dict("records")
    return {"config": stem, "rc": 0, "command_s": command_s, "overrides": sets, **summarize(rows)}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--configs", nargs="+", choices=sorted(BUDGET_S), help="a subset (default: all)")
    p.add_argument(
        "--wall-s",
        type=float,
        help="training seconds per config (default: per config, "
        + ", ".join(f"{k} {v}" for k, v in BUDGET_S.items())
        + ")",
    )
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="K=V",
        help="an override for every config (repeatable)",
    )
    p.add_argument("--storage", type=Path, help="where the runs go (default: a temporary folder)")
    p.add_argument("--out", type=Path, help="also write the figures as JSON here")
    args = p.parse_args(argv)
    if args.wall_s is not None and args.wall_s <= 0:
        p.error(f"--wall-s must be > 0 seconds, got {args.wall_s}")
    storage = args.storage or Path(tempfile.mkdtemp(prefix="rayrl-workloads-"))
    results = []
    for stem in args.configs or list(BUDGET_S):
        results.append(run_config(stem, args.wall_s or BUDGET_S[stem], storage, args.overrides))
        C.write_json(args.out, {"machine": C.machine(), "results": results}, quiet=True)
    rows = [
        [
            r["config"] + (" (on CPU)" if r["config"] in CPU_OVERRIDES else ""),
            f"{r.get('env_steps_per_s', math.nan):,.0f}",
            f"{r.get('env_steps', math.nan):,.0f}",
            f"{r.get('train_return_last', math.nan):.1f}",
            f"{r.get('eval_return_best', math.nan):.1f}",
            f"{r.get('wall_s', math.nan):.0f}",
            f"{r['command_s']:.0f}",
            r["rc"],
        ]
        for r in results
    ]
    print(
        C.table(
            [
                "config",
                "env steps/s",
                "env steps",
                "train return (last)",
                "eval return (best)",
                "train wall s",
                "command wall s",
                "rc",
            ],
            rows,
        )
    )
    failed = [r["config"] for r in results if r["rc"] != 0]
    for r in results:
        if r["rc"] != 0:
            print(f"\n[{r['config']}] failed (rc {r['rc']}):\n{r['error']}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
