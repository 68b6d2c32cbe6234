"""What the driver prints while Tune runs: a process-wide choice the CLIs make from their flags.

Kept apart from rayrl.observe.progress (which imports Tune) so the CLIs set it before Ray loads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rayrl.errors import SpecError

#: quiet: errors and summaries; normal: one line per trial event and a progress line every
#: ``every_s``; verbose: also one line per result
OUTPUT_MODES = ("quiet", "normal", "verbose")


@dataclass
class Output:
    mode: str = "normal"
    every_s: float = 30.0


OUTPUT = Output()


def set_output(mode: str = "normal", every_s: float = 30.0) -> None:
    """The driver's output mode (the CLIs' --quiet/--verbose/--progress-every)."""
    if mode not in OUTPUT_MODES:
        raise ValueError(f"output mode {mode!r}; valid: {', '.join(OUTPUT_MODES)}")
    OUTPUT.mode, OUTPUT.every_s = mode, float(every_s)


def output_mode() -> str:
    return OUTPUT.mode


def apply_output(args: Any) -> None:
    """--quiet / --verbose / --progress-every (rayrl.args.add_run_args) -> the output mode."""
    every = getattr(args, "progress_every", 30.0)
    if not every > 0:
        raise SpecError(f"--progress-every: {every!r} is not valid; give the seconds between progress lines, > 0.")
    set_output(getattr(args, "output", "normal"), every)
