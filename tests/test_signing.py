"""The storage trust boundary (rayrl.security.signing, rayrl.storage.checkpoints.choose): signed manifests,
refused when tampered, unsigned or of another key unless the user opts out, and a tier-1 folder others
could write refused. Real files, pyarrow's LocalFileSystem as the storage, and one moto S3 server; no Ray."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.fs as pafs
import pytest

from rayrl.errors import SpecError
from rayrl.security import signing
from rayrl.storage import checkpoints as ck
from rayrl.storage import manifest, upload

FS = pafs.LocalFileSystem()


@pytest.fixture(autouse=True)
def no_ambient_key(monkeypatch, tmp_path):
    """No key but the ones a test sets: this machine's Ray token and variables are out of sight."""
    for var in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", signing.KEY_FILE_ENV, signing.ALLOW_ENV):
        monkeypatch.delenv(var, raising=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    return home


def key_file(tmp_path: Path, secret: str, name: str = "key") -> str:
    path = tmp_path / name
    path.write_text(secret + "\n")
    path.chmod(0o600)
    return str(path)


def settings(tmp_path: Path, key: str = "", allow: bool = False) -> ck.TierSettings:
    return ck.TierSettings(local_dir=str(tmp_path / "tier1"), keep=3, key_file=key, allow_unsigned=allow)


def save(s: ck.TierSettings, trial: str, index: int, key: signing.Key | None | str = "settings") -> Path:
    """What the trainable's save() does: files into tier 1, the manifest last, signed; then the upload.
    ``key``: "settings" signs with the settings' key file, "env" with this node's key, None not at all."""
    folder = ck.local_root(s, trial) / f"checkpoint_{index:06d}"
    (folder / "learner").mkdir(parents=True)
    (folder / "algorithm_state.pkl").write_bytes(os.urandom(2000))
    (folder / "learner" / "weights.pt").write_bytes(os.urandom(6000))
    if key == "settings":
        manifest.write(folder, {"training_iteration": index}, key=signing.load(s.key_file))
    elif key == "env":
        manifest.write(folder, {"training_iteration": index})
    else:
        assert key is None or isinstance(key, signing.Key)
        manifest.write(folder, {"training_iteration": index}, key=key)
    upload.upload(folder, FS, f"{trial}/checkpoint_{index:06d}")
    return folder


def forge(folder: Path, rel: str = "algorithm_state.pkl", data: bytes = b"cos\nsystem\n(S'echo pwned'\ntR.") -> None:
    """An attacker without the key: new bytes in a file, every size and hash in the manifest recomputed,
    the MAC and key id left as they were."""
    (folder / rel).write_bytes(data)
    man = json.loads((folder / manifest.NAME).read_text())
    man["files"] = manifest.build(folder)["files"]
    (folder / manifest.NAME).write_text(json.dumps(man))


def wipe_tier1(tmp_path: Path) -> None:
    shutil.rmtree(tmp_path / "tier1", ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# The key


def test_key_sources_follow_rays_order_and_the_token_is_never_the_mac_key(tmp_path, monkeypatch, no_ambient_key):
    assert signing.load() is None  # nothing anywhere: manifests are written unsigned
    (no_ambient_key / ".ray").mkdir()
    (no_ambient_key / ".ray" / "auth_token").write_text("default-token\n")
    key = signing.load()
    assert key is not None and key.source == str(no_ambient_key / ".ray" / "auth_token")
    derived = hmac.new(b"default-token", b"rayrl-manifest-v1", hashlib.sha256).digest()
    assert key.secret == derived and key.secret != b"default-token"
    assert key.id == hashlib.sha256(derived).hexdigest()[:8] and "default-token" not in repr(key)
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", key_file(tmp_path, "path-token", "token"))
    assert signing.load().source.startswith("RAY_AUTH_TOKEN_PATH=")
    monkeypatch.setenv("RAY_AUTH_TOKEN", "  env-token ")
    assert signing.load() == signing.derive(b"env-token", "RAY_AUTH_TOKEN")
    monkeypatch.setenv(signing.KEY_FILE_ENV, key_file(tmp_path, "team-key"))
    assert signing.load().id == signing.derive(b"team-key", "").id
    # The driver's key file (carried in TierSettings) wins over this process's own.
    assert signing.load(key_file(tmp_path, "driver-key", "driver")).id == signing.derive(b"driver-key", "").id


def test_the_token_is_the_one_ray_itself_reads(tmp_path, monkeypatch, no_ambient_key):
    """Ray's own loader (ray._raylet.AuthenticationTokenLoader, the one Ray authenticates with), in a
    fresh process, reads the same token as signing.ray_token() from the default file and RAY_AUTH_TOKEN_PATH."""
    (no_ambient_key / ".ray").mkdir()
    (no_ambient_key / ".ray" / "auth_token").write_text(" default-token\n")
    probe = "from ray._raylet import AuthenticationTokenLoader as L; print(L.instance().get_raw_token(True))"
    for token_path, want in (("", "default-token"), (key_file(tmp_path, "  path-token ", "token"), "path-token")):
        if token_path:
            monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", token_path)
        ray_reads = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
        assert ray_reads.returncode == 0, ray_reads.stderr[-2000:]
        assert ray_reads.stdout.strip() == want and signing.ray_token()[0] == want.encode()


def test_a_named_key_file_that_cannot_be_read_is_an_error_not_another_key(tmp_path, monkeypatch, no_ambient_key):
    (no_ambient_key / ".ray").mkdir()
    (no_ambient_key / ".ray" / "auth_token").write_text("token")  # a fallback that must not be taken
    with pytest.raises(SpecError, match="RAYRL_STORAGE_KEY_FILE: cannot read the checkpoint signing key"):
        signing.load(str(tmp_path / "missing"))
    with pytest.raises(SpecError, match="is empty"):
        signing.load(key_file(tmp_path, "  "))
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "gone"))
    with pytest.raises(SpecError, match="RAY_AUTH_TOKEN_PATH: cannot read"):
        signing.load()


