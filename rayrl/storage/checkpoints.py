"""Tiered checkpoints: tier 1 a fast local folder, tier 2 the storage URI, uploaded in the background.

Tune persists a class Trainable's checkpoint in ``Trainable.save``: ``save_checkpoint`` into a temp
folder, then ``StorageContext.persist_current_checkpoint`` copies it to
``storage/EXPERIMENT/TRIAL/checkpoint_NNNNNN`` before training may go on, so every checkpoint to a
slow bucket stalls training for the whole upload. rayrl's trainable keeps Tune's layout, index
and registration (the same ``StorageContext``) but writes the checkpoint into a local folder
(tier 1), adds a manifest (``rayrl.storage.manifest``, written last) and hands the upload to a
background thread (``rayrl.storage.upload``: the files, then the manifest). This module is the
restore side. Restore verifies: it prefers an intact local copy, else downloads and checks the storage
copy, and when the registered (newest)
checkpoint is corrupt or incomplete it takes the newest good one instead, logs it and records it
as ``rayrl_restore_fallback-*.json`` in the trial folder.

Restore is also the trust boundary for storage (docs/security.md): before a copy is loaded, the tier-1
folder must pass the run folder's ownership/mode/symlink check, and the copy's manifest must carry a
MAC made with this node's key (`rayrl.security.signing`). A copy whose MAC is missing or made with
another key is refused like a corrupt one (an older checkpoint that verifies is taken instead), unless
the user opted out (``RAYRL_ALLOW_UNSIGNED_STORAGE=1``); one whose MAC is wrong under the right key
was tampered with and is refused even then. When nothing verifies and a signature was among the
reasons, restore fails with :class:`UntrustedCheckpoint` instead of starting fresh.

Two tier-1 duties besides: :func:`unuploaded` lists the intact, signed tier-1 copies a restore finds
that never reached storage (the trainable queues them for upload again), and :func:`tier1_full` turns
a checkpoint write that failed on a full tier-1 disk into :class:`Tier1Full`, whose paragraph the
driver stops the run with (`rayrl.storage.guard`).
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import posixpath
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rayrl.security import signing, trust
from rayrl.storage import files, manifest

log = logging.getLogger("rayrl.checkpoints")
FALLBACK_PREFIX = "rayrl_restore_fallback-"
DOWNLOAD_PREFIX = "rayrl_restore_download-"  #: a restore that downloaded its checkpoint (tier 1 had none)
META_KEYS = (
    "training_iteration",
    "time_total_s",
    "timesteps_total",
    "episodes_total",
    "num_env_steps_sampled_lifetime",
)


@dataclass(frozen=True)
class TierSettings:
    """What the trainable needs from ``CheckpointSpec`` (see its field docs)."""

    local_dir: str = "$RAYRL_HOME/checkpoints"
    tiered: bool = True
    keep: int = 3
    preempt_grace_s: float = 25.0
    #: the driver's RAYRL_STORAGE_KEY_FILE (a path, read on each trial's node); "" = the node's own
    key_file: str = ""
    #: the driver's RAYRL_ALLOW_UNSIGNED_STORAGE=1, carried to every trial
    allow_unsigned: bool = False


# ---------------------------------------------------------------------------------------------
# Storage copies


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


def tier1_dir(local_dir: str) -> Path:
    """checkpoint.local_dir on this node: ``$RAYRL_HOME`` (default ~/.rayrl) and ``~`` expanded here,
    on the trial's node, so a node with a fresh RAYRL_HOME has a fresh tier 1 too."""
    from rayrl.storage.mirror import home

    return Path(local_dir.replace("${RAYRL_HOME}", str(home())).replace("$RAYRL_HOME", str(home()))).expanduser()


def local_root(settings: TierSettings, trial_fs_path: str) -> Path:
    """Tier 1 folder of one trial: readable name plus a hash of its storage path (unique per run)."""
    digest = hashlib.sha1(trial_fs_path.encode()).hexdigest()[:10]
    return tier1_dir(settings.local_dir) / f"{posixpath.basename(trial_fs_path)}-{digest}"


