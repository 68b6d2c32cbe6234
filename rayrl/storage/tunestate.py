"""Keep the last whole copy of Tune's experiment state, and put it back when the newest is torn.

Tune rewrites ``experiment_state-*.json`` in place (a non-atomic copy from its staging folder), so
a full disk or a kill during that copy leaves a cut-short file, and Tune then cannot resume the
run. :func:`keep` copies each new whole version atomically to a hidden file beside it (Tune's glob
never sees it); :func:`repair` swaps a torn newest state for that copy on resume, keeping the torn
file under a ``.torn`` name, so nothing written is lost.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from rayrl.errors import SpecError
from rayrl.security import signing
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


# ---------------------------------------------------------------------------------------------
# The seal: Tune's experiment state in remote storage is unpickled on resume (tuner.pkl, the
# searcher's state, the trials pickled inside experiment_state-*.json), so rayrl signs what it wrote.

SEAL = ".rayrl-state-seal.json"  #: a dotfile: Tune never reads it
SEAL_KEEP_S = 1800.0  #: how long a sealed version stays accepted (Tune uploads state every few minutes)
SEAL_KEEP_MIN = 4  #: versions per file always kept, however old


def sealed(name: str) -> bool:
    """Whether a file at the experiment folder's root is covered by the seal: every one Tune may
    read (tuner.pkl, experiment_state-*, searcher-state-*, search_gen_state-*, ...); dotfiles are not
    Tune's (its storage marker, rayrl's seal and kept copies)."""
    return not name.startswith(".")


def seal_of(hashes: dict[str, str], previous: dict | None, now: float, key: signing.Key) -> dict:
    """The signed seal accepting ``hashes`` (name -> sha256 of the files just written) and the
    versions ``previous`` accepted within SEAL_KEEP_S (at least SEAL_KEEP_MIN per file): the copy in
    storage may be an older version than the one just written, uploaded before it."""
    old = (previous or {}).get("files") or {}
    files: dict[str, list] = {}
    for name in sorted(set(old) | set(hashes)):
        versions = [v for v in old.get(name, []) if isinstance(v, list) and len(v) == 2]
        if name in hashes and (not versions or versions[0][0] != hashes[name]):
            versions.insert(0, [hashes[name], round(now, 3)])
        files[name] = [v for i, v in enumerate(versions) if i < SEAL_KEEP_MIN or now - float(v[1]) <= SEAL_KEEP_S]
    return signing.sign({"version": 1, "files": files, "meta": {"sealed_at": round(now, 3)}}, key)


def seal_refusal(where: str, found: dict[str, str], seal: dict | None, key: signing.Key | None) -> str | None:
    """None when every file in ``found`` (name -> sha256, read from storage) is a version ``seal``
    accepts and the seal's MAC verifies under ``key``; else the one paragraph a resume stops with."""
    head = f"{where}: Tune's experiment state in storage is refused: "
    why = (
        " A resume unpickles it (tuner.pkl, the searcher's state, the trials inside experiment_state-*.json), "
        "so rayrl loads it only when a seal signed with this cluster's key vouches for every file "
        "(docs/security.md)."
    )
    fix = (
        f" If the run stopped within a second of starting, or you trust everyone who can write this storage, "
        f"set {signing.ALLOW_ENV}=1 for this start; otherwise start the run again under a new --name."
    )
    if seal is None:
        return head + f"it has no {SEAL} (written by a rayrl that did not seal it, or by someone else)." + why + fix
    verdict = signing.check(seal, key)
    if verdict != signing.OK:
        if verdict == signing.TAMPERED:
            fix = " The seal was changed without the key: find out who can write there; start again under a new --name."
        return head + f"its seal is {signing.reason(verdict, seal, key)}." + why + fix
    accepted = seal.get("files") or {}
    bad = sorted(n for n, h in found.items() if h not in {v[0] for v in accepted.get(n, [])})
    if bad:
        return (
            head + f"{', '.join(bad)} {'is' if len(bad) == 1 else 'are'} not a version rayrl sealed (changed in "
            "storage after rayrl wrote it, or written in the moment between Tune's upload and the seal's)." + why + fix
        )
    return None


def read_remote(fs: Any, exp_path: str) -> tuple[dict[str, str], dict | None]:
    """The sha256 of every sealed file at the root of ``exp_path`` on ``fs``, and the seal (None if
    missing or unreadable)."""
    import pyarrow.fs as pafs

    found: dict[str, str] = {}
    seal = None
    for info in fs.get_file_info(pafs.FileSelector(exp_path, recursive=False)):
        name = info.path.rsplit("/", 1)[-1]
        if info.type != pafs.FileType.File:
            continue
        with fs.open_input_stream(info.path) as f:
            data = f.read()
        if name == SEAL:
            try:
                seal = json.loads(data)
            except (ValueError, UnicodeDecodeError):
                seal = None
        elif sealed(name):
            found[name] = hashlib.sha256(data).hexdigest()
    return found, seal if isinstance(seal, dict) else None


def check_remote(fs: Any, exp_path: str, key_file: str = "", allow: bool = False) -> None:
    """Raise SpecError with the paragraph unless the experiment state at ``exp_path`` verifies (or
    the user opted out; a tampered seal is refused even then)."""
    found, seal = read_remote(fs, exp_path)
    if not found:
        return
    key = signing.load(key_file)
    refusal = seal_refusal(exp_path, found, seal, key)
    if refusal is None:
        return
    tampered = seal is not None and signing.check(seal, key) == signing.TAMPERED
    if signing.allowed_unsigned(allow) and not tampered:
        print(f"[rayrl] resuming from unverified experiment state ({signing.ALLOW_ENV}=1): {exp_path}", flush=True)
        return
    raise SpecError(refusal)
