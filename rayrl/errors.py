"""The exit-2 family: what a user gave is wrong (a spec, a flag, a path, a run name).

Every command catches :class:`UserError` before any cluster work, prints its message as one
paragraph and exits with :data:`EXIT_USAGE`. Imports nothing, so any layer may raise these.
"""

EXIT_USAGE = 2  #: exit status for bad input, as argparse uses


class UserError(Exception):
    """Bad input from the user; the message names the field or flag, the value and what is valid."""


class SpecError(UserError, ValueError):
    """A user's experiment spec (YAML or --set override) is invalid; the message says how."""


class UsageError(UserError):
    """Bad command-line input that is not a spec error (missing run folder, unwritable path)."""


class LockHeld(UserError):
    """Another live process runs this name; the message names it and what to do."""
