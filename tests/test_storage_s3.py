"""The done-when test of object storage: a sweep and `rayrl train` (killed mid-run) on an S3-compatible
server (moto), every local copy deleted, then the bucket alone: the contract parses, resume repeats
nothing, `rayrl train` continues its counters, `rayrl report` works on the URI."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest
import yaml
from conftest import ROOT, kill_session, subprocess_env

from rayrl.errors import SpecError
from rayrl.faults.driver_drill import state_names_a_checkpoint
from rayrl.observe import keys
from rayrl.storage import checkpoints as ck
from rayrl.storage import manifest, tunestate

pytestmark = pytest.mark.slow

TINY = [
    "--set",
    "env.envs_per_runner=2",
    "--set",
    "algo.train_batch_per_learner=512",
    "--set",
    "algo.minibatch_size=256",
    "--set",
    "algo.epochs=1",
    "--set",
    "resources.env_runners=0",
]
SWEEP = [
    sys.executable,
    str(ROOT / "experiments" / "sweep.py"),
    "--storage",
    "s3://rayrl/e2e",
    "--name",
    "sw",
    "--num-cpus",
    "2",
    *TINY,
    "--set",
    "search.doubling.start=512",
    "--set",
    "search.doubling.cap=512",
    "--set",
    "search.doubling.warmup_iters=0",
    "--set",
    "search.doubling.measure_iters=1",
    "--set",
    "search.num_samples=2",
    "--set",
    "search.max_env_steps=1024",
    "--set",
    "search.grace_env_steps=512",
    "--set",
    "search.max_concurrent=1",
    "--set",
    "search.min_batch=512",
]  # phase 2 on the one rung only
#: 32 iterations: a run still going while the poll below waits for a sealed state naming a checkpoint
TRAIN_ENV_STEPS = 512 * 32
TRAIN = [
    sys.executable,
    "-m",
    "rayrl.cli",
    "train",
    "--config",
    str(ROOT / "experiments/configs/cartpole_ppo.yaml"),
    "--storage",
    "s3://rayrl/e2e",
    "--name",
    "tr",
    "--num-cpus",
    "2",
    *TINY,
    "--set",
    "checkpoint.every=1",
    "--set",
    "stop.episode_return=100000",
    "--set",
    f"stop.env_steps={TRAIN_ENV_STEPS}",
]


def _run(cmd: list[str], env: dict, timeout: int = 300) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def _get(s3_server, key: str) -> bytes:
    return s3_server.client.get_object(Bucket=s3_server.bucket, Key=key)["Body"].read()


def bucket_state_names_a_checkpoint(s3_server, prefix: str) -> bool:
    """Whether Tune's newest experiment state in the bucket records a trial checkpoint (hex-pickled)."""
    listed = s3_server.client.list_objects_v2(Bucket=s3_server.bucket, Prefix=prefix).get("Contents", [])
    states = sorted(o["Key"] for o in listed if o["Key"].rsplit("/", 1)[-1].startswith("experiment_state-"))
    if not states:
        return False
    return state_names_a_checkpoint(_get(s3_server, states[-1]).decode(errors="replace"))


def _manifests(s3_server, prefix: str) -> list[str]:
    """Keys of the checkpoint manifests in the bucket: checkpoints whose upload finished."""
    listed = s3_server.client.list_objects_v2(Bucket=s3_server.bucket, Prefix=prefix).get("Contents", [])
    return [o["Key"] for o in listed if o["Key"].endswith("/" + manifest.NAME)]


def _sealed(s3_server, exp: str) -> bool:
    """Whether the bucket's experiment state at ``exp`` verifies against the driver's seal."""
    import pyarrow.fs as pafs

    host = s3_server.endpoint.removeprefix("http://")
    fs = pafs.S3FileSystem(access_key="testing", secret_key="testing", endpoint_override=host, scheme="http")
    try:
        tunestate.check_remote(fs, exp)
    except SpecError:
        return False
    return True


