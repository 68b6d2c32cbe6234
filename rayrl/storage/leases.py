"""Compare-and-swap on one small object: what makes the run lock exclusive on every store rayrl accepts.

Each store offers the same four operations on the lock file, with a *version* that changes on
every write (S3's ETag, a content hash on a local disk):

* ``read``: the content, its version and its age by the store's own clock (so a client's clock
  skew cannot make a live lock look old);
* ``create``: write only if nothing is there (S3 ``If-None-Match: *``; local: under ``flock`` of the
  run folder);
* ``replace``: write only if the version is still the one read (S3 ``If-Match``; local: compared
  under the same ``flock``);
* ``delete``: the same condition.

A lost race is an ordinary answer (``None``/``False``), never an exception; network errors raise.
"""

from __future__ import annotations

import contextlib
import email.utils
import fcntl
import hashlib
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from rayrl.errors import SpecError
from rayrl.storage import files
from rayrl.storage.uri import s3_endpoint


@dataclass(frozen=True)
class Seen:
    """One read of the lock file."""

    data: bytes
    version: str
    age_s: float  #: seconds since the last write, by the store's clock


class LeaseStore(Protocol):
    def read(self) -> Seen | None: ...
    def create(self, data: bytes) -> str | None: ...
    def replace(self, data: bytes, version: str) -> str | None: ...
    def delete(self, version: str) -> bool: ...


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class LocalLeaseStore:
    """A lock file on a local (or NFS) disk; every check-then-write holds ``flock`` on the run folder."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.folder = os.path.dirname(path) or "."

    @contextlib.contextmanager
    def _guard(self) -> Iterator[None]:
        os.makedirs(self.folder, exist_ok=True)
        fd = os.open(self.folder, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the flock

    def read(self) -> Seen | None:
        try:
            with open(self.path, "rb") as f:
                data = f.read()
                mtime = os.fstat(f.fileno()).st_mtime
        except FileNotFoundError:
            return None
        return Seen(data, _digest(data), max(0.0, time.time() - mtime))

    def create(self, data: bytes) -> str | None:
        with self._guard():
            if os.path.exists(self.path):
                return None
            files.write_local(self.path, data)
        return _digest(data)

    def replace(self, data: bytes, version: str) -> str | None:
        with self._guard():
            seen = self.read()
            if seen is None or seen.version != version:
                return None
            files.write_local(self.path, data)
        return _digest(data)

    def delete(self, version: str) -> bool:
        with self._guard():
            seen = self.read()
            if seen is None or seen.version != version:
                return False
            os.unlink(self.path)
        return True


class S3LeaseStore:
    """The lock object on S3 (or an S3-compatible server) with conditional PUT and DELETE."""

    def __init__(self, client: Any, bucket: str, key: str) -> None:
        self.client, self.bucket, self.key = client, bucket, key

    @classmethod
    def for_uri(cls, uri: str, path: str, timeout_s: float = 10.0) -> S3LeaseStore:
        try:
            import boto3
        except ImportError:
            raise SpecError(
                f"--storage: {uri!r} is on S3, and rayrl's run lock needs boto3 for S3's conditional "
                "writes (If-None-Match / If-Match); install it with pip install 'rayrl[s3]'."
            ) from None
        endpoint, region = s3_endpoint(uri)
        bucket, _, key = path.partition("/")
        from botocore.config import Config

        # Short timeouts and few retries: a renewal that hangs for minutes would outlive the lease.
        config = Config(
            connect_timeout=timeout_s, read_timeout=timeout_s, retries={"max_attempts": 2, "mode": "standard"}
        )
        return cls(boto3.client("s3", endpoint_url=endpoint, region_name=region, config=config), bucket, key)

    @staticmethod
    def _lost(exc: Exception) -> bool:
        code = getattr(exc, "response", {}).get("Error", {}).get("Code")
        # 412: the condition failed; 409: a concurrent conditional write to the same key is in flight.
        return code in ("PreconditionFailed", "ConditionalRequestConflict", "412", "409")

    def read(self) -> Seen | None:
        try:
            got = self.client.get_object(Bucket=self.bucket, Key=self.key)
        except self.client.exceptions.NoSuchKey:
            return None
        data = got["Body"].read()
        date = got["ResponseMetadata"]["HTTPHeaders"].get("date")
        now = email.utils.parsedate_to_datetime(date).timestamp() if date else time.time()
        return Seen(data, got["ETag"], max(0.0, now - got["LastModified"].timestamp()))

    def _put(self, data: bytes, **cond: str) -> str | None:
        try:
            return str(self.client.put_object(Bucket=self.bucket, Key=self.key, Body=data, **cond)["ETag"])
        except Exception as exc:
            if self._lost(exc):
                return None
            raise

    def create(self, data: bytes) -> str | None:
        return self._put(data, IfNoneMatch="*")

    def replace(self, data: bytes, version: str) -> str | None:
        return self._put(data, IfMatch=version)

    def delete(self, version: str) -> bool:
        try:
            self.client.delete_object(Bucket=self.bucket, Key=self.key, IfMatch=version)
        except Exception as exc:
            if self._lost(exc):
                return False
            raise
        return True


def for_location(loc: Any, timeout_s: float = 10.0) -> LeaseStore:
    """The lease store for the lock file of the run folder at ``loc`` (a rayrl.storage.uri.Location:
    a local folder or s3://, the only stores rayrl.storage.uri accepts); ``timeout_s`` per request."""
    from rayrl.storage.lock import LOCK_FILE

    path = loc.join(LOCK_FILE)
    return LocalLeaseStore(path) if loc.local else S3LeaseStore.for_uri(loc.uri, path, timeout_s)
