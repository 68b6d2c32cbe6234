"""Head fault tolerance, live: a `rayrl train` job keeps training across a restart of its head's GCS.

The head runs with GCS fault tolerance on a local Redis (Ray's way for `ray start`: RAY_REDIS_ADDRESS
and RAY_external_storage_namespace). The test SIGKILLs the head's gcs_server, leaves it down for a
while, starts it again with its own command line and environment (what Ray's
test_gcs_fault_tolerance.py does with Node.kill_gcs_server / Node.start_gcs_server), and checks that
the job's training goes on and the job succeeds, with every iteration in history.csv once and the run
folder whole. (KubeRay restarts the whole head pod, raylet included, which on one machine would also
end the driver's node; the GCS alone is what this test can restart and still watch the job.)

The head is started without `--block`: under `--block`, `ray start` kills every process of the head
as soon as one of them (here the GCS) exits, so there is nothing left to recover.

Measured (2-core shared machine): see docs/reliability.md, "Head (GCS) fault tolerance".
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import yaml
from conftest import RAY, ROOT, free_port, ray_head, submit_job, subprocess_env, wait_for_jobs_api

CONFIG = ROOT / "experiments" / "configs" / "cartpole_ppo.yaml"
DOWN_S = 15  # how long the GCS stays down: well under Ray's 60 s reconnect timeout (raylet, workers)
TRAIN = [
    "--set",
    "algo.train_batch_per_learner=512",
    "--set",
    "algo.minibatch_size=128",
    "--set",
    "algo.epochs=1",
    "--set",
    "env.envs_per_runner=4",
    "--set",
    "stop.episode_return=null",
    "--set",
    "stop.wall_s=null",
    "--set",
    # 300 iterations (about 25 s at batch 512): still training when the GCS comes back, even if
    # training runs on through the whole outage (the driver notices it at Tune's next state refresh)
    "stop.env_steps=153600",
    "--set",
    "checkpoint.every=5",
    "--set",
    "checkpoint.keep=3",
]


def _redis_call(port: int, *args: str):
    """One Redis command over RESP (no client library needed); returns the decoded reply."""
    request = f"*{len(args)}\r\n" + "".join(f"${len(a.encode())}\r\n{a}\r\n" for a in args)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock, sock.makefile("rb") as reply:
        sock.sendall(request.encode())
        return _resp(reply)


def _resp(reply):
    line = reply.readline().rstrip(b"\r\n")
    kind, rest = line[:1], line[1:]
    if kind == b"*":
        return [_resp(reply) for _ in range(int(rest))]
    if kind == b"$":
        return None if int(rest) < 0 else reply.read(int(rest) + 2)[:-2].decode(errors="replace")
    if kind == b":":
        return int(rest)
    if kind == b"-":
        raise RuntimeError(rest.decode(errors="replace"))
    return rest.decode()


@contextlib.contextmanager
def _redis(tmp_path: Path) -> Iterator[int]:
    """redis-server on 127.0.0.1 (no persistence), in its own process group; yields its port."""
    server = shutil.which("redis-server")
    if not server:
        pytest.skip(
            "redis-server is not installed (apt-get install redis-server); "
            "the GCS fault-tolerance test needs a Redis to keep the GCS's state"
        )
    port = free_port()
    proc = subprocess.Popen(
        [
            server,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(tmp_path),
        ],
        cwd=tmp_path,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if _redis_call(port, "PING") == "PONG":
                    break
            except OSError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                pytest.fail(f"redis-server did not answer on {port} within 30 s")
            time.sleep(0.2)
        yield port
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _alive(proc: psutil.Process) -> bool:
    """Running and not a zombie (the head's processes are not our children: init reaps them, or not)."""
    with contextlib.suppress(psutil.Error):
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    return False


def _in_group(pgid: int, name: str) -> list[psutil.Process]:
    """The live processes called ``name`` in process group ``pgid`` (the head's), nobody else's."""
    found = []
    for proc in psutil.process_iter(["name"]):
        with contextlib.suppress(psutil.Error, ProcessLookupError):
            if proc.info["name"] == name and os.getpgid(proc.pid) == pgid and _alive(proc):
                found.append(proc)
    return found


def _iterations(history: Path) -> list[int]:
    """training_iteration of every complete row of history.csv (a row being appended is skipped)."""
    try:
        with history.open(newline="") as f:
            return [
                int(row["training_iteration"])
                for row in csv.DictReader(f)
                if (row.get("training_iteration") or "").isdigit() and row.get("precision")
            ]
    except FileNotFoundError:
        return []


def _job_status(dashboard: str, job_id: str, env: dict) -> str:
    proc = subprocess.run(
        [RAY, "job", "status", "--address", dashboard, job_id], env=env, capture_output=True, text=True, timeout=60
    )
    said = proc.stdout + proc.stderr
    ended = re.search(r"Job '\w+' (succeeded|failed|stopped)", said)  # how the CLI words a finished job
    running = re.search(r"Status for job '\w+': (\w+)", said)
    return ended.group(1).upper() if ended else running.group(1) if running else "UNKNOWN"


def _restart_gcs(cmdline: list[str], environ: dict, cwd: str) -> subprocess.Popen:
    """Start the GCS again exactly as Ray started it (same flags: port, session, Redis; same environment)."""
    return subprocess.Popen(
        cmdline, env=environ, cwd=cwd, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


def _logs(temp_dir: Path, *names: str) -> str:
    out = []
    for name in names:
        for path in sorted(temp_dir.glob(f"session_2*/logs/{name}")):
            out.append(f"--- {path.name} ---\n" + path.read_text(errors="replace")[-2000:])
    return "\n".join(out)


@pytest.mark.slow
def test_training_goes_on_across_a_gcs_restart_with_redis(tmp_path):
    """SIGKILL the head's GCS while a `rayrl train` job runs, restart it after DOWN_S seconds: the raylet
    and the job survive, training resumes and the job succeeds with every iteration reported once."""
    namespace = f"rayrl-gcsft-{uuid.uuid4().hex[:12]}"
    env = subprocess_env(RAY_AUTH_MODE="token")
    storage = tmp_path / "runs"
    history = storage / "gcsft" / "history.csv"
    with _redis(tmp_path) as redis_port:
        head_env = dict(env, RAY_REDIS_ADDRESS=f"127.0.0.1:{redis_port}", RAY_external_storage_namespace=namespace)
        with ray_head(head_env, num_cpus=2, tag="gcsft", block=False) as head:
            assert head.process.returncode == 0, "ray start --head failed"
            pgid = head.process.pid
            (gcs,), (raylet,) = _in_group(pgid, "gcs_server"), _in_group(pgid, "raylet")
            assert f"--redis_port={redis_port}" in gcs.cmdline(), gcs.cmdline()  # FT is on, on our Redis

            wait_for_jobs_api(head.dashboard, env, "the head")
            submit = [
                RAY,
                "job",
                "submit",
                "--no-wait",
                "--address",
                head.dashboard,
                "--",
                sys.executable,
                "-m",
                "rayrl.cli",
                "train",
                "--config",
                str(CONFIG),
                "--storage",
                str(storage),
                "--name",
                "gcsft",
                *TRAIN,
            ]
            proc = submit_job(submit, env, timeout=120, cwd=ROOT)
            assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
            job_id = re.search(r"raysubmit_\w+", proc.stdout + proc.stderr).group(0)

            deadline = time.monotonic() + 150
            while len(_iterations(history)) < 3:
                if time.monotonic() > deadline:
                    pytest.fail(f"no 3 iterations within 150 s (job {_job_status(head.dashboard, job_id, env)})")
                time.sleep(0.5)

            cmdline, environ, cwd = gcs.cmdline(), gcs.environ(), gcs.cwd()
            at_kill = len(_iterations(history))
            killed = time.monotonic()
            gcs.send_signal(signal.SIGKILL)
            while _alive(gcs):
                assert time.monotonic() < killed + 10, "the GCS outlived SIGKILL by 10 s"
                time.sleep(0.05)
            while time.monotonic() < killed + DOWN_S:
                time.sleep(0.25)
            at_restart = _iterations(history)
            restarted = _restart_gcs(cmdline, environ, cwd)
            down_s = time.monotonic() - killed
            try:
                first_after = None
                deadline = time.monotonic() + 150
                status = "UNKNOWN"
                while time.monotonic() < deadline:
                    if first_after is None and len(_iterations(history)) > len(at_restart):
                        first_after = time.monotonic() - killed - down_s
                    status = _job_status(head.dashboard, job_id, env)
                    if status in ("SUCCEEDED", "FAILED", "STOPPED"):
                        break
                    time.sleep(2)
                done = _iterations(history)
                figures = (
                    f"GCS down {down_s:.1f} s; iterations: {at_kill} at the kill, {len(at_restart)} at the "
                    f"restart, {len(done)} at the end; first new one "
                    + (f"{first_after:.1f} s after the restart" if first_after is not None else "never")
                )
                print(figures)
                alive = _alive(raylet) and restarted.poll() is None
                assert status == "SUCCEEDED", (
                    f"job {status}; {figures}; raylet and new GCS alive: {alive}\n"
                    + _logs(head.temp_dir, "gcs_server.err", "raylet.err")
                    + subprocess.run(
                        [RAY, "job", "logs", "--address", head.dashboard, job_id],
                        env=env,
                        capture_output=True,
                        text=True,
                        timeout=60,
                    ).stdout[-3000:]
                )
                # The outage mattered: the job was still training when the GCS came back, and went on after it.
                assert at_restart and at_restart[-1] < done[-1], figures
                assert first_after is not None, figures
                # The same node and the GCS we started: nothing else restarted the head.
                assert alive, f"the raylet or the restarted GCS died; {figures}"
                assert [p.pid for p in _in_group(pgid, "gcs_server")] == [] and restarted.poll() is None
                # The GCS kept its tables in Redis under this cluster's namespace.
                assert any(namespace in key for key in _redis_call(redis_port, "KEYS", "*")), "nothing in Redis"
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(restarted.pid, signal.SIGKILL)
                restarted.wait()

    # The run folder is whole: every iteration once and in order, the run finished, checkpoints kept.
    assert done == list(range(1, len(done) + 1)), done
    run = storage / "gcsft"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["iterations"] == done[-1], summary
    assert yaml.safe_load((run / "spec.yaml").read_text())["name"] == "cartpole-ppo"
    checkpoints = sorted(p.name for p in (run / "tune").glob("*/checkpoint_*"))
    assert len(checkpoints) == 3, checkpoints  # checkpoint.keep
