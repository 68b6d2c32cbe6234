"""The rayrl sweep, the platform's main job (`--help` explains every flag).

    python experiments/sweep.py                     # local Ray, CartPole PPO
    python experiments/sweep.py --smoke             # the whole flow on tiny budgets
    ray job submit --working-dir . -- python experiments/sweep.py --config experiments/configs/cartpole_ppo.yaml

`ray.init()` joins the cluster under `ray job submit` and starts a local Ray otherwise. The README
and docs/benchmarks.md give the measured wall times.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from rayrl.sweep.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
