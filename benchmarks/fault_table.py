"""The fault table of docs/reliability.md: storage, lock and checkpoint faults injected into a real
`rayrl train`, and what each one cost.

Every fault gets its own tiny `rayrl train` (CartPole PPO, batch 512, one EnvRunner-free trial, a
checkpoint every iteration, the newest 3 kept, tiered) against moto's S3 server, started here as a
subprocess on 127.0.0.1. Once the run is steady (4 iterations reported, 2 checkpoints in the bucket,
Tune's state in the bucket naming one), the fault is injected with real parts:

- ``node_wiped``: the node is lost with its disk: every process of the run (the driver, its Ray, the
  trial) is SIGKILLed and its HOME, RAYRL_HOME (the mirror) and tier 1 deleted; the same command
  runs on a fresh HOME (the bucket alone);
- ``s3_down``: a TCP proxy between the run and the server refuses every connection (as a stopped
  server does) for ``--outage-s`` (moto keeps its data meanwhile);
- ``s3_slow``: the proxy holds every PUT ``--put-delay-s`` for ``--slow-s``;
- ``access_denied``: the server runs with authentication on; the run's IAM user gets an explicit
  Deny on s3:* (a permanent AccessDenied); after the run stops, access is given back and the same
  command is run again;
- ``disk_full``: tier 1 (``checkpoint.local_dir``) sits on a 16 MB tmpfs, filled up mid-run
  (needs root to mount; skipped otherwise); once the run stops, the space is freed and the command
  run again;
- ``lock_partition``: the holder reaches the server through the proxy, which cuts it off past its
  lease (``RAYRL_LOCK_STALE_S`` = ``--lock-stale-s``); once a taker on another node could win, the
  same command starts on a fresh node (direct to the server) and the partition heals;
- ``sigkill_upload``: every process of the run is SIGKILLed while a checkpoint is in tier 1 and not
  yet in the bucket; the same command runs again on the same node (tier 1 intact).

Measured per fault, from the runs' own per-iteration lines (``--verbose``) and the bucket: what was
lost (files the bucket should hold at the end and does not, checkpoints queued at the fault that
never reached it; iterations and env steps trained twice: each time the iteration counter goes back,
the last iteration before minus the first one after + 1), the recovery time (from the fault to the
first iteration after it ended, or to the clear stop for a refusal or a full disk), the longest
pause in training, and whether the outcome keeps the promise docs/reliability.md makes (ok / FAIL).
Each fault takes 1.5-3 minutes on 2 cores. Finished faults are kept in ``--work`` (one row.json
each) and not measured again; delete ``WORK/FAULT`` to measure one again.

    python -m benchmarks.fault_table --out faults.json
    python -m benchmarks.fault_table --faults s3_down,s3_slow --work /tmp/ft --out faults.json
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks import common as C
from rayrl.faults.driver_drill import state_names_a_checkpoint

BUCKET = "faults"
NAME = "run"
KEEP = 3  #: checkpoint.keep of every run (rayrl's default)
BATCH = 512
LOST_EXIT = 3  #: rayrl.storage.lock.LOST_EXIT (a run that lost its lease)
STEADY_ROWS = 4  #: iterations reported before a fault is injected
RUN_TIMEOUT_S = 300.0  #: one `rayrl train` of this benchmark never takes longer (else: killed, counted)
STOP_WITHIN_S = 120.0  #: a refusal or a full disk must have stopped the run by then
BACKPRESSURE_S = 120.0  #: rayrl.tune.trainable.BACKPRESSURE_S: the longest a checkpoint waits for uploads
HISTORY_BEHIND_S = 10.0  #: docs/storage.md: history.csv in the bucket is at most this far behind


# ---- what a run reported ------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One training iteration as `rayrl train --verbose` printed it, with the time the line arrived."""

    t: float
    iteration: int
    env_steps: int


_ROW = re.compile(r"\| iter (\d+) \| env steps ([\d,]+) \|")


def parse_row(line: str, t: float) -> Row | None:
    """The iteration of one output line of `rayrl train --verbose`, or None (the closing line too)."""
    m = _ROW.search(line)
    if m is None or " finished: " in line:
        return None
    return Row(t, int(m.group(1)), int(m.group(2).replace(",", "")))


def redone(rows: Sequence[Row], since: float) -> tuple[int, int]:
    """Iterations and env steps trained twice after ``since``.

    Rows in the order they arrived; each time one at or after ``since`` goes back to an iteration at
    or below the previous row's (a restore: a retry, a rerun), the iterations from it to the previous
    one count (previous - first after + 1), and the env steps from its restored point (the env steps
    of iteration first - 1, 0 for a fresh start) to the previous row's.
    """
    ordered = sorted(rows, key=lambda r: r.t)
    steps = [b.env_steps - a.env_steps for a, b in zip(ordered, ordered[1:]) if b.iteration == a.iteration + 1]
    per_iter = statistics.median(steps) if steps else BATCH
    env_at: dict[int, int] = {0: 0}
    iters = env = 0
    for prev, row in zip([None, *ordered], ordered):
        if prev is not None and row.t >= since and row.iteration <= prev.iteration:
            iters += prev.iteration - row.iteration + 1
            restored = env_at.get(row.iteration - 1, row.env_steps - per_iter)
            env += max(0, int(prev.env_steps - restored))
        env_at[row.iteration] = row.env_steps
    return iters, env


def training_again(rows: Sequence[Row], after: float) -> float | None:
    """When the first iteration after ``after`` arrived (None: training never went on)."""
    later = [r.t for r in rows if r.t > after]
    return min(later) if later else None


def longest_pause(rows: Sequence[Row], since: float, until: float) -> float:
    """The longest time without a new iteration from the last one before ``since`` to ``until``."""
    times = sorted(r.t for r in rows)
    before = [t for t in times if t <= since]
    marks = [before[-1] if before else since, *[t for t in times if since < t <= until]]
    if not times or max(times) < until:
        marks.append(until)
    return max((b - a for a, b in zip(marks, marks[1:])), default=0.0)


def usual_gap(rows: Sequence[Row], until: float) -> float:
    """The median time between consecutive iterations before ``until`` (the run's normal pace)."""
    times = sorted(r.t for r in rows if r.t <= until)
    gaps = [b - a for a, b in zip(times, times[1:])]
    return statistics.median(gaps) if gaps else float("nan")


def first_restore(rows: Sequence[Row], since: float, starts: Sequence[float] = ()) -> int | None:
    """The first iteration trained after the first restore at or after ``since`` (the iteration counter
    going back, or the first row of a process started at ``starts`` at or after ``since``: a restore to
    the newest checkpoint goes on counting), None when there was none."""
    ordered = sorted(rows, key=lambda r: r.t)
    fresh = sorted(s for s in starts if s >= since)
    for prev, row in zip(ordered, ordered[1:]):
        if row.t >= since and (row.iteration <= prev.iteration or (fresh and prev.t < fresh[0] <= row.t)):
            return row.iteration
    return None


