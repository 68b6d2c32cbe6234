"""Checkpoint tiers under storage trouble, without Ray where it can be: the trainable's save/restore hooks
on a stand-in algorithm, real tier-1 folders, storage on the local filesystem or moto's S3 server;
one `rayrl train` (slow) for the full tier-1 disk, which only a real driver and Tune's retries show."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.fs as pafs
import pytest
from conftest import ROOT, moto, small_disk, subprocess_env

from rayrl.storage import checkpoints as ck
from rayrl.storage import files, manifest, upload
from rayrl.storage.guard import DiskGuard, final_error

FS = pafs.LocalFileSystem()


class _Algorithm:
    """Stands in for the RLlib Algorithm behind TieredCheckpoints: a checkpoint of a few real files."""

    restored: list = []
    restored_metrics: list = []

    def save_checkpoint(self, folder: str) -> None:
        Path(folder, "algorithm_state.pkl").write_bytes(os.urandom(2000))
        Path(folder, "learner").mkdir()
        Path(folder, "learner", "weights.pt").write_bytes(os.urandom(6000))

    def step(self) -> dict:
        return {}

    def restore(self, checkpoint_path) -> str:
        type(self).restored.append(checkpoint_path.checkpoint.path)
        type(self).restored_metrics.append(dict(checkpoint_path.metrics))
        return "restored"


class _Storage:
    """Tune's StorageContext as the trainable uses it: an index that moves on each registered save."""

    def __init__(self, fs: pafs.FileSystem, trial: str) -> None:
        self.storage_filesystem, self.trial_fs_path = fs, trial
        self.current_checkpoint_index = -1

    def _update_checkpoint_index(self, metrics: dict) -> None:
        self.current_checkpoint_index += 1

    @property
    def checkpoint_fs_path(self) -> str:
        return f"{self.trial_fs_path}/checkpoint_{self.current_checkpoint_index:06d}"


def _trainable(settings: ck.TierSettings, fs: pafs.FileSystem, trial: str, uploader: upload.Uploader | None = None):
    from types import SimpleNamespace

    from rayrl.tune.trainable import tiered_trainable

    t = object.__new__(tiered_trainable(_Algorithm, settings))
    t._storage = _Storage(fs, trial)
    t._last_result = {"training_iteration": 1}
    t._rayrl_uploader = uploader or upload.Uploader(max_backoff_s=0.2)
    t._rayrl_preempt = SimpleNamespace(requested=False, saved=False)
    t._rayrl_events = {}
    t._rayrl_stall_s = 0.0
    _Algorithm.restored = []
    _Algorithm.restored_metrics = []
    return t


def _registered(fs: pafs.FileSystem, path: str, iteration: int):
    from ray.tune import Checkpoint
    from ray.tune.trainable.trainable import _TrainingResult

    return _TrainingResult(checkpoint=Checkpoint(filesystem=fs, path=path), metrics={"training_iteration": iteration})


def _tier1_copy(settings: ck.TierSettings, trial: str, index: int, signed: bool = True) -> Path:
    """A checkpoint the trainable wrote into tier 1 (files, then the signed manifest)."""
    folder = ck.local_root(settings, trial) / f"checkpoint_{index:06d}"
    ck.make_root(folder.parent)
    folder.mkdir()
    _Algorithm().save_checkpoint(str(folder))
    manifest.write(folder, {"training_iteration": index}, key="env" if signed else None)
    return folder


def _lines(text: str, marker: str) -> list[str]:
    return [line for line in text.splitlines() if marker in line]


# ---- 1. a bounded upload queue ---------------------------------------------------------------------


