"""Where runs live and how a process joins Ray: shared by `rayrl train` and the sweep."""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from rayrl import trust
from rayrl.spec import SpecError

REMOTE_SCHEMES = ("s3://", "gs://", "gcs://", "abfs://", "hdfs://")


@dataclass(frozen=True)
class RunPaths:
    """``storage`` is what Tune gets; ``run_dir`` is the local run folder rayrl writes its files to."""

    storage: str
    name: str
    run_dir: Path
    remote: bool


def resolve(storage: str, name: str, allow_shared: bool = False) -> RunPaths:
    """Check the storage path and the name before any Ray work; create the local run folder.

    Remote storage (s3://, gs://) is handed to Tune as is; rayrl's own files (CSV, JSON, YAML)
    are then kept in a local mirror under ~/.rayrl/runs/NAME and also copied to the bucket at the
    end of the run.
    """
    trust.check_name(name)
    if not name or "/" in name or name in (".", "..") or name.strip() != name:
        raise SpecError(f"--name: {name!r} is not a valid run name; use letters, digits, '-', '_' or '.' "
                        "with no '/' or surrounding spaces.")
    if storage.startswith(REMOTE_SCHEMES):
        run_dir = Path.home() / ".rayrl" / "runs" / name
        run_dir.mkdir(parents=True, exist_ok=True)
        return RunPaths(storage.rstrip("/"), name, run_dir, True)
    if "://" in storage:
        raise SpecError(f"--storage: {storage!r} uses an unsupported scheme; give a local folder or one of "
                        f"{', '.join(REMOTE_SCHEMES)}.")
    root = Path(storage).expanduser().resolve()
    trust.check_run_dir(root / name, allow_shared)
    try:
        root.mkdir(parents=True, exist_ok=True)
        (root / name).mkdir(exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=root / name, prefix=".write-test-"):
            pass
    except OSError as exc:
        raise SpecError(f"--storage: {str(root)!r} is not a writable folder ({exc.strerror or exc}); give a "
                        "folder you can write to, or an s3:// / gs:// URI.") from None
    return RunPaths(str(root), name, root / name, False)


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


def init_ray(address: str | None = None, num_cpus: int | None = None) -> None:
    """Join the cluster this process runs in (`ray job submit`, RAY_ADDRESS) or start a local Ray.

    Token authentication stays as Ray sets it up (on by default for local clusters).
    """
    import ray

    # Frequent small checkpoints are rayrl's choice (recovery loses less); don't warn about them.
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    if ray.is_initialized():
        return
    kwargs: dict = {"log_to_driver": os.environ.get("RAYRL_WORKER_LOGS", "0") == "1"}
    joining = address is not None or os.environ.get("RAY_ADDRESS")
    if not joining and num_cpus is not None:
        # An explicit CPU count means a new local Ray, never a stale `ray start` head on this host.
        address, kwargs["num_cpus"] = "local", num_cpus
    elif not joining and not _recorded_head_alive():
        address = "local"  # Ray would otherwise wait forever on a head that was killed, not stopped
    if not joining and os.environ.get("RAYRL_DASHBOARD") == "0":
        kwargs["include_dashboard"] = False
    if address == "local":
        # A Ray of this machine alone listens on loopback only: GCS, raylet, agents, workers and the
        # metrics endpoint (Ray binds that one to all interfaces unless the node IP is loopback).
        kwargs["_node_ip_address"] = "127.0.0.1"
    ray.init(address=address, **kwargs)


def record_posture(paths: RunPaths) -> None:
    """posture.json: the security posture of the Ray this run joined (the report judges it)."""
    from rayrl import posture

    write_json(paths.run_dir / "posture.json", posture.record(paths.run_dir, paths.storage))


def write_json(path: Path, data: dict) -> None:
    """Write a run-folder JSON file atomically: a kill mid-write leaves the old file, never a torn one.

    Values JSON does not know (numpy scalars, paths) are written as their str().
    """
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str))
    tmp.replace(path)
