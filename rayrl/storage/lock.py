"""One run per name: a lease on a lock file in the run folder (local disk or S3), renewed by a heartbeat.

The lock holds host, pid, the process start time and a token. Every write of it is conditional
(rayrl.storage.leases): created only if absent, replaced only if unchanged since it was read, so
of any number of racing takers exactly one wins, on one machine or many. A second start with the
same name finds a live lock and stops with :class:`LockHeld` (exit 2) before writing anything. A
stale lock is taken over: its process is gone from this host (or its pid now belongs to another
process), or, from any host, it was last written more than ``stale_s`` ago by the store's clock.

The holder renews the lease every ``stale_s / 4`` seconds. When a renewal finds the lock changed
(another process took it over) or no renewal has succeeded for ``FENCE`` of ``stale_s`` (past that
a taker may win), the lease is lost and the holder stops at once (``on_lost``: by default one
paragraph on stderr and exit status :data:`LOST_EXIT`), so two runs never write one folder.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from rayrl.errors import LockHeld
from rayrl.storage import leases

log = logging.getLogger("rayrl.storage.lock")

LOCK_FILE = ".rayrl-lock.json"
STALE_S = float(os.environ.get("RAYRL_LOCK_STALE_S", "120"))
FENCE = 0.75  #: a holder that could not renew for this fraction of stale_s stops: a taker may win after stale_s
LOST_EXIT = 3  #: exit status of a run that lost its lease


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
    info: dict | None, age_s: float, host: str, stale_s: float, started: Callable[[int], float | None] = process_start
) -> str | None:
    """Why the lock ``info``, last written ``age_s`` seconds ago, may be taken over (a sentence), or None
    while its holder is alive.

    Pure apart from ``started`` (the process table of this host), so it is tested without processes.
    """
    if info is None:
        return "no lock"
    try:
        pid, holder = int(info["pid"]), str(info["host"])
    except (KeyError, TypeError, ValueError):
        return "the lock file is unreadable"
    if holder == host:
        start = started(pid)
        if start is None:
            return f"its process {pid} is gone from this host"
        recorded = info.get("pid_start")
        if recorded is not None and start not in (-1.0, recorded) and abs(start - float(recorded)) > 1.0:
            return f"pid {pid} now belongs to another process"
    if age_s > stale_s:
        return f"its heartbeat is {age_s:.0f} s old (stale after {stale_s:.0f} s)"
    return None


def _parse(data: bytes) -> dict:
    try:
        info = json.loads(data)
    except ValueError:
        return {}
    return info if isinstance(info, dict) else {}


def exit_on_lost(message: str) -> None:
    """The default reaction to a lost lease: say why and stop the process now (no cleanup that writes),
    with every process it started: a local Ray's raylet, workers and agents would otherwise outlive
    ``os._exit`` (the agents did, in the fault table), and a worker could go on writing."""
    print(message, file=sys.stderr, flush=True)
    kill_descendants()
    os._exit(LOST_EXIT)


def kill_descendants() -> None:
    """SIGKILL every process below this one (best effort: one that is already gone is skipped)."""
    import psutil

    try:
        below = psutil.Process().children(recursive=True)
    except psutil.Error:
        return
    for proc in below:
        try:
            proc.kill()
        except psutil.Error:
            continue


class RunLock:
    """The lock of one run folder; use as a context manager around the run."""

    def __init__(
        self,
        store: leases.LeaseStore,
        uri: str,
        stale_s: float = STALE_S,
        on_lost: Callable[[str], None] = exit_on_lost,
    ) -> None:
        self.store, self.uri, self.stale_s, self.on_lost = store, uri, stale_s, on_lost
        self.token = uuid.uuid4().hex
        self.host = socket.gethostname()
        self.took_over: str | None = None
        self.lost: str | None = None
        self._version: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._info = {
            "host": self.host,
            "pid": os.getpid(),
            "pid_start": process_start(os.getpid()),
            "started": time.time(),
            "token": self.token,
        }

    @classmethod
    def at(cls, loc: Any, **kwargs: Any) -> RunLock:
        """The lock of the run folder at ``loc`` (a rayrl.storage.uri.Location)."""
        stale_s = kwargs.get("stale_s", STALE_S)
        # A renewal must fail fast enough for the fence to act before a taker may win.
        return cls(leases.for_location(loc, timeout_s=max(0.2, stale_s / 8)), loc.uri, **kwargs)

    def _body(self) -> bytes:
        return json.dumps({**self._info, "heartbeat": time.time()}).encode()

    def acquire(self) -> RunLock:
        for _ in range(5):  # a lost race re-reads: the winner's fresh lock then refuses this taker
            seen = self.store.read()
            if seen is None:
                version = self.store.create(self._body())
                reason = None
            else:
                info = _parse(seen.data)
                if info.get("token") == self.token:  # an earlier try landed though its answer was lost
                    version, reason = seen.version, None
                    break
                reason = staleness(info, seen.age_s, self.host, self.stale_s)
                if reason is None:
                    raise LockHeld(self._held_message(info, seen.age_s))
                version = self.store.replace(self._body(), seen.version)
            if version is not None:
                break
        else:
            seen = self.store.read()
            raise LockHeld(
                self._held_message(None, None) if seen is None else self._held_message(_parse(seen.data), seen.age_s)
            )
        if reason is not None:
            self.took_over = reason
            log.warning("run folder %s: took over a stale lock (%s)", self.uri, reason)
        self._version = version
        self._thread = threading.Thread(target=self._beat, name="rayrl-lock-heartbeat", daemon=True)
        self._thread.start()
        return self

    def _beat(self) -> None:
        sent_ok = time.monotonic()  # when the last successful renewal was *sent*: the lease runs from there
        while not self._stop.wait(self.stale_s / 4):
            sending = time.monotonic()
            try:
                version = self.store.replace(self._body(), self._version or "")
            except Exception as exc:  # a missed beat is not fatal while the lease has time left
                silent = time.monotonic() - sent_ok
                log.warning("run folder %s: lock heartbeat failed (%.0f s unrenewed): %s", self.uri, silent, exc)
                if silent >= FENCE * self.stale_s:
                    self._lose(f"no renewal succeeded for {silent:.0f} s (a taker may win after {self.stale_s:.0f} s)")
                    return
                continue
            if version is None:
                seen = self.store.read()
                now = {} if seen is None else _parse(seen.data)
                if seen is not None and now.get("token") == self.token:  # our last write landed, its answer lost
                    self._version, sent_ok = seen.version, sending
                    continue
                self._lose(f"another process took it over (host {now.get('host', '?')}, pid {now.get('pid', '?')})")
                return
            self._version, sent_ok = version, sending

    def _lose(self, why: str) -> None:
        self.lost = why
        self.on_lost(
            f"[rayrl] {self.uri}: this run lost its lock: {why}. It stops now, without writing more, so "
            "that two runs never write one run folder. If the other run is a mistake, stop it and run this "
            "command again: the run resumes from its last checkpoint."
        )

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self.lost is None and self._version is not None:
            self.store.delete(self._version)

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def _held_message(self, info: dict | None, age_s: float | None) -> str:
        info = info or {}
        age = f"{age_s:.0f} s" if age_s is not None else "?"
        return (
            f"--name: the run folder {self.uri} is in use by another rayrl process (host "
            f"{info.get('host', '?')}, pid {info.get('pid', '?')}, last heartbeat {age} ago); two runs "
            "with one name would overwrite each other's files, so this one starts nothing. Wait for that "
            "run to end or stop it, or give another --name. A lock is taken over by itself once its process "
            f"is gone from its host or its heartbeat is older than {self.stale_s:.0f} s "
            f"({self.uri.partition('?')[0]}/{LOCK_FILE})."
        )