def test_a_checkpoint_is_skipped_not_queued_while_uploads_stay_behind(tmp_path, monkeypatch, capsys):
    """Storage down (the trial folder's parent is a file, so the upload fails on real files): with
    keep 2, the second save waits BACKPRESSURE_S, then is skipped: nothing written, no checkpoint
    returned (Tune registers none), the storage index unmoved, a line naming the upload error, and
    counted in the results. The third is skipped without a second wait. Once storage is back the next
    save takes the next index; the queue never held more than one upload."""
    from rayrl.tune import trainable

    monkeypatch.setattr(trainable, "BACKPRESSURE_S", 0.5)
    settings = ck.TierSettings(local_dir=str(tmp_path / "tier1"), keep=2)
    blocker = tmp_path / "storage"
    blocker.write_text("not a folder")
    trial = str(blocker / "PPO_1")
    t = _trainable(settings, FS, trial)
    first = t.save()
    assert first.checkpoint.path == f"{trial}/checkpoint_000000" and t._rayrl_uploader.pending == 1

    start = time.monotonic()
    second = t.save()
    assert time.monotonic() - start >= 0.5
    assert second.checkpoint is None and t._storage.current_checkpoint_index == 0
    assert sorted(p.name for p in ck.local_root(settings, trial).iterdir()) == ["checkpoint_000000"]
    out = capsys.readouterr().out
    skipped = _lines(out, "skipped:")
    assert len(skipped) == 1 and "1 earlier upload(s) still pending" in skipped[0]
    assert t._rayrl_uploader.stats.last_error.split(":")[0] in skipped[0]  # the upload error, named

    start = time.monotonic()
    assert t.save().checkpoint is None and time.monotonic() - start < 0.3  # stuck since the last skip
    assert t._rayrl_uploader.pending == 1
    result = t.step()["rayrl"]
    assert result["checkpoints_skipped"] == 2 and result["checkpoint_uploads_pending"] == 1
    assert result["checkpoint_upload_failures"] >= 1

    blocker.unlink()  # storage back
    assert t._rayrl_uploader.drain(15) and t._rayrl_uploader.stats.uploaded == 1
    fourth = t.save()
    assert fourth.checkpoint.path == f"{trial}/checkpoint_000001"  # the skipped ones used no index
    assert t._rayrl_uploader.drain(15)
    assert manifest.problems(Path(trial) / "checkpoint_000000") == []
    assert manifest.problems(Path(trial) / "checkpoint_000001") == []
    assert t.step()["rayrl"]["checkpoints_skipped"] == 2


# ---- 2. tier-1 copies uploaded again on restart ----------------------------------------------------


def test_restore_uploads_again_the_intact_tier1_copies_storage_lacks(tmp_path, capsys):
    """A node that crashed with uploads unfinished, restarted on the same node: tier 1 holds checkpoints
    0-4, storage only 3. Restoring 4 (keep 3) queues 2 and 4, in index order; 0 and 1 (Tune deleted
    them from storage) and an unsigned copy are left alone; storage then holds 2, 3 and 4, byte-equal."""
    settings = ck.TierSettings(local_dir=str(tmp_path / "tier1"), keep=3)
    trial = str(tmp_path / "storage" / "PPO_1")
    copies = [_tier1_copy(settings, trial, i) for i in range(5)]
    upload.upload(copies[3], FS, f"{trial}/checkpoint_000003")
    assert ck.unuploaded(FS, f"{trial}/checkpoint_000004", settings) == [copies[2], copies[4]]

    unsigned = ck.TierSettings(local_dir=str(tmp_path / "tier1b"), keep=3)
    _tier1_copy(unsigned, trial, 1, signed=False)
    assert ck.unuploaded(FS, f"{trial}/checkpoint_000001", unsigned) == []

    t = _trainable(settings, FS, trial)
    assert t.restore(_registered(FS, f"{trial}/checkpoint_000004", 4)) == "restored"
    assert _Algorithm.restored == [str(copies[4])]  # the intact local copy, no download
    said = _lines(capsys.readouterr().out, "never reached storage")
    assert len(said) == 1 and "2 checkpoint(s)" in said[0] and "checkpoint_000002, checkpoint_000004" in said[0]
    assert t._rayrl_uploader.drain(15) and t._rayrl_uploader.stats.uploaded == 2
    assert t._rayrl_uploader.stats.uploaded_paths == [str(copies[2]), str(copies[4])]
    assert sorted(p.name for p in Path(trial).iterdir()) == [
        "checkpoint_000002",
        "checkpoint_000003",
        "checkpoint_000004",
    ]
    for i in (2, 3, 4):
        assert ck.remote_manifest(FS, f"{trial}/checkpoint_{i:06d}") == manifest.read(copies[i])
    assert t.step()["rayrl"]["tier1_reuploads"] == 2
    # Restored again: storage has them all now, nothing more to send.
    t = _trainable(settings, FS, trial)
    t.restore(_registered(FS, f"{trial}/checkpoint_000004", 4))
    assert ck.unuploaded(FS, f"{trial}/checkpoint_000004", settings) == [] and t._rayrl_uploader.pending == 0


