"""Tiered checkpoints: tier 1 a fast local folder, tier 2 the storage URI, uploaded in the background.

Tune persists a class Trainable's checkpoint in ``Trainable.save``: ``save_checkpoint`` into a temp
folder, then ``StorageContext.persist_current_checkpoint`` copies it to
``storage/EXPERIMENT/TRIAL/checkpoint_NNNNNN`` before training may go on, so every checkpoint to a
slow bucket stalls training for the whole upload. rayrl's trainable keeps Tune's layout, index
and registration (the same ``StorageContext``) but writes the checkpoint into a local folder
(tier 1), adds a manifest (``rayrl.storage.manifest``, written last) and hands the upload to a
background thread that copies the files and then the manifest. Restore verifies: it prefers an
intact local copy, else downloads and checks the storage copy, and when the registered (newest)
checkpoint is corrupt or incomplete it takes the newest good one instead, logs it and records it
as ``rayrl_restore_fallback-*.json`` in the trial folder.
"""

from __future__ import annotations

import hashlib
import json
import logging
import posixpath
import queue
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rayrl.storage import manifest

log = logging.getLogger("rayrl.checkpoints")
FALLBACK_PREFIX = "rayrl_restore_fallback-"
META_KEYS = ("training_iteration", "time_total_s", "timesteps_total", "episodes_total",
             "num_env_steps_sampled_lifetime")


@dataclass(frozen=True)
class TierSettings:
    """What the trainable needs from ``CheckpointSpec`` (see its field docs)."""

    local_dir: str = "~/.rayrl/checkpoints"
    tiered: bool = True
    keep: int = 3
    preempt_grace_s: float = 25.0


# ---------------------------------------------------------------------------------------------
# Copying one checkpoint folder between tiers (pyarrow filesystems: local, s3://, gs://, ...)


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


def remote_manifest(fs: Any, path: str) -> dict | None:
    """The manifest of a checkpoint folder in storage, or None."""
    try:
        with fs.open_input_stream(f"{path}/{manifest.NAME}") as f:
            data = json.loads(f.read())
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("files"), dict) else None


def download(fs: Any, path: str, local: Path) -> None:
    """Copy a storage checkpoint folder into ``local`` (replaced)."""
    import pyarrow.fs as pafs

    shutil.rmtree(local, ignore_errors=True)
    local.mkdir(parents=True)
    pafs.copy_files(path, str(local), source_filesystem=fs, destination_filesystem=pafs.LocalFileSystem())


def local_root(settings: TierSettings, trial_fs_path: str) -> Path:
    """Tier 1 folder of one trial: readable name plus a hash of its storage path (unique per run)."""
    digest = hashlib.sha1(trial_fs_path.encode()).hexdigest()[:10]
    return Path(settings.local_dir).expanduser() / f"{posixpath.basename(trial_fs_path)}-{digest}"


# ---------------------------------------------------------------------------------------------
# The background uploader


@dataclass
class UploadStats:
    uploaded: int = 0
    failed_attempts: int = 0
    last_upload_s: float = 0.0
    last_error: str = ""
    uploaded_paths: list = field(default_factory=list)


class Uploader:
    """One daemon thread uploading checkpoint folders in order, retrying each until it lands.

    Storage that fails or hangs delays uploads, never training; retries back off up to ``max_backoff_s``.
    """

    def __init__(self, max_backoff_s: float = 30.0) -> None:
        self.max_backoff_s = max_backoff_s
        self.stats = UploadStats()
        self._queue: queue.Queue = queue.Queue()
        self._pending = 0
        self.waiting: set[str] = set()  #: tier-1 folders not yet in storage (never pruned)
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
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

    def drain(self, timeout_s: float) -> bool:
        """Wait until every submitted upload landed (True) or ``timeout_s`` passed (False)."""
        deadline = time.monotonic() + timeout_s
        with self._idle:
            while self._pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
        return True

    def upload_now(self, local: Path, fs: Any, dest: str, attempts: int = 3) -> None:
        """Upload in this thread (synchronous mode, preemption); raises after ``attempts`` failures."""
        for attempt in range(attempts):
            try:
                self._once(local, fs, dest)
                return
            except OSError:
                if attempt == attempts - 1:
                    raise
                time.sleep(min(self.max_backoff_s, 2 ** attempt))

    def _once(self, local: Path, fs: Any, dest: str) -> None:
        start = time.perf_counter()
        try:
            upload(local, fs, dest)
        except OSError as exc:
            self.stats.failed_attempts += 1
            self.stats.last_error = f"{type(exc).__name__}: {exc}"[:300]
            raise
        self.stats.uploaded += 1
        self.stats.last_upload_s = time.perf_counter() - start
        self.stats.uploaded_paths = (self.stats.uploaded_paths + [str(local)])[-64:]

    def _run(self) -> None:
        while True:
            local, fs, dest = self._queue.get()
            backoff = 1.0
            while True:
                if not local.is_dir():  # pruned from tier 1 before it could land: nothing left to send
                    break
                try:
                    self._once(local, fs, dest)
                    break
                except OSError as exc:
                    log.warning("checkpoint upload to %s failed (%s); retrying in %.0fs", dest, exc, backoff)
                    time.sleep(backoff)
                    backoff = min(self.max_backoff_s, backoff * 2)
            with self._idle:
                self._pending -= 1
                self.waiting.discard(str(local))
                self._idle.notify_all()


