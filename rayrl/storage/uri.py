"""A storage URI -> (pyarrow filesystem, path): the one place rayrl turns --storage into a filesystem.

Local folders, ``file://`` and ``s3://`` (AWS and S3-compatible servers): the stores where rayrl
writes each file atomically and takes the run lock with conditional writes (rayrl.storage.leases).
Other pyarrow schemes are refused by name (:data:`REFUSED`). Ray Tune
takes the same pair (``storage_path`` + ``storage_filesystem``), so rayrl's own files and Tune's
experiments land in the same place. An S3-compatible endpoint (MinIO, Ceph, moto) is given the
usual ways: ``AWS_ENDPOINT_URL`` in the environment, or ``?endpoint_override=HOST:PORT&scheme=http``
on the URI (pyarrow's query parameters).
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from rayrl.errors import SpecError

OBJECT_SCHEMES = ("s3",)
SCHEMES = ("file", "s3")
#: Schemes pyarrow opens that rayrl refuses, and why (what rayrl's promises would need there).
REFUSED = {
    "hdfs": "a write there is not atomic (an interrupted write leaves a partial file) and it has no conditional "
    "create for the run lock",
    "viewfs": "a write there is not atomic (an interrupted write leaves a partial file) and it has no conditional "
    "create for the run lock",
    "abfs": "rayrl has no tested atomic write or conditional-create lock for Azure Data Lake",
    "abfss": "rayrl has no tested atomic write or conditional-create lock for Azure Data Lake",
    "gs": "rayrl's run lock needs GCS's generation preconditions, which rayrl does not implement yet (no "
    "local GCS server to test them against)",
    "gcs": "rayrl's run lock needs GCS's generation preconditions, which rayrl does not implement yet (no "
    "local GCS server to test them against)",
}


@dataclass(frozen=True)
class Location:
    """Where a folder lives: ``fs`` and ``path`` for pyarrow and Tune; ``uri`` to show and to rebuild."""

    uri: str
    fs: Any  # pyarrow.fs.FileSystem
    path: str
    local: bool

    def join(self, *parts: str) -> str:
        """A path below this location, on its filesystem."""
        return "/".join([self.path.rstrip("/"), *(p.strip("/") for p in parts if p)])

    def child(self, *parts: str) -> Location:
        """The location of a sub-folder (same filesystem; the URI keeps its query)."""
        base, _, query = self.uri.partition("?")
        uri = "/".join([base.rstrip("/"), *(p.strip("/") for p in parts if p)]) + (f"?{query}" if query else "")
        return Location(uri, self.fs, self.join(*parts), self.local)


def is_uri(value: str | os.PathLike) -> bool:
    """Whether ``value`` names a URI (scheme://...) rather than a local path."""
    return "://" in str(value)


def s3_endpoint(uri: str) -> tuple[str | None, str]:
    """(endpoint URL or None for AWS, region) of an s3:// URI: its query, else AWS_ENDPOINT_URL(_S3).

    The one rule for where an S3 URI points, used by the pyarrow filesystem and the boto3 client alike.
    """
    parts = urlsplit(uri)
    query = dict(parse_qsl(parts.query))
    endpoint = (
        query.get("endpoint_override") or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    )
    region = query.get("region") or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    if endpoint and "://" not in endpoint:
        endpoint = f"{query.get('scheme') or 'https'}://{endpoint}"
    return (endpoint.rstrip("/") if endpoint else None), region


def _s3_filesystem(parts: Any) -> tuple[Any, str]:
    """S3 with the endpoint and region of :func:`s3_endpoint`; AWS itself when there is no endpoint."""
    from pyarrow import fs as pafs

    endpoint, region = s3_endpoint(parts.geturl())
    if not endpoint:
        return pafs.FileSystem.from_uri(parts.geturl())
    scheme, _, host = endpoint.partition("://")
    query = dict(parse_qsl(parts.query))
    s3 = pafs.S3FileSystem(
        endpoint_override=host,
        scheme=scheme,
        region=region,
        allow_bucket_creation=query.get("allow_bucket_creation") == "true",
    )
    return s3, (parts.netloc + parts.path).rstrip("/")


def parse(storage: str | os.PathLike) -> Location:
    """Turn --storage (or a run folder given as a URI) into a :class:`Location`; clear SpecError if bad.

    Nothing is created or contacted here beyond what building the filesystem needs.
    """
    from pyarrow import fs as pafs

    text = str(storage).strip()
    if not text:
        raise SpecError("--storage: empty; give a local folder or a URI such as s3://BUCKET/PREFIX.")
    if not is_uri(text):
        root = str(Path(text).expanduser().resolve())
        return Location(root, pafs.LocalFileSystem(), root, True)
    parts = urlsplit(text)
    scheme = parts.scheme.lower()
    if scheme in REFUSED:
        raise SpecError(
            f"--storage: {text!r}: rayrl does not run on {scheme}:// storage: {REFUSED[scheme]}, so two runs "
            "could share one folder or a crash could leave a torn file. Give a local (or shared) folder, or "
            "s3://BUCKET/PREFIX (AWS S3, or an S3-compatible server such as MinIO or Ceph via AWS_ENDPOINT_URL)."
        )
    if scheme not in SCHEMES:
        raise SpecError(
            f"--storage: {text!r} uses the scheme {scheme + '://'!r}, which rayrl does not know; give a "
            f"local folder or a URI with one of {', '.join(s + '://' for s in SCHEMES)}."
        )
    if scheme == "file":
        root = str(Path(parts.path).resolve())
        return Location(root, pafs.LocalFileSystem(), root, True)
    if scheme in OBJECT_SCHEMES and not parts.netloc:
        raise SpecError(f"--storage: {text!r} names no bucket; write {scheme}://BUCKET or {scheme}://BUCKET/PREFIX.")
    try:
        fs, path = _s3_filesystem(parts)
    except Exception as exc:  # pyarrow raises ArrowInvalid, OSError, ... with a useful text
        raise SpecError(
            f"--storage: {text!r} cannot be opened as a filesystem ({_first_line(exc)}); check the "
            "URI, the credentials (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, ~/.aws, the instance "
            "role) and, for an S3-compatible server, AWS_ENDPOINT_URL or "
            "?endpoint_override=HOST:PORT&scheme=http."
        ) from None
    return Location(text.rstrip("/"), fs, path.rstrip("/"), False)


def check_writable(loc: Location) -> None:
    """Create the folder and write + delete one probe file; SpecError naming the URI if that fails.

    Runs before any Ray work, so a typo in a bucket name costs one paragraph, not a started cluster.
    """
    probe = loc.join(f".rayrl-write-test-{uuid.uuid4().hex[:8]}")
    try:
        loc.fs.create_dir(loc.path, recursive=True)
        with loc.fs.open_output_stream(probe) as out:
            out.write(b"ok")
        loc.fs.delete_file(probe)
    except Exception as exc:
        where = "folder you can write to" if loc.local else "bucket and prefix your credentials may write to"
        raise SpecError(
            f"--storage: {loc.uri!r} is not writable ({_first_line(exc)}); give a {where}. For "
            "object storage check the bucket name, the credentials and, for an S3-compatible "
            "server, AWS_ENDPOINT_URL or ?endpoint_override=HOST:PORT&scheme=http."
        ) from None


def _first_line(exc: BaseException) -> str:
    text = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    return text.strip().splitlines()[0][:300]
