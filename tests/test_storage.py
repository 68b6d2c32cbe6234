"""rayrl/storage: URIs, atomic writes on a full disk, the run lock, the object-storage mirror."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, small_disk, subprocess_env

from rayrl import runtime
from rayrl.errors import SpecError
from rayrl.storage import files, mirror, uri
from rayrl.storage import lock as lock_mod

CONFIG = ROOT / "experiments" / "configs" / "cartpole_ppo.yaml"


# --- URIs -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, words",
    [
        ("ftp://host/runs", ["'ftp://'", "s3://"]),
        ("s3:///runs", ["names no bucket", "s3://BUCKET"]),
        ("gs://bucket/runs", ["gs://", "generation preconditions", "s3://BUCKET/PREFIX"]),
        ("hdfs://namenode/runs", ["hdfs://", "not atomic", "conditional"]),
        ("abfs://container/runs", ["abfs://", "Azure"]),
    ],
)
def test_bad_storage_uris_are_one_clear_paragraph(value, words):
    with pytest.raises(SpecError) as err:
        uri.parse(value)
    assert "--storage" in str(err.value) and all(w in str(err.value) for w in words)


def test_local_paths_and_children_keep_the_query(tmp_path):
    loc = uri.parse(str(tmp_path / "runs"))
    assert loc.local and loc.path == str(tmp_path / "runs") and loc.child("a").path == str(tmp_path / "runs" / "a")
    assert uri.parse(f"file://{tmp_path}").path == str(tmp_path)
    s3 = uri.parse("s3://bucket/runs?endpoint_override=127.0.0.1:9&scheme=http")
    assert not s3.local and s3.path == "bucket/runs"
    assert s3.child("n").uri == "s3://bucket/runs/n?endpoint_override=127.0.0.1:9&scheme=http"
    assert s3.child("n").path == "bucket/runs/n"


def test_cli_rejects_a_bad_uri_before_ray(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "rayrl.cli", "train", "--config", str(CONFIG), "--storage", "ftp://host/runs"],
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "'ftp://'" in proc.stderr and "Traceback" not in proc.stderr
    assert "Started a local Ray" not in proc.stdout + proc.stderr


# --- atomic writes and a full disk -------------------------------------------------------------------


def _fill(folder: Path) -> Path:
    """Fill the disk under ``folder`` to the last byte."""
    filler = folder / "filler"
    with filler.open("wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    return filler


@pytest.fixture
def full_disk(tmp_path, monkeypatch):
    """A folder on a tmpfs that is full; where mounting is not allowed, os.write in rayrl.storage.files
    raises ENOSPC instead (the real call site of every run-folder write)."""
    disk = tmp_path / "disk"
    with small_disk(disk, "1m") as mounted:
        (disk / "run").mkdir()
        (disk / "run" / "summary.json").write_text('{"old": true}')
        (disk / "run" / "history.csv").write_text("a,b\n1,2\n")
        if mounted:
            filler = _fill(disk)
        else:

            def no_space(fd, data):
                raise OSError(errno.ENOSPC, "No space left on device")

            monkeypatch.setattr(files.os, "write", no_space)
            filler = None
        yield disk / "run", filler


def test_a_full_disk_leaves_the_old_file_and_a_clear_error(full_disk):
    run, filler = full_disk
    with pytest.raises(files.StorageError) as err:
        files.write_local(run / "summary.json", json.dumps({"new": "x" * 200_000}).encode())
    text = err.value.strerror
    assert "summary.json" in text and "full" in text and "run the same command again" in text
    assert json.loads((run / "summary.json").read_text()) == {"old": True}
    assert sorted(p.name for p in run.iterdir()) == ["history.csv", "summary.json"]  # no temp file left
    with pytest.raises(files.StorageError):
        files.append_line(run / "history.csv", "3," + "4" * 200_000 + "\n")
    assert (run / "history.csv").read_text() == "a,b\n1,2\n"  # the half-written row was cut off
    if filler is not None:  # space freed: the same writes now succeed
        filler.unlink()
        files.write_local(run / "summary.json", b'{"new": 1}')
        files.append_line(run / "history.csv", "3,4\n")
        assert json.loads((run / "summary.json").read_text()) == {"new": 1}
        assert (run / "history.csv").read_text().splitlines()[-1] == "3,4"


# --- the run lock ----------------------------------------------------------------------------------

HOST = socket.gethostname()


def _info(host=HOST, pid=1, pid_start=None):
    return {"host": host, "pid": pid, "pid_start": pid_start}


@pytest.mark.parametrize(
    "info, age, started, stale",
    [
        (_info(pid=42), 0.0, {42: 5.0}, None),  # alive here, fresh beat: held
        (_info(pid=42), 0.0, {}, "gone from this host"),  # dead here
        (_info(pid=42, pid_start=5.0), 0.0, {42: 900.0}, "another process"),  # pid reused
        (_info(host="other"), 30.0, {}, None),  # other host, fresh beat: held
        (_info(host="other"), 121.0, {}, "heartbeat is 121 s old"),  # other host, silent: stale
        ({"host": HOST}, 0.0, {}, "unreadable"),
        (None, 0.0, {}, "no lock"),
    ],
)
def test_lock_staleness_rules(info, age, started, stale):
    reason = lock_mod.staleness(info, age, HOST, 120.0, started=lambda pid: started.get(pid))
    assert (reason is None) if stale is None else (stale in reason)


HOLDER = """
import sys, time
from rayrl import runtime
paths = runtime.resolve(sys.argv[1], sys.argv[2])
with runtime.claim(paths):
    print("held", flush=True)
    time.sleep(120)