def trusted_root(settings: TierSettings, trial_fs_path: str) -> Path:
    """:func:`local_root`, after the tier-1 folder and the trial's folder in it passed the run folder's
    trust check (no symlink, owned by this user, writable by no one else); SpecError otherwise."""
    root = local_root(settings, trial_fs_path)
    trust.check_tier1_dir(root.parent)
    trust.check_tier1_dir(root)
    return root


def make_root(root: Path) -> None:
    """Create a trial's tier-1 folder and the tier-1 folder above it, mode 700: under any umask they
    pass :func:`trusted_root`'s check, and other users cannot read the checkpoints."""
    root.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    root.mkdir(mode=0o700, exist_ok=True)


class Tier1Full(RuntimeError):
    """A checkpoint could not be written to tier 1 because its disk is full: every retry of the trial
    would fail the same way, so the driver ends the run with this paragraph (`rayrl.storage.guard`)."""


def _free_mb(folder: Path) -> float | None:
    """Free MB on the disk of ``folder`` or of its nearest existing parent (None if none can be read)."""
    for path in (folder, *folder.parents):
        if path.exists():
            return files.free_mb(path)
    return None


def tier1_full(exc: BaseException, folder: Path, checkpoint: str) -> Tier1Full | None:
    """The paragraph for a checkpoint write into tier-1 ``folder`` that failed with ``exc``, when the
    disk is full: ENOSPC or EDQUOT anywhere in its chain, or less than ``files.MIN_FREE_MB`` free
    there now (libraries that write the checkpoint, torch among them, do not always keep the errno).
    None for any other failure."""
    free = _free_mb(folder)
    seen: BaseException | None = exc
    full = False
    for _ in range(16):  # a chain, never a cycle
        if seen is None:
            break
        full |= getattr(seen, "errno", None) in files.FULL
        seen = seen.__cause__ or seen.__context__
    if not full and (free is None or free >= files.MIN_FREE_MB):
        return None
    text = (str(exc).strip().splitlines() or [""])[0][:200]
    detail = getattr(exc, "strerror", None) or (f"{type(exc).__name__}: {text}" if text else os.strerror(errno.ENOSPC))
    space = f"{free:.1f} MB free on that disk" if free is not None else "its free space could not be read"
    return Tier1Full(
        f"checkpoint {checkpoint} could not be written to tier 1, {folder} ({detail}; {space}). Retrying "
        "cannot help, so the run stops here instead of failing the trial on every retry. Free space on that "
        "disk, or point checkpoint.local_dir at a local disk with room (--set checkpoint.local_dir=PATH; it "
        "holds checkpoint.keep checkpoints per trial plus any still uploading), then run the same command "
        "again: it resumes from the newest checkpoint in storage. checkpoint.tiered: false does not avoid "
        "this folder: it writes each checkpoint there before uploading it."
    )


# ---------------------------------------------------------------------------------------------
# Restore: the newest checkpoint that verifies


class NoIntactCheckpoint(RuntimeError):
    """Checkpoints with manifests exist, and none of them (local or in storage) verifies."""


class UntrustedCheckpoint(RuntimeError):
    """No checkpoint verifies and at least one was refused for its signature: the trial must not start
    fresh over it (a wrong key is fixed by the user, and starting over would discard the run)."""


@dataclass
class Choice:
    path: Path  #: a verified local folder to load
    meta: dict  #: its manifest's metadata (iteration, time, env steps)
    rejected: list  #: [(checkpoint name, why)] newer ones that did not verify
    downloaded_bytes: int = 0  #: > 0: tier 1 had no intact copy, this one came from storage
    unverified: str = ""  #: why its signature did not verify, when the user's opt-out let it load


