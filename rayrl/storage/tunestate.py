"""Keep the last whole copy of Tune's experiment state, and put it back when the newest is torn.

Tune rewrites ``experiment_state-*.json`` in place (a non-atomic copy from its staging folder), so
a full disk or a kill during that copy leaves a cut-short file, and Tune then cannot resume the
run. :func:`keep` copies each new whole version atomically to a hidden file beside it (Tune's glob
never sees it); :func:`repair` swaps a torn newest state for that copy on resume, keeping the torn
file under a ``.torn`` name, so nothing written is lost.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from rayrl.storage.files import StorageError, write_local

PATTERN = "experiment_state-*.json"


def good_copy(state: Path) -> Path:
    """Where the last whole copy of ``state`` is kept."""
    return state.with_name(f".rayrl-good-{state.name}")


def newest(exp_dir: Path) -> Path | None:
    """The state file Tune resumes from (the newest by name)."""
    states = sorted(exp_dir.glob(PATTERN))
    return states[-1] if states else None


def whole(data: bytes) -> bool:
    """Whether ``data`` is a complete JSON document (a cut-short one does not parse)."""
    try:
        json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return False
    return True


def keep(exp_dir: Path, seen: dict[Path, float]) -> None:
    """Copy the newest state aside when it changed since ``seen`` (path -> mtime) and is whole.

    Called between Tune's loop steps; a failed copy (the disk is full) keeps the previous copy.
    """
    state = newest(exp_dir)
    if state is None:
        return
    try:
        mtime = state.stat().st_mtime
        if seen.get(state) == mtime:
            return
        data = state.read_bytes()
    except OSError:
        return
    if not whole(data):
        return
    try:
        write_local(good_copy(state), data)
    except StorageError:
        return
    seen[state] = mtime


def repair(exp_dir: Path) -> str | None:
    """Put the kept copy back when the newest state is torn; returns what was done, or None."""
    state = newest(exp_dir)
    if state is None or whole(state.read_bytes()):
        return None
    copy = good_copy(state)
    if not copy.exists() or not whole(copy.read_bytes()):
        return None
    torn = state.with_name(state.name + ".torn")
    os.replace(state, torn)
    write_local(state, copy.read_bytes())
    return (
        f"{state} was cut short (the run stopped while Tune was writing it); resumed from the last whole "
        f"copy rayrl kept, which may be a few seconds older. The torn file is kept as {torn.name}."
    )
