"""`rayrl ...`: the command-line entry point.

Each subcommand parses and validates its input completely before importing Ray, so a bad
config or flag costs the user one clear paragraph and exit status 2, never a started cluster.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from typing import Sequence

from rayrl.spec import SpecError

EXIT_USAGE = 2


class UsageError(Exception):
    """Bad command-line input that is not a spec error (missing run folder, unwritable path)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's default prints usage + exits 2 already;
        self.print_usage(sys.stderr)         # keep its exit status, make the text one paragraph.
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        raise SystemExit(EXIT_USAGE)


def add_run_args(p: argparse.ArgumentParser, default_config: str | None = None) -> None:
    """The flags `rayrl train` and `experiments/sweep.py` share."""
    p.add_argument("--config", default=default_config, required=default_config is None,
                   help="experiment spec YAML" + (f" (default: {default_config})" if default_config else ""))
    p.add_argument("--name", default=None, help="run name: the folder under --storage; running the same "
                   "name again resumes it (default: the spec's name)")
    p.add_argument("--storage", default="runs", help="where runs are kept: a local folder or a URI (s3://, "
                   "gs://, any pyarrow filesystem; an S3-compatible server via AWS_ENDPOINT_URL or "
                   "?endpoint_override=HOST:PORT&scheme=http); one live run per name (default: ./runs)")
    p.add_argument("--allow-shared-run-dir", action="store_true",
                   help="accept a local run folder owned by another user or writable by others (resuming runs "
                   "what they wrote there; see docs/security.md); a symlinked run folder is never accepted")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a spec field by dotted path, value parsed as YAML, e.g. --set algo.lr=1e-4 "
                   "(repeatable)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="rayrl", description="Ray-native RL training: RLlib env runners, Torch learners, "
                     "Tune sweeps. See README.md.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    train = sub.add_parser("train", help="one long, checkpointed, resumable training run",
                           description="Train one experiment under Tune: checkpoints every "
                           "checkpoint.every iterations (keeping checkpoint.keep), retries from the latest "
                           "checkpoint on failure, stops at the spec's stop criteria. Ctrl-C leaves a "
                           "resumable run: the same command again continues from the last checkpoint.")
    add_run_args(train)
    train.add_argument("--address", default=None, help="Ray address to join (default: the cluster this "
                       "process runs in under `ray job submit`, else a new local Ray)")
    train.add_argument("--num-cpus", type=int, default=None, help="CPUs for a local Ray (default: all)")
    train.add_argument("--population", type=int, default=None, metavar="K", help="train K trials together with "
                       "Population Based Training (sets population.size; see `rayrl spec`)")

    spec_cmd = sub.add_parser("spec", help="print every spec field with its default and meaning, or "
                              "validate a spec file",
                              description="With no --config, list every spec field. With --config, "
                              "validate it (and any --set overrides) and print the full resolved spec.")
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
            from rayrl import train

            return train.main(args)
        return _spec(args)  # the only other command argparse accepts
    except (SpecError, UsageError) as exc:
        _fail(str(exc))
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("\nrayrl: interrupted; run the same command again to resume.", file=sys.stderr)
        return 130


def _fail(message: str) -> None:
    sys.stderr.write(textwrap.fill(f"rayrl: error: {message}", width=100) + "\n")


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
