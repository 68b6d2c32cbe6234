"""Tier 1 -> tier 2: copying a manifested checkpoint folder to storage, in the background.

Files first, the manifest last, so a storage copy with a manifest is complete; failures are retried
with backoff in a daemon thread and never reach training (`rayrl.storage.checkpoints` explains the
tiers). Every failed attempt is counted (``UploadStats.failed_attempts``, reported by the trainable as
``rayrl/checkpoint_upload_failures``); each distinct error is printed once, its repeats only counted.
"""

from __future__ import annotations

import logging
import posixpath
import queue
import re
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rayrl.storage import manifest

log = logging.getLogger("rayrl.checkpoints")


def _put(src: Path, fs: Any, dst: str) -> None:
    fs.create_dir(posixpath.dirname(dst), recursive=True)
    with open(src, "rb") as f, fs.open_output_stream(dst) as out:
        shutil.copyfileobj(f, out, 1 << 20)


def upload(local: Path, fs: Any, dest: str) -> None:
    """Copy a manifested checkpoint folder to ``dest`` on ``fs``: every file, then the manifest last."""
    import pyarrow.fs as pafs

    man = manifest.read(local)
    if man is None:
        raise FileNotFoundError(f"{local}: no manifest; only complete checkpoints are uploaded")
    fs.create_dir(dest, recursive=True)
    if fs.get_file_info(f"{dest}/{manifest.NAME}").type != pafs.FileType.NotFound:
        fs.delete_file(f"{dest}/{manifest.NAME}")  # a re-save of this index: incomplete until the end
    for rel in man["files"]:
        _put(local / rel, fs, f"{dest}/{rel}")
    _put(local / manifest.NAME, fs, f"{dest}/{manifest.NAME}")


#: words in a storage error that no retry can fix (S3's codes as pyarrow and boto word them)
PERMANENT_WORDS = (
    "ACCESS_DENIED",
    "AccessDenied",
    "INVALID_ACCESS_KEY_ID",
    "InvalidAccessKeyId",
    "SIGNATURE_DOES_NOT_MATCH",
    "SignatureDoesNotMatch",
    "NoSuchBucket",
    "NO_SUCH_BUCKET",
    "To create buckets, enable",  # pyarrow: "Bucket 'x' not found. To create buckets, enable ..."
    "EXPIRED_TOKEN",
    "ExpiredToken",
)


def is_permanent(exc: BaseException) -> bool:
    """A refusal (credentials, permissions, a missing bucket), not a slow or absent server."""
    text = str(exc)
    return any(word in text for word in PERMANENT_WORDS)


@dataclass
class UploadStats:
    uploaded: int = 0
    failed_attempts: int = 0
    last_upload_s: float = 0.0
    last_error: str = ""
    uploaded_paths: list = field(default_factory=list)
    #: distinct errors seen (each printed once; the same error again is only counted)
    distinct_errors: int = 0
    #: set once an upload was refused ``permanent_after`` times in a row: the storage will not take it
    permanent_error: str = ""
    given_up: list = field(default_factory=list)  #: tier-1 folders whose upload was abandoned


class StorageRefused(RuntimeError):
    """Storage refused checkpoint uploads permanently: the trial stops with the reason, and the driver's
    DiskGuard (`rayrl.storage.guard`) ends the run with it instead of letting Tune retry the trial."""


#: distinct errors printed at most; beyond it further new errors are only counted
MAX_DISTINCT = 32


def error_key(text: str) -> str:
    """An upload error with what changes from checkpoint to checkpoint taken out (the checkpoint's
    index, and so its file paths): one outage gives one key, however many checkpoints it fails."""
    return re.sub(r"checkpoint_\d+", "checkpoint_N", text)


def permanent_failure_message(stats: UploadStats, where: str) -> str:
    """The one paragraph a trial stops with when storage refuses its checkpoints."""
    return (
        f"checkpoint uploads to {where} are refused ({stats.permanent_error}); retrying cannot fix a refusal "
        f"(credentials, the bucket's policy or a missing bucket), so the run stops here rather than train on "
        f"with checkpoints that exist on this node only ({len(stats.given_up)} not uploaded, kept in tier 1: "
        f"{', '.join(stats.given_up[-3:])}). Fix the access (docs/storage.md) and run the same command again: "
        "it resumes from the newest checkpoint that landed."
    )


