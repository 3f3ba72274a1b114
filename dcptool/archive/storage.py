"""Where an archive's files live: the calls the archive code makes, each asking the store.

Every other module of `dcptool.archive` (and the pipeline tasks) reaches an archive's files
through this module, so every feature works on every store (`stores/`: a local directory,
an S3 bucket prefix, an in-memory space for tests):

- `location(x)` turns what a user typed (a path, ``s3://BUCKET/PREFIX``, ``mem://NAME``)
  into a location: a `pathlib.Path` for a local directory, an `S3Path` (a `MemPath`) for
  a key prefix. All offer the same small part of pathlib's interface (``/``, ``name``,
  ``parent``, ``exists()``, ``is_dir()``, ``is_file()``, ``read_bytes()``,
  ``read_text()``).
- `store_of(location)` is the location's `Store`; callers ask it what it can do (its
  capabilities: `packs`, `dirs`, `partial_visible`, `deferred_uploads`,
  `needs_credentials`, `lock_leases`, `local`) instead of asking where it lives.
- The functions below (`listdir`, `list_sizes`, `open_read`, `stat_size`, `write_new`,
  `atomic_write_bytes`, `create_exclusive`, `unlink`, `remove_tree`, `make_dir`,
  `sync_dir`, `replace_prefix_bytes`, ...) each hand the call to the location's store.
- A data file stored in a pack (archive/packing.py) is a `Member` location: `open_read`,
  `stat_size` and `file_size` take it, so it is read like the file it would have been.

The store is chosen once per call, from the location's type: nothing here runs per record.
"""
from __future__ import annotations

from typing import Any, BinaryIO

from .stores import (LOCAL, Member, NewFile, S3Path, S3Settings, StorageError, Store,
                     file_size, location, range_held, store_of)
from .stores.base import PACKS, PART_BYTES, UPLOADS, named
from .stores.s3 import SCHEME, held_in_memory, s3_client


def absolute(path: Any) -> Any:
    """The location as any process names it (a local path made absolute)."""
    return store_of(path).absolute(location(path))


# -- reading -------------------------------------------------------------------------------------


def listdir(path: Any) -> list[str]:
    """The names in a directory (objects and sub-prefixes of a prefix); FileNotFoundError
    for a local directory that does not exist (a prefix without objects is empty)."""
    return store_of(path).listdir(path)


def list_sizes(path: Any, *, dirs: bool = False) -> dict[str, int]:
    """{name: size} of the files in a directory (one listing on S3); with dirs=True
    sub-directories too (size -1)."""
    return store_of(path).list_sizes(path, dirs=dirs)


def stat_size(path: Any) -> int:
    return store_of(path).stat(path)


def read_bytes(path: Any) -> bytes:
    return store_of(path).read_bytes(path)


def read_range(path: Any, offset: int, length: int) -> bytes:
    return store_of(path).read_range(path, offset, length)


def open_read(path: Any) -> BinaryIO:
    """A binary file to read (and seek) from; FileNotFoundError when it is missing."""
    return store_of(path).open_read(path)


def identity(path: Any) -> tuple[Any, ...]:
    """What tells one version of a file from another without reading it: device, inode,
    size and mtime of a file; size and ETag of an object (FileNotFoundError when missing)."""
    return store_of(path).identity(path)


def age_seconds(path: Any) -> float:
    """Seconds since the file was last written (FileNotFoundError when missing)."""
    return store_of(path).age_seconds(path)


class pack_cache:
    """A scope in which the members of packs on a remote store are read from whole packs
    fetched once (see stores/base.py PackCache); nestable, for every thread of the process."""

    def __enter__(self) -> "pack_cache":
        PACKS.open()
        return self

    def __exit__(self, *exc: Any) -> None:
        PACKS.close()


# -- writing -------------------------------------------------------------------------------------


def write_new(path: Any, mode: int = 0o600, *, hold: bool = False) -> NewFile:
    """Start writing a new file (FileExistsError locally when it exists). `hold`: a local
    file stays in memory while it is small, so that `take` can still have it."""
    return store_of(path).write_new(path, mode, hold=hold)


