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
"""

from __future__ import annotations

import hashlib
import json
import logging
import posixpath
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rayrl.storage import manifest

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


# ---------------------------------------------------------------------------------------------
# Restore: the newest checkpoint that verifies


class NoIntactCheckpoint(RuntimeError):
    """Checkpoints with manifests exist, and none of them (local or in storage) verifies."""


@dataclass
class Choice:
    path: Path  #: a verified local folder to load
    meta: dict  #: its manifest's metadata (iteration, time, env steps)
    rejected: list  #: [(checkpoint name, why)] newer ones that did not verify
    downloaded_bytes: int = 0  #: > 0: tier 1 had no intact copy, this one came from storage


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
        size = sum(p.stat().st_size for p in local.rglob("*") if p.is_file())
        return Choice(local, manifest.meta(remote_man), rejected, downloaded_bytes=size)
    if not any_manifest:
        return None
    raise NoIntactCheckpoint(
        f"no intact checkpoint in {trial_fs_path} at or before {name}: "
        + "; ".join(f"{c}: {why}" for c, why in rejected)
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
        "checkpoint %s is not intact (%s); restored %s instead",
        event["registered"],
        "; ".join(f"{c}: {w}" for c, w in choice.rejected),
        event["restored"],
    )
    print(f"[rayrl] checkpoint {event['registered']} is not intact; restored {event['restored']} instead", flush=True)
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