class Uploader:
    """One daemon thread uploading checkpoint folders in order, retrying each until it lands.

    Storage that fails or hangs delays uploads, never training; retries back off up to ``max_backoff_s``.
    """

    def __init__(self, max_backoff_s: float = 30.0, permanent_after: int = 3) -> None:
        self.max_backoff_s = max_backoff_s
        self.permanent_after = permanent_after
        self.stats = UploadStats()
        self._queue: queue.Queue = queue.Queue()
        self._pending = 0
        self.waiting: set[str] = set()  #: tier-1 folders not yet in storage (never pruned)
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._said: set[str] = set()  #: error keys already printed
        threading.Thread(target=self._run, name="rayrl-checkpoint-upload", daemon=True).start()

    @property
    def pending(self) -> int:
        with self._lock:
            return self._pending

    def waiting_paths(self) -> set[str]:
        with self._lock:
            return set(self.waiting)

    def submit(self, local: Path, fs: Any, dest: str) -> None:
        with self._lock:
            self._pending += 1
            self.waiting.add(str(local))
        self._queue.put((local, fs, dest))

    def wait_below(self, limit: int, timeout_s: float) -> bool:
        """Wait until at most ``limit`` uploads are pending (True) or ``timeout_s`` passed (False)."""
        deadline = time.monotonic() + timeout_s
        with self._idle:
            while self._pending > limit:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
        return True

    def drain(self, timeout_s: float) -> bool:
        """Wait until every submitted upload landed (True) or ``timeout_s`` passed (False)."""
        return self.wait_below(0, timeout_s)

    def upload_now(self, local: Path, fs: Any, dest: str, attempts: int = 3) -> None:
        """Upload in this thread (synchronous mode, preemption); raises after ``attempts`` failures."""
        for attempt in range(attempts):
            try:
                self._once(local, fs, dest)
                return
            except OSError:
                if attempt == attempts - 1:
                    raise
                time.sleep(min(self.max_backoff_s, 2**attempt))

    def _once(self, local: Path, fs: Any, dest: str) -> None:
        start = time.perf_counter()
        try:
            upload(local, fs, dest)
        except Exception as exc:
            self.stats.failed_attempts += 1
            self.stats.last_error = f"{type(exc).__name__}: {exc}"[:300]
            self._say_once(local, dest)
            raise
        self.stats.uploaded += 1
        self.stats.last_upload_s = time.perf_counter() - start
        self.stats.uploaded_paths = (self.stats.uploaded_paths + [str(local)])[-64:]

    def _say_once(self, local: Path, dest: str) -> None:
        """Print the error just counted if it is a new one (``error_key``); its repeats are only counted."""
        key = error_key(self.stats.last_error)
        if key in self._said or len(self._said) >= MAX_DISTINCT:
            return
        self._said.add(key)
        self.stats.distinct_errors = len(self._said)
        print(
            f"[rayrl] checkpoint upload of {local.name} to {posixpath.dirname(dest)} failed "
            f"({self.stats.last_error}); retried with backoff. This error is printed once: each further "
            "failed attempt is counted in rayrl/checkpoint_upload_failures",
            flush=True,
        )

    def _run(self) -> None:
        while True:
            local, fs, dest = self._queue.get()
            backoff, refused, kept = 1.0, 0, False
            while True:
                if not local.is_dir():  # pruned from tier 1 before it could land: nothing left to send
                    break
                try:
                    self._once(local, fs, dest)
                    break
                except Exception as exc:  # noqa: BLE001 - any error: the thread must live on, and say so
                    refused = refused + 1 if is_permanent(exc) else 0
                    if refused >= self.permanent_after:
                        self.stats.permanent_error = self.stats.last_error
                        self.stats.given_up = (self.stats.given_up + [str(local)])[-64:]
                        log.error("checkpoint upload to %s refused %d times (%s); giving up", dest, refused, exc)
                        kept = True  # the only copy now: still protected from pruning
                        break
                    log.debug("checkpoint upload to %s failed (%s); retrying in %.0fs", dest, exc, backoff)
                    time.sleep(backoff)
                    backoff = min(self.max_backoff_s, backoff * 2)
            with self._idle:
                self._pending -= 1
                if not kept:
                    self.waiting.discard(str(local))
                self._idle.notify_all()


def prune_local(root: Path, keep: int, protect: set[str]) -> None:
    """Keep the newest ``keep`` checkpoint folders of tier 1 (and any still waiting to upload)."""
    folders = sorted(p for p in root.glob("checkpoint_*") if p.is_dir() and p.name[11:].isdigit())
    for old in folders[:-keep] if keep > 0 else folders:
        if str(old) not in protect:
            shutil.rmtree(old, ignore_errors=True)