def wait_uploads() -> None:
    """Wait for this process's background uploads; raise the first that failed."""
    UPLOADS.wait()


def abort_uploads(prefix: Any) -> int:
    """Abort the multipart uploads left open under a prefix (a writer killed mid-upload);
    nothing to do locally. Returns how many were aborted."""
    return store_of(prefix).abort_uploads(prefix)


def put_bytes(path: Any, data: bytes, *, if_none_match: bool = False) -> None:
    """Write a whole file at once (if_none_match: only when there is none)."""
    store_of(path).put(path, data, if_absent=if_none_match)


def unlink(path: Any, *, missing_ok: bool = True) -> None:
    store_of(path).unlink(path, missing_ok=missing_ok)


def remove_tree(path: Any) -> None:
    """Delete a directory and everything in it (every object under the prefix)."""
    store_of(path).remove_tree(path)


def sync_filesystem(path: Any) -> None:
    """Make everything this process wrote durable: syncfs(2) of the filesystem holding a
    local path (os.sync() where there is none); the background uploads of object storage."""
    store_of(path).sync_filesystem(path)


def sync_dir(path: Any) -> None:
    """Make a directory's entries durable (fsync); object storage needs nothing."""
    store_of(path).sync_dir(path)


def prepare_dir(path: Any, mode: int = 0o700) -> None:
    """Make a directory (and its parents) exist with `mode`; a prefix needs nothing."""
    store_of(path).prepare_dir(path, mode)


def make_dir(path: Any, mode: int = 0o700) -> None:
    """Create a directory with `mode` (and fsync its parent); a prefix needs nothing."""
    store_of(path).make_dir(path, mode)


def break_file(path: Any) -> None:
    """Remove a file another process may remove at the same moment (a stale lock): locally
    renamed aside first, so of two such processes one removes it and the other finds it
    gone; an object is deleted."""
    store_of(path).break_file(path)


def atomic_write_bytes(path: Any, data: bytes, *, durable: bool = True,
                       mode: int = 0o600) -> None:
    """Replace a file atomically: readers see the old content or the new, never a mix (a
    temporary file renamed over it, fsynced unless durable=False; one PUT on S3)."""
    store_of(path).atomic_write_bytes(path, data, durable=durable, mode=mode)


def create_exclusive(path: Any, data: bytes, mode: int = 0o600) -> None:
    """Create a file that must not exist yet (O_EXCL; If-None-Match: * on S3), durably;
    FileExistsError when it does."""
    store_of(path).create_exclusive(path, data, mode)


def replace_prefix_bytes(path: Any, keep: int, tail: bytes) -> None:
    """Make a file hold its first `keep` bytes followed by `tail` (recovery's cut of a
    partial backup's last segment). Locally the file is truncated and appended to; an
    object is written anew with that content."""
    store_of(path).replace_prefix_bytes(path, keep, tail)


def rename_dir(src: Any, dst: Any, *, last: str | None = None) -> None:
    """Move a directory of files: one atomic rename locally; on S3 a server-side copy of
    each object, the one named `last` after all the others (so a reader that goes by it
    sees the others complete), then the source is deleted."""
    store_of(src).rename_dir(src, dst, last=last)


__all__ = ["S3Path", "S3Settings", "Member", "StorageError", "NewFile", "Store", "LOCAL",
           "location", "store_of", "absolute", "pack_cache", "range_held",
           "held_in_memory", "listdir", "list_sizes", "stat_size", "read_bytes",
           "read_range", "open_read", "file_size", "identity", "age_seconds", "write_new",
           "wait_uploads", "abort_uploads", "put_bytes", "unlink", "remove_tree",
           "sync_filesystem", "sync_dir", "prepare_dir", "make_dir", "break_file",
           "atomic_write_bytes", "create_exclusive", "replace_prefix_bytes", "rename_dir",
           "s3_client", "named", "PART_BYTES", "SCHEME"]
