"""Tune's experiment state and the sweep's trial checkpoints in a bucket are unpickled on resume:
rayrl seals the state it wrote (rayrl.storage.tunestate, rayrl.tune.sealer) and signs the sweep's
checkpoints (rayrl.tune.trainable.SignedCheckpoints); a resume loads neither unless it verifies."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
from pathlib import Path
from types import SimpleNamespace

import pyarrow.fs as pafs
import pytest

from rayrl.errors import SpecError
from rayrl.security import signing
from rayrl.storage import checkpoints as ck
from rayrl.storage import manifest, tunestate

EVIL = b"cos\nsystem\n(S'echo pwned'\ntR."


@pytest.fixture
def key(tmp_path, monkeypatch) -> signing.Key:
    path = tmp_path / "storage.key"
    path.write_bytes(os.urandom(32).hex().encode())
    monkeypatch.setenv(signing.KEY_FILE_ENV, str(path))
    monkeypatch.delenv(signing.ALLOW_ENV, raising=False)
    loaded = signing.load()
    assert loaded is not None
    return loaded


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ---------------------------------------------------------------------------------------------
# The seal's rules, pure


def test_a_sealed_state_verifies_and_a_changed_file_is_named(key):
    seal = tunestate.seal_of({"tuner.pkl": sha(b"a"), "experiment_state-1.json": sha(b"{}")}, None, 100.0, key)
    assert (
        tunestate.seal_refusal("x", {"tuner.pkl": sha(b"a"), "experiment_state-1.json": sha(b"{}")}, seal, key) is None
    )
    refusal = tunestate.seal_refusal(
        "s3://b/run", {"tuner.pkl": sha(EVIL), "experiment_state-1.json": sha(b"{}")}, seal, key
    )
    assert refusal and "tuner.pkl is not a version rayrl sealed" in refusal and "s3://b/run" in refusal
    assert signing.ALLOW_ENV in refusal
    # a file Tune would read that the seal never saw (a planted newer state) is refused too
    planted = {"tuner.pkl": sha(b"a"), "experiment_state-9.json": sha(EVIL)}
    assert "experiment_state-9.json" in (tunestate.seal_refusal("x", planted, seal, key) or "")


def test_no_seal_another_key_and_a_forged_seal_are_refused(key, tmp_path):
    found = {"tuner.pkl": sha(b"a")}
    assert "has no .rayrl-state-seal.json" in (tunestate.seal_refusal("x", found, None, key) or "")
    other = signing.derive(b"another cluster", "test")
    assert "signed with key id" in (
        tunestate.seal_refusal("x", found, tunestate.seal_of(found, None, 1.0, other), key) or ""
    )
    forged = tunestate.seal_of(found, None, 1.0, key)
    forged["files"]["tuner.pkl"][0][0] = sha(EVIL)  # the attacker's hash, the old MAC
    refusal = tunestate.seal_refusal("x", {"tuner.pkl": sha(EVIL)}, forged, key)
    assert refusal and "MAC wrong" in refusal and signing.ALLOW_ENV not in refusal


def test_the_seal_keeps_recent_versions_since_storage_may_hold_an_older_upload(key):
    seal = None
    for t, content in enumerate([b"v1", b"v2", b"v3", b"v4", b"v5", b"v6"]):
        seal = tunestate.seal_of({"experiment_state-1.json": sha(content)}, seal, 1000.0 + t, key)
    assert tunestate.seal_refusal("x", {"experiment_state-1.json": sha(b"v2")}, seal, key) is None  # 4 s old
    # An hour later: only the newest SEAL_KEEP_MIN versions stay accepted.
    seal = tunestate.seal_of({"experiment_state-1.json": sha(b"v7")}, seal, 1000.0 + tunestate.SEAL_KEEP_S + 60, key)
    accepted = [v[0] for v in seal["files"]["experiment_state-1.json"]]
    assert accepted == [sha(c) for c in (b"v7", b"v6", b"v5", b"v4")]
    assert tunestate.seal_refusal("x", {"experiment_state-1.json": sha(b"v1")}, seal, key) is not None


# ---------------------------------------------------------------------------------------------
# The sealer and the resume's check, on moto's S3 server


@pytest.fixture(scope="module")
def s3():
    from conftest import moto, moto_fs

    with moto() as port:
        fs = moto_fs(port)
        fs.create_dir("bucket")
        yield fs


def tune_writes(staging: Path, files: dict[str, bytes]) -> None:
    staging.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (staging / name).write_bytes(data)


def tune_uploads(fs, staging: Path, exp: str) -> None:
    """What Tune's syncer does: the staging folder's files copied to storage."""
    pafs.copy_files(str(staging), exp, source_filesystem=pafs.LocalFileSystem(), destination_filesystem=fs)


def test_a_resume_checks_the_bucket_against_the_seal_the_driver_wrote(key, s3, tmp_path, capsys, monkeypatch):
    from rayrl.tune.sealer import StateSealer

    exp, staging = "bucket/run1/tune", tmp_path / "staging"
    trials = [SimpleNamespace(storage=SimpleNamespace(experiment_driver_staging_path=str(staging)))]
    sealer = StateSealer(s3, exp)
    state = {"tuner.pkl": b"tuner", "experiment_state-1.json": b'{"v": 1}', "searcher-state-1.pkl": b"s"}
    tune_writes(staging, state)
    tune_uploads(s3, staging, exp)
    assert sealer.update(trials)
    tunestate.check_remote(s3, exp)  # what the driver wrote verifies
    # Tune writes a new version, the sealer seals it; the bucket still holds the older upload: accepted.
    tune_writes(staging, {"experiment_state-1.json": b'{"v": 2}'})
    os.utime(staging / "experiment_state-1.json", (1, 1))
    assert sealer.update(trials)
    tunestate.check_remote(s3, exp)
    tune_uploads(s3, staging, exp)
    tunestate.check_remote(s3, exp)
    # No key in the pickle Tune uploads with tuner.pkl.
    assert sealer.key is not None and sealer.key.secret not in pickle.dumps(sealer)
    assert pickle.loads(pickle.dumps(sealer)).key == sealer.key
    # Someone who can write the bucket but has no key swaps the searcher's pickle: refused, by name.
    with s3.open_output_stream(f"{exp}/searcher-state-1.pkl") as f:
        f.write(EVIL)
    with pytest.raises(SpecError, match="searcher-state-1.pkl is not a version rayrl sealed"):
        tunestate.check_remote(s3, exp)
    # The user's opt-out lets an unverified state load (with a line) ...
    monkeypatch.setenv(signing.ALLOW_ENV, "1")
    tunestate.check_remote(s3, exp)
    assert "unverified experiment state" in capsys.readouterr().out
    # ... but never past a seal changed without the key.
    with s3.open_input_stream(f"{exp}/{tunestate.SEAL}") as f:
        seal = json.loads(f.read())
    seal["files"]["searcher-state-1.pkl"][0][0] = sha(EVIL)
    with s3.open_output_stream(f"{exp}/{tunestate.SEAL}") as f:
        f.write(json.dumps(seal).encode())
    with pytest.raises(SpecError, match="MAC wrong"):
        tunestate.check_remote(s3, exp)


def test_a_resumed_sealer_keeps_the_uploaded_versions_and_drops_a_stale_downloaded_seal(key, s3, tmp_path):
    from rayrl.tune.sealer import StateSealer

    exp, staging = "bucket/run2/tune", tmp_path / "staging"
    trials = [SimpleNamespace(storage=SimpleNamespace(experiment_driver_staging_path=str(staging)))]
    tune_writes(staging, {"tuner.pkl": b"t", "experiment_state-1.json": b"1"})
    tune_uploads(s3, staging, exp)
    assert StateSealer(s3, exp).update(trials)
    # A new start on another machine: Tune downloads the folder, seal included, into its staging.
    staging.joinpath(tunestate.SEAL).write_bytes(b"{}")
    resumed = StateSealer(s3, exp)
    resumed.on_step_begin(0, trials)
    assert not staging.joinpath(tunestate.SEAL).exists()  # Tune's next upload cannot put it back
    tune_writes(staging, {"experiment_state-2.json": b"2"})
    resumed.on_step_end(1, trials)
    tunestate.check_remote(s3, exp)  # the first start's upload still verifies ...
    tune_uploads(s3, staging, exp)
    tunestate.check_remote(s3, exp)  # ... and so does the new one


# ---------------------------------------------------------------------------------------------
# The sweep's trial checkpoints


class _Algorithm:
    loaded: list = []

    def save_checkpoint(self, folder: str) -> None:
        Path(folder, "algorithm_state.pkl").write_bytes(os.urandom(300))

    def load_checkpoint(self, folder) -> None:
        type(self).loaded.append(str(folder))


def _trainable(remote: bool, allow: bool = False):
    from rayrl.tune.trainable import signed_trainable

    t = object.__new__(signed_trainable(_Algorithm, ck.TierSettings(allow_unsigned=allow)))
    fs = SimpleNamespace(type_name="s3") if remote else pafs.LocalFileSystem()
    t._storage = SimpleNamespace(storage_filesystem=fs)
    t._iteration = 3
    _Algorithm.loaded = []
    return t


def test_sweep_checkpoints_are_signed_and_one_from_a_bucket_loads_only_if_it_verifies(key, tmp_path):
    folder = tmp_path / "checkpoint_000003"
    folder.mkdir()
    _trainable(remote=True).save_checkpoint(str(folder))
    written = manifest.read(folder)
    assert written and signing.check(written, key) == signing.OK
    _trainable(remote=True).load_checkpoint(str(folder))
    assert _Algorithm.loaded == [str(folder)]
    # Forged in the bucket (hashes recomputed, MAC kept): refused before RLlib sees it.
    (folder / "algorithm_state.pkl").write_bytes(EVIL)
    forged = dict(written, files={"algorithm_state.pkl": {"size": len(EVIL), "sha256": sha(EVIL)}})
    (folder / manifest.NAME).write_text(json.dumps(forged))
    t = _trainable(remote=True)
    with pytest.raises(ck.UntrustedCheckpoint, match="MAC wrong"):
        t.load_checkpoint(str(folder))
    assert _Algorithm.loaded == []
    # Bytes changed under an intact manifest: not the checkpoint it describes.
    (folder / manifest.NAME).write_text(json.dumps(written))
    with pytest.raises(ck.NoIntactCheckpoint, match="29 bytes, manifest says 300"):
        _trainable(remote=True).load_checkpoint(str(folder))


def test_a_sweep_checkpoint_with_no_manifest_loads_from_a_local_run_folder_only(key, tmp_path):
    old = tmp_path / "checkpoint_000001"  # written by a rayrl that did not sign sweep checkpoints
    old.mkdir()
    (old / "algorithm_state.pkl").write_bytes(b"x")
    _trainable(remote=False).load_checkpoint(str(old))  # the run folder's own trust check guards it
    assert _Algorithm.loaded == [str(old)]
    with pytest.raises(ck.UntrustedCheckpoint, match="has no rayrl_manifest.json"):
        _trainable(remote=True).load_checkpoint(str(old))
    _trainable(remote=True, allow=True).load_checkpoint(str(old))
    assert _Algorithm.loaded == [str(old)]
