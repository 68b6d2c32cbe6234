"""A checkpoint's manifest: every file with its size and sha256, written last.

A checkpoint folder is complete and intact exactly when its manifest exists and every file it lists
has that size and hash. Written last (locally and on upload), a manifest's presence means every
file before it landed; its hashes catch bytes flipped afterwards (a bad disk, a torn object-store
upload). Hashes prove integrity, not authorship: ``write`` also signs the manifest with this
node's key (`rayrl.security.signing`: a MAC over ``files`` and ``meta``, and the key's id), and restore
loads only what verifies. Pure file functions, no Ray.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Literal

from rayrl.security import signing

NAME = "rayrl_manifest.json"
VERSION = 1


def sha256(path: Path) -> str:
    """The file's sha256 (read in 1 MiB blocks)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def build(folder: Path, meta: dict | None = None) -> dict:
    """The manifest of ``folder``'s files (the manifest itself excluded), with ``meta`` attached."""
    files = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.name != NAME):
        files[path.relative_to(folder).as_posix()] = {"size": path.stat().st_size, "sha256": sha256(path)}
    return {"version": VERSION, "files": files, "meta": dict(meta or {})}


def write(folder: Path, meta: dict | None = None, key: signing.Key | None | Literal["env"] = "env") -> dict:
    """Hash ``folder`` and write its manifest last, atomically (temp, fsync, rename), signed with ``key``.

    ``key``: "env" signs with this node's key (``signing.load()``: RAYRL_STORAGE_KEY_FILE, else the
    Ray token); None writes it unsigned. The MAC covers the JSON as it will be read back (``meta``
    values JSON cannot hold are written as strings, as before).
    """
    manifest = json.loads(json.dumps(build(folder, meta), default=str))
    key = signing.load() if key == "env" else key
    if key is not None:
        manifest = signing.sign(manifest, key)
    tmp = folder / (NAME + ".tmp")
    with open(tmp, "w") as f:
        json.dump(manifest, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(folder / NAME)
    return manifest


def read(folder: Path) -> dict | None:
    """The manifest of ``folder``, or None when it is missing or not a manifest."""
    try:
        data = json.loads((folder / NAME).read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("files"), dict):
        return None
    return data


def problems(folder: Path, manifest: dict | None = None) -> list[str]:
    """Why ``folder`` is not the complete checkpoint its manifest describes ([] when it is)."""
    manifest = manifest if manifest is not None else read(folder)
    if manifest is None:
        return [f"no readable {NAME} (the checkpoint was cut short before its manifest was written)"]
    found = []
    for rel, want in manifest["files"].items():
        path = folder / rel
        if not path.is_file():
            found.append(f"{rel}: missing")
        elif path.stat().st_size != want.get("size"):
            found.append(f"{rel}: {path.stat().st_size} bytes, manifest says {want.get('size')}")
        elif sha256(path) != want.get("sha256"):
            found.append(f"{rel}: sha256 differs from the manifest")
    return found


def unlisted(folder: Path, manifest: dict) -> list[Path]:
    """Files in ``folder`` its manifest does not list (the manifest itself aside): not covered by
    its hashes or MAC, so restore removes them before anything is loaded."""
    listed = set(manifest["files"]) | {NAME}
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.relative_to(folder).as_posix() not in listed)


def same_content(a: dict | None, b: dict | None) -> bool:
    """Whether two manifests list the same files with the same hashes."""
    return a is not None and b is not None and a.get("files") == b.get("files")


def meta(manifest: dict | None) -> dict[str, Any]:
    """The metadata saved with the checkpoint (iteration, time, env steps) or {}."""
    return dict((manifest or {}).get("meta") or {})
