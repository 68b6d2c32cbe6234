"""Multi-host on one machine: a head and a worker node in two network namespaces, the worker's link cut.

Two network namespaces joined by a veth pair stand in for two hosts: a Ray head (1 CPU) in the
first, a Ray worker node (1 CPU) in the second, each `ray start --block` in its own process group,
token authentication on (RAY_AUTH_MODE=token and one token file in RAY_AUTH_TOKEN_PATH for the head,
the worker and the drivers). The smoke sweep runs as a driver in the head's namespace with RAY_ADDRESS set; each
trial holds 1 CPU (resources.env_runners=0), so the two phase-2 trials run one per node. Once the
trial on the worker has a checkpoint and a few iterations, the worker's end of the veth is set
down mid-trial. The test then asserts the sweep still exits 0 with its run-folder contract, that
the worker node was alive before the cut and dead after it (`ray.nodes()`, polled by a second
driver in the head's namespace), and that the worker's trial was retried on the head from its
checkpoint and trained on. It prints the measured figures on "[multihost]" lines.

Needs root (CAP_NET_ADMIN) for `ip netns`; skips with the failing command's stderr otherwise.
Cleanup kills only the process groups it started and deletes only its namespaces (which takes the
veth pair with them); never `ray stop`, which would end every Ray on the machine.
"""

from __future__ import annotations

import csv
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from conftest import RAY, ROOT, free_port, head_port_flags, subprocess_env

from rayrl.observe import keys

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

SWEEP_S_MAX = 420  # the sweep itself (about 90 s, 65 s of it waiting for Ray to see the node gone)
CUT_AT_ITERATION = 3  # the worker's trial has its first checkpoint (checkpoint.every=2) and one more result
TARGET = yaml.safe_load((ROOT / "experiments/configs/cartpole_ppo.yaml").read_text())["stop"]["episode_return"]
BUDGET = 40 * 512  # env steps per phase-2 trial: 40 iterations, 10-60 s a trial here, a window to cut in
SWEEP_SET = [
    "search.doubling.start=512",
    "search.doubling.cap=512",
    "search.doubling.warmup_iters=0",
    "search.doubling.measure_iters=1",
    "search.num_samples=2",
    f"search.max_env_steps={BUDGET}",
    f"search.grace_env_steps={BUDGET}",
    "search.min_batch=512",
    "search.confirm_top_k=0",
    "resources.env_runners=0",
    "checkpoint.every=2",
]

WATCH = """
import json, os, sys, time
import ray
ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=False)
while True:
    nodes = [{"ip": n["NodeManagerAddress"], "alive": bool(n["Alive"]), "id": n["NodeID"]} for n in ray.nodes()]
    print(json.dumps({"t": time.time(), "nodes": nodes}), flush=True)
    time.sleep(0.5)
"""

WAIT_PORT = """
import socket, sys, time
deadline = time.monotonic() + float(sys.argv[3])
while True:
    try:
        socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=1).close()
        break
    except OSError:
        if time.monotonic() > deadline:
            sys.exit(f"nothing listens on {sys.argv[1]}:{sys.argv[2]}")
        time.sleep(0.3)
"""


def figure(config: pytest.Config, text: str) -> None:
    """Print a measured figure to the terminal even while pytest captures output."""
    capman = config.pluginmanager.getplugin("capturemanager")
    if capman is None:
        print(f"[multihost] {text}", flush=True)
        return
    with capman.global_and_fixture_disabled():
        print(f"\n[multihost] {text}", flush=True)


def ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)


@pytest.fixture
def netns_pair() -> Iterator[SimpleNamespace]:
    """Two namespaces (head, worker) joined by a veth pair with private addresses, lo up in both."""
    if shutil.which("ip") is None:
        pytest.skip("the `ip` command (iproute2) is not installed")
    pid = os.getpid()
    net = f"10.213.{pid % 250 + 1}"
    ns = SimpleNamespace(
        head=f"rayrl-h-{pid}",
        worker=f"rayrl-w-{pid}",
        head_veth=f"rrh{pid}",
        worker_veth=f"rrw{pid}",
        head_ip=f"{net}.1",
        worker_ip=f"{net}.2",
    )
    created: list[str] = []
    steps = [
        (["netns", "add", ns.head], ns.head),
        (["netns", "add", ns.worker], ns.worker),
        (["link", "add", ns.head_veth, "type", "veth", "peer", "name", ns.worker_veth], None),
        (["link", "set", ns.head_veth, "netns", ns.head], None),
        (["link", "set", ns.worker_veth, "netns", ns.worker], None),
        (["-n", ns.head, "addr", "add", f"{ns.head_ip}/24", "dev", ns.head_veth], None),
        (["-n", ns.worker, "addr", "add", f"{ns.worker_ip}/24", "dev", ns.worker_veth], None),
        (["-n", ns.head, "link", "set", "lo", "up"], None),
        (["-n", ns.worker, "link", "set", "lo", "up"], None),
        (["-n", ns.head, "link", "set", ns.head_veth, "up"], None),
        (["-n", ns.worker, "link", "set", ns.worker_veth, "up"], None),
    ]
    try:
        for args, name in steps:
            proc = ip(*args)
            if proc.returncode != 0:
                pytest.skip(
                    f"cannot build the two-host network: `ip {' '.join(args)}` exited {proc.returncode}: "
                    f"{proc.stderr.strip()} (needs root / CAP_NET_ADMIN)"
                )
            if name:
                created.append(name)
        yield ns
    finally:
        for name in created:  # a namespace takes its end of the veth with it, and a veth its peer
            ip("netns", "del", name)
        if ip("link", "show", ns.head_veth).returncode == 0:  # created but never moved into a namespace
            ip("link", "del", ns.head_veth)


