"""The trust boundary of a run folder: who may write it decides what rayrl executes.

`Tuner.restore`, the doubling searcher's saved state and `rayrl drill` unpickle files from the run
folder, and `env.id` imports code: write access to a run folder (or its bucket) is code execution
for whoever resumes it. So a local run folder must be a real directory owned by the user running
rayrl and writable by no one else, and names carry no control characters (a NUL or an escape in a
name breaks paths, logs and terminals). The tier-1 checkpoint folder (``checkpoint.local_dir``), which
restore prefers over storage, gets the same check on each trial's node. docs/security.md states the
whole boundary.
"""

from __future__ import annotations

import os
import stat
import unicodedata
from pathlib import Path

from rayrl.errors import SpecError

ALLOW_FLAG = "--allow-shared-run-dir"


def check_name(name: str, field: str = "--name") -> None:
    """Refuse a run name with any control character (Unicode category Cc: NUL, ESC, DEL, C1, ...)."""
    bad = sorted({f"U+{ord(c):04X}" for c in name if unicodedata.category(c) == "Cc"})
    if bad:
        raise SpecError(
            f"{field}: {name!r} contains control characters ({', '.join(bad)}); use letters, digits, '-', '_' or '.'."
        )


def check_run_dir(run_dir: Path, allow_shared: bool = False) -> None:
    """Refuse a local run folder that is a symlink, belongs to another user or others may write.

    Checked with lstat before anything is created or read, so nothing is followed or written.
    ``allow_shared`` (the CLI's --allow-shared-run-dir) accepts foreign ownership and group or
    world write access for teams that share a folder on purpose; a symlink is never accepted.
    """
    try:
        st = os.lstat(run_dir)
    except (FileNotFoundError, NotADirectoryError):  # nothing there yet: resolve() creates it
        return
    if stat.S_ISLNK(st.st_mode):
        raise SpecError(
            f"--storage/--name: the run folder {str(run_dir)!r} is a symbolic link (to "
            f"{os.readlink(run_dir)!r}); rayrl never follows one, since whoever controls the link "
            "chooses what rayrl unpickles and writes. Give the real folder as --storage, or remove "
            "the link."
        )
    if not stat.S_ISDIR(st.st_mode):
        raise SpecError(f"--storage/--name: {str(run_dir)!r} exists and is not a folder; choose another --name.")
    if allow_shared:
        return
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        raise SpecError(
            f"--storage/--name: the run folder {str(run_dir)!r} belongs to user id {st.st_uid}, not to "
            f"you ({os.getuid()}); resuming it would run what that user wrote there (pickled state, "
            f"env code). Use your own folder, or pass {ALLOW_FLAG} if you trust that user."
        )
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        who = "everyone" if st.st_mode & stat.S_IWOTH else "its group"
        raise SpecError(
            f"--storage/--name: the run folder {str(run_dir)!r} is writable by {who} (mode "
            f"{stat.S_IMODE(st.st_mode):o}); anyone who can write it can make rayrl run code. "
            f"`chmod go-w {run_dir}`, or pass {ALLOW_FLAG} if the folder is shared on purpose."
        )


def check_tier1_dir(folder: Path) -> None:
    """The run folder's check for the tier-1 checkpoint folder (``checkpoint.local_dir`` on this node)
    and each trial's folder in it, before a checkpoint is written there or restored from there.

    No opt-out: tier 1 is a node-local cache, so there is no reason to share it; a team folder is
    chosen with ``checkpoint.local_dir``.
    """
    where = f"checkpoint.local_dir: the tier-1 checkpoint folder {str(folder)!r}"
    try:
        st = os.lstat(folder)
    except (FileNotFoundError, NotADirectoryError):  # not made yet: save() makes it, as this user
        return
    if stat.S_ISLNK(st.st_mode):
        raise SpecError(
            f"{where} is a symbolic link (to {os.readlink(folder)!r}); rayrl never follows one, since whoever "
            "controls the link chooses what restore unpickles. Set checkpoint.local_dir to the real folder."
        )
    if not stat.S_ISDIR(st.st_mode):
        raise SpecError(f"{where} exists and is not a folder; set checkpoint.local_dir to a folder.")
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        raise SpecError(
            f"{where} belongs to user id {st.st_uid}, not to you ({os.getuid()}); restoring from it would "
            "unpickle what that user put there. Set checkpoint.local_dir to a folder of your own."
        )
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        who = "everyone" if st.st_mode & stat.S_IWOTH else "its group"
        raise SpecError(
            f"{where} is writable by {who} (mode {stat.S_IMODE(st.st_mode):o}); anyone who can write it can "
            f"replace a checkpoint that restore then unpickles. `chmod go-w {folder}`, or set "
            "checkpoint.local_dir to a folder of your own."
        )