# ---- 2b. Tune's saved state behind the checkpoints -------------------------------------------------


def test_a_state_naming_a_pruned_checkpoint_restores_the_newest_intact_one_not_iteration_0(tmp_path, capsys):
    """Tune rewrites its experiment state every ~10 s, so after a crash it may name checkpoint 2 that Tune
    had already replaced (3, 4) and deleted from storage. Measured by benchmarks/fault_table.py: such
    trials started over from iteration 0. The restore takes 4 from storage (tier 1 lost with the node),
    says so, and the next save takes folder 5, not 3 (which would overwrite and later lose progress)."""
    settings = ck.TierSettings(local_dir=str(tmp_path / "tier1"), keep=2)
    trial = str(tmp_path / "storage" / "PPO_1")
    for i in (3, 4):  # 0-2 pruned by Tune; 3 and 4 landed
        upload.upload(_tier1_copy(settings, trial, i), FS, f"{trial}/checkpoint_{i:06d}")
    import shutil

    shutil.rmtree(tmp_path / "tier1")  # the node is gone
    t = _trainable(settings, FS, trial)
    t._storage.current_checkpoint_index = 2  # what the stale state gives the restored trial
    assert t.restore(_registered(FS, f"{trial}/checkpoint_000002", 2)) == "restored"
    assert [Path(p).name for p in _Algorithm.restored] == ["checkpoint_000004"]
    assert _Algorithm.restored_metrics[0]["training_iteration"] == 4  # the newer one's, not the state's
    out = capsys.readouterr().out
    assert "starts fresh" not in out and "never uploaded" not in out
    said = _lines(out, "Tune's saved state names checkpoint_000002")
    assert len(said) == 1 and "restoring the newest intact one, checkpoint_000004 (iteration 4)" in said[0]
    assert "restored checkpoint_000004 from storage" in out
    assert t.step()["rayrl"]["restored_newer_than_registered"] == 1
    t._last_result = {"training_iteration": 5}
    saved = t.save()
    assert Path(saved.checkpoint.path).name == "checkpoint_000005"
    assert t._rayrl_uploader.drain(15)
    assert manifest.read(Path(trial) / "checkpoint_000004")["meta"]["training_iteration"] == 4  # untouched
    # Tune never registered 3 and 4, so it would never delete them: the trainable does, as Tune does
    # with the ones it knows (keep 2: N - 2 goes when N registers).
    assert _checkpoints_in(trial) == ["checkpoint_000004", "checkpoint_000005"]
    t._last_result = {"training_iteration": 6}
    t.save()
    assert t._rayrl_uploader.drain(15)
    assert _checkpoints_in(trial) == ["checkpoint_000005", "checkpoint_000006"]


def _checkpoints_in(trial: str) -> list[str]:
    return sorted(p.name for p in Path(trial).iterdir() if p.name.startswith("checkpoint_"))