def prune_local(root: Path, keep: int, protect: set[str]) -> None:
    """Keep the newest ``keep`` checkpoint folders of tier 1 (and any still waiting to upload)."""
    folders = sorted(p for p in root.glob("checkpoint_*") if p.is_dir() and p.name[11:].isdigit())
    for old in folders[:-keep] if keep > 0 else folders:
        if str(old) not in protect:
            shutil.rmtree(old, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# Restore: the newest checkpoint that verifies


@dataclass
class Choice:
    path: Path            #: a verified local folder to load
    meta: dict            #: its manifest's metadata (iteration, time, env steps)
    rejected: list        #: [(checkpoint name, why)] newer ones that did not verify


def _indices(fs: Any, trial_fs_path: str, root: Path) -> set[int]:
    import pyarrow.fs as pafs

    names = {p.name for p in root.glob("checkpoint_*") if p.is_dir()}
    try:
        infos = fs.get_file_info(pafs.FileSelector(trial_fs_path, allow_not_found=True))
        names |= {posixpath.basename(i.path) for i in infos if i.type == pafs.FileType.Directory}
    except OSError:
        pass
    return {int(n[11:]) for n in names if n.startswith("checkpoint_") and n[11:].isdigit()}


def choose(fs: Any, registered: str, settings: TierSettings) -> Choice | None:
    """The newest intact checkpoint at or before ``registered`` (local copy first, then storage).

    None when no checkpoint of the trial has a manifest at all (made before rayrl wrote them):
    the caller restores the registered one as Tune would.
    """
    trial_fs_path, name = posixpath.split(registered.rstrip("/"))
    root = local_root(settings, trial_fs_path)
    newest = int(name[11:]) if name.startswith("checkpoint_") and name[11:].isdigit() else None
    indices = sorted((i for i in _indices(fs, trial_fs_path, root) if newest is None or i <= newest), reverse=True)
    rejected: list[tuple[str, str]] = []
    any_manifest = False
    for index in indices:
        ckpt = f"checkpoint_{index:06d}"
        local, remote = root / ckpt, f"{trial_fs_path}/{ckpt}"
        remote_man, local_man = remote_manifest(fs, remote), manifest.read(local)
        any_manifest |= remote_man is not None or local_man is not None
        if local_man is not None and (remote_man is None or manifest.same_content(local_man, remote_man)):
            found = manifest.problems(local, local_man)
            if not found:
                return Choice(local, manifest.meta(local_man), rejected)
            rejected.append((ckpt, f"local copy: {found[0]}"))
        if remote_man is None:
            rejected.append((ckpt, "storage copy: no manifest (upload incomplete or never made)"))
            continue
        staging = root / (ckpt + ".download")
        try:
            download(fs, remote, staging)
        except OSError as exc:
            rejected.append((ckpt, f"storage copy: download failed ({exc})"))
            continue
        found = manifest.problems(staging)
        if found:
            rejected.append((ckpt, f"storage copy: {found[0]}"))
            shutil.rmtree(staging, ignore_errors=True)
            continue
        shutil.rmtree(local, ignore_errors=True)
        staging.rename(local)
        return Choice(local, manifest.meta(remote_man), rejected)
    if not any_manifest:
        return None
    raise RuntimeError(f"no intact checkpoint in {trial_fs_path} at or before {name}: "
                       + "; ".join(f"{c}: {why}" for c, why in rejected))


def record_fallback(fs: Any, trial_fs_path: str, registered: str, choice: Choice) -> dict:
    """Log a restore that skipped corrupt checkpoints and write it into the trial folder."""
    event = {"when": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "registered": posixpath.basename(registered),
             "restored": choice.path.name, "restored_iteration": choice.meta.get("training_iteration"),
             "rejected": [{"checkpoint": c, "why": why} for c, why in choice.rejected]}
    log.warning("checkpoint %s is not intact (%s); restored %s instead", event["registered"],
                "; ".join(f"{c}: {w}" for c, w in choice.rejected), event["restored"])
    print(f"[rayrl] checkpoint {event['registered']} is not intact; restored {event['restored']} instead",
          flush=True)
    try:
        with fs.open_output_stream(f"{trial_fs_path}/{FALLBACK_PREFIX}{int(time.time() * 1000)}.json") as out:
            out.write(json.dumps(event, indent=1).encode())
    except OSError as exc:
        log.warning("could not record the fallback in %s: %s", trial_fs_path, exc)
    return event


def fallbacks(run_dir: Path) -> list[dict]:
    """Every recorded restore fallback of a run folder's trials (for summary.json)."""
    found = []
    for path in sorted(run_dir.glob(f"*/*/{FALLBACK_PREFIX}*.json")):
        try:
            found.append({"trial": path.parent.name, **json.loads(path.read_text())})
        except (OSError, ValueError):
            continue
    return found
