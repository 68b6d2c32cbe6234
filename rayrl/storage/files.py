"""Atomic file writes, reads and listings on any pyarrow filesystem: every run-folder file goes through here.

Local disk: write a temporary file in the same folder, fsync it, rename it over the target, fsync
the folder; a kill or a full disk at any moment leaves the old file whole. Object storage: one
upload per file; the object appears only when the upload completes, so readers see the old object
or the new one, never a part. A failed write raises :class:`StorageError`, whose text says what
happened, that existing files are intact, and how to go on.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path
from typing import Any

FULL = (errno.ENOSPC, errno.EDQUOT)
MIN_FREE_MB = float(os.environ.get("RAYRL_MIN_FREE_MB", "32"))  # below this a run stops (rayrl.storage.guard)


class StorageError(OSError):
    """A run-folder file could not be written; the message is one paragraph for the user."""


def _is_local(fs: Any) -> bool:
    from pyarrow import fs as pafs

    return isinstance(fs, pafs.LocalFileSystem)


def failure(path: str, exc: BaseException, doing: str = "write") -> StorageError:
    """The user-facing error for a failed write of ``path``."""
    code = getattr(exc, "errno", None)
    if code in FULL:
        detail = getattr(exc, "strerror", None)
        what = "the disk (or quota) is full" + (f" ({detail})" if detail else "")
        fix = "free space (or raise the quota)"
    else:
        what = (getattr(exc, "strerror", None) or str(exc) or type(exc).__name__).strip().splitlines()[0][:300]
        fix = "fix the storage (permissions, credentials, network)"
    err = StorageError(
        code or errno.EIO,
        f"could not {doing} {path}: {what}. Every file already in the run folder is "
        f"intact and readable (rayrl writes a temporary file and renames it). {fix.capitalize()}, then "
        "run the same command again: the run resumes from its last checkpoint.",
    )
    err.filename = path
    return err


def _fsync_dir(folder: str) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_local(path: str | Path, data: bytes) -> None:
    """temp + fsync + rename + fsync(folder) on the local disk; StorageError on failure, old file kept."""
    path = str(path)
    folder = os.path.dirname(path) or "."
    tmp = os.path.join(folder, f".{os.path.basename(path)}.tmp-{os.getpid()}")
    try:
        os.makedirs(folder, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise failure(path, exc) from None
    _fsync_dir(folder)


def write_bytes(fs: Any, path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` on ``fs`` atomically (see the module docstring)."""
    if _is_local(fs):
        write_local(path, data)
        return
    try:
        parent = path.rsplit("/", 1)[0]
        fs.create_dir(parent, recursive=True)
        with fs.open_output_stream(path) as out:  # one object, visible when the upload completes
            out.write(data)
    except Exception as exc:
        raise failure(path, exc) from None


def write_text(fs: Any, path: str, text: str) -> None:
    write_bytes(fs, path, text.encode())


def append_line(path: str | Path, line: str, header: str | None = None) -> None:
    """Append one line to a local file in one write, fsync'd; on failure cut back to the old length.

    For history.csv, which grows by a row per result: rewriting it whole each time would cost
    O(rows) per result; a failed append (full disk) is undone, so the file never ends in half a row.
    """
    path = str(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    size = os.fstat(fd).st_size
    try:
        data = ((header if size == 0 and header else "") + line).encode()
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    except OSError as exc:
        try:
            os.ftruncate(fd, size)
        except OSError:
            pass
        raise failure(path, exc) from None
    finally:
        os.close(fd)


def free_mb(folder: str | Path) -> float | None:
    """Free megabytes on the disk holding ``folder`` (None when it cannot be told)."""
    try:
        return shutil.disk_usage(folder).free / 2**20
    except OSError:
        return None


def low_space(folder: str | Path, min_free_mb: float = MIN_FREE_MB) -> StorageError | None:
    """The error to stop with when the disk holding ``folder`` has less than ``min_free_mb`` free."""
    free = free_mb(folder)
    if free is None or free >= min_free_mb:
        return None
    return failure(
        str(folder), OSError(errno.ENOSPC, f"{free:.1f} MB free, below {min_free_mb:g} MB"), doing="keep writing to"
    )


def explain(exc: BaseException, folder: str | Path) -> StorageError | None:
    """A StorageError for ``exc`` when it came from a full disk (anywhere in its chain, or the run
    folder's disk is now nearly full); None for any other failure, which the caller re-raises.

    Tune's own code fails on a full disk in ways rayrl cannot catch at the write (an EOFError
    reading a trial's error file); this turns those into the same one paragraph.
    """
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, StorageError):
            return seen
        if getattr(seen, "errno", None) in FULL:
            return failure(getattr(seen, "filename", None) or str(folder), seen)
        seen = seen.__cause__ or seen.__context__
    return low_space(folder)


def read_bytes(fs: Any, path: str) -> bytes:
    with fs.open_input_stream(path) as f:
        return f.read()


def exists(fs: Any, path: str) -> bool:
    from pyarrow import fs as pafs

    return fs.get_file_info(path).type != pafs.FileType.NotFound


def is_file(fs: Any, path: str) -> bool:
    from pyarrow import fs as pafs

    return fs.get_file_info(path).type == pafs.FileType.File


def list_files(fs: Any, folder: str, recursive: bool = False) -> list[str]:
    """Paths of the files below ``folder`` relative to it ('' folder missing -> [])."""
    from pyarrow import fs as pafs

    selector = pafs.FileSelector(folder, allow_not_found=True, recursive=recursive)
    base = folder.rstrip("/") + "/"
    return sorted(i.path[len(base) :] for i in fs.get_file_info(selector) if i.type == pafs.FileType.File)


def delete(fs: Any, path: str) -> None:
    try:
        fs.delete_file(path)
    except (FileNotFoundError, OSError):
        pass
