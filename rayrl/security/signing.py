"""Signed checkpoint manifests: a keyed MAC proves that a holder of the cluster's key wrote them.

A checkpoint's manifest (`rayrl.storage.manifest`) lists each file's size and sha256: that proves
the bytes are the ones written, not who wrote them, and restore unpickles what it finds. So rayrl
adds an HMAC-SHA256 over the manifest's ``files`` and ``meta`` (canonical JSON) with a key the
bucket's other writers do not hold, and restore loads only what verifies (docs/security.md).

The key, read on each node that writes or restores a checkpoint, in order:

1. the file named by ``RAYRL_STORAGE_KEY_FILE`` (its bytes, surrounding whitespace stripped);
2. the Ray cluster's auth token, found as Ray 2.60 finds it: ``RAY_AUTH_TOKEN`` (the value), else
   the file in ``RAY_AUTH_TOKEN_PATH``, else ``~/.ray/auth_token``.

Neither is used as the MAC key itself: the key is ``HMAC(secret, b"rayrl-manifest-v1")``, so the
raw token never meets manifest data. A manifest names its key by id (the first 8 hex digits of
the sha256 of that derived key), never by value. ``RAYRL_ALLOW_UNSIGNED_STORAGE=1`` is the one
opt-out. Pure functions of files, the environment and bytes; no Ray.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from rayrl.errors import SpecError

KEY_FILE_ENV = "RAYRL_STORAGE_KEY_FILE"
ALLOW_ENV = "RAYRL_ALLOW_UNSIGNED_STORAGE"
CONTEXT = b"rayrl-manifest-v1"  #: derivation label: the MAC key is HMAC(secret, CONTEXT)
MAC, KEY_ID = "mac", "key_id"  #: the manifest fields this module writes

#: verdicts of :func:`check`
OK, UNSIGNED, OTHER_KEY, NO_KEY, TAMPERED = "ok", "unsigned", "other key", "no key here", "tampered"


@dataclass(frozen=True)
class Key:
    """A derived MAC key, its id and where its secret came from (never the secret)."""

    secret: bytes = field(repr=False)
    id: str
    source: str


def derive(raw: bytes, source: str) -> Key:
    """The MAC key made from ``raw`` (a key file's bytes or Ray's token)."""
    secret = hmac.new(raw, CONTEXT, hashlib.sha256).digest()
    return Key(secret, hashlib.sha256(secret).hexdigest()[:8], source)


def _read_secret(path: Path, what: str, fix: str) -> bytes:
    try:
        raw = path.expanduser().read_bytes().strip()
    except OSError as exc:
        raise SpecError(
            f"{what}: cannot read the checkpoint signing key {str(path)!r} on this node "
            f"({exc.strerror or exc}); every node that writes or restores checkpoints needs it. {fix}"
        ) from exc
    if not raw:
        raise SpecError(f"{what}: the checkpoint signing key {str(path)!r} is empty. {fix}")
    return raw


def ray_token() -> tuple[bytes, str] | None:
    """The Ray cluster's auth token and where it came from, as Ray 2.60 looks it up; None without one.

    Ray's order (its C++ AuthenticationTokenLoader): a non-empty ``RAY_AUTH_TOKEN``, else the file in
    ``RAY_AUTH_TOKEN_PATH`` (an error there when it cannot be read, as in Ray), else
    ``~/.ray/auth_token``; whitespace around the token is dropped.
    """
    value = os.environ.get("RAY_AUTH_TOKEN", "")
    if value:
        token = value.strip().encode()
        return (token, "RAY_AUTH_TOKEN") if token else None
    path = os.environ.get("RAY_AUTH_TOKEN_PATH", "")
    if path:
        fix = "Point it at the cluster's token file (Ray cannot connect without it either)."
        return _read_secret(Path(path), "RAY_AUTH_TOKEN_PATH", fix), f"RAY_AUTH_TOKEN_PATH={path}"
    default = Path.home() / ".ray" / "auth_token"
    try:
        token = default.read_bytes().strip()
    except OSError:
        return None
    return (token, str(default)) if token else None


def load(key_file: str = "") -> Key | None:
    """The key this node signs and verifies with (see the module doc); None when there is none.

    ``key_file`` (the driver's ``RAYRL_STORAGE_KEY_FILE``, carried to the trial) wins over this
    process's own ``RAYRL_STORAGE_KEY_FILE``; a named file that cannot be read is an error, never a
    silent fall back to another key.
    """
    named = key_file or os.environ.get(KEY_FILE_ENV, "")
    if named:
        fix = f"Put the same random secret at that path on every node, or unset {KEY_FILE_ENV} to use the Ray token."
        return derive(_read_secret(Path(named), KEY_FILE_ENV, fix), f"{KEY_FILE_ENV}={named}")
    token = ray_token()
    return derive(*token) if token else None


def allowed_unsigned(flag: bool = False) -> bool:
    """Whether the user opted out: ``flag`` (the driver's setting) or this process's environment."""
    return flag or os.environ.get(ALLOW_ENV, "") == "1"


def payload(manifest: dict) -> bytes:
    """The signed bytes: the label, then ``files`` and ``meta`` as canonical JSON (sorted keys, no spaces)."""
    body = {"files": manifest.get("files"), "meta": manifest.get("meta")}
    return CONTEXT + b"\n" + json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=True).encode()


def mac(manifest: dict, key: Key) -> str:
    return hmac.new(key.secret, payload(manifest), hashlib.sha256).hexdigest()


def sign(manifest: dict, key: Key) -> dict:
    """``manifest`` with its MAC and key id added. Sign what will be read back: JSON-normalised data."""
    return {**manifest, MAC: mac(manifest, key), KEY_ID: key.id}


def check(manifest: dict, key: Key | None) -> str:
    """OK, or why ``manifest`` is not proven to come from a holder of ``key`` (one of the verdicts)."""
    found_mac, found_id = manifest.get(MAC), manifest.get(KEY_ID)
    if not isinstance(found_mac, str) or not found_mac:
        return UNSIGNED
    if key is None:
        return NO_KEY
    if found_id != key.id:
        return OTHER_KEY
    return OK if hmac.compare_digest(found_mac, mac(manifest, key)) else TAMPERED


def reason(verdict: str, manifest: dict, key: Key | None) -> str:
    """The verdict in a few words, with the key ids found and expected."""
    here = f"key id {key.id} ({key.source})" if key else "no key on this node"
    found = manifest.get(KEY_ID)
    return {
        UNSIGNED: f"not signed (no MAC; this node expects {here})",
        NO_KEY: f"signed with key id {found}, and this node has no key to check it",
        OTHER_KEY: f"signed with key id {found}, this node has {here}",
        TAMPERED: f"MAC wrong under key id {found}: changed after it was signed",
    }[verdict]


def refusal(checkpoint: str, verdict: str, manifest: dict, key: Key | None) -> str:
    """The one paragraph a restore stops with when a checkpoint's signature fails."""
    head = f"{checkpoint} is refused: its manifest is {reason(verdict, manifest, key)}."
    why = (
        " rayrl unpickles checkpoints, so it loads only those whose manifest carries a MAC made with "
        "this cluster's key (docs/security.md)."
    )
    same_key = (
        f" Restore with the key that wrote it: the same {KEY_FILE_ENV} file, or the same Ray token "
        "(RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token) on every node."
    )
    if verdict == TAMPERED:
        return (
            head + why + " Someone without the key changed this checkpoint (or its manifest) in storage or tier 1: "
            "it is never loaded, not even with "
            f"{ALLOW_ENV}=1. Find out who can write there; delete the folder to resume from an older "
            "checkpoint, or start the run under a new --name."
        )
    return (
        head + why + same_key + f" Or, if you trust everyone who can write this storage, set {ALLOW_ENV}=1 "
        "for this run: unsigned checkpoints and those of another key then load after their sha256 check."
    )
