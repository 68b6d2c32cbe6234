"""`rayrl train` after argument parsing: the input checked first, then the run (rayrl.train.run).

Light on purpose: the spec and the storage URI are checked before Ray, RLlib and Tune are imported,
so bad input gets its one-paragraph error (exit 2) in a moment.
"""

from __future__ import annotations

import argparse

from rayrl import runtime
from rayrl import spec as spec_mod


def main(args: argparse.Namespace) -> int:
    """Bad input raises rayrl.errors.UserError (rayrl.cli prints it, exit 2)."""
    from rayrl.observe.output import apply_output

    apply_output(args)
    overrides = list(args.overrides)
    if getattr(args, "population", None) is not None:
        overrides.append(f"population.size={args.population}")
    spec = spec_mod.load(args.config, overrides)
    paths = runtime.resolve(args.storage, args.name or spec.name, args.allow_shared_run_dir)
    from rayrl.train.run import launch

    return launch(args, spec, paths)
