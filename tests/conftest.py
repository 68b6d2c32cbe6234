"""Shared fixtures: one local Ray for the in-process tests, small and shut down at the end."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
RAY = str(Path(sys.executable).parent / "ray")

# Tests start local Rays without a dashboard (2 cores are scarce); token auth stays as Ray sets it.
os.environ.setdefault("RAYRL_DASHBOARD", "0")


@pytest.fixture(scope="session", autouse=True)
def storage_key(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path | None]:
    """One checkpoint signing key for the whole session (rayrl.security.signing), as a cluster has one:
    without it the key is the Ray token in ~/.ray/auth_token, which tests that give a run a fresh HOME
    (a machine with no local copy) would lose with the rest of that machine."""
    if os.environ.get("RAYRL_STORAGE_KEY_FILE"):
        yield None
        return
    key = tmp_path_factory.mktemp("signing") / "storage.key"
    key.write_bytes(os.urandom(32).hex().encode())
    key.chmod(0o600)
    os.environ["RAYRL_STORAGE_KEY_FILE"] = str(key)
    yield key
    os.environ.pop("RAYRL_STORAGE_KEY_FILE", None)


@pytest.fixture(scope="module")
def ray_local():
    """A local Ray with 2 CPUs shared by the in-process tests of one module.

    Module scope, not session: some modules start a Ray of their own (metrics export port,
    multi-node clusters), which needs no other Ray in this process.
    """
    import ray

    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def subprocess_env(**extra: str) -> dict:
    """Environment for scripts run by tests: the repo importable, no dashboard, quiet workers."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("RAYRL_DASHBOARD", "0")
    env.pop("RAY_ADDRESS", None)
    env.update(extra)
    return env


def kill_session(session: int, timeout: float = 60) -> None:
    """SIGKILL every process of a session a test started (``start_new_session=True``) and wait until
    none is left: Ray puts its workers in process groups of their own, so ``killpg`` on the driver's
    group leaves them running for seconds, writing files a test has just wiped."""
    deadline = time.monotonic() + timeout
    while True:
        left = []
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            with contextlib.suppress(OSError):
                if os.getsid(int(name)) == session:
                    left.append(int(name))
                    os.kill(int(name), signal.SIGKILL)
        if not left:
            return
        assert time.monotonic() < deadline, f"processes {left} of session {session} outlived SIGKILL"
        time.sleep(0.2)


_HANDED_OUT: set[int] = set()


def _ephemeral_low() -> int:
    with contextlib.suppress(OSError, ValueError):
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    return 32768


def free_port() -> int:
    """A TCP port nobody listens on now, below the kernel's ephemeral range and above Ray's worker ports.

    Not from bind(0): that hands out an ephemeral port, and between our release and Ray's bind any
    outgoing connection (Ray's own gRPC clients open dozens while a head starts) may take it as its
    local port. Held by another socket, the metrics export or the dashboard agent's gRPC port ends the
    whole head about 38 s after its dashboard came up (measured): how a CI run most likely lost
    test_security's head mid-test. Ray's workers use 10002-19999 by default.
    """
    low, high = 20000, _ephemeral_low() - 1
    for _ in range(1000):
        port = random.randint(low, high)
        if port in _HANDED_OUT:
            continue
        with socket.socket() as s, contextlib.suppress(OSError):
            s.bind(("127.0.0.1", port))
            _HANDED_OUT.add(port)  # never twice to one test session: the first taker may not have bound yet
            return port
    raise RuntimeError(f"no free TCP port in {low}-{high}")


def head_port_flags() -> list[str]:
    """`ray start --head` flags that move every fixed default port to a free one.

    Ray's defaults (job agent 52365, client server 10001, ...) collide with any other Ray on the
    machine; a head whose job agent cannot bind answers "No available agent to submit job" forever.
    """
    return [
        f"--dashboard-agent-listen-port={free_port()}",
        f"--dashboard-agent-grpc-port={free_port()}",
        f"--node-manager-port={free_port()}",
        f"--object-manager-port={free_port()}",
        f"--ray-client-server-port={free_port()}",
        f"--runtime-env-agent-port={free_port()}",
        f"--metrics-export-port={free_port()}",
    ]


def head_log_tails(temp_dir: Path, lines: int = 15) -> str:
    """The last lines of a head's own logs, for a failure message: why a head went away mid-test."""
    logs = temp_dir / "session_latest" / "logs"
    names = ("raylet.out", "raylet.err", "gcs_server.out", "dashboard.log", "dashboard_agent.log")
    parts = []
    for name in names:
        path = logs / name
        if path.exists():
            parts.append(f"--- {name}\n" + "\n".join(path.read_text(errors="replace").splitlines()[-lines:]))
    return "\n".join(parts) or f"(no logs under {logs})"


