"""What a sweep runs: the spec file, --smoke's budgets, the --set overrides; and how it fails.

Light on purpose (no Ray, no RLlib): `experiments/sweep.py` checks everything the user gave with this
before it imports the sweep runner, so bad input gets its error in a moment.
"""

from __future__ import annotations

from rayrl import spec as spec_mod
from rayrl.spec import Spec

#: Batch sizes above this lose sample efficiency (the source guide's 16K); a cap above it is warned of.
SAFE_CAP = 16384


class SweepError(RuntimeError):
    """The sweep cannot go on (e.g. the first rung failed); the message says what to change."""


def smoke(spec: Spec) -> Spec:
    """Tiny budgets: the whole sweep, confirmation included, in a few minutes on 2 cores (tests, a first try).

    Sampling and evaluation run in the trial's own process (no EnvRunner actors), so a cluster preset
    (e.g. the Pong GPU config with its learners set to 0) fits a 2-core machine.
    """
    return spec_mod.replace(
        spec,
        env={"envs_per_runner": 4},
        algo={"train_batch_per_learner": 512, "minibatch_size": 128, "epochs": 4},
        resources={"env_runners": 0},
        evaluation={"env_runners": 0},
        checkpoint={"every": 5},
        search={
            "doubling": {
                "start": 512,
                "factor": 2,
                "cap": 2048,
                "min_gain": spec.search.doubling.min_gain,
                "warmup_iters": 1,
                "measure_iters": 2,
            },
            "num_samples": 4,
            "max_env_steps": 16000,
            "grace_env_steps": 4000,
            "reduction_factor": 2.0,
            "max_concurrent": 0,
            "min_batch": 256,
            "confirm_top_k": min(spec.search.confirm_top_k, 2),
            "confirm_seeds": 2,
            "confirm_env_steps": 4000,
        },
    )


def load_spec(config: str, overrides: list[str] | tuple[str, ...] = (), *, tiny: bool = False) -> Spec:
    """The spec a sweep runs: the file, then --smoke's budgets, then the --set overrides (they win)."""
    if not tiny:
        return spec_mod.load(config, overrides)
    # --set is validated on top of the smoke budgets, not the file's (e.g. a cap below the file's start)
    spec = spec_mod.load(config, [])
    return spec_mod.from_dict(spec_mod.apply_overrides(spec_mod.to_dict(smoke(spec)), overrides))
