"""A live head started the way the shipped launcher configs start it listens, off loopback, only on
the ports the config names, so the security group or firewall can admit exactly those."""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest
import yaml
from conftest import RAY, free_port

ROOT = Path(__file__).resolve().parents[1]
PORT_FLAG = re.compile(r"--([a-z-]*port)=(\d+)")
PORT_ENV = re.compile(r"\b(AUTOSCALER_METRIC_PORT|DASHBOARD_METRIC_PORT)=(\d+)")


def head_command(config: str) -> tuple[str, dict[str, int]]:
    """The `ray start --head ...` part of the config's head start command, and the port variables it exports."""
    data = yaml.safe_load((ROOT / "cluster_configs" / config).read_text())
    text = " ".join(str(c) for c in data["head_start_ray_commands"])
    return text[text.index("ray start --head") :].split(";")[0], {k: int(v) for k, v in PORT_ENV.findall(text)}


def named_ports(command: str) -> tuple[set[int], tuple[int, int]]:
    flags = dict((k, int(v)) for k, v in PORT_FLAG.findall(command))
    span = (flags.pop("min-worker-port"), flags.pop("max-worker-port"))
    return set(flags.values()), span


def _listening(pids: set[int]) -> list[tuple[str, int, int]]:
    out = []
    for conn in psutil.net_connections(kind="inet"):
        if conn.status == psutil.CONN_LISTEN and conn.pid in pids:
            out.append((conn.laddr.ip, conn.laddr.port, conn.pid))
    return out


def _name(pid: int) -> str:
    try:
        return " ".join(psutil.Process(pid).cmdline()[:4])[-120:]
    except psutil.Error:
        return "?"


def _session_pids(session: int) -> set[int]:
    pids = set()
    for proc in psutil.process_iter(["pid"]):
        try:
            if os.getsid(proc.pid) == session:
                pids.add(proc.pid)
        except (ProcessLookupError, PermissionError):
            continue
    return pids


@pytest.mark.slow
def test_a_live_head_started_like_gpu_yaml_listens_only_on_named_ports(tmp_path: Path) -> None:
    """Every port flag of gpu.yaml's head command is moved to a free port (other Rays may run here);
    the head's processes are found by their session and their listening sockets read with psutil."""
    command, port_env = head_command("gpu.yaml")
    assert set(port_env) == {"AUTOSCALER_METRIC_PORT", "DASHBOARD_METRIC_PORT"}
    lo, hi = named_ports(command)[1]
    # the config's worker range, moved as a block to free ports of the same width; the other ports avoid it
    base = free_port()
    while base + (hi - lo) > 65000:
        base = free_port()
    span = range(base, base + hi - lo + 1)
    mapping = {}

    def move(m: re.Match) -> str:
        if m.group(1) in ("min-worker-port", "max-worker-port"):
            return m.group(0)
        port = free_port()
        while port in span:
            port = free_port()
        mapping[int(m.group(2))] = port
        return f"--{m.group(1)}={port}"

    command = PORT_FLAG.sub(move, command).replace("--autoscaling-config=~/ray_bootstrap_config.yaml", "")
    command = command.replace(f"--min-worker-port={lo}", f"--min-worker-port={base}").replace(
        f"--max-worker-port={hi}", f"--max-worker-port={base + hi - lo}"
    )
    ports, (lo, hi) = named_ports(command)
    moved_env = {}
    for var in port_env:
        port = free_port()
        while port in span:
            port = free_port()
        moved_env[var] = port
    ports |= set(moved_env.values())
    temp_dir = Path("/tmp") / f"rayrl-expo-{os.getpid()}"
    env = {
        **os.environ,
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": str(tmp_path / "token"),
        **{k: str(v) for k, v in moved_env.items()},
    }
    (tmp_path / "token").write_text("0123456789abcdef0123456789abcdef")
    argv = [RAY] + shlex.split(command)[1:] + ["--block", "--num-cpus=1", f"--temp-dir={temp_dir}"]
    log = open(tmp_path / "head.log", "w")
    head = subprocess.Popen(argv, env=env, start_new_session=True, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        seen: list[tuple[str, int, int]] = []
        while time.monotonic() < deadline:  # wait until the dashboard, agents and client server are up
            seen = _listening(_session_pids(head.pid))
            names = {p for _, p, _ in seen}
            if ports <= names or head.poll() is not None:
                break
            time.sleep(2)
        assert head.poll() is None, "the head exited: " + (tmp_path / "head.log").read_text()[-2000:]
        time.sleep(5)  # late listeners (idle workers) too
        seen = _listening(_session_pids(head.pid))
        exposed = {(ip, port) for ip, port, _ in seen if not ip.startswith("127.") and ip != "::1"}
        names = {port: _name(pid) for _, port, pid in seen}
        unnamed = {(ip, port, names[port]) for ip, port in exposed if port not in ports and not lo <= port <= hi}
        assert exposed, "the head listens on no non-loopback address; the test saw nothing"
        assert not unnamed, f"listening off loopback on ports the config does not name: {sorted(unnamed)}"
        dashboard = mapping[8265]
        assert all(ip.startswith("127.") for ip, port, _ in seen if port == dashboard), seen
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(head.pid, signal.SIGKILL)
        head.wait()
        shutil.rmtree(temp_dir, ignore_errors=True)