"""


def _digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != lock_mod.LOCK_FILE
    }


def test_a_second_start_with_the_same_name_exits_2_and_touches_nothing(tmp_path):
    run = tmp_path / "dup"
    run.mkdir()
    (run / "spec.yaml").write_text("name: first\n")
    (run / "history.csv").write_text("trial_id,env_steps\nt,100\n")
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path), "dup"],
        env=subprocess_env(),
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        before = _digest(run)
        second = subprocess.run(
            [
                sys.executable,
                "-m",
                "rayrl.cli",
                "train",
                "--config",
                str(CONFIG),
                "--storage",
                str(tmp_path),
                "--name",
                "dup",
            ],
            env=subprocess_env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert second.returncode == 2, second.stderr
        said = " ".join(second.stderr.split())
        assert "in use by another rayrl process" in said and f"pid {holder.pid}" in said
        assert "Traceback" not in second.stderr and "Started a local Ray" not in second.stdout + second.stderr
        assert _digest(run) == before
    finally:
        holder.kill()
        holder.wait()
    # The holder is gone (killed, its lock left behind): the next start takes the lock over.
    assert json.loads((run / lock_mod.LOCK_FILE).read_text())["pid"] == holder.pid
    paths = runtime.resolve(str(tmp_path), "dup")
    with runtime.claim(paths) as lock:
        assert "gone from this host" in lock.took_over
        assert json.loads((run / lock_mod.LOCK_FILE).read_text())["pid"] == os.getpid()
    assert not (run / lock_mod.LOCK_FILE).exists()  # released at the end


def test_a_lock_with_an_old_heartbeat_from_another_host_is_taken_over(tmp_path):
    paths = runtime.resolve(str(tmp_path), "old")
    stale = {"host": "node-gone", "pid": 7, "heartbeat": time.time(), "token": "x"}
    lock_file = paths.run_dir / lock_mod.LOCK_FILE
    lock_file.write_text(json.dumps(stale))
    # Age is the store's clock (the file's mtime), not the heartbeat the holder wrote: a skewed clock
    # on the holder's host cannot make a live lock look old, nor a dead one look fresh.
    os.utime(lock_file, (time.time() - 500, time.time() - 500))
    with runtime.claim(paths) as lock:
        assert "heartbeat is 500 s old" in lock.took_over
    stale["heartbeat"] = time.time() - 5000  # a live run elsewhere (whatever its own clock says): refused
    lock_file.write_text(json.dumps(stale))
    with pytest.raises(lock_mod.LockHeld, match="host node-gone, pid 7"):
        with runtime.claim(paths):
            pass


def test_the_heartbeat_keeps_a_long_run_fresh(tmp_path):
    paths = runtime.resolve(str(tmp_path), "beat")
    loc = paths.location
    with lock_mod.RunLock.at(loc, stale_s=0.8):
        first = json.loads((paths.run_dir / lock_mod.LOCK_FILE).read_text())["heartbeat"]
        time.sleep(1.0)
        later = json.loads((paths.run_dir / lock_mod.LOCK_FILE).read_text())["heartbeat"]
        assert later > first and time.time() - later < 0.8


# --- object storage (moto's S3 server) -------------------------------------------------------------


def test_object_storage_mirror_bucket_wins_and_wipes_are_survived(s3_server, monkeypatch, tmp_path):
    for key, value in s3_server.env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("RAYRL_HOME", str(tmp_path / "home"))
    paths = runtime.resolve("s3://rayrl/unit", "m")
    assert paths.remote and str(paths.run_dir).startswith(str(tmp_path / "home"))
    paths.write_json("summary.json", {"a": 1})
    paths.write_text("spec.yaml", "name: m\n")
    (paths.run_dir / "stray.csv").write_text("not the bucket's\n")
    keys = {o["Key"] for o in s3_server.client.list_objects_v2(Bucket="rayrl", Prefix="unit/m/")["Contents"]}
    assert keys - {"unit/m/"} == {"unit/m/summary.json", "unit/m/spec.yaml"}  # (pyarrow's folder marker)
    with runtime.claim(paths):  # the start pulls the bucket: its files win, strays go
        assert {p.name for p in paths.run_dir.iterdir()} == {"summary.json", "spec.yaml"}
        assert "unit/m/.rayrl-lock.json" in {
            o["Key"] for o in s3_server.client.list_objects_v2(Bucket="rayrl", Prefix="unit/m/")["Contents"]
        }
        with pytest.raises(lock_mod.LockHeld):
            with runtime.claim(runtime.resolve("s3://rayrl/unit", "m")):
                pass
    import shutil

    shutil.rmtree(tmp_path / "home")  # every local copy gone: a reader fetches from the bucket alone
    local, store = mirror.fetch("s3://rayrl/unit/m")
    assert json.loads((local / "summary.json").read_text()) == {"a": 1} and store is not None
    with pytest.raises(FileNotFoundError):
        mirror.fetch("s3://rayrl/unit/none")


def test_a_file_whose_upload_failed_is_sent_at_the_next_start_not_lost(s3_server, monkeypatch, tmp_path):
    from urllib.parse import urlsplit

    from slowproxy import SlowProxy

    up = urlsplit(s3_server.endpoint)
    proxy = SlowProxy((up.hostname, up.port))
    for key, value in {**s3_server.env, "AWS_ENDPOINT_URL": proxy.url}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("RAYRL_HOME", str(tmp_path / "home"))
    try:
        paths = runtime.resolve("s3://rayrl/unsent", "u")
        paths.write_json("summary.json", {"v": 1})
        proxy.block()  # the store goes away: the next two writes land locally only
        for rel, data in (("summary.json", {"v": 2}), ("trials.csv", {"rows": 3})):
            with pytest.raises(files.StorageError):
                paths.write_json(rel, data)
        assert json.loads((paths.run_dir / "summary.json").read_text()) == {"v": 2}
        proxy.unblock()
        with runtime.claim(paths):  # the start sends them instead of letting the bucket's copy win
            for rel, data in (("summary.json", {"v": 2}), ("trials.csv", {"rows": 3})):
                assert json.loads((paths.run_dir / rel).read_text()) == data
                got = s3_server.client.get_object(Bucket="rayrl", Key=f"unsent/u/{rel}")["Body"].read()
                assert json.loads(got) == data
        assert paths.store.unsent() == []
    finally:
        proxy.close()


def _history_result(trial_id: str, iteration: int):
    from types import SimpleNamespace

    trial = SimpleNamespace(trial_id=trial_id, config={"train_batch_size_per_learner": 256, "lr": 1e-3})
    return trial, {"training_iteration": iteration, "num_env_steps_sampled_lifetime": 256 * iteration}


def test_history_uploads_failing_never_end_the_run_and_no_row_is_lost(s3_server, monkeypatch, tmp_path, capsys):
    """history.csv on S3 while the store goes down (the fault table's outage and 5 s PUTs ended `rayrl
    train` here), then a driver killed between uploads: Tune's loop is never stopped, the failure is
    printed once, and the next start sends every local row instead of taking the bucket's older copy."""
    from urllib.parse import urlsplit

    from slowproxy import SlowProxy

    from rayrl.observe.progress import HistoryWriter

    up = urlsplit(s3_server.endpoint)
    proxy = SlowProxy((up.hostname, up.port))
    for key, value in {**s3_server.env, "AWS_ENDPOINT_URL": proxy.url}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("RAYRL_HOME", str(tmp_path / "home"))
    key = "history/h/history.csv"

    def bucket_rows() -> int:
        return len(s3_server.client.get_object(Bucket="rayrl", Key=key)["Body"].read().decode().splitlines()) - 1

    try:
        paths = runtime.resolve("s3://rayrl/history", "h")
        writer = HistoryWriter(paths.run_dir / "history.csv", "train", store=paths.store, upload_s=0.0)
        writer.on_trial_result(1, [], *_history_result("t1", 1))
        writer._sender.join(30)
        assert bucket_rows() == 1 and paths.store.unsent() == []
        proxy.block()  # the store goes away for three results
        for i in (2, 3, 4):
            writer.on_trial_result(i, [], *_history_result("t1", i))
            started = time.monotonic()
            writer.on_step_end(i, [])  # never raises for an upload: Tune's loop goes on
            assert time.monotonic() - started < 1.0
            writer._sender.join(60)
        said = [line for line in capsys.readouterr().out.splitlines() if "could not be uploaded" in line]
        assert len(said) == 1 and "training goes on" in said[0], said  # one line for the outage
        assert writer.upload_failures == 3 and writer.failed is None
        assert paths.store.unsent() == ["history.csv"] and bucket_rows() == 1
        proxy.unblock()
        writer.on_trial_result(5, [], *_history_result("t1", 5))
        writer._sender.join(30)
        assert bucket_rows() == 5 and paths.store.unsent() == []
        assert "history.csv uploaded again (3 failed attempts so far)" in capsys.readouterr().out
        # A driver killed between uploads: row 6 is local only; the next start keeps it and sends it.
        writer.upload_s = 3600.0
        writer.on_trial_result(6, [], *_history_result("t1", 6))
        assert paths.store.unsent() == ["history.csv"] and bucket_rows() == 5
        again = runtime.resolve("s3://rayrl/history", "h")
        with runtime.claim(again):
            assert len((again.run_dir / "history.csv").read_text().splitlines()) == 7
            assert bucket_rows() == 6
    finally:
        proxy.close()


def test_an_unwritable_bucket_exits_2_before_ray(s3_server):
    proc = subprocess.run(
        [sys.executable, "-m", "rayrl.cli", "train", "--config", str(CONFIG), "--storage", "s3://no-such-bucket/runs"],
        env=subprocess_env(**s3_server.env),
        capture_output=True,
        text=True,
        timeout=120,
    )
    said = " ".join(proc.stderr.split())
    assert proc.returncode == 2 and "s3://no-such-bucket/runs" in said and "not writable" in said
    assert "Traceback" not in proc.stderr and "Started a local Ray" not in proc.stdout + proc.stderr


@pytest.mark.parametrize("command", ["report", "doctor", "drill"])
def test_readers_take_a_uri_and_name_an_empty_one(s3_server, command):
    proc = subprocess.run(
        [sys.executable, "-m", "rayrl.cli", command, "s3://rayrl/nothing/here"],
        env=subprocess_env(**s3_server.env),
        capture_output=True,
        text=True,
        timeout=120,
    )
    said = " ".join(proc.stderr.split())
    assert proc.returncode == 2 and "s3://rayrl/nothing/here" in said and "no files there" in said, proc.stderr
    assert "Traceback" not in proc.stderr
