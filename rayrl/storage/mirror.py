"""A run folder on any storage, seen through a local folder rayrl reads and writes.

On local storage the local folder *is* the run folder. On object storage (s3://, gs://, ...) it
is a mirror under ``$RAYRL_HOME/runs`` (default ``~/.rayrl/runs``): every write goes to the mirror
(atomically) and then to the bucket (one upload), so the bucket holds the run-folder contract as
the run goes; a start first pulls the bucket's files into the mirror, so a machine whose local
copies were wiped resumes from the bucket alone. Tune's experiments (phase1/, phase2/, tune/) are
written by Tune itself to the same filesystem, not mirrored.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from rayrl.storage import files
from rayrl.storage.lock import LOCK_FILE
from rayrl.storage.uri import Location, is_uri, parse

log = logging.getLogger("rayrl.storage.mirror")

# Tune's experiment folders: never mirrored file by file (Tune syncs them itself).
TUNE_DIRS = ("phase1", "phase2", "confirm", "tune", "drills")
UNSENT = ".rayrl-unsent.json"  #: in the local mirror: files whose upload failed, sent at the next start


def home() -> Path:
    """rayrl's local state folder: $RAYRL_HOME, default ~/.rayrl."""
    return Path(os.environ.get("RAYRL_HOME") or Path.home() / ".rayrl")


def mirror_dir(loc: Location) -> Path:
    """The local mirror of a remote run folder: one per URI, the folder named as the run."""
    tag = hashlib.sha1(loc.uri.encode()).hexdigest()[:10]
    return home() / "runs" / tag / Path(loc.path).name


@dataclass(frozen=True)
class RunStore:
    """Writes and uploads the run folder's own files (not Tune's)."""

    loc: Location
    local_dir: Path

    @property
    def remote(self) -> bool:
        return not self.loc.local

    def write_bytes(self, rel: str, data: bytes) -> None:
        """Atomically write ``rel`` in the local folder and, on object storage, upload it."""
        files.write_local(self.local_dir / rel, data)
        if self.remote:
            self._send(rel, data)

    def write_text(self, rel: str, text: str) -> None:
        self.write_bytes(rel, text.encode())

    def upload(self, rel: str) -> None:
        """Send the local ``rel`` (e.g. history.csv after appends) to the bucket as one object."""
        if self.remote and (self.local_dir / rel).exists():
            self._send(rel, (self.local_dir / rel).read_bytes())

    def send(self, rel: str, data: bytes) -> None:
        """Upload ``data`` as ``rel``, leaving the marks to the caller (:meth:`mark_unsent` before,
        :meth:`mark_sent` after, when it knows the local file did not grow meanwhile)."""
        files.write_bytes(self.loc.fs, self.loc.join(rel), data)

    def mark_unsent(self, rel: str) -> None:
        """``rel`` changed locally and the bucket lacks the change (a write only when that is news)."""
        self._mark(rel, failed=True)

    def mark_sent(self, rel: str) -> None:
        self._mark(rel, failed=False)

    # A failed upload is written down (UNSENT) so the next start sends the local file instead of
    # letting the bucket's older copy, or its absence, win over it.
    def unsent(self) -> list[str]:
        try:
            return list(json.loads((self.local_dir / UNSENT).read_text()))
        except (OSError, ValueError):
            return []

    def _mark(self, rel: str, failed: bool) -> None:
        now = self.unsent()
        if failed == (rel in now):
            return
        now = sorted({*now, rel}) if failed else [r for r in now if r != rel]
        files.write_local(self.local_dir / UNSENT, json.dumps(now).encode())

    def _send(self, rel: str, data: bytes) -> None:
        try:
            files.write_bytes(self.loc.fs, self.loc.join(rel), data)
        except OSError:
            self._mark(rel, failed=True)
            raise
        self._mark(rel, failed=False)

    def resend(self) -> list[str]:
        """Upload the files whose upload failed before; returns those still not in the bucket."""
        for rel in self.unsent():
            if not (self.local_dir / rel).exists():
                self._mark(rel, failed=False)
                continue
            try:
                self._send(rel, (self.local_dir / rel).read_bytes())
            except OSError as exc:
                log.warning("%s: %s is still not uploaded (%s); the local copy is kept", self.loc.uri, rel, exc)
        return self.unsent()

    def pull(self, full: bool = False) -> list[str]:
        """Make the local folder hold the bucket's run-folder files (the bucket wins); returns them.

        ``full`` also copies Tune's folders (the drills restore checkpoints from a local copy).
        """
        if not self.remote:
            return []
        self.local_dir.mkdir(parents=True, exist_ok=True)
        keep = set(self.resend())  # never overwrite or delete a local file the bucket has not received
        names = [
            n
            for n in files.list_files(self.loc.fs, self.loc.path, recursive=True)
            if n != LOCK_FILE and (full or n.split("/")[0] not in TUNE_DIRS)
        ]
        for name in names:
            if name not in keep:
                files.write_local(self.local_dir / name, files.read_bytes(self.loc.fs, self.loc.join(name)))
        top = {n for n in names if "/" not in n} | keep | {UNSENT}
        for stale in self.local_dir.iterdir():  # files the bucket does not have are not this run's
            if stale.is_file() and stale.name not in top:
                stale.unlink()
        return names


def open_store(loc: Location) -> RunStore:
    """The store of the run folder at ``loc`` (local folder, or a mirror for object storage)."""
    return RunStore(loc, Path(loc.path) if loc.local else mirror_dir(loc))


def fetch(run: str | os.PathLike, full: bool = False) -> tuple[Path, RunStore | None]:
    """A local folder holding the run folder ``run`` (a path or a URI) for reading; the store when remote.

    Raises FileNotFoundError when the URI names no folder with files.
    """
    if not is_uri(run):
        return Path(run), None
    loc = parse(str(run))
    if loc.local:
        return Path(loc.path), None
    store = open_store(loc)
    if not store.pull(full=full):
        raise FileNotFoundError(f"{loc.uri}: no files there")
    return store.local_dir, store


def publish(run: str, local_dir: Path, rels: list[str]) -> None:
    """Upload files a reader wrote into a fetched copy (report.md, plots/, drill.json) back to ``run``."""
    store = open_store(parse(run))
    for rel in rels:
        store.upload(rel) if store.local_dir == local_dir else files.write_bytes(
            store.loc.fs, store.loc.join(rel), (local_dir / rel).read_bytes()
        )