def test_the_driver_carries_its_key_file_and_opt_out_to_every_trial(tmp_path, monkeypatch):
    from rayrl.spec import load as load_spec
    from rayrl.tune.trainable import settings_for

    spec = load_spec(str(Path(__file__).resolve().parents[1] / "experiments" / "configs" / "cartpole_ppo.yaml"))
    assert settings_for(spec).key_file == "" and not settings_for(spec).allow_unsigned
    monkeypatch.setenv(signing.KEY_FILE_ENV, str(tmp_path / "nope"))
    with pytest.raises(SpecError, match="cannot read the checkpoint signing key"):  # before any trial starts
        settings_for(spec)
    monkeypatch.setenv(signing.KEY_FILE_ENV, key_file(tmp_path, "k"))
    monkeypatch.setenv(signing.ALLOW_ENV, "1")
    tier = settings_for(spec)
    assert tier.key_file == str(tmp_path / "key") and tier.allow_unsigned


# ---------------------------------------------------------------------------------------------
# Restore


def test_a_signed_round_trip_restores_from_storage_and_the_manifest_holds_no_secret(tmp_path):
    s = settings(tmp_path, key_file(tmp_path, "s3cret-key-material"))
    trial = str(tmp_path / "storage" / "PPO_1")
    for i in (1, 2):
        local = save(s, trial, i)
    text = (local / manifest.NAME).read_text()
    man = json.loads(text)
    key = signing.load(s.key_file)
    assert man["key_id"] == key.id and len(man["mac"]) == 64 and signing.check(man, key) == signing.OK
    assert "s3cret" not in text and key.secret.hex() not in text
    choice = ck.choose(FS, f"{trial}/checkpoint_000002", s)  # the tier-1 copy, verified
    assert choice.path == local and choice.rejected == [] and choice.unverified == ""
    wipe_tier1(tmp_path)  # a fresh node, whose umask lets its group write new folders
    old_umask = os.umask(0o002)
    try:
        choice = ck.choose(FS, f"{trial}/checkpoint_000002", s)  # the storage copy, downloaded and verified
    finally:
        os.umask(old_umask)
    assert choice.downloaded_bytes > 8000 and choice.meta["training_iteration"] == 2 and choice.rejected == []
    assert (tmp_path / "tier1").stat().st_mode & 0o077 == 0  # made private: the next save's check passes
    assert ck.trusted_root(s, trial) == choice.path.parent


