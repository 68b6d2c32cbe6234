"""Where runs live and how a process joins Ray: shared by `rayrl train` and the sweep."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from rayrl.errors import SpecError
from rayrl.security import trust
from rayrl.storage import leases
from rayrl.storage.files import write_local
from rayrl.storage.lock import RunLock
from rayrl.storage.mirror import RunStore, mirror_dir
from rayrl.storage.uri import Location, check_writable, parse


@dataclass(frozen=True)
class RunPaths:
    """Where one run lives.

    ``storage`` is the --storage URI or folder as given; ``root`` the same as a pyarrow filesystem and
    path (what Tune gets); ``run_dir`` the local folder rayrl writes its files to: the run folder
    itself on local storage, a mirror on object storage, whose writes ``store`` also uploads.
    """

    storage: str
    name: str
    run_dir: Path
    remote: bool
    root: Location | None = None

    @property
    def location(self) -> Location:
        """The run folder itself (STORAGE/NAME) on its filesystem."""
        return (self.root or parse(self.storage)).child(self.name)

    @property
    def store(self) -> RunStore:
        return RunStore(self.location, self.run_dir)

    def tune_storage(self) -> dict:
        """Tune's RunConfig storage arguments: the run folder on its filesystem."""
        loc = self.location
        return {"storage_path": loc.path, "storage_filesystem": None if loc.local else loc.fs}

    def experiment(self, subdir: str) -> tuple[str, object]:
        """(path, filesystem or None) of one of Tune's experiments in this run folder."""
        loc = self.location
        return loc.join(subdir), None if loc.local else loc.fs

    def write_text(self, rel: str, text: str) -> None:
        """Write a run-folder file atomically (and upload it on object storage)."""
        self.store.write_text(rel, text)

    def write_json(self, rel: str, data: dict) -> None:
        self.store.write_text(rel, json.dumps(data, indent=2, default=str))


def resolve(storage: str, name: str, allow_shared: bool = False) -> RunPaths:
    """Check the storage (local folder or URI) and the name before any Ray work; create the run folder.

    Object storage: rayrl's own files (CSV, JSON, YAML) are written to a local mirror (see
    rayrl.storage.mirror) and uploaded to STORAGE/NAME as each is written.
    """
    trust.check_name(name)
    if not name or "/" in name or name in (".", "..") or name.strip() != name or "?" in name:
        raise SpecError(
            f"--name: {name!r} is not a valid run name; use letters, digits, '-', '_' or '.' "
            "with no '/' or surrounding spaces."
        )
    root = parse(storage)
    run = root.child(name)
    if root.local:  # nothing is followed or created before the trust check
        trust.check_run_dir(Path(run.path), allow_shared)
    check_writable(run)
    leases.for_location(run)  # what the run lock needs (boto3 for s3://) is checked before any Ray work
    run_dir = Path(run.path) if root.local else mirror_dir(run)
    run_dir.mkdir(parents=True, exist_ok=True)
    return RunPaths(root.uri, name, run_dir, not root.local, root)


@contextlib.contextmanager
def claim(paths: RunPaths) -> Iterator[RunLock]:
    """Hold the run's lock (exit 2 via LockHeld when another live run has it) and bring the mirror
    up to date from the bucket, for the length of one run."""
    loc = paths.location
    with RunLock.at(loc) as lock:
        if lock.took_over:
            print(f"[rayrl] {loc.uri}: took over a stale lock ({lock.took_over})", flush=True)
        if paths.remote:
            pulled = paths.store.pull()
            if pulled:
                print(f"[rayrl] {loc.uri}: resuming from the bucket's run folder ({len(pulled)} files)", flush=True)
        yield lock


def _recorded_head_alive() -> bool:
    """Whether the head `ray start` last recorded on this host (which ray.init() joins) answers.

    A head killed without `ray stop` leaves its address behind, and ray.init() then hangs on it.
    """
    import socket

    recorded = Path(os.environ.get("RAY_TMPDIR", "/tmp")) / "ray" / "ray_current_cluster"
    try:
        host, _, port = recorded.read_text().strip().rpartition(":")
        with socket.create_connection((host, int(port)), timeout=2):
            return True
    except (OSError, ValueError):
        return False


def init_ray(address: str | None = None, num_cpus: int | None = None) -> bool:
    """Join the cluster this process runs in (`ray job submit`, RAY_ADDRESS) or start a local Ray.

    Token authentication stays as Ray sets it up (on by default for local clusters). Returns True
    when this call started a local Ray (its size is fixed: no autoscaler adds nodes).
    """
    import ray

    # Frequent small checkpoints are rayrl's choice (recovery loses less); don't warn about them.
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    if ray.is_initialized():
        return False
    kwargs: dict = {"log_to_driver": os.environ.get("RAYRL_WORKER_LOGS", "0") == "1"}
    joining = address is not None or os.environ.get("RAY_ADDRESS")
    if not joining and num_cpus is not None:
        # An explicit CPU count means a new local Ray, never a stale `ray start` head on this host.
        address, kwargs["num_cpus"] = "local", num_cpus
    elif not joining and not _recorded_head_alive():
        address = "local"  # Ray would otherwise wait forever on a head that was killed, not stopped
    if not joining and os.environ.get("RAYRL_DASHBOARD") == "0":
        kwargs["include_dashboard"] = False
    ray.init(address=address, **kwargs)
    return address == "local"


def record_posture(paths: RunPaths) -> None:
    """posture.json: the security posture of the Ray this run joined (the report judges it)."""
    from rayrl.security import posture

    paths.write_json("posture.json", posture.record(paths.run_dir, paths.storage))


def write_json(path: Path, data: dict) -> None:
    """Write a local JSON file atomically (temp + fsync + rename): a kill or a full disk mid-write
    leaves the old file, never a torn one. Values JSON does not know are written as their str().
    """
    write_local(path, json.dumps(data, indent=2, default=str).encode())


def cluster_resources() -> dict[str, float]:
    """The connected Ray cluster's total resources (CPU, GPU, ...)."""
    import ray

    return dict(ray.cluster_resources())