class _Trust:
    """One restore's key and opt-out; judges each copy's manifest and keeps the first refusal's paragraph."""

    def __init__(self, settings: TierSettings) -> None:
        self.key = signing.load(settings.key_file)
        self.allow = signing.allowed_unsigned(settings.allow_unsigned)
        self.refusal = ""  #: the paragraph for the newest copy refused for its signature

    def refused(self, checkpoint: str, man: dict) -> str | None:
        """None when ``man`` may be loaded (after its hashes), else why not, in a few words."""
        verdict = signing.check(man, self.key)
        if verdict == signing.OK or (self.allow and verdict != signing.TAMPERED):
            return None
        self.refusal = self.refusal or signing.refusal(checkpoint, verdict, man, self.key)
        return signing.reason(verdict, man, self.key)

    def unverified(self, man: dict) -> str:
        verdict = signing.check(man, self.key)
        return "" if verdict == signing.OK else signing.reason(verdict, man, self.key)


def verify_folder(folder: Path, settings: TierSettings, name: str, required: bool) -> str:
    """Check a downloaded checkpoint folder before anything in it is unpickled: its manifest's MAC
    (this node's key), then every listed file's size and sha256; files the manifest does not list are
    removed. Raises UntrustedCheckpoint (the paragraph) or NoIntactCheckpoint. A folder with no
    manifest passes only when not ``required`` (a local run folder written by an older rayrl, guarded
    by the run folder's trust check) or under the user's opt-out. Returns why an opted-out copy is
    unverified ("" when it verified)."""
    judge = _Trust(settings)
    man = manifest.read(folder)
    if man is None:
        if required and not judge.allow:
            raise UntrustedCheckpoint(
                f"{name} is refused: it has no {manifest.NAME}, so nothing proves who wrote it, and rayrl "
                "unpickles checkpoints (docs/security.md). It was written by a rayrl that did not sign sweep "
                f"checkpoints, or by someone else. If you trust everyone who can write this storage, set "
                f"{signing.ALLOW_ENV}=1 for this run."
            )
        return "no manifest" if required else ""
    problem = _problem(judge, name, folder, man)
    if problem is not None and judge.refusal:
        raise UntrustedCheckpoint(judge.refusal)
    if problem is not None:
        raise NoIntactCheckpoint(f"{name} is not the checkpoint its manifest describes: {problem}")
    return judge.unverified(man)


def _problem(judge: _Trust, name: str, folder: Path, man: dict | None) -> str | None:
    """Why ``folder`` may not be loaded (its manifest's signature first, then its files), or None after
    removing the files the verified manifest does not list."""
    why = judge.refused(name, man) if man is not None else None
    found = [why] if why else manifest.problems(folder, man)
    if found:
        return found[0]
    assert man is not None
    _only_listed(folder, man)
    return None


def _only_listed(folder: Path, man: dict) -> None:
    """Remove what the (verified) manifest does not cover: only signed bytes are loaded."""
    for path in manifest.unlisted(folder, man):
        log.warning("%s: not in the checkpoint's manifest; removed before restore", path)
        path.unlink()


def _indices(fs: Any, trial_fs_path: str, root: Path) -> set[int]:
    import pyarrow.fs as pafs

    names = {p.name for p in root.glob("checkpoint_*") if p.is_dir()}
    try:
        infos = fs.get_file_info(pafs.FileSelector(trial_fs_path, allow_not_found=True))
        names |= {posixpath.basename(i.path) for i in infos if i.type == pafs.FileType.Directory}
    except OSError:
        pass
    return {int(n[11:]) for n in names if n.startswith("checkpoint_") and n[11:].isdigit()}


def index_of(name: str) -> int | None:
    """N of ``checkpoint_N`` (Tune's folder name), else None."""
    name = posixpath.basename(name.rstrip("/"))
    return int(name[11:]) if name.startswith("checkpoint_") and name[11:].isdigit() else None