@pytest.mark.parametrize("where", ["storage", "tier1"])
def test_a_tampered_checkpoint_is_never_loaded_even_with_the_opt_out(tmp_path, where):
    s = settings(tmp_path, key_file(tmp_path, "the-key"))
    trial = str(tmp_path / "storage" / "PPO_1")
    save(s, trial, 1)
    local2 = save(s, trial, 2)
    forge(Path(trial) / "checkpoint_000002")
    if where == "tier1":
        forge(local2)  # the same forgery in both copies
    else:
        wipe_tier1(tmp_path)
    key_id = signing.load(s.key_file).id
    for allow in (False, True):
        choice = ck.choose(FS, f"{trial}/checkpoint_000002", settings(tmp_path, s.key_file, allow))
        assert choice.path.name == "checkpoint_000001" and choice.meta["training_iteration"] == 1
        assert choice.rejected[0][0] == "checkpoint_000002"
        assert f"MAC wrong under key id {key_id}: changed after it was signed" in choice.rejected[0][1]
        assert (choice.path / "algorithm_state.pkl").read_bytes()[:3] != b"cos"
    # With nothing older to fall back on, the restore fails (it does not start fresh) and says why.
    shutil.rmtree(Path(trial) / "checkpoint_000001")
    shutil.rmtree(ck.local_root(s, trial) / "checkpoint_000001", ignore_errors=True)
    with pytest.raises(ck.UntrustedCheckpoint, match=f"checkpoint_000002 .* key id {key_id}.* never loaded") as err:
        ck.choose(FS, f"{trial}/checkpoint_000002", settings(tmp_path, s.key_file, allow=True))
    assert not isinstance(err.value, ck.NoIntactCheckpoint)


def test_changing_the_metadata_breaks_the_mac(tmp_path):
    s = settings(tmp_path, key_file(tmp_path, "k"))
    trial = str(tmp_path / "storage" / "PPO_1")
    local = save(s, trial, 1)
    man = manifest.read(local)
    man["meta"]["training_iteration"] = 999
    assert signing.check(man, signing.load(s.key_file)) == signing.TAMPERED


def test_unsigned_checkpoints_are_refused_unless_the_user_opts_out(tmp_path, monkeypatch):
    s = settings(tmp_path, key_file(tmp_path, "k"))
    trial = str(tmp_path / "storage" / "PPO_1")
    save(s, trial, 1, key=None)  # written where no key was found
    wipe_tier1(tmp_path)
    key_id = signing.load(s.key_file).id
    with pytest.raises(ck.UntrustedCheckpoint) as err:
        ck.choose(FS, f"{trial}/checkpoint_000001", s)
    message = str(err.value)
    assert f"checkpoint_000001 (storage copy in {trial}) is refused" in message
    assert f"not signed (no MAC; this node expects key id {key_id}" in message
    assert "RAYRL_ALLOW_UNSIGNED_STORAGE=1" in message and "the same RAYRL_STORAGE_KEY_FILE" in message
    assert not (ck.local_root(s, trial) / "checkpoint_000001").exists()  # not even downloaded
    # The opt-out, from the driver (TierSettings) or this process's environment: loaded after its hashes.
    choice = ck.choose(FS, f"{trial}/checkpoint_000001", settings(tmp_path, s.key_file, allow=True))
    assert choice.downloaded_bytes > 0 and choice.unverified.startswith("not signed")
    monkeypatch.setenv(signing.ALLOW_ENV, "1")
    assert ck.choose(FS, f"{trial}/checkpoint_000001", s).path.name == "checkpoint_000001"


