"""Tiered checkpoints without Ray: manifests, the background uploader, restore's choice of the newest
intact checkpoint, against a local-path storage and an S3 server (moto) on 127.0.0.1; and the pure
rules of the failure budget and the hung-runner watchdog."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pyarrow.fs as pafs
import pytest

from rayrl.faults.preemption import over_budget
from rayrl.faults.watchdog import silent_too_long
from rayrl.storage import checkpoints as ck
from rayrl.storage import manifest, upload


def make_checkpoint(folder: Path, iteration: int, size: int = 3000) -> Path:
    """A checkpoint-shaped folder (nested files) with its manifest."""
    (folder / "learner" / "module").mkdir(parents=True)
    (folder / "algorithm_state.pkl").write_bytes(os.urandom(size))
    (folder / "learner" / "module" / "weights.pt").write_bytes(os.urandom(size * 3))
    (folder / "learner" / "state.json").write_text(json.dumps({"iteration": iteration}))
    manifest.write(folder, {"training_iteration": iteration})
    return folder


def flip_byte(path: Path, offset: int = 100) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def test_manifest_finds_flipped_truncated_and_missing_files(tmp_path):
    ckpt = make_checkpoint(tmp_path / "checkpoint_000001", 1)
    assert manifest.problems(ckpt) == []
    man = manifest.read(ckpt)
    assert set(man["files"]) == {"algorithm_state.pkl", "learner/module/weights.pt", "learner/state.json"}
    assert man["files"]["algorithm_state.pkl"]["size"] == 3000 and man["meta"]["training_iteration"] == 1
    flip_byte(ckpt / "learner" / "module" / "weights.pt")
    assert manifest.problems(ckpt) == ["learner/module/weights.pt: sha256 differs from the manifest"]
    (ckpt / "algorithm_state.pkl").write_bytes(b"short")
    assert "algorithm_state.pkl: 5 bytes, manifest says 3000" in manifest.problems(ckpt)
    (ckpt / "learner" / "state.json").unlink()
    assert "learner/state.json: missing" in manifest.problems(ckpt)
    (ckpt / manifest.NAME).unlink()
    assert "no readable" in manifest.problems(ckpt)[0]


def _settings(tmp_path: Path) -> ck.TierSettings:
    return ck.TierSettings(local_dir=str(tmp_path / "tier1"), keep=2)


def _save(settings: ck.TierSettings, trial: str, index: int) -> Path:
    """What the trainable's save() does: the checkpoint into tier 1, manifest last."""
    return make_checkpoint(ck.local_root(settings, trial) / f"checkpoint_{index:06d}", index)


def _storage_round_trip(fs: pafs.FileSystem, trial: str, tmp_path: Path) -> None:
    """Upload 3 checkpoints in the background, corrupt the newest in storage, wipe tier 1: restore
    takes the newest intact one from storage and records why the newer one was skipped."""
    settings = _settings(tmp_path)
    uploader = upload.Uploader()
    for i in (1, 2, 3):
        uploader.submit(_save(settings, trial, i), fs, f"{trial}/checkpoint_{i:06d}")
    assert uploader.drain(60) and uploader.stats.uploaded == 3 and uploader.pending == 0
    local3 = ck.local_root(settings, trial) / "checkpoint_000003"
    assert ck.remote_manifest(fs, f"{trial}/checkpoint_000003") == manifest.read(local3)
    # An intact local copy is preferred (no download).
    choice = ck.choose(fs, f"{trial}/checkpoint_000003", settings)
    assert choice.path == local3 and choice.rejected == [] and choice.meta["training_iteration"] == 3
    # Bytes flipped in storage after registration, and tier 1 lost (a new node): falls back to #2.
    with fs.open_output_stream(f"{trial}/checkpoint_000003/learner/module/weights.pt") as out:
        out.write(b"\0" * 9000)
    import shutil

    shutil.rmtree(tmp_path / "tier1")
    choice = ck.choose(fs, f"{trial}/checkpoint_000003", settings)
    assert choice.path.name == "checkpoint_000002" and choice.meta["training_iteration"] == 2
    assert choice.rejected == [
        ("checkpoint_000003", "storage copy: learner/module/weights.pt: sha256 differs from the manifest")
    ]
    assert manifest.problems(choice.path) == []
    event = ck.record_fallback(fs, trial, f"{trial}/checkpoint_000003", choice)
    assert event["restored"] == "checkpoint_000002" and event["restored_iteration"] == 2
    # An upload cut short (files there, no manifest) is skipped as well.
    fs.delete_file(f"{trial}/checkpoint_000002/{manifest.NAME}")
    shutil.rmtree(tmp_path / "tier1")
    choice = ck.choose(fs, f"{trial}/checkpoint_000003", settings)
    assert choice.path.name == "checkpoint_000001" and len(choice.rejected) == 2


