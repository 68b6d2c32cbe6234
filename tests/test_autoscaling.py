"""Autoscaling with gpu.yaml's node types, on one machine: nodes come when learners need them,
the sweep finishes on them, and they go once idle.

Ray's fake_multinode provider starts "worker nodes" as extra raylets on this machine. Their types
are derived from cluster_configs/gpu.yaml (tests/fake_multinode.py): same names and
labels, one CPU each, the GPUs replaced by the custom resource `rayrl_fake_gpu` so no CUDA is
needed. A smoke sweep is submitted with `ray job submit` whose learners ask for that resource
(resources.custom_per_learner; learners=1, because with learners=0 RLlib's placement group does
not request custom_resources_per_learner; stop.episode_return=30 ends phase-2 trials early so the
test stays near 3 minutes on 2 cores). Token authentication is on, the token read from a file.

The head runs in its own process group with its own temp dir and free ports (fake nodes join it
through provider.gcs_address, so it need not hold 6379, which another Ray on this machine may use);
teardown kills that group and then any process still carrying this test's marker in its environment.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from conftest import RAY, ROOT, free_port, head_port_flags
from fake_multinode import fake_multinode_config

STAND_IN = "rayrl_fake_gpu"
IDLE_TIMEOUT_MIN = 0.25
MARKER = "RAYRL_AUTOSCALING_TEST"

pytestmark = pytest.mark.slow


# Runs beside the test (never inside pytest, whose Ray state it would change): one JSON line per
# second with the cluster's alive nodes.
WATCHER = """
import json, sys, time, ray
while True:
    try:
        ray.init(address=sys.argv[1], log_to_driver=False)
        break
    except Exception:
        time.sleep(1)
with open(sys.argv[2], "a") as out:
    while True:
        nodes = [{"id": n["NodeID"], "labels": n.get("Labels") or {}, "resources": n["Resources"]}
                 for n in ray.nodes() if n["Alive"]]
        out.write(json.dumps(nodes) + "\\n")
        out.flush()
        time.sleep(1)
"""


@dataclass
class FakeCluster:
    gcs_address: str
    dashboard_url: str
    env: dict
    temp_dir: Path
    head: subprocess.Popen
    nodes_file: Path

    def nodes(self) -> list[dict] | None:
        """The alive nodes at the watcher's last look; None before its first."""
        lines = self.nodes_file.read_text().splitlines() if self.nodes_file.exists() else []
        for line in reversed(lines[-2:]):  # the last line may be half written
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
        return None

    def worker_nodes(self) -> list[dict]:
        """Alive nodes that the autoscaler added (they carry the GPU stand-in)."""
        return [n for n in self.nodes() or [] if n["resources"].get(STAND_IN)]


def _wait(what: str, done: Callable[[], object], timeout: float, head: subprocess.Popen | None = None) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = done()
        if value:
            return value
        if head is not None and head.poll() is not None:
            raise AssertionError(f"the head exited ({head.returncode}) while waiting for {what}")
        time.sleep(1)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def _marked_pids(marker: str) -> list[int]:
    """Processes whose environment carries this test's marker (ours, whatever their group)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if f"{MARKER}={marker}".encode() in (entry / "environ").read_bytes().split(b"\0"):
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def _stop(head: subprocess.Popen, marker: str) -> list[int]:
    """SIGTERM the head's process group, then SIGKILL it and any marked survivor; returns survivors."""
    for sig, grace in ((signal.SIGTERM, 5), (signal.SIGKILL, 5)):
        try:
            os.killpg(head.pid, sig)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and (head.poll() is None or _marked_pids(marker)):
            time.sleep(0.5)
        if head.poll() is not None and not _marked_pids(marker):
            return []
    survivors = _marked_pids(marker)
    for pid in survivors:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return survivors