def in_ns(ns: str, cmd: list[str], env: dict, log: Path) -> subprocess.Popen:
    """``cmd`` inside namespace ``ns``, in its own process group, output to ``log``."""
    with open(log, "wb") as out:
        return subprocess.Popen(
            ["ip", "netns", "exec", ns, *cmd],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=ROOT,
        )


def end(proc: subprocess.Popen) -> None:
    """Kill the process group this test started (and nothing else)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def watch_lines(log: Path) -> list[dict]:
    out = []
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith('{"t"'):
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:  # the line being written
                pass
    return out


def alive(entry: dict, node_ip: str) -> bool | None:
    states = [n["alive"] for n in entry["nodes"] if n["ip"] == node_ip]
    return any(states) if states else None


def results(trial_dir: Path) -> list[dict]:
    """Tune's result.json of one trial, the lines written so far."""
    path = trial_dir / "result.json"
    if not path.exists():
        return []
    out = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:  # the line being written
            pass
    return out


def tail(log: Path, n: int = 6000) -> str:
    return log.read_text(errors="replace")[-n:] if log.exists() else f"({log} missing)"


def test_sweep_survives_a_worker_host_losing_its_network(
    netns_pair: SimpleNamespace, tmp_path: Path, pytestconfig: pytest.Config
) -> None:
    ns = netns_pair
    token = tmp_path / "auth_token"
    token.write_text(secrets.token_hex(32))
    token.chmod(0o600)
    env = subprocess_env(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token))
    env.pop("RAY_AUTH_TOKEN", None)
    py = sys.executable
    gcs_port = free_port()
    address = f"{ns.head_ip}:{gcs_port}"
    head_tmp = Path("/tmp") / f"rayrl-mhh-{os.getpid()}"  # short: Ray's socket paths have a length limit
    worker_tmp = Path("/tmp") / f"rayrl-mhw-{os.getpid()}"
    storage = tmp_path / "runs"
    run_dir = storage / "mh"
    logs = {k: tmp_path / f"{k}.log" for k in ("head", "worker", "watch", "sweep")}
    procs: list[subprocess.Popen] = []
    try:
        procs.append(
            in_ns(
                ns.head,
                [
                    RAY,
                    "start",
                    "--head",
                    "--block",
                    f"--node-ip-address={ns.head_ip}",
                    f"--port={gcs_port}",
                    "--num-cpus=1",
                    "--include-dashboard=false",
                    *head_port_flags(),
                    f"--temp-dir={head_tmp}",
                ],
                env,
                logs["head"],
            )
        )
        wait = subprocess.run(
            ["ip", "netns", "exec", ns.head, py, "-c", WAIT_PORT, ns.head_ip, str(gcs_port), "90"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert wait.returncode == 0, wait.stderr + tail(logs["head"])
        worker_flags = [f for f in head_port_flags() if not f.startswith("--ray-client-server-port")]
        procs.append(
            in_ns(
                ns.worker,
                [
                    RAY,
                    "start",
                    "--block",
                    f"--address={address}",
                    f"--node-ip-address={ns.worker_ip}",
                    "--num-cpus=1",
                    *worker_flags,
                    f"--temp-dir={worker_tmp}",
                ],
                env,
                logs["worker"],
            )
        )
        driver_env = {**env, "RAY_ADDRESS": address}
        procs.append(in_ns(ns.head, [py, "-c", WATCH], driver_env, logs["watch"]))
        deadline = time.monotonic() + 120
        while not any(alive(e, ns.head_ip) and alive(e, ns.worker_ip) for e in watch_lines(logs["watch"])):
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs), (
                "the two nodes did not join within 120 s\n--- head\n"
                + tail(logs["head"])
                + "\n--- worker\n"
                + tail(logs["worker"])
                + "\n--- watcher\n"
                + tail(logs["watch"])
            )
            time.sleep(1)

        start = time.monotonic()
        sweep = in_ns(
            ns.head,
            [
                py,
                str(ROOT / "experiments" / "sweep.py"),
                "--smoke",
                "--storage",
                str(storage),
                "--name",
                "mh",
                *[a for kv in SWEEP_SET for a in ("--set", kv)],
            ],
            driver_env,
            logs["sweep"],
        )
        procs.append(sweep)
        cut = None
        while sweep.poll() is None and time.monotonic() - start < SWEEP_S_MAX:
            if cut is None:
                for trial in sorted((run_dir / "phase2").glob("PPO_*")):
                    on_worker = [r for r in results(trial) if r.get("node_ip") == ns.worker_ip]
                    if (
                        on_worker
                        and on_worker[-1]["training_iteration"] >= CUT_AT_ITERATION
                        and any(trial.glob("checkpoint_*"))
                    ):
                        down = ip("-n", ns.worker, "link", "set", ns.worker_veth, "down")
                        assert down.returncode == 0, down.stderr
                        cut = SimpleNamespace(
                            t=time.time(),
                            trial=trial,
                            iteration=on_worker[-1]["training_iteration"],
                            after_s=time.monotonic() - start,
                        )
                        break
            time.sleep(0.2)
        if sweep.poll() is None:
            pytest.fail(f"the sweep did not finish within {SWEEP_S_MAX} s\n" + tail(logs["sweep"]))
        wall = time.monotonic() - start
        time.sleep(1.5)  # the watcher's last samples
        watched = watch_lines(logs["watch"])
    finally:
        for proc in reversed(procs):
            end(proc)
        for path in (head_tmp, worker_tmp):
            shutil.rmtree(path, ignore_errors=True)

    out = tail(logs["sweep"], 20000)
    assert sweep.returncode == 0, out
    assert cut is not None, "no phase-2 trial ever ran on the worker node, so the link was never cut\n" + out

    # the run-folder contract
    with open(run_dir / "doubling.csv") as f:
        assert [r["batch_size"] for r in csv.DictReader(f)] == ["512"]
    with open(run_dir / "trials.csv") as f:
        trials = list(csv.DictReader(f))
    assert len(trials) == 2 and all(t["status"] in ("completed", "reached_target") for t in trials), trials
    best = yaml.safe_load((run_dir / "best_config.yaml").read_text())
    assert best["algo"]["train_batch_per_learner"] == 512
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["kind"] == "sweep" and summary["trials"] == 2

    # the worker held work when the link went down, and Ray saw it die
    before = [e for e in watched if e["t"] < cut.t]
    after = [e for e in watched if e["t"] >= cut.t]
    assert before and alive(before[-1], ns.worker_ip) is True, before[-1:]
    dead = [e for e in after if alive(e, ns.worker_ip) is False]
    assert dead, f"the worker node never showed as dead after the cut: {after[-1:]}"
    assert alive(watched[-1], ns.head_ip) is True
    detect_s = dead[0]["t"] - cut.t

    # Tune saw the trial's actor die with its node ...
    log = logs["sweep"].read_text(errors="replace")
    assert "ActorDiedError" in log and f"ip: {ns.worker_ip}" in log, out

    # ... and retried the trial on the head from its checkpoint and finished its budget there
    rows = results(cut.trial)
    moved = [r for r in rows if r.get("node_ip") == ns.head_ip and r["timestamp"] >= int(cut.t)]
    assert moved, f"{cut.trial.name} never trained on the head after the cut"
    reached = max(r["training_iteration"] for r in rows if r.get("node_ip") == ns.worker_ip)  # before the cut
    assert rows[0]["node_ip"] == ns.worker_ip and reached >= cut.iteration
    first = moved[0]["training_iteration"]
    assert 1 < first <= reached + 1, (first, reached)  # from a checkpoint, not from zero
    # it finished there: its whole budget (search.max_env_steps), or the target return, whichever came first
    status = {t["trial_id"]: t["status"] for t in trials}[moved[-1]["trial_id"]]
    if status == "reached_target":
        assert keys.lookup(moved[-1], keys.TRAIN_RETURN) >= TARGET, moved[-1]
    else:
        assert status == "completed" and keys.lookup(moved[-1], keys.ENV_STEPS) >= BUDGET, (status, moved[-1])
    back_s = moved[0]["timestamp"] - cut.t

    figure(
        pytestconfig,
        f"worker link cut {cut.after_s:.0f}s into the sweep, {cut.trial.name} on the worker at "
        f"iteration {reached}; Ray marked the worker node dead {detect_s:.1f}s later; the trial trained again on "
        f"the head {back_s:.0f}s after the cut, from iteration {first}, {len(moved)} iterations after the cut; "
        f"sweep wall {wall:.0f}s (summary.json {summary['wall_s']}s)",
    )