def test_a_kill_with_newer_checkpoints_only_in_tier1_restores_them_and_uploads_them(tmp_path, capsys):
    """SIGKILL while checkpoints 3 and 4 were still uploading: storage has 2 (what the state names), tier 1
    on the same node has 2-4 intact. The restore loads 4 from tier 1 and sends 3 and 4 to storage."""
    settings = ck.TierSettings(local_dir=str(tmp_path / "tier1"), keep=3)
    trial = str(tmp_path / "storage" / "PPO_1")
    copies = {i: _tier1_copy(settings, trial, i) for i in (2, 3, 4)}
    upload.upload(copies[2], FS, f"{trial}/checkpoint_000002")
    t = _trainable(settings, FS, trial)
    t._storage.current_checkpoint_index = 2
    t.restore(_registered(FS, f"{trial}/checkpoint_000002", 2))
    assert _Algorithm.restored == [str(copies[4])]
    out = capsys.readouterr().out
    assert "checkpoint_000003, checkpoint_000004); uploading them again" in out
    assert t._rayrl_uploader.drain(15)
    assert sorted(p.name for p in Path(trial).iterdir()) == [f"checkpoint_00000{i}" for i in (2, 3, 4)]
    assert t._storage.current_checkpoint_index == 4


def test_another_trials_checkpoint_is_restored_as_named(tmp_path):
    """A checkpoint from another trial's folder (a user's --resume-from, PBT-style exploits) is meant as
    named: its trial's newer checkpoints are not taken."""
    settings = ck.TierSettings(local_dir=str(tmp_path / "tier1"), keep=3)
    other = str(tmp_path / "storage" / "PPO_other")
    for i in (1, 2):
        upload.upload(_tier1_copy(settings, other, i), FS, f"{other}/checkpoint_{i:06d}")
    t = _trainable(settings, FS, str(tmp_path / "storage" / "PPO_1"))
    t.restore(_registered(FS, f"{other}/checkpoint_000001", 1))
    assert [Path(p).name for p in _Algorithm.restored] == ["checkpoint_000001"]
    assert t._storage.current_checkpoint_index == -1


# ---- 3. a full tier-1 disk ----------------------------------------------------------------------------


def _fill(disk: Path) -> None:
    with (disk / "filler").open("wb") as f:
        try:
            while True:
                f.write(b"\0" * (1 << 16))
                f.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC


def test_a_full_tier1_disk_fails_the_save_with_one_paragraph_and_the_driver_stops(tmp_path, capsys, monkeypatch):
    """A tmpfs filled to the last byte as checkpoint.local_dir (or, where this user may not mount, ENOSPC
    raised by the write itself): save() raises Tier1Full naming the folder, the free space and the fixes,
    and leaves no part-written folder; the driver's DiskGuard turns that trial error (as Tune pickles it)
    into the run's StorageError instead of a retry, and lets any other trial error be retried."""
    import cloudpickle
    from ray.exceptions import RayTaskError

    disk = tmp_path / "disk"
    with small_disk(disk, "2m") as mounted:
        (disk / "t1").mkdir(mode=0o700)
        settings = ck.TierSettings(local_dir=str(disk / "t1"), keep=2)
        trial = str(tmp_path / "storage" / "PPO_1")
        t = _trainable(settings, FS, trial)
        if mounted:
            _fill(disk)
        else:

            def no_space(self, folder: str) -> None:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(Path(folder, "algorithm_state.pkl")))

            monkeypatch.setattr(type(t), "save_checkpoint", no_space)
        with pytest.raises(ck.Tier1Full) as caught:
            t.save()
        text = str(caught.value)
        assert f"could not be written to tier 1, {ck.local_root(settings, trial)}" in text
        assert "No space left on device" in text and "MB free on that disk" in text
        assert "checkpoint.local_dir" in text and "run the same command again" in text
        assert isinstance(caught.value.__cause__, OSError) or not mounted
        assert list(ck.local_root(settings, trial).iterdir()) == []
        if mounted:  # a writer that loses the errno (torch: "file write failed") on a disk with no room left
            assert ck.tier1_full(RuntimeError("file write failed"), disk / "t1", "checkpoint_000000") is not None
        assert t._rayrl_uploader.pending == 0
        assert _lines(capsys.readouterr().out, "could not be written to tier 1") == [f"[rayrl] {text}"]

    # The driver's side: the error as Tune writes it for the trial (a pickled RayTaskError).
    staging = tmp_path / "staging"
    staging.mkdir()
    from types import SimpleNamespace

    trial_obj = SimpleNamespace(local_path=str(staging), run_metadata=SimpleNamespace(pickled_error_filename="e.pkl"))
    raised = RayTaskError("PPO.save", "Traceback ...", caught.value).as_instanceof_cause()
    (staging / "e.pkl").write_bytes(cloudpickle.dumps(raised))
    with pytest.raises(files.StorageError) as stopped:
        DiskGuard(tmp_path).on_trial_recover(0, [], trial_obj)
    assert stopped.value.errno == errno.ENOSPC and stopped.value.strerror == text
    assert files.explain(stopped.value, tmp_path) is stopped.value  # what `rayrl train` prints, exit 1
    refused = RayTaskError("PPO.train", "...", upload.StorageRefused("refused para")).as_instanceof_cause()
    (staging / "e.pkl").write_bytes(cloudpickle.dumps(refused))
    assert final_error(trial_obj).strerror == "refused para"
    other = RayTaskError("PPO.train", "...", ValueError("a bug")).as_instanceof_cause()
    (staging / "e.pkl").write_bytes(cloudpickle.dumps(other))
    assert final_error(trial_obj) is None
    DiskGuard(tmp_path).on_trial_recover(0, [], trial_obj)  # retried as before
    (staging / "e.pkl").unlink()
    assert final_error(trial_obj) is None