def test_an_unsigned_newest_checkpoint_falls_back_to_the_older_signed_one(tmp_path):
    s = settings(tmp_path, key_file(tmp_path, "k"))
    trial = str(tmp_path / "storage" / "PPO_1")
    save(s, trial, 1)
    save(s, trial, 2, key=None)
    choice = ck.choose(FS, f"{trial}/checkpoint_000002", s)
    assert choice.path.name == "checkpoint_000001" and choice.unverified == ""
    assert [c for c, _ in choice.rejected] == ["checkpoint_000002", "checkpoint_000002"]  # tier 1, storage
    assert all("not signed" in why for _, why in choice.rejected)


def test_a_checkpoint_of_another_key_is_refused_with_both_key_ids(tmp_path, no_ambient_key):
    writer, reader = key_file(tmp_path, "old-token", "old"), key_file(tmp_path, "new-token", "new")
    trial = str(tmp_path / "storage" / "PPO_1")
    save(settings(tmp_path, writer), trial, 1)
    old_id, new_id = signing.load(writer).id, signing.load(reader).id
    with pytest.raises(ck.UntrustedCheckpoint, match=f"signed with key id {old_id}, this node has key id {new_id}"):
        ck.choose(FS, f"{trial}/checkpoint_000001", settings(tmp_path, reader))
    # A node with no key at all cannot check it either.
    with pytest.raises(ck.UntrustedCheckpoint, match=f"key id {old_id}, and this node has no key"):
        ck.choose(FS, f"{trial}/checkpoint_000001", settings(tmp_path))
    choice = ck.choose(FS, f"{trial}/checkpoint_000001", settings(tmp_path, reader, allow=True))
    assert (
        choice.unverified
        == f"signed with key id {old_id}, this node has key id {new_id} (RAYRL_STORAGE_KEY_FILE={reader})"
    )


def test_the_ray_token_signs_when_no_key_file_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", key_file(tmp_path, "cluster-token", "token"))
    s = settings(tmp_path)
    trial = str(tmp_path / "storage" / "PPO_1")
    save(s, trial, 1, key="env")  # manifest.write's default: this node's key
    assert ck.choose(FS, f"{trial}/checkpoint_000001", s).unverified == ""
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", key_file(tmp_path, "another-cluster", "token2"))
    with pytest.raises(ck.UntrustedCheckpoint, match="RAY_AUTH_TOKEN_PATH="):
        ck.choose(FS, f"{trial}/checkpoint_000001", s)


def test_files_the_manifest_does_not_list_are_not_restored(tmp_path):
    s = settings(tmp_path, key_file(tmp_path, "k"))
    trial = str(tmp_path / "storage" / "PPO_1")
    save(s, trial, 1)
    (Path(trial) / "checkpoint_000001" / "learner" / "extra_module.pkl").write_bytes(b"planted")
    wipe_tier1(tmp_path)
    choice = ck.choose(FS, f"{trial}/checkpoint_000001", s)
    assert choice.downloaded_bytes > 0 and not (choice.path / "learner" / "extra_module.pkl").exists()
    assert (choice.path / "learner" / "weights.pt").is_file()


def test_a_checkpoint_without_any_manifest_is_refused_unless_opted_out(tmp_path):
    trial = tmp_path / "storage" / "PPO_1"
    (trial / "checkpoint_000001").mkdir(parents=True)
    (trial / "checkpoint_000001" / "algorithm_state.pkl").write_bytes(b"x")
    s = settings(tmp_path, key_file(tmp_path, "k"))
    assert ck.choose(FS, str(trial / "checkpoint_000001"), s) is None  # the trainable decides:
    refused = ck.unmanifested(str(trial / "checkpoint_000001"), s)
    assert refused and "no rayrl_manifest.json" in refused and "RAYRL_ALLOW_UNSIGNED_STORAGE=1" in refused
    assert ck.unmanifested(str(trial / "checkpoint_000001"), settings(tmp_path, s.key_file, allow=True)) is None


# ---------------------------------------------------------------------------------------------
# The tier-1 folder