@pytest.fixture
def fake_cluster() -> Iterator[FakeCluster]:
    from ray._private.services import get_node_ip_address

    temp_dir = Path(tempfile.mkdtemp(prefix="rayrl-as-", dir="/tmp"))  # short: Ray's socket paths
    marker = uuid.uuid4().hex
    token = temp_dir / "auth_token"
    token.write_text(secrets.token_hex(32))
    token.chmod(0o600)
    ip = get_node_ip_address()
    gcs_port, dash_port = free_port(), free_port()
    launcher = yaml.safe_load((ROOT / "cluster_configs" / "gpu.yaml").read_text())
    config = fake_multinode_config(
        launcher,
        gpu_stand_in=STAND_IN,
        max_workers_per_type=1,
        idle_timeout_minutes=IDLE_TIMEOUT_MIN,
        head_cpus=1,
        gcs_address=f"{ip}:{gcs_port}",
    )
    (temp_dir / "autoscaling.yaml").write_text(json.dumps(config))
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(
        {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token), "RAY_USAGE_STATS_ENABLED": "0", MARKER: marker}
    )
    log = (temp_dir / "head.log").open("w")
    head = subprocess.Popen(
        [
            RAY,
            "start",
            "--head",
            "--block",
            f"--port={gcs_port}",
            f"--dashboard-port={dash_port}",
            *head_port_flags(),
            "--num-cpus=1",
            "--num-gpus=0",
            f"--temp-dir={temp_dir}",
            "--object-store-memory=200000000",
            f"--autoscaling-config={temp_dir / 'autoscaling.yaml'}",
            "--disable-usage-stats",
        ],
        env={**env, "RAY_FAKE_CLUSTER": "1", "AUTOSCALER_UPDATE_INTERVAL_S": "1"},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    fc = FakeCluster(f"{ip}:{gcs_port}", f"http://127.0.0.1:{dash_port}", env, temp_dir, head, temp_dir / "nodes.jsonl")
    watcher = None
    try:
        watcher = subprocess.Popen(
            [sys.executable, "-c", WATCHER, fc.gcs_address, str(fc.nodes_file)],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        _wait("the head to accept a driver", lambda: fc.nodes() is not None, 120, head)
        yield fc
    finally:
        if watcher is not None:
            watcher.kill()
            watcher.wait()
        survivors = _stop(head, marker)
        log.close()
        head_log = (temp_dir / "head.log").read_text(errors="replace")[-3000:]
        shutil.rmtree(temp_dir, ignore_errors=True)
        assert not survivors, f"processes {survivors} outlived the head's process group; head log:\n{head_log}"


@pytest.mark.timeout(480)
def test_sweep_scales_gpu_workers_up_and_idle_workers_down(fake_cluster: FakeCluster, tmp_path: Path) -> None:
    fc = fake_cluster
    assert fc.worker_nodes() == [], "the cluster starts with the head only (min_workers: 0)"
    job_log = tmp_path / "job.log"
    sweep = [
        sys.executable,
        str(ROOT / "experiments" / "sweep.py"),
        "--smoke",
        "--name",
        "autoscale",
        "--storage",
        str(tmp_path / "runs"),
        "--set",
        "resources.learners=1",
        "--set",
        f"resources.custom_per_learner={{{STAND_IN}: 1}}",
        "--set",
        "stop.episode_return=30",
        # one rung, two short trials, no confirmation: this test is about nodes coming and going
        "--set",
        "search.doubling.cap=512",
        "--set",
        "search.min_batch=512",
        "--set",
        "search.num_samples=2",
        "--set",
        "search.max_env_steps=2048",
        "--set",
        "search.grace_env_steps=1024",
        "--set",
        "search.confirm_top_k=0",
    ]
    with job_log.open("w") as out:
        # No --working-dir here (a real cluster takes `--working-dir .`): fake nodes share this machine's
        # session folder, and a fake node's runtime-env agent deletes the unpacked working dir when its
        # own workers stop, under the driver's feet. The checkout is installed in this venv anyway.
        job = subprocess.Popen(
            [RAY, "job", "submit", f"--address={fc.dashboard_url}", "--", *sweep],
            cwd=ROOT,
            env=fc.env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        seen: set[str] = set()

        def scaled_up() -> bool:
            seen.update(n["id"] for n in fc.worker_nodes())
            return bool(seen) or job.poll() is not None

        _wait("the autoscaler to add a GPU worker node", scaled_up, 120, fc.head)
        assert seen, f"the job ended before any worker node joined:\n{job_log.read_text()[-4000:]}"
        assert all(n["labels"].get("rayrl.io/role") == "learner" for n in fc.worker_nodes())

        def job_done() -> bool:
            seen.update(n["id"] for n in fc.worker_nodes())
            return job.poll() is not None

        _wait("the smoke sweep to finish", job_done, 300, fc.head)
        output = job_log.read_text()
        assert job.returncode == 0, f"the sweep job failed:\n{output[-6000:]}"
        assert "[sweep] done" in output
        run = tmp_path / "runs" / "autoscale"
        summary = json.loads((run / "summary.json").read_text())
        assert summary["best"] is not None and summary["trials"] >= 1
        assert (run / "doubling.csv").exists() and (run / "trials.csv").exists()

        _wait("idle worker nodes to be removed", lambda: not fc.worker_nodes(), 120, fc.head)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
