"""Argument parsing shared by every rayrl command: one-paragraph errors, exit status 2."""

from __future__ import annotations

import argparse
import sys
import textwrap

from rayrl.errors import EXIT_USAGE


class Parser(argparse.ArgumentParser):
    """argparse, with its error made one paragraph (its exit status, 2, kept)."""

    def error(self, message: str) -> None:  # type: ignore[override]  # argparse declares NoReturn
        self.print_usage(sys.stderr)
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        raise SystemExit(EXIT_USAGE)


def fail(message: str, prog: str = "rayrl") -> None:
    """Print ``message`` as one wrapped paragraph on stderr, prefixed ``PROG: error:``."""
    sys.stderr.write(textwrap.fill(f"{prog}: error: {message}", width=100) + "\n")


def add_run_args(p: argparse.ArgumentParser, default_config: str | None = None) -> None:
    """The flags `rayrl train` and `experiments/sweep.py` share (rayrl.observe.progress: --quiet...)."""
    p.add_argument(
        "--config",
        default=default_config,
        required=default_config is None,
        help="experiment spec YAML" + (f" (default: {default_config})" if default_config else ""),
    )
    p.add_argument(
        "--name",
        default=None,
        help="run name: the folder under --storage; running the same name again resumes it (default: the spec's name)",
    )
    p.add_argument(
        "--storage",
        default="runs",
        help="where runs are kept: a local (or shared) folder or s3://BUCKET/PREFIX (AWS, or an "
        "S3-compatible server via AWS_ENDPOINT_URL or ?endpoint_override=HOST:PORT&scheme=http; other "
        "schemes are refused); one live run per name (default: ./runs)",
    )
    p.add_argument(
        "--allow-shared-run-dir",
        action="store_true",
        help="accept a local run folder owned by another user or writable by others (resuming runs "
        "what they wrote there; see docs/security.md); a symlinked run folder is never accepted",
    )
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a spec field by dotted path, value parsed as YAML, e.g. --set algo.lr=1e-4 (repeatable)",
    )
    shown = p.add_mutually_exclusive_group()
    shown.add_argument(
        "--quiet",
        dest="output",
        action="store_const",
        const="quiet",
        default="normal",
        help="print only errors and the closing summary",
    )
    shown.add_argument(
        "--verbose",
        dest="output",
        action="store_const",
        const="verbose",
        help="also print one line per training iteration of every trial",
    )
    p.add_argument(
        "--progress-every",
        type=float,
        default=30.0,
        metavar="S",
        help="seconds between progress lines (trials, env steps, steps/s, best return) when the output is a "
        "log, not a terminal; a terminal gets the live view (default: 30)",
    )