@pytest.mark.parametrize("level", ["tier1", "trial"])
@pytest.mark.parametrize("mode, who", [(0o777, "everyone"), (0o770, "its group")])
def test_a_tier1_folder_others_can_write_is_refused_before_restore_reads_it(tmp_path, level, mode, who):
    s = settings(tmp_path, key_file(tmp_path, "k"))
    trial = str(tmp_path / "storage" / "PPO_1")
    save(s, trial, 1)
    folder = tmp_path / "tier1" if level == "tier1" else ck.local_root(s, trial)
    folder.chmod(mode)
    with pytest.raises(SpecError, match=f"checkpoint.local_dir: the tier-1 checkpoint folder .* writable by {who}"):
        ck.choose(FS, f"{trial}/checkpoint_000001", s)
    with pytest.raises(SpecError, match="chmod go-w"):
        ck.trusted_root(s, trial)  # what save() checks before writing there
    folder.chmod(0o700)
    assert ck.choose(FS, f"{trial}/checkpoint_000001", s).path.name == "checkpoint_000001"


def test_a_symlinked_tier1_folder_is_refused(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    s = ck.TierSettings(local_dir=str(elsewhere), key_file=key_file(tmp_path, "k"))
    trial = str(tmp_path / "storage" / "PPO_1")
    save(s, trial, 1)
    (tmp_path / "tier1").symlink_to(elsewhere)
    with pytest.raises(SpecError, match="is a symbolic link"):
        ck.choose(FS, f"{trial}/checkpoint_000001", settings(tmp_path, s.key_file))


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="chown to another user needs root")
def test_a_tier1_folder_of_another_user_is_refused(tmp_path):
    s = settings(tmp_path, key_file(tmp_path, "k"))
    trial = str(tmp_path / "storage" / "PPO_1")
    save(s, trial, 1)
    os.chown(tmp_path / "tier1", 4242, 4242)
    with pytest.raises(SpecError, match="belongs to user id 4242"):
        ck.choose(FS, f"{trial}/checkpoint_000001", s)


# ---------------------------------------------------------------------------------------------
# An S3 server


def test_signed_checkpoints_on_an_s3_server(tmp_path):
    """moto's S3 server: a signed checkpoint restores from the bucket; one forged in the bucket (hashes
    recomputed, MAC kept) is refused and the older one restored."""
    import boto3
    from conftest import moto, moto_fs

    with moto() as port:
        fs = moto_fs(port)
        fs.create_dir("bucket")
        s = settings(tmp_path, key_file(tmp_path, "k"))
        trial = "bucket/run/tune/PPO_1"
        uploader = upload.Uploader()
        for i in (1, 2):
            folder = ck.local_root(s, trial) / f"checkpoint_{i:06d}"
            folder.mkdir(parents=True)
            (folder / "algorithm_state.pkl").write_bytes(os.urandom(3000))
            manifest.write(folder, {"training_iteration": i}, key=signing.load(s.key_file))
            uploader.submit(folder, fs, f"{trial}/checkpoint_{i:06d}")
        assert uploader.drain(60) and uploader.stats.uploaded == 2
        wipe_tier1(tmp_path)
        assert ck.choose(fs, f"{trial}/checkpoint_000002", s).downloaded_bytes > 3000  # the files and manifest
        # The attacker: new bytes, a manifest with their hashes, the old MAC.
        client = boto3.client(
            "s3",
            endpoint_url=f"http://127.0.0.1:{port}",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
        )
        evil = b"cos\nsystem\n(S'echo pwned'\ntR."
        key2 = "run/tune/PPO_1/checkpoint_000002"
        client.put_object(Bucket="bucket", Key=f"{key2}/algorithm_state.pkl", Body=evil)
        man = json.loads(client.get_object(Bucket="bucket", Key=f"{key2}/{manifest.NAME}")["Body"].read())
        man["files"]["algorithm_state.pkl"] = {"size": len(evil), "sha256": hashlib.sha256(evil).hexdigest()}
        client.put_object(Bucket="bucket", Key=f"{key2}/{manifest.NAME}", Body=json.dumps(man).encode())
        wipe_tier1(tmp_path)
        choice = ck.choose(fs, f"{trial}/checkpoint_000002", s)
        assert choice.path.name == "checkpoint_000001" and "MAC wrong" in choice.rejected[-1][1]
        assert not (ck.local_root(s, trial) / "checkpoint_000002").exists()