def rows_lost_late(rows: Sequence[Row], gaps: Sequence[int], t_fault: float, allowed_s: float) -> list[int]:
    """The iterations missing from the bucket's history.csv whose row was written more than
    ``allowed_s`` before the fault (history.csv may be that far behind; older rows must be there)."""
    written = {r.iteration: r.t for r in sorted(rows, key=lambda r: r.t) if r.t <= t_fault}
    return [g for g in gaps if g in written and t_fault - written[g] > allowed_s]


def spans(numbers: Sequence[int]) -> str:
    """``[2, 3, 4, 7]`` -> ``"2-4, 7"``."""
    out: list[str] = []
    for n in sorted(numbers):
        if out and int(out[-1].split("-")[-1]) == n - 1:
            out[-1] = f"{out[-1].split('-')[0]}-{n}"
        else:
            out.append(str(n))
    return ", ".join(out)


# ---- the S3 server, a proxy in front of it, the bucket's view ----------------------------------


def _moto_server() -> str | None:
    own = Path(sys.executable).parent / "moto_server"  # this interpreter's moto, not one on PATH
    return str(own) if own.exists() else shutil.which("moto_server")


class Moto:
    """moto's S3 server (its own process group) with the bucket; with ``auth``, authentication on and
    an IAM user ``run`` whose keys the run uses, so that its access can be revoked."""

    def __init__(self, auth: bool = False) -> None:
        import boto3

        self.port = C.free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [_moto_server() or "moto_server", "-H", "127.0.0.1", "-p", str(self.port)],
            env={**os.environ, **({"INITIAL_NO_AUTH_ACTION_COUNT": "4"} if auth else {})},
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    self.close()
                    raise RuntimeError(f"moto_server did not listen on {self.port} within 60 s") from None
                time.sleep(0.2)
        self.key, self.secret = "bench", "bench"
        self._boto3 = boto3
        self.client().create_bucket(Bucket=BUCKET)  # without auth these four calls are the free ones
        if auth:
            iam = self._client("iam")
            iam.create_user(UserName="run")
            self.allow(True, iam)
            made = iam.create_access_key(UserName="run")["AccessKey"]
            self.key, self.secret = made["AccessKeyId"], made["SecretAccessKey"]

    def _client(self, service: str, endpoint: str | None = None) -> Any:
        from botocore.config import Config

        return self._boto3.client(
            service,
            endpoint_url=endpoint or self.endpoint,
            region_name="us-east-1",
            aws_access_key_id=self.key,
            aws_secret_access_key=self.secret,
            config=Config(retries={"max_attempts": 2}, connect_timeout=5, read_timeout=30),
        )

    def client(self) -> Any:
        """A boto3 S3 client straight to the server (never through the proxy)."""
        return self._client("s3")

    def allow(self, on: bool, iam: Any = None) -> None:
        """Give the run's user s3:* (True) or an explicit Deny on s3:* (False); IAM stays allowed."""
        statements = [{"Effect": "Allow", "Action": ["iam:*"], "Resource": "*"}]
        statements.append({"Effect": "Allow" if on else "Deny", "Action": ["s3:*"], "Resource": "*"})
        (iam or self._client("iam")).put_user_policy(
            UserName="run",
            PolicyName="run",
            PolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": statements}),
        )

    def env(self, endpoint: str | None = None) -> dict[str, str]:
        return {
            "AWS_ACCESS_KEY_ID": self.key,
            "AWS_SECRET_ACCESS_KEY": self.secret,
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": endpoint or self.endpoint,
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


class Proxy:
    """A TCP proxy in front of the S3 server: it holds each request that starts a PUT ``put_delay_s``
    before passing it on (a slow store), and while down it refuses every connection and cuts the open
    ones (a stopped server, a partition). ``put_times``: when each PUT passed."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream = ("127.0.0.1", upstream_port)
        self.put_delay_s = 0.0
        self.put_times: list[float] = []
        self._lock = threading.Lock()
        self._open: list[socket.socket] = []
        self._listener: socket.socket | None = None
        self.port = C.free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.up()

    def up(self) -> None:
        if self._listener is None:
            self._listener = socket.create_server(("127.0.0.1", self.port))  # SO_REUSEADDR: same port again
            threading.Thread(target=self._accept, args=(self._listener,), daemon=True).start()

    def down(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)  # wakes accept()
            listener.close()
        with self._lock:
            opened, self._open = self._open, []
        for s in opened:
            _close(s)

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._open += [client, server]
            threading.Thread(target=self._pipe, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, False), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, requests: bool) -> None:
        try:
            while chunk := src.recv(65536):
                if requests and chunk.startswith(b"PUT "):
                    with self._lock:
                        self.put_times.append(time.time())
                    if self.put_delay_s:
                        time.sleep(self.put_delay_s)
                dst.sendall(chunk)
        except OSError:
            pass
        finally:
            _close(src)
            _close(dst)

    def close(self) -> None:
        self.down()


def _close(s: socket.socket) -> None:
    with contextlib.suppress(OSError):
        s.shutdown(socket.SHUT_RDWR)
    s.close()


class Bucket:
    """The run folder in the bucket, read straight from the server. A thread notes when each version of
    each checkpoint's manifest (written last: that upload is complete) first appeared, by its ETag: an
    index is saved again, with other contents, after a restore to an older checkpoint."""

    def __init__(self, client: Any, prefix: str) -> None:
        self.client, self.prefix = client, prefix.rstrip("/") + "/"
        self.seen: dict[int, dict[str, float]] = {}  #: index -> manifest ETag -> when first listed
        self.at_fault: list[int] = []  #: the checkpoints complete here just before the fault
        self._stop = threading.Event()
        threading.Thread(target=self._watch, daemon=True).start()

    def listing(self) -> dict[str, tuple[int, str]]:
        """Every key under the run folder (relative to it) with its size and ETag."""
        out: dict[str, tuple[int, str]] = {}
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=self.prefix)
        for page in pages:
            for o in page.get("Contents", []):
                out[o["Key"][len(self.prefix) :]] = (o["Size"], o.get("ETag", "").strip('"'))
        return out

    def get(self, rel: str) -> bytes:
        return self.client.get_object(Bucket=BUCKET, Key=self.prefix + rel)["Body"].read()

    def manifests(self, listing: dict[str, tuple[int, str]] | None = None) -> dict[int, str]:
        """The checkpoints whose upload finished (their manifest is there): index -> the manifest's ETag."""
        from rayrl.storage import manifest

        keys = self.listing() if listing is None else listing
        found = {}
        for key, (_, etag) in keys.items():
            index = _index(key)
            if index is not None and key.endswith("/" + manifest.NAME):
                found[index] = etag
        return found

    def landed(self, index: int, etags: set[str]) -> float | None:
        """When the manifest with one of ``etags`` (one tier-1 copy) was first in the bucket, or None."""
        times = [t for etag, t in self.seen.get(index, {}).items() if etag in etags]
        return min(times) if times else None

    def first_seen(self, index: int) -> float | None:
        times = self.seen.get(index, {}).values()
        return min(times) if times else None

    def state_names_a_checkpoint(self) -> bool:
        """Whether Tune's newest experiment state in the bucket records a checkpoint (what a resume reads)."""
        states = sorted(k for k in self.listing() if k.startswith("tune/experiment_state-"))
        if not states:
            return False
        text = self.get(states[-1]).decode(errors="replace")
        return state_names_a_checkpoint(text)

    def look(self) -> None:
        """Note the manifests listed now (the watcher's look; ``outcome`` takes one more, so a manifest
        that landed in the watcher's last second is not judged never to have landed)."""
        try:
            found = self.manifests()
        except Exception:  # noqa: BLE001 - the server refuses or is slow: look again later
            return
        now = time.time()
        for index, etag in found.items():
            self.seen.setdefault(index, {}).setdefault(etag, now)

    def _watch(self) -> None:
        while not self._stop.wait(1.0):
            self.look()

    def stop(self) -> None:
        self._stop.set()

    def end_state(self, finished: bool) -> dict:
        """What the bucket holds once the runs ended, against what it should: the run-folder files,
        every iteration once in history.csv, the newest ``KEEP`` checkpoints complete (manifest last,
        every file it lists there with its size)."""
        listing = self.listing()
        wanted = ["spec.yaml", "posture.json", "history.csv", *(["summary.json"] if finished else [])]
        missing = [f for f in wanted if f not in listing]
        gaps: list[int] = []
        if "history.csv" in listing:
            import csv
            import io

            seen = {
                int(float(r["training_iteration"]))
                for r in csv.DictReader(io.StringIO(self.get("history.csv").decode()))
                if r.get("training_iteration")
            }
            gaps = sorted(set(range(1, max(seen, default=0) + 1)) - seen)
        folders: dict[int, str] = {}
        for key in listing:
            index = _index(key)
            if index is not None:
                folders[index] = key.split("/checkpoint_")[0] + f"/checkpoint_{index:06d}"
        incomplete = []
        for index in sorted(folders)[-KEEP:]:
            problem = self._checkpoint_problem(folders[index], listing)
            if problem:
                incomplete.append(f"checkpoint_{index:06d} ({problem})")
        return {
            "missing": missing,
            "history_gaps": gaps,
            "incomplete_checkpoints": incomplete,
            "checkpoints": sorted(folders),
            "downloaded_bytes": self._downloaded(listing),
        }

    def _checkpoint_problem(self, folder: str, listing: dict[str, tuple[int, str]]) -> str:
        from rayrl.storage import manifest

        if f"{folder}/{manifest.NAME}" not in listing:
            return "no manifest: its upload never finished"
        files = json.loads(self.get(f"{folder}/{manifest.NAME}")).get("files", {})
        bad = [rel for rel, want in files.items() if listing.get(f"{folder}/{rel}", (None,))[0] != want.get("size")]
        return f"{len(bad)} of {len(files)} files missing or short" if bad else ""

    def _downloaded(self, listing: dict[str, tuple[int, str]]) -> int:
        from rayrl.storage import checkpoints as ck

        total = 0
        for key in listing:
            if key.rsplit("/", 1)[-1].startswith(ck.DOWNLOAD_PREFIX):
                total += int(json.loads(self.get(key)).get("downloaded_bytes", 0))
        return total


def _index(key: str) -> int | None:
    m = re.search(r"/checkpoint_(\d{6})(/|$)", key)
    return int(m.group(1)) if m else None


def etags(data: bytes) -> set[str]:
    """The ETags S3 gives ``data`` uploaded in one PUT or as one multipart part (pyarrow's way)."""
    import hashlib

    md5 = hashlib.md5(data)
    return {md5.hexdigest(), hashlib.md5(md5.digest()).hexdigest() + "-1"}


def tier1_manifests(local_dir: Path) -> dict[int, set[str]]:
    """The checkpoints complete in tier 1 (their manifest written): index -> the ETags it would get."""
    from rayrl.storage import manifest

    found = {}
    for path in local_dir.glob(f"*/checkpoint_*/{manifest.NAME}"):
        try:
            found[int(path.parent.name[11:])] = etags(path.read_bytes())
        except (OSError, ValueError):
            continue  # pruned or being replaced right now
    return found


def queued_now(bucket: Bucket, local_dir: Path) -> dict[int, set[str]]:
    """Checkpoints complete in tier 1 whose copy has not (yet) reached the bucket (index -> ETags)."""
    try:
        there = bucket.manifests()
    except Exception:  # noqa: BLE001 - the store refuses: what the watcher saw last
        there = {}
    return {
        i: tags
        for i, tags in tier1_manifests(local_dir).items()
        if bucket.landed(i, tags) is None and there.get(i) not in tags
    }


# ---- one `rayrl train` ---------------------------------------------------------------------------


class Train:
    """`rayrl train --verbose` in its own session (its local Ray included); every output line kept with
    the time it arrived, and written to ``log``."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self.lines: list[tuple[float, str, str]] = []
        self.env_s3: dict[str, str] = {}  #: how it reached S3, and its node (Ctx.train sets them)
        self.node: dict[str, Path] = {}
        self.iters = 0  #: the iterations it trains in all
        self._lock = threading.Lock()
        self._log = log.open("a")
        self.started = time.time()
        self.ended: float | None = None
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rayrl.cli", "train", *args],
            env=env,
            cwd=C.ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self._readers = [
            threading.Thread(target=self._read, args=(stream, name), daemon=True)
            for stream, name in ((self.proc.stdout, "out"), (self.proc.stderr, "err"))
        ]
        for r in self._readers:
            r.start()

    def _read(self, stream: Any, name: str) -> None:
        for line in stream:
            now = time.time()
            with self._lock:
                self.lines.append((now, name, line.rstrip("\n")))
                self._log.write(f"{now:.3f} {name} {line}")
                self._log.flush()

    def rows(self) -> list[Row]:
        with self._lock:
            lines = list(self.lines)
        return [r for t, name, line in lines if name == "out" and (r := parse_row(line, t)) is not None]

    def text(self, stream: str = "err") -> str:
        with self._lock:
            return "\n".join(line for _, name, line in self.lines if name == stream)

    def poll(self) -> int | None:
        rc = self.proc.poll()
        if rc is not None and self.ended is None:
            self.ended = time.time()
        return rc

    def wait(self, timeout: float) -> int | None:
        """The exit status, or None (still running) after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while self.poll() is None:
            if time.monotonic() > deadline:
                return None
            time.sleep(0.2)
        for r in self._readers:
            r.join(10)
        return self.proc.returncode

    def session(self) -> list[int]:
        """Its processes still alive: every one of its session (Ray's workers, the trial among them, run
        in process groups of their own, so a kill of the driver's group alone leaves them running)."""
        return [pid for pid, _ in session_members(self.proc.pid)]

    def kill(self) -> float:
        """SIGKILL every process of its session at once (the node dies); the time it was sent."""
        t = time.time()
        for pid in [self.proc.pid, *self.session()]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.wait(30)
        return t

    def close(self) -> None:
        if self.poll() is None or self.session():
            self.kill()
        self._log.close()


def session_members(sid: int) -> list[tuple[int, str]]:
    """The live processes of session ``sid``: (pid, name)."""
    import psutil

    found = []
    for p in psutil.process_iter(["pid", "name"]):
        with contextlib.suppress(psutil.Error, ProcessLookupError):
            if os.getsid(p.info["pid"]) == sid and p.status() != psutil.STATUS_ZOMBIE:
                found.append((p.info["pid"], p.info["name"]))
    return found


_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # Ray colours its workers' line prefixes


def error_paragraph(text: str) -> str:
    """The run's closing error: the first ``rayrl train: error:`` or lost-lock paragraph, else the
    last non-empty line (a traceback's end), shortened."""
    lines = [_ANSI.sub("", line) for line in text.splitlines()]
    for i, line in enumerate(lines):
        if "rayrl train: error:" in line or "lost its lock" in line or "the trial failed:" in line:
            para = [line]
            for more in lines[i + 1 :]:
                if not more.strip() or more.startswith(("[", "(", "20")):
                    break
                para.append(more)
            return " ".join(" ".join(para).split())[:600]
    last = [line for line in lines if line.strip()]
    return " ".join(last[-1].split())[:600] if last else ""


def ended_with_paragraph(text: str) -> bool:
    """Whether the run's stderr ends with rayrl's one-paragraph error (Tune may log a trial's failure,
    traceback included, before it), not with a traceback."""
    lines = text.splitlines()
    marks = [i for i, line in enumerate(lines) if "rayrl train: error:" in line or "lost its lock" in line]
    tracebacks = [i for i, line in enumerate(lines) if line.startswith("Traceback")]
    return bool(marks) and (not tracebacks or tracebacks[-1] < marks[-1])


# ---- one fault --------------------------------------------------------------------------------


@dataclass
class Ctx:
    """What a fault's function gets: its folder, the settings, and the runs it started."""

    folder: Path
    args: argparse.Namespace
    key_file: Path
    runs: list[Train] = field(default_factory=list)

    def node(self, tag: str) -> dict[str, Path]:
        """A node's local disk: HOME, RAYRL_HOME (the mirror) and tier 1, fresh folders."""
        base = self.folder / tag
        paths = {"HOME": base / "user", "RAYRL_HOME": base / "home", "tier1": base / "tier1"}
        for p in (paths["HOME"], paths["RAYRL_HOME"]):
            p.mkdir(parents=True, exist_ok=True)
        return paths

    def train(self, s3: dict[str, str], node: dict[str, Path], tier1: Path | None = None, **env: str) -> Train:
        """The fault's `rayrl train` (the same command every time) on ``node``, S3 reached as ``s3`` says."""
        full = dict(os.environ)
        full.pop("RAY_ADDRESS", None)
        full.update(
            PYTHONPATH=str(C.ROOT) + os.pathsep + full.get("PYTHONPATH", ""),
            RAYRL_DASHBOARD="0",
            RAYRL_WORKER_LOGS="1",  # the trial's own lines (upload errors) in the log too
            RAYRL_STORAGE_KEY_FILE=str(self.key_file),  # kept off the node: a fresh node verifies
            HOME=str(node["HOME"]),
            RAYRL_HOME=str(node["RAYRL_HOME"]),
            **s3,
            **env,
        )
        sets = {
            "env.envs_per_runner": 2,
            "algo.train_batch_per_learner": BATCH,
            "algo.minibatch_size": 256,
            "algo.epochs": 1,
            "resources.env_runners": 0,
            "checkpoint.every": 1,
            "checkpoint.keep": KEEP,
            "checkpoint.local_dir": tier1 or node["tier1"],
            "stop.episode_return": "null",
            "stop.wall_s": "null",
            "stop.env_steps": BATCH * self.args.iters,
        }
        args = [
            "--config",
            str(C.DEFAULT_CONFIG),
            "--storage",
            f"s3://{BUCKET}/{self.folder.name}",
            "--name",
            NAME,
            "--num-cpus",
            "2",
            "--verbose",
            *[x for k, v in sets.items() for x in ("--set", f"{k}={v}")],
        ]
        run = Train(args, full, self.folder / f"train-{len(self.runs) + 1}.log")
        run.env_s3, run.node, run.iters = s3, node, self.args.iters
        self.runs.append(run)
        return run

    def rows(self) -> list[Row]:
        return sorted((r for run in self.runs for r in run.rows()), key=lambda r: r.t)


def wait_steady(run: Train, bucket: Bucket) -> None:
    """Until the run is steady: STEADY_ROWS iterations reported, 2 checkpoints in the bucket, Tune's
    state there naming one (what a resume reads); RuntimeError when the run ends or takes too long.
    The checkpoints complete in the bucket then are noted in ``bucket.at_fault``."""
    deadline = time.monotonic() + 240
    while True:
        there, rows = bucket.manifests(), run.rows()
        if rows and rows[-1].iteration > run.iters - STEADY_ROWS:
            raise RuntimeError(
                f"the run reached iteration {rows[-1].iteration} of {run.iters} before it was steady (this machine "
                "trains faster than Tune saves its state): give a larger --iters"
            )
        if len(rows) >= STEADY_ROWS and len(there) >= 2 and bucket.state_names_a_checkpoint():
            bucket.at_fault = sorted(there)
            return
        if run.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(
                f"the run was not steady before the fault (exit {run.poll()}, {len(run.rows())} iterations): "
                + error_paragraph(run.text())
            )
        time.sleep(0.3)


def finish(run: Train, timeout: float = RUN_TIMEOUT_S) -> int | None:
    """Wait for ``run`` to end; past ``timeout`` it is killed and None returned."""
    rc = run.wait(timeout)
    if rc is None:
        run.kill()
    return rc


def outcome(
    ctx: Ctx,
    bucket: Bucket,
    t_fault: float,
    t_end: float,
    queued: dict[int, set[str]],
    extra: dict,
) -> dict:
    """The figures every fault reports, from the runs' rows and the bucket's end state.

    ``queued``: the checkpoints in tier 1 and not in the bucket at the fault (index -> their ETags).
    """
    rows = ctx.rows()
    finished = ctx.runs[-1].poll() == 0
    end = bucket.end_state(finished)
    iters, env = redone(rows, t_fault)
    again = training_again(rows, t_end)
    gap = usual_gap(rows, t_fault)
    late = rows_lost_late(rows, end["history_gaps"], t_fault, HISTORY_BEHIND_S + 2 * (gap if gap == gap else 0))
    bucket.look()
    landed = {i: bucket.landed(i, tags) for i, tags in sorted(queued.items())}
    lost = [*end["missing"], *end["incomplete_checkpoints"]]
    if end["history_gaps"]:
        lost.append(
            f"history.csv rows {spans(end['history_gaps'])}"
            + (f" ({spans(late)} older than {HISTORY_BEHIND_S:g} s)" if late else f" (< {HISTORY_BEHIND_S:g} s old)")
        )
    lost += [
        f"checkpoint_{i:06d} (tier 1 only at the fault, never in the bucket)" for i, t in landed.items() if t is None
    ]
    before = [r for r in rows if r.t <= t_fault]
    after = [r for r in rows if r.t > t_end]
    stop = max((run.ended or 0.0) for run in ctx.runs)
    resumed = first_restore(rows, t_fault, [run.started for run in ctx.runs])
    return {
        "files_lost": len(lost),
        "lost": lost,
        "history_rows_lost_late": late,
        "iterations_redone": iters,
        "env_steps_redone": env,
        "last_iteration_before": max((r.iteration for r in before), default=None),
        "first_iteration_after": after[0].iteration if after else None,
        # checkpoint_N holds iteration N + 1, so a restore to it trains iteration N + 2 first
        "restored_checkpoint": resumed - 2 if resumed is not None and resumed > 1 else None,
        "iterations_total": max((r.iteration for r in rows), default=None),
        "recovery_s": round(again - t_fault, 2) if again is not None else None,
        "recovery_to": "training again",
        "longest_pause_s": round(longest_pause(rows, t_fault, stop or time.time()), 2),
        "usual_gap_s": round(gap, 2),
        "bucket_checkpoints_at_fault": bucket.at_fault,
        "queued_at_fault": sorted(queued),
        "queued_landed_after_s": {f"checkpoint_{i:06d}": round(t - t_fault, 2) for i, t in landed.items() if t},
        "exit_codes": [run.poll() for run in ctx.runs],
        "bucket": end,
        "message": next((error_paragraph(r.text()) for r in ctx.runs if r.poll() not in (0, -signal.SIGKILL)), ""),
        **extra,
    }


# ---- the faults -------------------------------------------------------------------------------


def node_wiped(ctx: Ctx) -> dict:
    server = Moto()
    bucket = Bucket(server.client(), f"{ctx.folder.name}/{NAME}")
    try:
        node = ctx.node("node")
        run = ctx.train(server.env(), node)
        wait_steady(run, bucket)
        queued = queued_now(bucket, node["tier1"])
        t_fault = run.kill()
        shutil.rmtree(ctx.folder / "node")  # HOME, the mirror and tier 1: the node's disk is gone
        again = ctx.train(server.env(), ctx.node("node"))
        finish(again)
        out = outcome(ctx, bucket, t_fault, t_fault, queued, {})
    finally:
        bucket.stop()
        server.close()
    b = out["bucket"]
    checks = [
        (out["exit_codes"][-1] == 0, "the same command on a fresh node finished"),
        ((out["first_iteration_after"] or 0) > 1, "it resumed from a checkpoint, not from iteration 1"),
        (b["downloaded_bytes"] > 0, "the checkpoint came from the bucket (bytes downloaded)"),
        (whole(out), "the bucket is whole"),
        (len(out["queued_at_fault"]) <= KEEP - 1, f"at most keep - 1 = {KEEP - 1} queued checkpoints lost"),
    ]
    return judged(out, checks)


def s3_down(ctx: Ctx) -> dict:
    server = Moto()
    proxy = Proxy(server.port)
    bucket = Bucket(server.client(), f"{ctx.folder.name}/{NAME}")
    try:
        node = ctx.node("node")
        run = ctx.train(server.env(proxy.url), node)
        wait_steady(run, bucket)
        t_fault = time.time()
        proxy.down()
        trained_during = _sleep_counting(run, ctx.args.outage_s)
        proxy.up()
        t_end = time.time()
        queued = queued_now(bucket, node["tier1"])
        rc = finish(run)
        stopped = rc != 0
        message = error_paragraph(run.text()) if stopped else ""
        if stopped:  # as a user would: the same command again, the server being back
            finish(ctx.train(server.env(proxy.url), node))
        out = outcome(
            ctx,
            bucket,
            t_fault,
            t_end,
            queued,
            {
                "outage_s": ctx.args.outage_s,
                "iterations_during_outage": trained_during,
                "stopped_by_the_outage": stopped,
                "stop_s": round(run.ended - t_fault, 2) if stopped and run.ended else None,
                "message": message,
            },
        )
    finally:
        bucket.stop()
        proxy.close()
        server.close()
    checks = [
        (not out["stopped_by_the_outage"], "the run went on through the outage (no exit, no rerun needed)"),
        (out["iterations_redone"] == 0, "no iteration trained twice"),
        (whole(out), "the bucket is whole"),
        (len(out["queued_landed_after_s"]) == len(out["queued_at_fault"]), "every checkpoint queued meanwhile landed"),
    ]
    return judged(out, checks)


def _sleep_counting(run: Train, seconds: float) -> int:
    """Sleep ``seconds`` (or until the run ends); the iterations it reported meanwhile."""
    before = len(run.rows())
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and run.poll() is None:
        time.sleep(0.2)
    while time.monotonic() < deadline:
        time.sleep(0.2)
    return len(run.rows()) - before


def s3_slow(ctx: Ctx) -> dict:
    server = Moto()
    proxy = Proxy(server.port)
    bucket = Bucket(server.client(), f"{ctx.folder.name}/{NAME}")
    try:
        node = ctx.node("node")
        run = ctx.train(server.env(proxy.url), node)
        wait_steady(run, bucket)
        t_fault = time.time()
        puts_before = len(proxy.put_times)
        proxy.put_delay_s = ctx.args.put_delay_s
        trained_during = _sleep_counting(run, ctx.args.slow_s)
        proxy.put_delay_s = 0.0
        t_end = time.time()
        puts_during = len(proxy.put_times) - puts_before
        landed_during = [t for d in bucket.seen.values() for t in d.values() if t_fault < t <= t_end]
        queued = queued_now(bucket, node["tier1"])
        rc = finish(run)
        stopped = rc != 0
        message = error_paragraph(run.text()) if stopped else ""
        if stopped:
            finish(ctx.train(server.env(proxy.url), node))
        caught_up = max((bucket.landed(i, tags) or t_end for i, tags in queued.items()), default=t_end)
        out = outcome(
            ctx,
            bucket,
            t_fault,
            t_end,
            queued,
            {
                "slow_s": ctx.args.slow_s,
                "put_delay_s": ctx.args.put_delay_s,
                "iterations_while_slow": trained_during,
                "puts_while_slow": puts_during,
                "checkpoints_landed_while_slow": len(landed_during),
                "uploads_caught_up_s": round(caught_up - t_end, 2),
                "stopped_by_the_fault": stopped,
                "stop_s": round(run.ended - t_fault, 2) if stopped and run.ended else None,
                "message": message,
            },
        )
    finally:
        bucket.stop()
        proxy.close()
        server.close()
    checks = [
        (not out["stopped_by_the_fault"], "the run went on (no exit)"),
        (
            out["longest_pause_s"] <= BACKPRESSURE_S + 3 * out["usual_gap_s"] + 5,
            f"training waited at most the back-pressure's {BACKPRESSURE_S:g} s at a time",
        ),
        (out["iterations_redone"] == 0, "no iteration trained twice"),
        (whole(out), "the bucket is whole"),
        (len(out["queued_landed_after_s"]) == len(out["queued_at_fault"]), "every checkpoint queued meanwhile landed"),
    ]
    return judged(out, checks)


def access_denied(ctx: Ctx) -> dict:
    server = Moto(auth=True)
    bucket = Bucket(server.client(), f"{ctx.folder.name}/{NAME}")
    try:
        node = ctx.node("node")
        run = ctx.train(server.env(), node)
        wait_steady(run, bucket)
        t_fault = time.time()
        server.allow(False)
        out = stop_then_fix(ctx, run, bucket, node["tier1"], t_fault, lambda: server.allow(True), lambda: {})
    finally:
        bucket.stop()
        server.close()
    words = ("refused", "AccessDenied", "ACCESS_DENIED", "Access Denied")
    return judged(out, stop_checks(out, any(w in out["message"] for w in words), "names the refusal"))


def disk_full(ctx: Ctx) -> dict:
    disk = ctx.folder / "disk"
    with small_disk(disk, "16m") as mounted:
        if not mounted:
            return {"verdict": "skipped", "why": "mounting a tmpfs needs root"}
        server = Moto()
        bucket = Bucket(server.client(), f"{ctx.folder.name}/{NAME}")
        tier1 = disk / "tier1"
        try:
            node = ctx.node("node")
            run = ctx.train(server.env(), node, tier1=tier1)
            wait_steady(run, bucket)
            t_fault = time.time()
            filler = disk / "filler"
            _fill(filler)
            out = stop_then_fix(ctx, run, bucket, tier1, t_fault, filler.unlink, lambda: {"tier1": tier1})
        finally:
            bucket.stop()
            server.close()
    said = " ".join(out["message"].split())
    return judged(out, stop_checks(out, "full" in said, "says the disk is full"))


def stop_then_fix(
    ctx: Ctx,
    run: Train,
    bucket: Bucket,
    tier1: Path,
    t_fault: float,
    fix: Callable[[], Any],
    again: Callable[[], dict],
) -> dict:
    """A fault the run must stop on: wait for the stop, ``fix`` the cause, and (when it stopped) run the
    same command again (``again``: its extra arguments for :meth:`Ctx.train`)."""
    rc = finish(run, STOP_WITHIN_S + 60)
    t_stop = run.ended or time.time()
    err = run.text()
    queued = queued_now(bucket, tier1)
    trained_on = len([r for r in run.rows() if r.t > t_fault])
    fix()
    stopped = rc not in (None, 0)
    if stopped:
        finish(ctx.train(ctx.runs[0].env_s3, ctx.runs[0].node, **again()))
    out = outcome(
        ctx,
        bucket,
        t_fault,
        t_stop,
        queued,
        {
            "stop_exit": rc,
            "trial_failures": err.count("Trial task failed for trial"),
            "iterations_after_fault": trained_on,
            "ended_with_paragraph": ended_with_paragraph(err),
            "tune_logged_traceback": "Traceback" in err,
            "message": error_paragraph(err) if stopped else "",
        },
    )
    out["stop_s"] = round(t_stop - t_fault, 2) if stopped else None
    out["recovery_s"] = out["stop_s"]
    out["recovery_to"] = "clear stop" if stopped else ("did not stop" if rc == 0 else "killed: no stop")
    return out


def stop_checks(out: dict, names_it: bool, what: str) -> list[tuple[bool, str]]:
    """The promise for a refusal and a full disk: a clear stop (exit 1, one paragraph, no crash loop),
    then the same command resumes once the cause is fixed."""
    stopped = out["stop_s"] is not None
    return [
        (
            stopped and out["stop_exit"] == 1 and out["stop_s"] <= STOP_WITHIN_S,
            f"stopped, exit 1, within {STOP_WITHIN_S:g} s",
        ),
        (stopped and names_it, f"its paragraph {what}"),
        (out["trial_failures"] <= 1, f"no crash loop ({out['trial_failures']} trial failures)"),
        (not stopped or out["ended_with_paragraph"], "it ended with rayrl's paragraph, not a traceback"),
        (
            stopped and out["exit_codes"][-1] == 0 and (out["first_iteration_after"] or 0) > 1,
            "the same command resumed once fixed",
        ),
    ]


def _fill(path: Path) -> None:
    with path.open("wb") as f:
        try:
            while True:
                f.write(b"\0" * (1 << 20))
                f.flush()
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise


@contextlib.contextmanager
def small_disk(path: Path, size: str) -> Iterator[bool]:
    """A tmpfs of ``size`` (mode 700) mounted at ``path`` (True), or False where this user may not mount."""
    path.mkdir(parents=True, exist_ok=True)
    cmd = ["mount", "-t", "tmpfs", "-o", f"size={size},mode=700", "tmpfs", str(path)]
    mounted = shutil.which("mount") is not None and subprocess.run(cmd, capture_output=True).returncode == 0
    try:
        yield mounted
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(path)], capture_output=True)


