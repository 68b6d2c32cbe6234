"""One run per name: a lock file in the run folder (local disk or object storage) with a heartbeat.

The lock holds host, pid, the process start time and a heartbeat time, rewritten every
``stale_s / 4`` seconds by a daemon thread. A second start with the same name finds a live lock
and stops with :class:`LockHeld` (exit 2) before writing anything. A stale lock is taken over:
its process is gone from this host (or its pid now belongs to another process), or, from any
host, its heartbeat is older than ``stale_s``. Object stores have no create-if-absent here, so a
taker writes its lock, waits a moment and reads it back: of two racing takers exactly one sees
its own token and goes on.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from rayrl.errors import LockHeld
from rayrl.storage import files

log = logging.getLogger("rayrl.storage.lock")

LOCK_FILE = ".rayrl-lock.json"
STALE_S = float(os.environ.get("RAYRL_LOCK_STALE_S", "120"))
SETTLE_S = 0.5


def process_start(pid: int) -> float | None:
    """The start time of process ``pid`` on this host, or None when there is no such process."""
    import psutil

    try:
        return round(psutil.Process(pid).create_time(), 2)
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return None
    except psutil.AccessDenied:
        return -1.0  # alive, owned by someone else


def staleness(
    info: dict | None, now: float, host: str, stale_s: float, started: Callable[[int], float | None] = process_start
) -> str | None:
    """Why the lock ``info`` may be taken over (a sentence), or None while its holder is alive.

    Pure apart from ``started`` (the process table of this host), so it is tested without processes.
    """
    if info is None:
        return "no lock"
    try:
        beat, pid, holder = float(info["heartbeat"]), int(info["pid"]), str(info["host"])
    except (KeyError, TypeError, ValueError):
        return "the lock file is unreadable"
    if holder == host:
        start = started(pid)
        if start is None:
            return f"its process {pid} is gone from this host"
        recorded = info.get("pid_start")
        if recorded is not None and start not in (-1.0, recorded) and abs(start - float(recorded)) > 1.0:
            return f"pid {pid} now belongs to another process"
    age = now - beat
    if age > stale_s:
        return f"its heartbeat is {age:.0f} s old (stale after {stale_s:.0f} s)"
    return None


class RunLock:
    """The lock of one run folder; use as a context manager around the run."""

    def __init__(self, fs: Any, folder: str, uri: str, stale_s: float = STALE_S) -> None:
        self.fs, self.path, self.uri = fs, f"{folder.rstrip('/')}/{LOCK_FILE}", uri
        self.stale_s = stale_s
        self.token = uuid.uuid4().hex
        self.host = socket.gethostname()
        self.took_over: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._info = {
            "host": self.host,
            "pid": os.getpid(),
            "pid_start": process_start(os.getpid()),
            "started": time.time(),
            "token": self.token,
        }

    def read(self) -> dict | None:
        try:
            return json.loads(files.read_bytes(self.fs, self.path))
        except (FileNotFoundError, OSError):
            return None
        except ValueError:
            return {}

    def _write(self) -> None:
        files.write_bytes(self.fs, self.path, json.dumps({**self._info, "heartbeat": time.time()}).encode())

    def acquire(self) -> RunLock:
        current = self.read()
        reason = staleness(current, time.time(), self.host, self.stale_s)
        if reason is None:
            raise LockHeld(self._held_message(current))
        if current is not None:
            self.took_over = reason
            log.warning("run folder %s: taking over a stale lock (%s)", self.uri, reason)
        self._write()
        time.sleep(SETTLE_S)
        mine = self.read()
        if not mine or mine.get("token") != self.token:
            raise LockHeld(self._held_message(mine))
        self._thread = threading.Thread(target=self._beat, name="rayrl-lock-heartbeat", daemon=True)
        self._thread.start()
        return self

    def _beat(self) -> None:
        while not self._stop.wait(self.stale_s / 4):
            try:
                current = self.read()
                if current and current.get("token") != self.token:
                    log.error(
                        "run folder %s: another process took this run's lock over (%s); stop one of them",
                        self.uri,
                        current,
                    )
                    return
                self._write()
            except OSError as exc:  # a missed beat is not fatal; the next one may succeed
                log.warning("run folder %s: lock heartbeat failed: %s", self.uri, exc)

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        current = self.read()
        if current and current.get("token") == self.token:
            files.delete(self.fs, self.path)

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def _held_message(self, info: dict | None) -> str:
        info = info or {}
        age = time.time() - float(info.get("heartbeat", time.time()))
        return (
            f"--name: the run folder {self.uri} is in use by another rayrl process (host "
            f"{info.get('host', '?')}, pid {info.get('pid', '?')}, last heartbeat {age:.0f} s ago); two runs "
            "with one name would overwrite each other's files, so this one starts nothing. Wait for that "
            "run to end or stop it, or give another --name. A lock is taken over by itself once its process "
            f"is gone from its host or its heartbeat is older than {self.stale_s:.0f} s "
            f"({self.uri.partition('?')[0]}/{LOCK_FILE})."
        )
