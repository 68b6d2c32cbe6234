"""Shared fixtures: one local Ray for the in-process tests, small and shut down at the end."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Tests start local Rays without a dashboard (2 cores are scarce); token auth stays as Ray sets it.
os.environ.setdefault("RAYRL_DASHBOARD", "0")


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


def free_port() -> int:
    """A TCP port nobody listens on now (tests start several Ray heads on one machine)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def head_port_flags() -> list[str]:
    """`ray start --head` flags that move every fixed default port to a free one.

    Ray's defaults (job agent 52365, client server 10001, ...) collide with any other Ray on the
    machine; a head whose job agent cannot bind answers "No available agent to submit job" forever.
    """
    return [f"--dashboard-agent-listen-port={free_port()}", f"--ray-client-server-port={free_port()}",
            f"--runtime-env-agent-port={free_port()}", f"--metrics-export-port={free_port()}"]
