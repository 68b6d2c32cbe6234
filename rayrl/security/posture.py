"""The run's security posture as configured, recorded once at start as posture.json.

The report judges it (rayrl.judge.security): token auth, TLS between Ray processes, which Ray
listeners on the driver's node bind off loopback, and who may write the run folder. Recorded
from the running Ray, not from the config file, so the report says what really ran.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

LOOPBACK = ("127.", "::1")


def _auth_mode() -> str:
    try:
        from ray._raylet import AuthenticationMode, get_authentication_mode  # type: ignore[attr-defined]

        return "token" if get_authentication_mode() == AuthenticationMode.TOKEN else "disabled"
    except Exception:  # an older Ray without the call: say so rather than guess
        return "unknown"


def _ray_listeners() -> list[dict[str, Any]]:
    """Listening TCP sockets of Ray's processes on this node (raylet, GCS, agents, workers, client)."""
    import psutil

    names: dict[int, str] = {}
    for proc in psutil.process_iter(["pid", "name", "cmdline"]):
        cmd = " ".join(proc.info.get("cmdline") or [])
        name = proc.info.get("name") or ""
        if name in ("raylet", "gcs_server") or name.startswith("ray::") or "/ray/" in cmd or "ray." in cmd:
            names[proc.info["pid"]] = name
    out: list[dict[str, Any]] = []
    try:
        conns = psutil.net_connections(kind="tcp")
    except psutil.AccessDenied:
        return out
    for c in conns:
        if c.status == psutil.CONN_LISTEN and c.pid in names:
            out.append({"ip": c.laddr.ip, "port": c.laddr.port, "process": names[c.pid]})
    return sorted(out, key=lambda r: (r["port"], r["ip"]))


def _storage(run_dir: Path, storage: str) -> dict[str, Any]:
    if "://" in storage:
        return {"kind": "object store", "uri": storage}
    st = os.lstat(run_dir)
    return {
        "kind": "local",
        "owner_uid": st.st_uid,
        "mode": oct(stat.S_IMODE(st.st_mode)),
        "is_owner": st.st_uid == os.getuid(),
        "group_or_world_writable": bool(st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)),
        "symlink": stat.S_ISLNK(st.st_mode),
    }


def record(run_dir: Path, storage: str) -> dict[str, Any]:
    """posture.json's content; call after Ray is up (it reads the running Ray's auth mode)."""
    return {
        "auth_mode": _auth_mode(),
        "tls": os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"),
        "listeners": _ray_listeners(),
        "storage": _storage(run_dir, storage),
    }


def off_loopback(listeners: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in listeners if not str(r.get("ip", "")).startswith(LOOPBACK)]
