"""The RLlib Algorithm as rayrl's Tune trainable: tiered, verified checkpoints and SIGTERM handling.

A subclass made per spec (:func:`tiered_trainable`), with the same name as the algorithm's class, so
Tune's trial folders (``PPO_...``) and actor names do not change. It overrides only Trainable's
persistence hooks (``save``, ``restore``, ``cleanup``) and ``step`` (to report upload figures and
ask for a checkpoint after a SIGTERM); see `rayrl.storage.checkpoints` for why.
"""

from __future__ import annotations

import os
import posixpath
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rayrl.faults.preemption import TrialPreemption
from rayrl.security import signing
from rayrl.storage import checkpoints as ck
from rayrl.storage import manifest, upload

DRAIN_S = 600.0  #: how long a stopping trial waits for its last uploads
BACKPRESSURE_S = 120.0  #: how long a checkpoint waits for earlier uploads before it is skipped


if TYPE_CHECKING:
    from ray.tune import Trainable as _Trainable
else:
    _Trainable = object  # at run time the algorithm class supplies Trainable, after this mixin in the MRO


class TieredCheckpoints(_Trainable):
    """rayrl's persistence hooks, put in front of an RLlib Algorithm class by :func:`tiered_trainable`.

    A module-level class, so a checkpoint's pickled trainable (Tune and RLlib pickle the class) refers
    to these methods by name instead of carrying their code: a checkpoint written by one rayrl
    version loads with the next one's code.
    """

    _rayrl_tier: ck.TierSettings
    _rayrl_skipped = 0  #: checkpoints skipped because uploads stayed behind (see _backpressure)
    _rayrl_skip_mark: int | None = None  #: uploads landed when the last one was skipped (None: no skip pending)

    def setup(self, config: Any) -> None:
        from rayrl.rllib.algo import quiet_notices

        quiet_notices(type(self).__name__)  # the class is named after the algorithm (see the module doc)
        self._rayrl_uploader = upload.Uploader()
        self._rayrl_stall_s = 0.0
        self._rayrl_events: dict = {}
        self._rayrl_preempt = TrialPreemption(self._rayrl_tier.preempt_grace_s)
        self._rayrl_preempt.install()
        super().setup(config)

    def step(self) -> dict:
        if self._rayrl_preempt.saved:  # Tune registered the preemption checkpoint: go now
            self._rayrl_uploader.drain(self._rayrl_tier.preempt_grace_s)
            self._rayrl_preempt.exit_now()
        result = super().step()
        up = self._rayrl_uploader.stats
        if up.permanent_error:  # storage refuses the checkpoints: stop, do not train on unprotected
            where = getattr(getattr(self, "_storage", None), "trial_fs_path", None) or "storage"
            raise upload.StorageRefused(upload.permanent_failure_message(up, str(where)))
        result.setdefault("rayrl", {}).update(
            checkpoint_stall_s=self._rayrl_stall_s,
            checkpoint_uploads=up.uploaded,
            checkpoint_upload_failures=up.failed_attempts,
            checkpoint_upload_s=up.last_upload_s,
            checkpoint_uploads_pending=self._rayrl_uploader.pending,
            checkpoints_skipped=self._rayrl_skipped,
            **self._rayrl_events,
        )
        if self._rayrl_preempt.requested:
            result["should_checkpoint"] = True
        return result

    def save(self, checkpoint_dir: str | None = None) -> Any:
        storage = getattr(self, "_storage", None)
        if checkpoint_dir is not None or storage is None:
            return super().save(checkpoint_dir)  # a direct call outside Tune: Tune's own path
        from ray.tune import Checkpoint
        from ray.tune.trainable.trainable import _TrainingResult

        start = time.perf_counter()
        metrics = dict(self._last_result or {})
        preempted = self._rayrl_preempt.requested
        synchronous = preempted or not self._rayrl_tier.tiered
        if not synchronous and not self._backpressure(metrics.get("training_iteration", "?")):
            # Skipped: nothing written and no checkpoint returned, so Tune registers none (its controller
            # ignores an empty checkpoint) and deletes none of the registered ones; the index stays free.
            self._rayrl_stall_s = time.perf_counter() - start
            return _TrainingResult(checkpoint=None, metrics=metrics)
        storage._update_checkpoint_index(metrics)
        self._prune_orphans(storage)
        dest = storage.checkpoint_fs_path
        root = ck.trusted_root(self._rayrl_tier, storage.trial_fs_path)
        local = root / posixpath.basename(dest)
        shutil.rmtree(local, ignore_errors=True)
        try:  # tier 1: a full disk here ends the run with one paragraph (Tier1Full), not a retry loop
            ck.make_root(root)
            local.mkdir()
            wrote = self.save_checkpoint(str(local))
            if wrote in (None, str(local)):
                self._write_manifest(local, metrics)
        except Exception as exc:
            full = ck.tier1_full(exc, root, local.name)
            if full is None:
                raise
            shutil.rmtree(local, ignore_errors=True)  # a part-written folder helps no one and holds space
            print(f"[rayrl] {full}", flush=True)
            raise full from exc
        if wrote not in (None, str(local)):
            raise TypeError("rayrl's tiered checkpoints need save_checkpoint to write into its folder")
        if synchronous:
            self._rayrl_uploader.drain(DRAIN_S if not preempted else self._rayrl_tier.preempt_grace_s)
            self._rayrl_uploader.upload_now(local, storage.storage_filesystem, dest)
        else:
            self._rayrl_uploader.submit(local, storage.storage_filesystem, dest)
        upload.prune_local(root, self._rayrl_tier.keep, protect={str(local), *self._rayrl_uploader.waiting_paths()})
        self._rayrl_stall_s = time.perf_counter() - start
        self._rayrl_preempt.saved = preempted
        return _TrainingResult(checkpoint=Checkpoint(filesystem=storage.storage_filesystem, path=dest), metrics=metrics)

    def _write_manifest(self, local: Any, metrics: dict) -> None:
        key = signing.load(self._rayrl_tier.key_file)
        if key is None and not getattr(self, "_rayrl_warned_unsigned", False):
            self._rayrl_warned_unsigned = True
            print(
                "[rayrl] no checkpoint signing key on this node (no RAYRL_STORAGE_KEY_FILE, no Ray auth token): "
                f"checkpoints are written unsigned, and a restore refuses them unless {signing.ALLOW_ENV}=1",
                flush=True,
            )
        manifest.write(local, {k: metrics[k] for k in ck.META_KEYS if k in metrics}, key=key)

    def _backpressure(self, iteration: Any = "?") -> bool:
        """Whether this checkpoint may be queued: at most ``keep - 2`` uploads pending, after waiting up
        to BACKPRESSURE_S for them; False skips it (a line and ``rayrl/checkpoints_skipped``).

        Tune deletes checkpoint N - keep from storage when N registers; were that one still
        uploading, the delete would race the upload (a manifest over missing files) and storage
        could hold no complete checkpoint at all. With at most ``keep - 1`` pending after a submit,
        and the uploads done in order, the pending ones are always the newest, which Tune keeps; the
        queue never grows past that. While no upload landed since the last skip (storage down), the
        next checkpoint is skipped without waiting again, so an outage costs one wait, not one per
        checkpoint."""
        limit = max(0, self._rayrl_tier.keep - 2)
        up = self._rayrl_uploader
        if up.pending <= limit:
            self._rayrl_skip_mark = None
            return True
        waited = time.perf_counter()
        stuck = self._rayrl_skip_mark is not None and up.stats.uploaded == self._rayrl_skip_mark
        if not stuck and up.wait_below(limit, BACKPRESSURE_S):
            self._rayrl_events = {**self._rayrl_events, "checkpoint_wait_s": time.perf_counter() - waited}
            self._rayrl_skip_mark = None
            return True
        self._rayrl_events = {**self._rayrl_events, "checkpoint_wait_s": time.perf_counter() - waited}
        self._rayrl_skipped += 1
        self._rayrl_skip_mark = up.stats.uploaded
        why = "no upload landed since the last skip" if stuck else f"none landed in {BACKPRESSURE_S:g}s"
        print(
            f"[rayrl] checkpoint of iteration {iteration} skipped: {up.pending} earlier "
            f"upload(s) still pending and {why} (storage slow or down; last upload error: "
            f"{up.stats.last_error or 'none yet'}); training goes on, the newest checkpoint is still the last "
            f"one queued ({self._rayrl_skipped} skipped so far, rayrl/checkpoints_skipped)",
            flush=True,
        )
        return False

    def restore(self, checkpoint_path: Any) -> None:
        from ray.tune import Checkpoint
        from ray.tune.trainable.trainable import _TrainingResult

        if not isinstance(checkpoint_path, _TrainingResult):
            return super().restore(checkpoint_path)
        registered = checkpoint_path.checkpoint
        storage = getattr(self, "_storage", None)
        own = storage is not None and posixpath.dirname(registered.path.rstrip("/")) == storage.trial_fs_path
        try:
            choice = ck.choose(registered.filesystem, registered.path, self._rayrl_tier, newer=own)
        except ck.UntrustedCheckpoint as exc:
            # A wrong key or a tampered checkpoint: fail (the trial's error names the fix) rather than
            # start over on top of a run the user can resume once the key is right.
            print(f"[rayrl] {exc}", flush=True)
            raise
        except ck.NoIntactCheckpoint as exc:
            # Every copy is broken or missing: a restore would fail the same way on every retry.
            print(f"[rayrl] {exc}; the trial starts fresh from iteration 0", flush=True)
            self._rayrl_events = {"restarted_fresh": 1}
            return None
        if choice is None and not ck.landed(registered.filesystem, registered.path):
            # No checkpoint of this trial reached storage or this node's tier 1 (killed before the
            # first upload finished): restoring would fail the same way on every retry.
            print(
                f"[rayrl] no checkpoint of this trial reached storage ({registered.path} was registered "
                "but never uploaded); it starts fresh from iteration 0",
                flush=True,
            )
            self._rayrl_events = {"restarted_fresh": 1}
            return None
        if choice is None:  # no manifests: a checkpoint from before rayrl wrote them (or not rayrl's)
            refused = ck.unmanifested(registered.path, self._rayrl_tier)
            if refused:
                print(f"[rayrl] {refused}", flush=True)
                raise ck.UntrustedCheckpoint(refused)
            return super().restore(checkpoint_path)
        if choice.unverified:
            print(
                f"[rayrl] restoring {choice.path.name} without a verified signature ({choice.unverified}), "
                f"as {signing.ALLOW_ENV}=1 allows",
                flush=True,
            )
        metrics = dict(checkpoint_path.metrics)
        chosen, named = ck.index_of(choice.path.name), ck.index_of(registered.path)
        if own and chosen is not None and (named is None or chosen > named):
            self._newer_than_registered(registered.path, choice)
            metrics = {**metrics, **choice.meta}
        if choice.rejected and (named is None or chosen is None or chosen < named):
            # the named checkpoint itself did not verify (newer ones skipped above were cut-short uploads)
            event = ck.record_fallback(
                registered.filesystem, posixpath.dirname(registered.path), registered.path, choice
            )
            metrics = {**metrics, **choice.meta}
            self._rayrl_events = {"restore_fallbacks": len(choice.rejected), "restored_from": event["restored"]}
        if choice.downloaded_bytes:
            ck.record_download(registered.filesystem, posixpath.dirname(registered.path), choice)
            self._rayrl_events = {**self._rayrl_events, "restore_downloaded_bytes": choice.downloaded_bytes}
        restored = f"{posixpath.dirname(registered.path.rstrip('/'))}/{choice.path.name}"
        self._reupload(registered.filesystem, restored)
        local = Checkpoint.from_directory(str(choice.path))
        return super().restore(_TrainingResult(checkpoint=local, metrics=metrics))

    def _newer_than_registered(self, registered: str, choice: ck.Choice) -> None:
        """Restoring a checkpoint newer than the one Tune's saved state names: say so, and move the
        trial's checkpoint index past it, so the next save takes a fresh folder instead of overwriting
        that newer checkpoint (and a later restore cannot pick an older one by its higher index)."""
        index = ck.index_of(choice.path.name)
        storage = self._storage
        named = ck.index_of(registered)
        if index is not None and storage.current_checkpoint_index < index:
            storage.current_checkpoint_index = index
        if index is not None:  # Tune never registered these, so it will never delete them: we do
            self._rayrl_orphans = list(range((named if named is not None else -1) + 1, index + 1))
        print(
            f"[rayrl] Tune's saved state names {posixpath.basename(registered.rstrip('/'))}, written before "
            f"newer checkpoints; restoring the newest intact one, {choice.path.name} (iteration "
            f"{choice.meta.get('training_iteration', '?')})",
            flush=True,
        )
        self._rayrl_events = {**self._rayrl_events, "restored_newer_than_registered": 1}

    def _prune_orphans(self, storage: Any) -> None:
        """Delete the checkpoints a restore took beyond Tune's state (``_newer_than_registered``) once
        ``keep`` newer ones are registered, as Tune deletes the ones it knows; by then the back-pressure
        has let at most ``keep - 2`` of those newer ones be pending, so storage still holds complete ones."""
        orphans = getattr(self, "_rayrl_orphans", None)
        if not orphans:
            return
        due = [i for i in orphans if i <= storage.current_checkpoint_index - self._rayrl_tier.keep]
        for i in due:
            path = f"{storage.trial_fs_path}/checkpoint_{i:06d}"
            try:
                storage.storage_filesystem.delete_dir(path)
            except FileNotFoundError:
                pass
            except OSError as exc:  # a leftover folder, not a reason to stop training
                print(f"[rayrl] could not delete {path}, a checkpoint older than the newest kept: {exc}", flush=True)
        self._rayrl_orphans = [i for i in orphans if i not in due]

    def _reupload(self, fs: Any, registered: str) -> None:
        """Queue the intact, signed tier-1 copies storage lacks (an upload a crash cut short), in the
        order Tune registered them (see ck.unuploaded), so storage converges; a line says how many."""
        found = ck.unuploaded(fs, registered, self._rayrl_tier)
        if not found:
            return
        trial_fs_path = posixpath.dirname(registered.rstrip("/"))
        for local in found:
            self._rayrl_uploader.submit(local, fs, f"{trial_fs_path}/{local.name}")
        print(
            f"[rayrl] tier 1 on this node holds {len(found)} checkpoint(s) that never reached storage "
            f"({', '.join(p.name for p in found)}); uploading them again",
            flush=True,
        )
        self._rayrl_events = {**self._rayrl_events, "tier1_reuploads": len(found)}

    def cleanup(self) -> None:
        # Tier 1 is a cache for this trial's process (and for a retry on this node after a crash):
        # once every upload landed, a stopping trial removes it.
        uploader, storage = getattr(self, "_rayrl_uploader", None), getattr(self, "_storage", None)
        if uploader is not None and not uploader.drain(DRAIN_S):
            print(
                f"[rayrl] {uploader.pending} checkpoint upload(s) did not finish in {DRAIN_S:g}s; "
                "their local copies stay in tier 1",
                flush=True,
            )
        elif uploader is not None and storage is not None:
            shutil.rmtree(ck.local_root(self._rayrl_tier, storage.trial_fs_path), ignore_errors=True)
        super().cleanup()


