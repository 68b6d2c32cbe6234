"""The rayrl sweep, the platform's main job.

    python experiments/sweep.py                     # local Ray, CartPole PPO, about 10 minutes on 2 cores
    python experiments/sweep.py --smoke             # the whole flow in about 3 minutes
    ray job submit --working-dir . -- python experiments/sweep.py --config experiments/configs/cartpole_ppo.yaml

`ray.init()` joins the cluster under `ray job submit` and starts a local Ray otherwise.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from rayrl.sweep import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