#: Ray's per-node agents: they outlive a driver that exits at once (os._exit) but write nothing of a run
RAY_AGENTS = ("DashboardAgent", "RuntimeEnvAgent", "dashboard_agent", "runtime_env_agent")


def lock_partition(ctx: Ctx) -> dict:
    stale = ctx.args.lock_stale_s
    server = Moto()
    proxy = Proxy(server.port)
    bucket = Bucket(server.client(), f"{ctx.folder.name}/{NAME}")
    try:
        holder = ctx.train(server.env(proxy.url), ctx.node("holder"), RAYRL_LOCK_STALE_S=str(stale))
        wait_steady(holder, bucket)
        t_fault = time.time()
        proxy.down()  # the holder's node is cut off from the store
        rc = finish(holder, stale * 3)
        t_exit = holder.ended or time.time()
        held_after = [r for r in holder.rows() if r.t > t_fault]
        # A taker on another node may win once the lease ran out (stale_s after the last renewal).
        time.sleep(max(0.0, t_fault + stale - time.time()))
        left = [f"{name} ({pid})" for pid, name in session_members(holder.proc.pid)]  # still alive then
        writers = [p for p in left if not any(agent in p for agent in RAY_AGENTS)]
        proxy.up()  # ... and the partition heals: anything the old holder still sends gets through
        t_heal = time.time()
        taker = ctx.train(server.env(), ctx.node("taker"), RAYRL_LOCK_STALE_S=str(stale))
        t_gone = t_heal if not writers else None
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while taker.poll() is None and time.monotonic() < deadline:
            if t_gone is None and not [p for p in writers if int(p.rsplit("(", 1)[1][:-1]) in holder.session()]:
                t_gone = time.time()
            time.sleep(0.2)
        finish(taker, 1)
        stale_puts = len([t for t in proxy.put_times if t > t_heal])
        out = outcome(
            ctx,
            bucket,
            t_fault,
            t_heal,
            {},
            {
                "lock_stale_s": stale,
                "holder_exit": rc,
                "holder_stop_s": round(t_exit - t_fault, 2),
                "holder_processes_left_at_lease_end": left,
                "holder_writers_left_at_lease_end": writers,
                "holder_writers_gone_s": round(t_gone - t_fault, 2) if t_gone is not None else None,
                "holder_iterations_after_cut": len(held_after),
                "holder_puts_after_heal": stale_puts,
                "took_over": "took over a stale lock" in taker.text("out"),
                "message": error_paragraph(holder.text()),
            },
        )
    finally:
        bucket.stop()
        proxy.close()
        server.close()
    checks = [
        (
            out["holder_exit"] == LOST_EXIT and "lost its lock" in out["message"],
            "the holder exited 3 with the paragraph",
        ),
        (
            not out["holder_writers_left_at_lease_end"],
            f"its driver and workers were gone when a taker could win ({stale:g} s after the cut)",
        ),
        (out["holder_puts_after_heal"] == 0, "nothing of the old holder reached the store after the heal"),
        (out["took_over"], "the taker took the name over"),
        (out["exit_codes"][-1] == 0 and (out["first_iteration_after"] or 0) > 1, "the taker resumed and finished"),
        (whole(out), "the bucket is whole"),
    ]
    return judged(out, checks)