class SignedCheckpoints(_Trainable):
    """Signed, verified checkpoints for the sweep's trials, which keep Tune's own persistence.

    Tune uploads each checkpoint folder as it is and, on a retry or a resumed sweep, downloads it and
    hands it to RLlib, which unpickles it: so the folder gets a signed manifest before Tune uploads it,
    and a folder loaded from remote storage must carry one that verifies (rayrl.storage.checkpoints).
    """

    _rayrl_tier: ck.TierSettings

    def save_checkpoint(self, checkpoint_dir: str) -> Any:
        out = super().save_checkpoint(checkpoint_dir)
        meta = {"iteration": getattr(self, "_iteration", None)}
        manifest.write(Path(checkpoint_dir), meta, key=signing.load(self._rayrl_tier.key_file))
        return out

    def load_checkpoint(self, checkpoint: Any) -> None:
        if isinstance(checkpoint, (str, os.PathLike)):
            storage = getattr(self, "_storage", None)
            fs = getattr(storage, "storage_filesystem", None)
            remote = fs is not None and getattr(fs, "type_name", "local") != "local"
            why = ck.verify_folder(Path(checkpoint), self._rayrl_tier, f"checkpoint {checkpoint}", required=remote)
            if why:
                print(f"[rayrl] loading checkpoint {checkpoint} unverified ({why}): {signing.ALLOW_ENV}=1", flush=True)
        super().load_checkpoint(checkpoint)