# ---------------------------------------------------------------------------------------------
# The trainable's hooks (Tune's objects, no Ray cluster)


class _Algorithm:
    """Stands in for the RLlib Algorithm behind TieredCheckpoints: records what Tune's restore got."""

    restored: list = []

    def save_checkpoint(self, folder: str) -> None:
        Path(folder, "algorithm_state.pkl").write_bytes(os.urandom(500))

    def restore(self, checkpoint_path) -> str:
        type(self).restored.append(checkpoint_path.checkpoint.path)
        return "restored"


def _trainable(s: ck.TierSettings, trial: str, index: int):
    from types import SimpleNamespace

    from rayrl.tune.trainable import tiered_trainable

    t = object.__new__(tiered_trainable(_Algorithm, s))
    t._storage = SimpleNamespace(
        _update_checkpoint_index=lambda metrics: None,
        checkpoint_fs_path=f"{trial}/checkpoint_{index:06d}",
        trial_fs_path=trial,
        storage_filesystem=FS,
    )
    t._last_result = {"training_iteration": index}
    t._rayrl_uploader = upload.Uploader()
    t._rayrl_preempt = SimpleNamespace(requested=False, saved=False)
    t._rayrl_events = {}
    _Algorithm.restored = []
    return t


def test_the_trainable_signs_with_the_drivers_key_and_refuses_what_it_cannot_verify(tmp_path, capsys):
    from ray.tune import Checkpoint
    from ray.tune.trainable.trainable import _TrainingResult

    s = ck.TierSettings(local_dir=str(tmp_path / "tier1"), tiered=False, key_file=key_file(tmp_path, "k"))
    trial = str(tmp_path / "storage" / "PPO_1")
    old_umask = os.umask(0o002)  # a group-writable default must not make tier 1 fail its own check
    try:
        result = _trainable(s, trial, 1).save()
    finally:
        os.umask(old_umask)
    assert (tmp_path / "tier1").stat().st_mode & 0o077 == 0
    stored = manifest.read(Path(trial) / "checkpoint_000001")
    assert stored["key_id"] == signing.load(s.key_file).id and signing.check(stored, signing.load(s.key_file)) == "ok"
    t = _trainable(s, trial, 1)
    assert t.restore(result) == "restored" and _Algorithm.restored == [
        str(ck.local_root(s, trial) / "checkpoint_000001")
    ]
    # Another key: the trial fails with the paragraph; it neither starts fresh nor reaches Tune's restore.
    other = ck.TierSettings(local_dir=str(tmp_path / "tier1"), key_file=key_file(tmp_path, "other", "other"))
    t = _trainable(other, trial, 1)
    with pytest.raises(ck.UntrustedCheckpoint, match="signed with key id"):
        t.restore(result)
    assert _Algorithm.restored == [] and "restarted_fresh" not in t._rayrl_events
    # A checkpoint with no manifest anywhere (Tune's own restore would unpickle it): refused unless opted out.
    legacy = tmp_path / "storage" / "PPO_2" / "checkpoint_000001"
    legacy.mkdir(parents=True)
    (legacy / "algorithm_state.pkl").write_bytes(b"x")
    registered = _TrainingResult(checkpoint=Checkpoint(filesystem=FS, path=str(legacy)), metrics={})
    with pytest.raises(ck.UntrustedCheckpoint, match="has no rayrl_manifest.json"):
        _trainable(s, str(legacy.parent), 1).restore(registered)
    assert _Algorithm.restored == [] and "RAYRL_ALLOW_UNSIGNED_STORAGE=1" in capsys.readouterr().out
    allowed = ck.TierSettings(local_dir=str(tmp_path / "tier1"), key_file=s.key_file, allow_unsigned=True)
    assert _trainable(allowed, str(legacy.parent), 1).restore(registered) == "restored"