def sigkill_upload(ctx: Ctx) -> dict:
    server = Moto()
    bucket = Bucket(server.client(), f"{ctx.folder.name}/{NAME}")
    try:
        node = ctx.node("node")
        run = ctx.train(server.env(), node)
        wait_steady(run, bucket)
        deadline = time.monotonic() + 120
        while not (queued := queued_now(bucket, node["tier1"])):
            if run.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("no checkpoint was ever in tier 1 and not in the bucket: nothing to kill between")
            time.sleep(0.1)
        t_fault = run.kill()
        there = bucket.manifests()  # an upload may have ended just before the kill
        bucket.at_fault = sorted(there)
        queued = {i: tags for i, tags in queued.items() if there.get(i) not in tags}
        still_tier1 = sorted(set(queued) & set(tier1_manifests(node["tier1"])))
        finish(ctx.train(server.env(), node))
        if not queued:
            raise RuntimeError("the queued upload landed before the kill took effect: measure it again")
        out = outcome(ctx, bucket, t_fault, t_fault, queued, {"queued_in_tier1_after_kill": still_tier1})
    finally:
        bucket.stop()
        server.close()
    restored = out["restored_checkpoint"]
    # Queued ones after the restored checkpoint were trained again (counted as redone), their index saved anew.
    owed = [i for i in out["queued_at_fault"] if restored is not None and i <= restored]
    checks = [
        (out["exit_codes"][-1] == 0, "the same command finished"),
        (restored is not None, "it resumed from a checkpoint"),
        (whole(out), "the bucket is whole"),
        (
            all(f"checkpoint_{i:06d}" in out["queued_landed_after_s"] for i in owed),
            "the tier-1 copies it resumed from (or older) reached the bucket after the restart",
        ),
    ]
    return judged(out, checks)