def choose(fs: Any, registered: str, settings: TierSettings, newer: bool = False) -> Choice | None:
    """The newest intact, signed checkpoint at or before ``registered`` (local copy first, then storage);
    with ``newer``, also the trial's checkpoints after it.

    ``newer`` is for a trial restoring its own checkpoint: Tune's experiment state is written every few
    seconds, so after a crash it may name a checkpoint that Tune had already replaced and deleted,
    while newer complete ones sit in storage or tier 1; taking only those at or before it would start
    the trial over from iteration 0. (Not for a checkpoint of another trial, which is meant as named.)

    None when no checkpoint of the trial has a manifest at all (made before rayrl wrote them, or
    never uploaded): the caller decides (see :func:`unmanifested`). Raises SpecError when the tier-1
    folder fails the trust check, UntrustedCheckpoint or NoIntactCheckpoint when nothing verifies.
    """
    trial_fs_path, name = posixpath.split(registered.rstrip("/"))
    root = trusted_root(settings, trial_fs_path)
    judge = _Trust(settings)
    newest = None if newer else index_of(name)
    indices = sorted((i for i in _indices(fs, trial_fs_path, root) if newest is None or i <= newest), reverse=True)
    rejected: list[tuple[str, str]] = []
    any_manifest = False
    for index in indices:
        ckpt = f"checkpoint_{index:06d}"
        local, remote = root / ckpt, f"{trial_fs_path}/{ckpt}"
        remote_man, local_man = remote_manifest(fs, remote), manifest.read(local)
        any_manifest |= remote_man is not None or local_man is not None
        if local_man is not None and (remote_man is None or manifest.same_content(local_man, remote_man)):
            problem = _problem(judge, f"{ckpt} (tier-1 copy in {root})", local, local_man)
            if problem is None:
                return Choice(local, manifest.meta(local_man), rejected, unverified=judge.unverified(local_man))
            rejected.append((ckpt, f"local copy: {problem}"))
        if remote_man is None:
            rejected.append((ckpt, "storage copy: no manifest (upload incomplete or never made)"))
            continue
        why = judge.refused(f"{ckpt} (storage copy in {trial_fs_path})", remote_man)
        if why:  # not even downloaded
            rejected.append((ckpt, f"storage copy: {why}"))
            continue
        staging = root / (ckpt + ".download")
        make_root(root)
        try:
            download(fs, remote, staging)
        except OSError as exc:
            rejected.append((ckpt, f"storage copy: download failed ({exc})"))
            continue
        # Judge the manifest that came down with the files: storage may have changed since the read above.
        staged_man = manifest.read(staging)
        problem = _problem(judge, f"{ckpt} (storage copy in {trial_fs_path})", staging, staged_man)
        if problem is not None or staged_man is None:
            rejected.append((ckpt, f"storage copy: {problem}"))
            shutil.rmtree(staging, ignore_errors=True)
            continue
        shutil.rmtree(local, ignore_errors=True)
        staging.rename(local)
        size = sum(p.stat().st_size for p in local.rglob("*") if p.is_file())
        return Choice(
            local, manifest.meta(staged_man), rejected, downloaded_bytes=size, unverified=judge.unverified(staged_man)
        )
    if not any_manifest:
        return None
    tried = "; ".join(f"{c}: {why}" for c, why in rejected)
    if judge.refusal:
        raise UntrustedCheckpoint(f"{judge.refusal} Checkpoints tried in {trial_fs_path}: {tried}")
    where = "" if newer else f" at or before {name}"
    raise NoIntactCheckpoint(f"no intact checkpoint in {trial_fs_path}{where}: {tried}")


def unuploaded(fs: Any, registered: str, settings: TierSettings) -> list[Path]:
    """Tier-1 copies of this trial that storage lacks (no manifest there) and that verify here (files
    and signature): the ones an upload never finished before a crash. Only the ``settings.keep``
    indices up to ``registered``: Tune has deleted older ones from storage and knows of no newer one.

    Oldest first, the order Tune registered them: the uploader works in order, so its pending copies
    stay the newest ones, which Tune does not delete when the next checkpoints register (newest
    first would leave the oldest pending while Tune deletes it).
    """
    trial_fs_path, name = posixpath.split(registered.rstrip("/"))
    newest = index_of(name)
    if newest is None:
        return []
    root = trusted_root(settings, trial_fs_path)
    judge = _Trust(settings)
    found = []
    for index in range(max(0, newest - settings.keep + 1), newest + 1):
        ckpt = f"checkpoint_{index:06d}"
        local = root / ckpt
        local_man = manifest.read(local)
        if local_man is None or remote_manifest(fs, f"{trial_fs_path}/{ckpt}") is not None:
            continue
        if judge.refused(f"{ckpt} (tier-1 copy in {root})", local_man) or manifest.problems(local, local_man):
            continue
        found.append(local)
    return found