@contextlib.contextmanager
def ray_head(env: dict, num_cpus: int, tag: str, block: bool = True) -> Iterator[SimpleNamespace]:
    """`ray start --head --block` in its own process group, every port free, the dashboard on localhost.

    Yields its gcs address, dashboard URL and temp dir; at the end the group is killed and the temp
    dir removed (never `ray stop`: it would end every Ray on the machine).

    ``block=False`` starts the head without `--block` and waits for `ray start` to return (its exit
    status in ``process.returncode``); the head's processes stay in its process group, killed the
    same way. Needed to kill one of them: under `--block` Ray ends the whole head once any of its
    processes dies.
    """
    gcs, dash = free_port(), free_port()
    temp_dir = Path("/tmp") / f"rayrl-{tag}-{os.getpid()}"  # short: Ray's socket paths have a length limit
    head = subprocess.Popen(
        [
            RAY,
            "start",
            "--head",
            *(["--block"] if block else []),
            f"--num-cpus={num_cpus}",
            f"--port={gcs}",
            f"--dashboard-port={dash}",
            "--dashboard-host=127.0.0.1",
            "--include-dashboard=true",
            *head_port_flags(),
            f"--temp-dir={temp_dir}",
        ],
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        if not block:
            head.wait(timeout=300)
        yield SimpleNamespace(
            process=head, gcs=f"127.0.0.1:{gcs}", dashboard=f"http://127.0.0.1:{dash}", temp_dir=temp_dir
        )
    finally:
        with contextlib.suppress(ProcessLookupError):  # without --block the group may be empty already
            os.killpg(head.pid, signal.SIGKILL)
        head.wait()
        shutil.rmtree(temp_dir, ignore_errors=True)


def wait_for_jobs_api(dashboard: str, env: dict, what: str, timeout: float = 120) -> None:
    """Until `ray job list` answers at ``dashboard``: the Jobs API comes up after `ray start` returns."""
    deadline = time.monotonic() + timeout
    while (
        subprocess.run(
            [RAY, "job", "list", "--address", dashboard], env=env, capture_output=True, timeout=60
        ).returncode
        != 0
    ):
        if time.monotonic() > deadline:
            pytest.fail(f"{what}'s Jobs API did not come up within {timeout:.0f} s")
        time.sleep(2)


def submit_job(
    command: list[str], env: dict, timeout: float, cwd: Path | None = None, tries: int = 30
) -> subprocess.CompletedProcess:
    """`ray job submit ...`, retried while the Jobs API answers but the node's job agent is not up yet."""
    for _ in range(tries):
        proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout, cwd=cwd)
        if "No available agent" not in proc.stdout + proc.stderr:
            break
        time.sleep(2)
    return proc


@contextlib.contextmanager
def moto(extra_env: dict | None = None) -> Iterator[int]:
    """moto's S3-compatible server on 127.0.0.1 (own process group, ended by pid); yields its port.

    ``extra_env`` reaches the server, e.g. ``INITIAL_NO_AUTH_ACTION_COUNT=0`` turns its
    authentication on (then it refuses unknown keys as AWS does).
    """
    # This interpreter's moto first: a moto_server on PATH may be another Python's (a pyenv shim runs
    # the system Python's older moto, which fails pyarrow's multipart uploads with INTERNAL_FAILURE).
    own = Path(sys.executable).parent / "moto_server"
    server = str(own) if own.exists() else shutil.which("moto_server") or str(own)
    port = free_port()
    proc = subprocess.Popen(
        [server, "-H", "127.0.0.1", "-p", str(port)],
        env={**os.environ, **(extra_env or {})},
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    pytest.fail(f"moto_server did not listen on {port} within 60 s")
                time.sleep(0.2)
        yield port
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def moto_fs(port: int, **extra: Any) -> Any:
    """pyarrow's S3 filesystem on moto's server at ``port`` (fake credentials, buckets creatable)."""
    import pyarrow.fs as pafs

    options = dict(region="us-east-1", allow_bucket_creation=True) | extra
    return pafs.S3FileSystem(
        access_key="testing", secret_key="testing", endpoint_override=f"127.0.0.1:{port}", scheme="http", **options
    )


@pytest.fixture(scope="module")
def s3_server() -> Iterator[SimpleNamespace]:
    """moto's server (see ``moto``) with bucket 'rayrl'.

    ``env`` holds what a client needs: fake credentials and AWS_ENDPOINT_URL, the usual setting an
    S3-compatible store (MinIO, Ceph) is given by.
    """
    boto3 = pytest.importorskip("boto3")
    with moto() as port:
        endpoint = f"http://127.0.0.1:{port}"
        env = {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_EC2_METADATA_DISABLED": "true",
        }
        client = boto3.client(
            "s3",
            endpoint_url=endpoint,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
        )
        client.create_bucket(Bucket="rayrl")
        yield SimpleNamespace(endpoint=endpoint, env=env, client=client, bucket="rayrl")


@contextlib.contextmanager
def small_disk(path: Path, size: str) -> Iterator[bool]:
    """A tmpfs of ``size`` mounted at ``path`` (yields True), or nothing when this user may not mount
    (yields False; the caller then injects ENOSPC at the write call site instead)."""
    path.mkdir(parents=True, exist_ok=True)
    mounted = (
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True
        ).returncode
        == 0
    )
    try:
        yield mounted
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(path)], capture_output=True)