def whole(out: dict) -> bool:
    """The bucket holds every run-folder file, the newest checkpoints complete, and every history row
    older than the 10 s history.csv may lag."""
    b = out["bucket"]
    return not b["missing"] and not b["incomplete_checkpoints"] and not out["history_rows_lost_late"]


def judged(out: dict, checks: list[tuple[bool, str]]) -> dict:
    """``out`` with its verdict: ok when every check of the promise held, else FAIL and the ones that did not."""
    failed = [what for held, what in checks if not held]
    out["checks"] = [{"check": what, "held": bool(held)} for held, what in checks]
    out["verdict"] = "FAIL" if failed else "ok"
    out["why"] = "; ".join(f"not: {w}" for w in failed)
    return out


@dataclass(frozen=True)
class Fault:
    name: str
    what: str  #: the fault as the table names it
    injected: Callable[[argparse.Namespace], str]  #: how it was injected, with its figures
    promise: str  #: what the docs promise for it (the checks of its function)
    run: Callable[[Ctx], dict]


FAULTS = {
    f.name: f
    for f in (
        Fault(
            "node_wiped",
            "node-local tier wiped mid-run",
            lambda a: "driver, Ray and trial SIGKILLed, HOME, mirror and tier 1 deleted; same command, fresh node",
            "resumes from the bucket alone (bytes downloaded), from a checkpoint; at most keep - 1 queued "
            "checkpoints lost; the bucket whole",
            node_wiped,
        ),
        Fault(
            "s3_down",
            "S3 server down",
            lambda a: f"every connection refused for {a.outage_s:g} s",
            "uploads retried with backoff, training goes on; nothing lost",
            s3_down,
        ),
        Fault(
            "s3_slow",
            "S3 slow",
            lambda a: f"each PUT held {a.put_delay_s:g} s, for {a.slow_s:g} s",
            "training waits only for the local write (then the back-pressure); nothing lost",
            s3_slow,
        ),
        Fault(
            "access_denied",
            "permanent AccessDenied",
            lambda a: "explicit Deny on s3:* for the run's IAM user; given back after the stop",
            "stops with one paragraph naming the refusal, no training on; the same command resumes once fixed",
            access_denied,
        ),
        Fault(
            "disk_full",
            "tier-1 disk full",
            lambda a: "tier 1 on a 16 MB tmpfs, filled; freed after the stop",
            "one paragraph (the disk is full), exit 1, no crash loop; resumes once space is freed",
            disk_full,
        ),
        Fault(
            "lock_partition",
            "lock holder partitioned past its lease",
            lambda a: f"holder cut off from S3 (lease {a.lock_stale_s:g} s); a taker on another node after the lease",
            "the holder stops (exit 3) before its lease can be taken, writes nothing more; the taker resumes",
            lock_partition,
        ),
        Fault(
            "sigkill_upload",
            "SIGKILL between a local write and its upload",
            lambda a: "driver, Ray and trial SIGKILLed while a checkpoint was in tier 1 only; same command, same node",
            "resumes from the newest complete checkpoint; the bucket whole",
            sigkill_upload,
        ),
    )
}