def test_sweep_and_train_on_s3_resume_from_the_bucket_alone(s3_server, tmp_path):
    home, user = tmp_path / "home", tmp_path / "user"
    # A fresh HOME and RAYRL_HOME: the mirror, tier 1 ($RAYRL_HOME/checkpoints) and anything under ~.
    env = subprocess_env(**s3_server.env, RAYRL_HOME=str(home), HOME=str(user))

    def wipe() -> None:  # every local copy of the run folders and checkpoints is gone
        shutil.rmtree(home, ignore_errors=True)
        shutil.rmtree(user, ignore_errors=True)
        user.mkdir()

    wipe()
    _run(SWEEP, env)
    wipe()

    get = lambda key: _get(s3_server, f"e2e/{key}")  # noqa: E731
    doubling = pd.read_csv(io.BytesIO(get("sw/doubling.csv")))
    assert list(doubling["batch_size"]) == [512] and list(doubling["decision"]) == ["cap"]
    trials = pd.read_csv(io.BytesIO(get("sw/trials.csv")))
    assert len(trials) == 2 and set(trials["batch_size"]) == {512}
    summary = json.loads(get("sw/summary.json"))
    # the best is a phase-2 trial, or the spec's own config when it won the confirmation (confirm_baseline)
    assert summary["knee_batch_size"] == 512 and summary["best"]["trial_id"] in {*trials["trial_id"], "spec"}
    assert yaml.safe_load(get("sw/best_config.yaml"))["algo"]["train_batch_per_learner"] == 512
    assert yaml.safe_load(get("sw/spec.yaml"))["search"]["num_samples"] == 2
    assert set(pd.read_csv(io.BytesIO(get("sw/history.csv")))["phase"]) == {"ladder", "search", "confirm"}
    assert len(pd.read_csv(io.BytesIO(get("sw/confirm.csv")))) == summary["confirm"]["candidates"][0]["runs"] * len(
        summary["confirm"]["candidates"]
    )

    again = _run(SWEEP, env)  # from the bucket alone
    assert "ladder already finished" in again.stdout and "resuming from the bucket" in again.stdout
    assert "[ladder" not in again.stdout and "[search" not in again.stdout  # nothing reran
    assert "confirm already finished" in again.stdout and "[confirm" not in again.stdout
    assert (
        pd.read_csv(io.BytesIO(get("sw/trials.csv")))
        .sort_values("trial_id")
        .reset_index(drop=True)
        .equals(trials.sort_values("trial_id").reset_index(drop=True))
    )

    # `rayrl train` killed after 2 iterations, local copies wiped: the same command resumes from the bucket.
    wipe()
    history = None
    proc = subprocess.Popen(
        TRAIN, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 240
        while True:
            found = list(home.glob("runs/*/tr/history.csv"))
            # Tune records a checkpoint in its state every 10 s or after checkpoint.keep of them, and the
            # background upload of one must have finished (its manifest is written last): wait for both.
            # ... and the driver's seal vouches for that state (a kill in the moment between the state's
            # upload and the seal's is refused on resume: docs/security.md).
            if (
                found
                and len(pd.read_csv(found[0])) >= 2
                and bucket_state_names_a_checkpoint(s3_server, "e2e/tr/tune/")
                and _manifests(s3_server, "e2e/tr/tune/")
                and _sealed(s3_server, "rayrl/e2e/tr/tune")
            ):
                history = found[0]
                break
            assert proc.poll() is None and time.monotonic() < deadline, "rayrl train made no progress"
            time.sleep(0.2)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        kill_session(proc.pid)  # the node is gone: its Ray workers too, before the wipe (not after it)
    killed_at = int(pd.read_csv(history)[keys.ITERATION].max())
    wipe()
    # Someone who can write the bucket, without the key, swaps Tune's pickled state: the resume refuses it
    # (exit 2, the file named) and unpickles nothing; with the real file back, it resumes.
    marker = tmp_path / "pwned"
    evil = f"cos\nsystem\n(S'touch {marker}'\ntR.".encode()
    real = _get(s3_server, "e2e/tr/tune/tuner.pkl")
    s3_server.client.put_object(Bucket=s3_server.bucket, Key="e2e/tr/tune/tuner.pkl", Body=evil)
    forged = subprocess.run(TRAIN, env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    said = " ".join((forged.stdout + forged.stderr).split())  # the paragraph is wrapped to the terminal
    assert forged.returncode == 2 and "tuner.pkl is not a version rayrl sealed" in said, (
        forged.stdout[-3000:] + forged.stderr[-3000:]
    )
    assert not marker.exists() and "took over a stale lock" in said
    s3_server.client.put_object(Bucket=s3_server.bucket, Key="e2e/tr/tune/tuner.pkl", Body=real)
    wipe()
    more = _run(TRAIN, env)
    # The checkpoint came from the bucket: its bytes were downloaded (no local copy was left to read).
    listed = s3_server.client.list_objects_v2(Bucket=s3_server.bucket, Prefix="e2e/tr/tune/").get("Contents", [])
    downloads = [o["Key"] for o in listed if o["Key"].rsplit("/", 1)[-1].startswith(ck.DOWNLOAD_PREFIX)]
    assert downloads, "the resume read no checkpoint from the bucket:\n" + more.stdout[-4000:]
    assert json.loads(_get(s3_server, downloads[0]))["downloaded_bytes"] > 10_000
    assert "resuming from the bucket" in more.stdout  # (the refused start above took over the killed run's lock)
    first = int(re.search(r"iter (\d+)", more.stdout).group(1))
    assert 1 < first <= killed_at + 1  # the counters go on from the checkpoint in the bucket
    train_summary = json.loads(get("tr/summary.json"))
    assert train_summary["status"] == "finished" and train_summary["env_steps"] >= TRAIN_ENV_STEPS
    assert int(pd.read_csv(io.BytesIO(get("tr/history.csv")))[keys.ITERATION].max()) == train_summary["iterations"]

    wipe()
    report = subprocess.run(
        [sys.executable, "-m", "rayrl.cli", "report", "s3://rayrl/e2e/sw"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert report.returncode == 0, report.stdout[-2000:] + report.stderr[-2000:]
    assert "s3://rayrl/e2e/sw/report.md" in report.stdout
    assert get("sw/report.md").startswith(b"#")