def test_a_save_failing_for_another_reason_is_not_called_a_full_disk(tmp_path, monkeypatch):
    settings = ck.TierSettings(local_dir=str(tmp_path / "tier1"), keep=2)
    t = _trainable(settings, FS, str(tmp_path / "storage" / "PPO_1"))

    def bug(self, folder: str) -> None:
        raise ValueError("a bug")

    monkeypatch.setattr(type(t), "save_checkpoint", bug)
    with pytest.raises(ValueError, match="a bug"):
        t.save()
    assert ck.tier1_full(OSError(errno.EACCES, "Permission denied"), tmp_path, "checkpoint_000000") is None
    assert files.free_mb(tmp_path) > files.MIN_FREE_MB  # so a lost errno is not read as a full disk here
    assert ck.tier1_full(RuntimeError("file write failed"), tmp_path, "checkpoint_000000") is None


# ---- 4. every upload failure reported --------------------------------------------------------------


def test_each_upload_failure_is_counted_and_each_distinct_error_printed_once(tmp_path, capsys):
    """moto's S3 server killed under a running uploader: the retried upload fails again and again, every
    attempt counted (and in the trainable's results), the error printed once. With authentication on,
    two checkpoints refused three times each: six attempts counted, one line (the same refusal)."""
    settings = ck.TierSettings(local_dir=str(tmp_path / "tier1"), keep=3)
    with moto() as port:
        fs = pafs.S3FileSystem(
            access_key="testing",
            secret_key="testing",
            endpoint_override=f"127.0.0.1:{port}",
            scheme="http",
            allow_bucket_creation=True,
            retry_strategy=pafs.AwsStandardS3RetryStrategy(1),
        )
        fs.create_dir("rayrl")
        t = _trainable(settings, fs, "rayrl/run/PPO_1")
        assert t.save().checkpoint.path == "rayrl/run/PPO_1/checkpoint_000000"
        assert t._rayrl_uploader.drain(30) and t._rayrl_uploader.stats.uploaded == 1
    # The server is gone.
    up = t._rayrl_uploader
    t._last_result = {"training_iteration": 2}
    assert t.save().checkpoint.path == "rayrl/run/PPO_1/checkpoint_000001"
    deadline = time.monotonic() + 30
    while up.stats.failed_attempts < 4 and time.monotonic() < deadline:
        time.sleep(0.1)
    failures = up.stats.failed_attempts
    assert failures >= 4 and up.pending == 1 and not up.stats.permanent_error
    assert t.step()["rayrl"]["checkpoint_upload_failures"] >= failures
    said = _lines(capsys.readouterr().out, "[rayrl] checkpoint upload of")
    assert len(said) == 1 and "checkpoint_000001" in said[0] and up.stats.distinct_errors == 1
    assert up.stats.last_error.split(" during ")[0] in said[0]

    with moto({"INITIAL_NO_AUTH_ACTION_COUNT": "0"}) as port:
        fs = pafs.S3FileSystem(
            access_key="testing", secret_key="testing", endpoint_override=f"127.0.0.1:{port}", scheme="http"
        )
        refused = upload.Uploader(max_backoff_s=0.2)
        trial = "rayrl/run/PPO_2"
        for i in (1, 2):
            refused.submit(_tier1_copy(settings, trial, i), fs, f"{trial}/checkpoint_{i:06d}")
        assert refused.drain(60)
    # Six refusals; on a loaded machine a first connection to the fresh server can fail (seen once in CI-like
    # runs: NETWORK_CONNECTION), which is retried and printed as its own error.
    said = _lines(capsys.readouterr().out, "[rayrl] checkpoint upload of")
    # (a refusal's own text can name NETWORK_CONNECTION too, seen once under load: it counts as the refusal)
    transient = [line for line in said if "NETWORK_CONNECTION" in line and "ACCESS_DENIED" not in line]
    attempts = refused.stats.failed_attempts
    assert (attempts == 6 if not transient else attempts > 6) and len(refused.stats.given_up) == 2, (attempts, said)
    assert [line for line in said if line not in transient] == [said[-1]] and "ACCESS_DENIED" in said[-1]
    assert refused.stats.distinct_errors == len(said) <= 2