# ---- the table --------------------------------------------------------------------------------

HEADERS = [
    "fault",
    "injected",
    "files lost",
    "iterations redone",
    "env steps redone",
    "recovery (s)",
    "longest pause (s)",
    "promise kept",
]


def _num(value: Any) -> Any:
    return "-" if value is None else value


def table_rows(rows: Sequence[dict]) -> list[list[Any]]:
    """One line per fault for :func:`benchmarks.common.table`."""
    out = []
    for r in rows:
        if r.get("verdict") in ("skipped", "error"):
            out.append(
                [r["what"], r.get("injected", ""), "-", "-", "-", "-", "-", f"{r['verdict']}: {r.get('why', '')}"]
            )
            continue
        lost = str(r["files_lost"]) + (f" ({'; '.join(r['lost'])})" if r["lost"] else "")
        if r.get("recovery_s") is not None:
            recovery = f"{r['recovery_s']:.1f}"
        else:
            recovery = "never" if r.get("recovery_to") == "training again" else r.get("recovery_to") or "-"
        if r.get("recovery_to") == "clear stop" and r.get("recovery_s") is not None:
            recovery += " to the stop"
        verdict = r["verdict"] + (f" ({r['why']})" if r.get("why") else "")
        out.append(
            [
                r["what"],
                r["injected"],
                lost,
                _num(r["iterations_redone"]),
                _num(r["env_steps_redone"]),
                recovery,
                f"{r['longest_pause_s']:.1f}",
                verdict,
            ]
        )
    return out