def test_upload_and_restore_against_a_local_path_storage(tmp_path):
    storage = tmp_path / "storage"
    storage.mkdir()
    trial = str(storage / "tune" / "PPO_0001")
    _storage_round_trip(pafs.LocalFileSystem(), trial, tmp_path)
    recorded = list(Path(trial).glob(f"{ck.FALLBACK_PREFIX}*.json"))
    assert len(recorded) == 1 and json.loads(recorded[0].read_text())["registered"] == "checkpoint_000003"


@pytest.fixture()
def s3(tmp_path):
    """A moto S3 server on 127.0.0.1 and a pyarrow S3FileSystem on it, with a bucket."""
    from conftest import free_port
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    fs = pafs.S3FileSystem(
        endpoint_override=f"127.0.0.1:{port}",
        scheme="http",
        access_key="test",
        secret_key="test",
        region="us-east-1",
        allow_bucket_creation=True,
        retry_strategy=pafs.AwsStandardS3RetryStrategy(1),
    )
    fs.create_dir("bucket")
    yield fs
    server.stop()


@pytest.mark.slow  # a server start: a few seconds the fast set cannot spare
def test_upload_and_restore_against_an_s3_server(s3, tmp_path):
    _storage_round_trip(s3, "bucket/runs/r/tune/PPO_0001", tmp_path)


def test_no_manifest_anywhere_means_tunes_own_restore(tmp_path):
    trial = tmp_path / "storage" / "PPO_1"
    (trial / "checkpoint_000001").mkdir(parents=True)
    (trial / "checkpoint_000001" / "algorithm_state.pkl").write_bytes(b"x")
    assert ck.choose(pafs.LocalFileSystem(), str(trial / "checkpoint_000001"), _settings(tmp_path)) is None


def test_nothing_intact_is_a_clear_error(tmp_path):
    settings = _settings(tmp_path)
    trial = str(tmp_path / "storage" / "PPO_1")
    local = _save(settings, trial, 1)
    flip_byte(local / "algorithm_state.pkl")
    with pytest.raises(
        RuntimeError, match="no intact checkpoint .* checkpoint_000001: local copy: algorithm_state.pkl: sha256 differs"
    ):
        ck.choose(pafs.LocalFileSystem(), f"{trial}/checkpoint_000001", settings)


def test_a_failing_storage_delays_uploads_not_the_caller(tmp_path):
    """Storage that refuses writes: submit returns at once, the upload is retried and lands once the
    storage is back (the destination's parent is a file, so even root cannot write there)."""
    settings = _settings(tmp_path)
    blocker = tmp_path / "storage"
    blocker.write_text("not a folder")
    trial = str(blocker / "PPO_1")
    uploader = upload.Uploader(max_backoff_s=0.5)
    start = time.perf_counter()
    uploader.submit(_save(settings, trial, 1), pafs.LocalFileSystem(), f"{trial}/checkpoint_000001")
    assert time.perf_counter() - start < 0.1
    assert not uploader.drain(1.5)
    assert uploader.stats.failed_attempts >= 2 and uploader.stats.uploaded == 0 and uploader.pending == 1
    blocker.unlink()
    assert uploader.drain(10) and uploader.stats.uploaded == 1
    assert manifest.problems(Path(trial) / "checkpoint_000001") == []


