"""`rayrl ...`: the command-line entry point.

Each subcommand parses and validates its input completely before importing Ray, so a bad
config or flag costs the user one clear paragraph and exit status 2, never a started cluster.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from rayrl.args import Parser, add_run_args, fail
from rayrl.errors import EXIT_USAGE, UserError


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="rayrl",
        description="Ray-native RL training: RLlib env runners, Torch learners, Tune sweeps. See README.md.",
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)

    train = sub.add_parser(
        "train",
        help="one long, checkpointed, resumable training run",
        description="Train one experiment under Tune: checkpoints every "
        "checkpoint.every iterations (keeping checkpoint.keep), retries from the latest "
        "checkpoint on failure, stops at the spec's stop criteria. Ctrl-C leaves a "
        "resumable run: the same command again continues from the last checkpoint.",
    )
    add_run_args(train)
    train.add_argument(
        "--address",
        default=None,
        help="Ray address to join (default: the cluster this "
        "process runs in under `ray job submit`, else a new local Ray)",
    )
    train.add_argument("--num-cpus", type=int, default=None, help="CPUs for a local Ray (default: all)")
    train.add_argument(
        "--population",
        type=int,
        default=None,
        metavar="K",
        help="train K trials together with Population Based Training (sets population.size; see `rayrl spec`)",
    )

    spec_cmd = sub.add_parser(
        "spec",
        help="print every spec field with its default and meaning, or validate a spec file",
        description="With no --config, list every spec field. With --config, "
        "validate it (and any --set overrides) and print the full resolved spec.",
    )
    spec_cmd.add_argument("--config", default=None, help="a spec YAML to validate and print resolved")
    spec_cmd.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")

    for name, (_module, text) in DELEGATED.items():  # listed for `rayrl --help`; main() dispatches them
        sub.add_parser(name, help=text, add_help=False, description=text)
    return parser


# Subcommands that own their argument parsing: `rayrl NAME ...` calls `rayrl.MODULE.main([...])`,
# which returns an exit status (2 for bad input). Imported only when used.
DELEGATED = {
    "cluster": ("cluster.cli", "validate cluster YAMLs (ray up launcher configs, KubeRay manifests) offline"),
    "report": ("judge.report", "write the five-part acceptance report (report.md + plots) for a run folder"),
    "doctor": ("judge.doctor", "diagnose a run folder: name likely causes and fixes"),
    "drill": ("faults.drill", "run fault drills against a run folder and write drill.json"),
    "plan": ("scale.plan", "capacity plan from a measured run: throughput, cost, time to target at 1..N GPUs"),
    "export": ("policy.export", "export a run's trained policy as ONNX or TorchScript (runs without Ray) + JSON"),
    "play": ("policy.play", "play a run's trained policy for N episodes: returns, mean, spread, videos"),
}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in DELEGATED:  # the module parses its own flags, --help included
        import importlib

        return int(importlib.import_module(f"rayrl.{DELEGATED[argv[0]][0]}").main(argv[1:]))
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "train":
            from rayrl.train.cli import main as train_main

            return train_main(args)
        return _spec(args)  # the only other command argparse accepts
    except UserError as exc:
        fail(str(exc))
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("\nrayrl: interrupted; run the same command again to resume.", file=sys.stderr)
        return 130


def _spec(args: argparse.Namespace) -> int:
    import yaml

    from rayrl import spec

    if args.config:
        resolved = spec.load(args.config, args.overrides)
        print(yaml.safe_dump(spec.to_dict(resolved), sort_keys=False), end="")
        return 0
    for name, default, text in spec.field_table():
        print(f"{name:34} {default:>14}  {text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