# ---- the command ------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from rayrl.args import Parser

    p = Parser(
        prog="python -m benchmarks.fault_table",
        description=__doc__.split("\n\n")[0],
        epilog="faults: "
        + "; ".join(f"{f.name} ({f.what})" for f in FAULTS.values())
        + ". Run it niced beside other work: nice -n 19 python -m benchmarks.fault_table --out F.json",
    )
    p.add_argument("--out", type=Path, default=None, help="write the rows and the machine as JSON here")
    p.add_argument(
        "--faults",
        default=",".join(FAULTS),
        help="comma-separated faults to measure, in this order (default: all seven)",
    )
    p.add_argument(
        "--work",
        type=Path,
        default=Path(tempfile.gettempdir()) / "rayrl-fault-table",
        help="scratch folder; a fault with WORK/FAULT/row.json is kept, not measured again (default %(default)s)",
    )
    p.add_argument(
        "--iters",
        type=int,
        default=80,
        help="iterations each run trains in all (default %(default)s: a fault waits until Tune has saved "
        "its state in the bucket, and a 40-iteration run once ended first)",
    )
    p.add_argument("--outage-s", type=float, default=30.0, help="s3_down: seconds refused (default %(default)s)")
    p.add_argument(
        "--put-delay-s", type=float, default=5.0, help="s3_slow: seconds each PUT is held (default %(default)s)"
    )
    p.add_argument(
        "--slow-s", type=float, default=60.0, help="s3_slow: seconds the store is slow (default %(default)s)"
    )
    p.add_argument(
        "--lock-stale-s",
        type=float,
        default=12.0,
        help="lock_partition: the lease (RAYRL_LOCK_STALE_S; rayrl's default is 120) (default %(default)s)",
    )
    args = p.parse_args(argv)
    names = [n.strip() for n in args.faults.split(",") if n.strip()]
    unknown = [n for n in names if n not in FAULTS]
    if unknown or not names:
        p.error(
            f"--faults: {', '.join(map(repr, unknown)) or 'nothing'} is not a fault this benchmark knows; "
            f"give a comma-separated list of {', '.join(FAULTS)}."
        )
    args.names = list(dict.fromkeys(names))
    if args.iters < STEADY_ROWS + 4:
        p.error(f"--iters: {args.iters} leaves no iterations after the fault; give at least {STEADY_ROWS + 4}.")
    for flag, value, low in (
        ("--outage-s", args.outage_s, 0.0),
        ("--slow-s", args.slow_s, 0.0),
        ("--put-delay-s", args.put_delay_s, 0.0),
        ("--lock-stale-s", args.lock_stale_s, 4.0),
    ):
        if not value > low or value != value or value > 3600:
            p.error(f"{flag}: {value:g} is out of range; give seconds above {low:g} and at most 3600.")
    if args.work.exists() and not args.work.is_dir():
        p.error(f"--work: {str(args.work)!r} exists and is not a folder; give a folder (it is created if missing).")
    if args.out is not None and args.out.is_dir():
        p.error(f"--out: {str(args.out)!r} is a folder; give the path of the JSON file to write.")
    if _moto_server() is None:
        p.error("moto_server is not installed, and every fault runs against it; pip install 'moto[server]'.")
    return args