def test_prune_keeps_the_newest_and_anything_not_yet_uploaded(tmp_path):
    root = tmp_path / "tier1"
    for i in range(1, 6):
        (root / f"checkpoint_{i:06d}").mkdir(parents=True)
    upload.prune_local(root, keep=2, protect={str(root / "checkpoint_000001")})
    assert sorted(p.name for p in root.iterdir()) == ["checkpoint_000001", "checkpoint_000004", "checkpoint_000005"]


def test_failure_budget_counts_by_rate_not_lifetime():
    hour = 3600.0
    spread = [i * hour for i in range(100)]  # one preemption an hour for 4 days
    assert not over_budget(spread, spread[-1], max_failures=10, window_s=hour)
    loop = [1000.0 + 20 * i for i in range(11)]  # a crash loop: a failure every 20 s
    assert not over_budget(loop[:10], loop[9], max_failures=10, window_s=hour)
    assert over_budget(loop, loop[-1], max_failures=10, window_s=hour)
    assert not over_budget(loop * 10, loop[-1], max_failures=-1, window_s=hour)


def test_watchdog_restarts_only_a_runner_silent_for_the_whole_window():
    silent: dict[int, float] = {}
    asked = {1, 2}
    assert silent_too_long(silent, {1, 2}, asked, 0.0, 10.0) == [] and silent == {}
    assert silent_too_long(silent, {1}, asked, 1.0, 10.0) == [] and silent == {2: 1.0}
    assert silent_too_long(silent, {1}, asked, 10.9, 10.0) == []
    assert silent_too_long(silent, {1}, asked, 11.0, 10.0) == [2]
    # A runner that answers again (a slow sample, not a hang) starts from zero.
    silent = {2: 0.0}
    assert silent_too_long(silent, {1, 2}, asked, 5.0, 10.0) == [] and silent == {}
    assert silent_too_long(silent, {1}, asked, 6.0, 10.0) == [] and silent == {2: 6.0}


def test_wait_below_bounds_the_upload_queue(tmp_path):
    """The back-pressure the trainable applies before queueing a checkpoint: it waits for uploads."""
    fs = pafs.LocalFileSystem()
    settings = _settings(tmp_path)
    trial = str(tmp_path / "storage" / "PPO_0001")
    gate = threading.Event()
    real_put = upload._put

    def held_put(src, fs_, dst):  # storage that answers only once the gate opens
        gate.wait(30)
        real_put(src, fs_, dst)

    uploader = upload.Uploader()
    upload._put = held_put
    try:
        for i in (1, 2):
            uploader.submit(_save(settings, trial, i), fs, f"{trial}/checkpoint_{i:06d}")
        start = time.monotonic()
        assert not uploader.wait_below(0, 0.3) and uploader.pending == 2  # waited its timeout, queue held
        assert time.monotonic() - start >= 0.3
        threading.Timer(0.2, gate.set).start()
        assert uploader.wait_below(0, 30) and uploader.pending == 0 and uploader.stats.uploaded == 2
    finally:
        upload._put = real_put


def test_no_intact_checkpoint_anywhere_is_its_own_error(tmp_path):
    fs = pafs.LocalFileSystem()
    settings = _settings(tmp_path)
    trial = str(tmp_path / "storage" / "PPO_0001")
    upload.upload(_save(settings, trial, 1), fs, f"{trial}/checkpoint_000001")
    (Path(trial) / "checkpoint_000001" / "algorithm_state.pkl").unlink()
    import shutil

    shutil.rmtree(tmp_path / "tier1")
    # The trainable catches this one and starts the trial fresh instead of crash-looping on it.
    with pytest.raises(ck.NoIntactCheckpoint, match="algorithm_state.pkl: missing"):
        ck.choose(fs, f"{trial}/checkpoint_000001", settings)
    assert not ck.landed(fs, f"{trial}/checkpoint_000009") and ck.landed(fs, f"{trial}/checkpoint_000001")