def unmanifested(registered: str, settings: TierSettings) -> str | None:
    """The paragraph that refuses a checkpoint with no manifest anywhere (Tune's own restore would
    unpickle it unverified), or None when the user opted out of signed storage."""
    if signing.allowed_unsigned(settings.allow_unsigned):
        return None
    return (
        f"{registered} has no {manifest.NAME} in storage or tier 1, so nothing proves who wrote it "
        "(written before rayrl signed its checkpoints, an upload cut short, or put there by someone else); "
        "rayrl unpickles checkpoints and loads only signed ones (docs/security.md). If you trust everyone "
        f"who can write this storage, set {signing.ALLOW_ENV}=1 for this run to restore it as Tune would."
    )


def landed(fs: Any, registered: str) -> bool:
    """Whether the checkpoint Tune registered exists in storage at all (a kill before its upload
    finished leaves Tune's state naming a folder that was never written)."""
    from rayrl.storage import files

    try:
        return files.exists(fs, registered.rstrip("/"))
    except OSError:
        return True  # cannot tell: let Tune try, and say what it says


def _record(fs: Any, trial_fs_path: str, prefix: str, event: dict) -> None:
    """One restore event as a JSON file in the trial folder (best effort: a failed write only logs)."""
    try:
        with fs.open_output_stream(f"{trial_fs_path}/{prefix}{int(time.time() * 1000)}.json") as out:
            out.write(json.dumps(event, indent=1).encode())
    except OSError as exc:
        log.warning("could not record %s in %s: %s", prefix.rstrip("-"), trial_fs_path, exc)


def record_fallback(fs: Any, trial_fs_path: str, registered: str, choice: Choice) -> dict:
    """Log a restore that skipped corrupt checkpoints and write it into the trial folder."""
    event = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "registered": posixpath.basename(registered),
        "restored": choice.path.name,
        "restored_iteration": choice.meta.get("training_iteration"),
        "rejected": [{"checkpoint": c, "why": why} for c, why in choice.rejected],
    }
    log.warning(
        "checkpoint %s is not intact or not signed (%s); restored %s instead",
        event["registered"],
        "; ".join(f"{c}: {w}" for c, w in choice.rejected),
        event["restored"],
    )
    print(
        f"[rayrl] checkpoint {event['registered']} is not intact or not signed ({choice.rejected[0][1]}); "
        f"restored {event['restored']} instead",
        flush=True,
    )
    _record(fs, trial_fs_path, FALLBACK_PREFIX, event)
    return event


def record_download(fs: Any, trial_fs_path: str, choice: Choice) -> None:
    """Write a restore that came from storage (no intact tier-1 copy on this node) into the trial folder:
    the evidence that a run resumed from the bucket alone."""
    event = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "restored": choice.path.name,
        "downloaded_bytes": choice.downloaded_bytes,
        "to": str(choice.path.parent),
    }
    print(
        f"[rayrl] restored {choice.path.name} from storage ({choice.downloaded_bytes:,} bytes downloaded)", flush=True
    )
    _record(fs, trial_fs_path, DOWNLOAD_PREFIX, event)


def fallbacks(run_dir: Path) -> list[dict]:
    """Every recorded restore fallback of a run folder's trials (for summary.json)."""
    found = []
    for path in sorted(run_dir.glob(f"*/*/{FALLBACK_PREFIX}*.json")):
        try:
            found.append({"trial": path.parent.name, **json.loads(path.read_text())})
        except (OSError, ValueError):
            continue
    return found