def measure(fault: Fault, args: argparse.Namespace, key_file: Path) -> dict:
    """One fault's row: kept from WORK/FAULT/row.json when there, else measured and written there."""
    folder = args.work / fault.name
    saved = folder / "row.json"
    if saved.exists():
        C.say(f"[{fault.name}] kept from {saved} (delete {folder} to measure it again)")
        return json.loads(saved.read_text())
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    ctx = Ctx(folder, args, key_file)
    C.say(f"[{fault.name}] {fault.what}: {fault.injected(args)}")
    start = time.time()
    try:
        row = fault.run(ctx)
    except Exception as exc:  # noqa: BLE001 - one fault's failure is its row, the table goes on
        row = {"verdict": "error", "why": f"{type(exc).__name__}: {exc}"[:500]}
    finally:
        for run in ctx.runs:
            run.close()
    row = {"fault": fault.name, "what": fault.what, "injected": fault.injected(args), "promise": fault.promise, **row}
    row["wall_s"] = round(time.time() - start, 1)
    C.say(f"[{fault.name}] {row['verdict']} in {row['wall_s']:.0f}s" + (f": {row['why']}" if row.get("why") else ""))
    if row["verdict"] != "error":  # an error is measured again next time
        C.write_json(saved, row, quiet=True)
    return row


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    key_file = args.work / "storage.key"  # one signing key for every node: a fresh node verifies
    if not key_file.exists():
        key_file.write_bytes(os.urandom(32).hex().encode())
    key_file.chmod(0o600)
    rows = [measure(FAULTS[name], args, key_file) for name in args.names]
    print(C.table(HEADERS, table_rows(rows)))
    settings = {k: v for k, v in vars(args).items() if k not in ("names",)}
    C.write_json(
        args.out,
        {
            "machine": C.machine(),
            "settings": {**settings, "faults": args.names, "batch": BATCH, "keep": KEEP},
            "rows": [{k: v for k, v in r.items()} for r in rows],
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