def test_a_pickled_trainable_refers_to_rayrl_code_so_old_checkpoints_load_with_new_code(monkeypatch):
    """RLlib pickles the trainable class into every checkpoint (class_and_ctor_args.pkl). A class made
    per spec is pickled by value: were rayrl's hooks defined inside it, a checkpoint would carry that
    version's code, and a changed helper signature would break loading it (seen on 2026-12-03:
    `Uploader.__init__() got an unexpected keyword argument`)."""
    import cloudpickle
    from ray.rllib.algorithms.ppo import PPO

    from rayrl.tune.trainable import TieredCheckpoints, tiered_trainable

    settings = ck.TierSettings(local_dir="/x", keep=3)
    blob = cloudpickle.dumps(tiered_trainable(PPO, settings))
    monkeypatch.setattr(TieredCheckpoints, "cleanup", lambda self: "this version's cleanup")
    loaded = cloudpickle.loads(blob)
    assert loaded.__name__ == "PPO" and loaded._rayrl_tier == settings
    assert loaded.__mro__[1:3] == (TieredCheckpoints, PPO)
    assert loaded.cleanup(object.__new__(loaded)) == "this version's cleanup"


class _Exploding:
    """The real local filesystem, except that making a folder raises a non-OSError (a driver's bug)."""

    def __init__(self) -> None:
        self._fs = pafs.LocalFileSystem()
        self.broken = True

    def __getattr__(self, name):
        return getattr(self._fs, name)

    def create_dir(self, path, recursive=True):
        if self.broken:
            raise RuntimeError("driver bug: not an OSError")
        return self._fs.create_dir(path, recursive=recursive)


def test_an_unexpected_upload_error_is_counted_and_the_thread_lives_on(tmp_path):
    settings = _settings(tmp_path)
    uploader = upload.Uploader(max_backoff_s=0.2, permanent_after=2)
    bad, fs = _save(settings, str(tmp_path / "bad"), 1), _Exploding()
    uploader.submit(bad, fs, str(tmp_path / "store" / "bad"))
    deadline = time.monotonic() + 5
    while uploader.stats.failed_attempts < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert uploader.stats.failed_attempts >= 2 and "RuntimeError" in uploader.stats.last_error
    # A transient-looking error keeps being retried (not given up): the thread is alive and trying,
    # and the upload lands once the filesystem works again.
    assert uploader.pending == 1 and not uploader.stats.permanent_error
    fs.broken = False
    assert uploader.drain(10) and uploader.stats.uploaded == 1


def test_a_permanent_refusal_from_the_s3_server_stops_retrying_and_keeps_the_only_copy(tmp_path):
    """moto with authentication on refuses the fake keys (INVALID_ACCESS_KEY_ID / ACCESS_DENIED): three
    refusals in a row end that upload instead of retrying forever; the tier-1 copy stays protected."""
    from conftest import moto

    with moto({"INITIAL_NO_AUTH_ACTION_COUNT": "0"}) as port:
        fs = pafs.S3FileSystem(
            access_key="testing", secret_key="testing", endpoint_override=f"127.0.0.1:{port}", scheme="http"
        )
        settings = _settings(tmp_path)
        uploader = upload.Uploader(max_backoff_s=0.2)
        local = _save(settings, "PPO_1", 1)
        uploader.submit(local, fs, "rayrl/run/PPO_1/checkpoint_000001")
        assert uploader.drain(30), "a refused upload was retried past the permanent limit"
        stats = uploader.stats
        assert stats.uploaded == 0 and stats.failed_attempts == 3
        assert "ACCESS_DENIED" in stats.permanent_error or "INVALID_ACCESS_KEY_ID" in stats.permanent_error
        assert str(local) in uploader.waiting_paths() and local.is_dir()  # never pruned: the only copy
        message = upload.permanent_failure_message(stats, "s3://rayrl/run")
        assert "are refused" in message and "run the same command again" in message and str(local) in message


def test_refusals_and_outages_are_told_apart():
    assert upload.is_permanent(OSError("AWS Error ACCESS_DENIED during HeadBucket operation"))
    assert upload.is_permanent(OSError("Bucket 'x' not found. To create buckets, enable the allow_bucket_creation"))
    assert not upload.is_permanent(OSError("AWS Error NETWORK_CONNECTION during PutObject: Connection refused"))
    assert not upload.is_permanent(TimeoutError("timed out"))