def signed_trainable(base: type, settings: ck.TierSettings) -> type:
    """``base`` (an RLlib Algorithm class) with signed, verified Tune checkpoints; same name as ``base``."""
    return type(base.__name__, (SignedCheckpoints, base), {"_rayrl_tier": settings, "__qualname__": base.__name__})


def tiered_trainable(base: type, settings: ck.TierSettings) -> type:
    """``base`` (an RLlib Algorithm class) with rayrl's checkpoint persistence; same name as ``base``."""
    return type(base.__name__, (TieredCheckpoints, base), {"_rayrl_tier": settings, "__qualname__": base.__name__})


def settings_for(spec: Any) -> ck.TierSettings:
    """Tier settings from a Spec's checkpoint section, and this (the driver's) process's signing choices:
    RAYRL_STORAGE_KEY_FILE and RAYRL_ALLOW_UNSIGNED_STORAGE travel with the trainable to every trial's
    node (a trial's own environment counts only where the driver set neither). A named key file is
    read here once, so a wrong path is an error before any trial starts."""
    c = spec.checkpoint
    key_file = os.environ.get(signing.KEY_FILE_ENV, "")
    if key_file:
        signing.load(key_file)
    return ck.TierSettings(
        local_dir=c.local_dir,
        tiered=c.tiered,
        keep=c.keep,
        preempt_grace_s=c.preempt_grace_s,
        key_file=key_file,
        allow_unsigned=signing.allowed_unsigned(),
    )