def test_error_key_takes_out_only_the_checkpoint_index():
    a = "OSError: When creating key 'run/PPO_1/checkpoint_000004/weights.pt': curlCode: 7"
    b = "OSError: When creating key 'run/PPO_1/checkpoint_000005/weights.pt': curlCode: 7"
    assert upload.error_key(a) == upload.error_key(b)
    assert upload.error_key(a) != upload.error_key(a.replace("curlCode: 7", "curlCode: 28"))


# ---- 3, end to end: `rayrl train` with a full tier-1 disk ------------------------------------------


@pytest.mark.slow
def test_train_with_a_full_tier1_disk_stops_once_with_the_paragraph(tmp_path):
    """`rayrl train` whose checkpoint.local_dir is a full tmpfs: the first checkpoint fails, the run ends
    with exit 1 and the tier-1 paragraph, after one trial failure, not Tune's retries up to the budget."""
    disk = tmp_path / "disk"
    with small_disk(disk, "2m") as mounted:
        if not mounted:
            pytest.skip("mounting a tmpfs needs root; the fast test injects ENOSPC at the write instead")
        (disk / "t1").mkdir(mode=0o700)
        _fill(disk)
        cmd = [
            sys.executable,
            "-m",
            "rayrl.cli",
            "train",
            "--config",
            str(ROOT / "experiments/configs/cartpole_ppo.yaml"),
        ]
        cmd += ["--storage", str(tmp_path / "runs"), "--name", "t1full", "--num-cpus", "2"]
        for setting in (
            "env.envs_per_runner=2",
            "algo.train_batch_per_learner=256",
            "algo.minibatch_size=128",
            "algo.epochs=1",
            "resources.env_runners=0",
            "checkpoint.every=1",
            "checkpoint.max_failures=2",
            f"checkpoint.local_dir={disk / 't1'}",
            "stop.episode_return=100000",
            "stop.env_steps=4096",
        ):
            cmd += ["--set", setting]
        start = time.monotonic()
        proc = subprocess.run(cmd, env=subprocess_env(), capture_output=True, text=True, timeout=240)
        took = time.monotonic() - start
    said = " ".join(proc.stderr.split())
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "rayrl train: error: checkpoint checkpoint_000000 could not be written to tier 1" in said, said[-3000:]
    assert str(disk / "t1") in said and "MB free on that disk" in said and "checkpoint.local_dir" in said
    # One attempt: each retry of Tune's would start afresh (no checkpoint landed) and report iteration 1 again.
    rows = (tmp_path / "runs" / "t1full" / "history.csv").read_text().splitlines()[1:]
    assert len(rows) == 1, rows
    print(f"rayrl train with a full tier-1 disk: exit 1 after {took:.1f}s")
