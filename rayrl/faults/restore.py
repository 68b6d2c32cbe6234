"""The restore check: every checkpoint the run keeps must load and play, or it is no checkpoint.

`rayrl drill` runs it after the drills and `rayrl report` judges its restore rate; it reads the run
only (``Algorithm.from_checkpoint`` on each kept ``checkpoint_*``, then one greedy episode).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rayrl.faults.harness import say
from rayrl.spec import Spec


def kept_checkpoints(run_dir: Path) -> list[Path]:
    """The checkpoint_* folders of the run's Tune trials: EXPERIMENT/TRIAL/checkpoint_* (the drills'
    scratch runs under drills/NAME/ lie a level deeper, so they are never among them)."""
    return sorted(p for p in run_dir.glob("*/*/checkpoint_*") if p.is_dir())


def restore_checkpoints(run_dir: Path, spec: Spec) -> tuple[list[dict], float | None]:
    """Algorithm.from_checkpoint on each kept checkpoint, then one greedy episode; (rows, rate)."""
    from ray.rllib.algorithms.algorithm import Algorithm

    from rayrl.rllib.algo import env_name

    env_name(spec)  # registers a factory env with Tune's registry, as training did
    rows = []
    paths = kept_checkpoints(run_dir)
    for i, path in enumerate(paths, 1):
        start = time.monotonic()
        row: dict[str, Any] = {"checkpoint": str(path.relative_to(run_dir))}
        algorithm = None
        try:
            algorithm = Algorithm.from_checkpoint(str(path.resolve()))  # pyarrow takes no relative path
            row["restore_s"] = round(time.monotonic() - start, 2)
            row["episode_return"], row["episode_len"] = _play_episode(algorithm)
            row["ok"] = True
        except Exception as exc:  # any failure to restore is a finding for drill.json
            row.update(ok=False, error=f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}")
        finally:
            if algorithm is not None:
                algorithm.stop()
        rows.append(row)
        say(
            f"restore {i}/{len(paths)}: {row['checkpoint']}: "
            + (
                f"restored in {row['restore_s']:.1f}s, episode return {row['episode_return']:.1f}"
                if row["ok"]
                else f"FAILED ({row['error']})"
            )
        )
    rate = sum(r["ok"] for r in rows) / len(rows) if rows else None
    return rows, rate


def _play_episode(algorithm: Any) -> tuple[float, int]:
    """One greedy episode with the restored policy, on the local EnvRunner or a remote one."""
    runner = algorithm.env_runner
    if runner is not None and getattr(runner, "env", None) is not None:
        episodes = runner.sample(num_episodes=1, explore=False)
    else:
        episodes = algorithm.env_runner_group.foreach_env_runner(
            lambda r: r.sample(num_episodes=1, explore=False), local_env_runner=False
        )[0]
    done = [e for e in episodes if e.is_done] or episodes
    return float(done[0].get_return()), len(done[0])
