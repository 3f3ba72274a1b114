"""What every store offers: the `Store` interface, and the parts all stores share.

A store keeps an archive's files: a local directory (`local.py`), an S3 bucket prefix
(`s3.py`), a dictionary of this process (`memory.py`). Its locations are `pathlib.Path`
objects for a local directory and `KeyPath`s (an object key, or key prefix, of a bucket)
elsewhere; both offer the same small part of pathlib's interface (``/``, ``name``,
``parent``, ``exists()``, ``is_dir()``, ``is_file()``, ``read_bytes()``, ``read_text()``).

The interface is small (save, load a range, stat, list, remove, create-if-absent), and the
rest has a default here that a store overrides where it can do better. Callers do not ask
where a file lives but what its store can do: the capabilities are class attributes of
`Store` (`local`, `dirs`, `packs`, `partial_visible`, `deferred_uploads`,
`needs_credentials`, `lock_leases`).
"""
from __future__ import annotations

import io
import os
import threading
from pathlib import PurePosixPath
from typing import Any, BinaryIO, Iterator

from ..errors import ArchiveError

#: the size of one part of a multipart upload (S3's minimum is 5 MiB); a local writer that
#: holds a file in memory (write_new(hold=True)) holds it up to this size too
PART_BYTES = 8 << 20
#: what a reader of an object fetches with one ranged GET
READ_AHEAD = 8 << 20
#: uploads a process runs at once in the background (writes with sync=False)
UPLOAD_THREADS = 16
#: bytes those background uploads may hold in memory, together, before a writer waits
UPLOAD_BUFFER_BYTES = 128 << 20
#: the largest pack the pack cache loads whole (a pack written by dcptool holds about
#: packing.PACK_BYTES and at most twice that)
PACK_CACHE_ONE = 32 << 20
#: bytes of packs one process caches at most (while a `pack_cache()` scope is open)
PACK_CACHE_BYTES = 96 << 20


class StorageError(ArchiveError):
    """Object storage refused or failed a request (one line: what, where, why)."""


def range_held(offset: int, size: int, total: int) -> int:
    """How many of the `size` bytes from `offset` a file of `total` bytes holds (a pack
    member's size when its pack holds it whole)."""
    return max(0, min(size, total - offset))


def named(exc: OSError, path: Any) -> OSError:
    """`exc` naming `path` (a write or fsync on a descriptor names no file): the one line
    the user reads then says which file, e.g. "No space left on device: PATH"."""
    if path is None or exc.filename is not None or not exc.strerror:
        return exc
    return type(exc)(exc.errno, exc.strerror, str(path))


class NewFile:
    """A file being written once (`write_new`): write(), then close(sync) or abort()."""

    fd = -1

    def write(self, data: bytes) -> None:
        raise NotImplementedError

    def close(self, sync: bool = True) -> None:
        raise NotImplementedError

    def abort(self) -> None:
        raise NotImplementedError

    def take(self) -> bytes | None:
        """Everything written, when none of it has left the process yet: the file is then
        not written at all (the caller stores the bytes elsewhere, as a pack member); None
        when the file is already on its way (close() it as usual)."""
        return None


class Member:
    """One data file stored as a byte range of a pack (see `packing`): `pack` is the pack's
    location, the file its `size` bytes from `offset`. `name` and `parent` are the file's
    own (its name in the manifest, and the backup directory), so the file is read, checked
    and opened (in an encrypted archive) as if it lay there alone. Picklable."""

    __slots__ = ("pack", "offset", "size", "name")

    def __init__(self, pack: Any, offset: int, size: int, name: str):
        self.pack = pack
        self.offset = int(offset)
        self.size = int(size)
        self.name = name

    def __getstate__(self) -> tuple:
        return (self.pack, self.offset, self.size, self.name)

    def __setstate__(self, state: tuple) -> None:
        self.pack, self.offset, self.size, self.name = state

    @property
    def parent(self) -> Any:
        return self.pack.parent

    def __str__(self) -> str:
        return f"{self.pack.parent / self.name} (in {self.pack.name})"

    def __repr__(self) -> str:
        return f"Member({str(self.pack)!r}, {self.offset}, {self.size}, {self.name!r})"


# -- reading by ranges ---------------------------------------------------------------------------


class RangedReader(io.RawIOBase):
    """A seekable, read-only file that fetches what it reads by ranges (`_range`), at least
    `_ahead` bytes at a time, and keeps the last range fetched."""

    _ahead = READ_AHEAD

    def __init__(self) -> None:
        self._pos = 0
        self._buf: Any = b""
        self._buf_at = 0
        self._size = 0

    def _range(self, offset: int, length: int) -> bytes:
        raise NotImplementedError

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def size(self) -> int:
        return self._size

    def seek(self, pos: int, whence: int = 0) -> int:
        if whence == 1:
            pos += self._pos
        elif whence == 2:
            pos += self._size
        self._pos = max(0, pos)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            n = self._size - self._pos
        n = min(n, self._size - self._pos)
        if n <= 0:
            return b""
        start = self._pos - self._buf_at
        if not (0 <= start and start + n <= len(self._buf)):
            self._buf = self._range(self._pos, min(max(n, self._ahead), self._size - self._pos))
            self._buf_at = self._pos
            start = 0
        out = bytes(self._buf[start:start + n])
        self._pos += len(out)
        return out

    def readinto(self, b: Any) -> int:
        data = self.read(len(b))
        b[:len(data)] = data
        return len(data)


class MemberReader(RangedReader):
    """A file over a member of a pack, read by ranges of the pack (`store.read_range`):
    `first` is what was already fetched from its start, `size` what the pack holds of it."""

    def __init__(self, store: "Store", member: Member, first: Any, size: int,
                 ahead: int = READ_AHEAD):
        super().__init__()
        self._store = store
        self._m = member
        self._buf = first
        self._size = size
        self._ahead = ahead

    def _range(self, offset: int, length: int) -> bytes:
        return self._store.read_range(self._m.pack, self._m.offset + offset, length)


def file_size(f: Any) -> int:
    """The size of a file `open_read` returned."""
    if isinstance(f, RangedReader):
        return f.size()
    return os.fstat(f.fileno()).st_size


# -- the pack cache ------------------------------------------------------------------------------


class PackCache:
    """Whole packs of a remote store, read once while a `pack_cache()` scope is open: a
    reader of a pack's members (a restore task, verify, restore's checks) then costs one GET
    per pack instead of one per member. Only packs whose store gives them a cache key are
    cached (`Store.pack_cache_key`; a local pack is read through the page cache). Nothing is
    evicted: once PACK_CACHE_BYTES are held, further packs are read by ranges. Emptied when
    the last scope closes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._scopes = 0
        self._held = 0
        self._data: dict[tuple, bytes | None] = {}  # None: not cached (too large, no room)
        self._loading: dict[tuple, threading.Event] = {}

    def open(self) -> None:
        with self._lock:
            self._scopes += 1

    def close(self) -> None:
        with self._lock:
            self._scopes -= 1
            if self._scopes <= 0:
                self._scopes = 0
                self._data.clear()
                self._held = 0

    def load(self, store: "Store", pack: Any) -> bytes | None:
        """The pack's bytes when a scope is open and they fit (read now if not yet);
        None: read the member by ranges. FileNotFoundError when the pack is missing."""
        key = store.pack_cache_key(pack)
        if key is None:
            return None
        while True:
            with self._lock:
                if not self._scopes:
                    return None
                if key in self._data:
                    return self._data[key]
                if self._held >= PACK_CACHE_BYTES:
                    return None
                ev = self._loading.get(key)
                if ev is None:
                    ev = self._loading[key] = threading.Event()
                    break
            ev.wait()
        data: bytes | None = None
        try:
            data = store.load_whole(pack, PACK_CACHE_ONE)
        finally:
            with self._lock:
                del self._loading[key]
                if self._scopes and (data is None or self._held + len(data) <= PACK_CACHE_BYTES):
                    self._data[key] = data
                    self._held += len(data or b"")
                ev.set()
        return data


PACKS = PackCache()


# -- background uploads --------------------------------------------------------------------------


class Uploads:
    """Background writes of one process: writers that need no durability at once (a backup
    task's segments and done files, which it makes durable together before it reports its
    vbuckets done) hand their last request here and go on streaming; `wait()` ends them
    all and raises the first failure. Memory is bounded: a writer waits while the queued
    uploads hold UPLOAD_BUFFER_BYTES."""

    def __init__(self) -> None:
        self._pool: Any = None
        self._cond = threading.Condition()
        self._held = 0
        self._futures: list[Any] = []

    def submit(self, fn: Any, nbytes: int) -> None:
        from concurrent.futures import ThreadPoolExecutor

        with self._cond:
            while self._held and self._held + nbytes > UPLOAD_BUFFER_BYTES:
                self._cond.wait()
            self._held += nbytes
            if self._pool is None:
                self._pool = ThreadPoolExecutor(UPLOAD_THREADS, thread_name_prefix="dcptool-s3")

        def run() -> None:
            try:
                fn()
            finally:
                with self._cond:
                    self._held -= nbytes
                    self._cond.notify_all()

        fut = self._pool.submit(run)
        with self._cond:
            self._futures = [f for f in self._futures if not f.done() or f.exception()]
            self._futures.append(fut)

    def wait(self) -> None:
        with self._cond:
            futures, self._futures = self._futures, []
        first: BaseException | None = None
        for f in futures:
            exc = f.exception()
            if exc is not None and first is None:
                first = exc
        if first is not None:
            raise first


UPLOADS = Uploads()


# -- key locations -------------------------------------------------------------------------------


class KeyPath:
    """An object key (or key prefix) in a bucket of a store without directories, with
    pathlib's interface where the archive code uses it. Immutable and picklable (a Spark
    task carries it). A subclass names its `store` and `scheme`."""

    __slots__ = ("bucket", "key")

    store: "Store"
    scheme = ""

    def __init__(self, bucket: str, key: str = ""):
        self.bucket = bucket
        self.key = key.strip("/")

    def _child(self, key: str) -> "KeyPath":
        return type(self)(self.bucket, key)

    @classmethod
    def parse(cls, url: str) -> "KeyPath":
        rest = url[len(cls.scheme):]
        bucket, _, key = rest.partition("/")
        if not bucket:
            raise StorageError(f"{url!r} names no bucket (use {cls.scheme}BUCKET/PREFIX)")
        if ".." in PurePosixPath(key).parts:
            raise StorageError(f"{url!r}: '..' is not allowed in an object key")
        return cls(bucket, key)

    def __getstate__(self) -> tuple:
        return (self.bucket, self.key)

    def __setstate__(self, state: tuple) -> None:
        self.bucket, self.key = state

    # -- pathlib's shape ---------------------------------------------------------------------

    def __truediv__(self, name: Any) -> "KeyPath":
        name = str(name).strip("/")
        return self._child(f"{self.key}/{name}" if self.key else name)

    @property
    def name(self) -> str:
        return self.key.rsplit("/", 1)[-1]

    @property
    def parent(self) -> "KeyPath":
        return self._child(self.key.rsplit("/", 1)[0] if "/" in self.key else "")

    def with_name(self, name: str) -> "KeyPath":
        return self.parent / name

    def absolute(self) -> "KeyPath":
        return self

    def __str__(self) -> str:
        return f"{self.scheme}{self.bucket}/{self.key}" if self.key else \
            f"{self.scheme}{self.bucket}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and \
            (self.bucket, self.key) == (other.bucket, other.key)  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((self.bucket, self.key))

    def exists(self) -> bool:
        return self.is_file() or self.is_dir()

    def is_file(self) -> bool:
        try:
            self.store.stat(self)
            return True
        except FileNotFoundError:
            return False

    def is_dir(self) -> bool:
        return self.store.is_dir(self)

    def iterdir(self) -> Iterator["KeyPath"]:
        for name in self.store.listdir(self):
            yield self / name

    def read_bytes(self) -> bytes:
        return self.store.read_bytes(self)

    def read_text(self, encoding: str = "utf-8") -> str:
        return self.store.read_bytes(self).decode(encoding)


# -- the interface -------------------------------------------------------------------------------


class Store:
    """One kind of storage. The methods marked abstract are what a new store must write;
    the others have a default built on them (for a store without directories, whose
    objects are written whole), which a store overrides where it can do better."""

    #: the prefix of the locations a user types for it ("s3://"); None: local paths
    scheme: str | None = None
    #: the type of its locations
    location_type: type = object

    # -- capabilities: what callers ask instead of where the data lives ------------------------
    #: files of this machine's filesystem, named by local paths
    local = False
    #: directories exist on their own (made, fsynced, renamed at once); without them a
    #: directory is a key prefix, present while an object lies under it
    dirs = False
    #: small files are worth packing into a few objects (packing.py): each file costs requests
    packs = False
    #: readers can see a file while it is written; without it a file appears whole, at close
    partial_visible = False
    #: writes with sync=False go on in the background: `wait_uploads` before relying on them
    deferred_uploads = False
    #: a process reaches it with an endpoint and credentials of its own (a Spark engine's
    #: executors have those the engine was started with)
    needs_credentials = False
    #: the archive lock is a lease its holder renews (a holder's pid cannot be checked)
    lock_leases = False

    # -- what every store writes -------------------------------------------------------------

    def parse(self, text: str) -> Any:
        """The location a user's text names (it starts with `scheme`)."""
        raise NotImplementedError

    def list_sizes(self, path: Any, *, dirs: bool = False) -> dict[str, int]:
        """{name: size} of the files in a directory; with dirs=True sub-directories too
        (size -1)."""
        raise NotImplementedError

    def stat(self, path: Any) -> int:
        """A file's size (FileNotFoundError when it is missing)."""
        raise NotImplementedError

    def read_range(self, path: Any, offset: int, length: int) -> bytes:
        """`length` bytes from `offset` (fewer at the end of the file)."""
        raise NotImplementedError

    def read_bytes(self, path: Any) -> bytes:
        raise NotImplementedError

    def write_new(self, path: Any, mode: int = 0o600, *, hold: bool = False) -> NewFile:
        """Start writing a new file: all or nothing, unless `partial_visible`."""
        raise NotImplementedError

    def put(self, path: Any, data: bytes, *, if_absent: bool = False) -> None:
        """Write a whole file at once (FileExistsError with if_absent when it exists)."""
        raise NotImplementedError

    def unlink(self, path: Any, *, missing_ok: bool = True) -> None:
        raise NotImplementedError

    def remove_tree(self, path: Any) -> None:
        """Delete a directory and everything in it."""
        raise NotImplementedError

    def identity(self, path: Any) -> tuple[Any, ...]:
        """What tells one version of a file from another without reading it
        (FileNotFoundError when missing)."""
        raise NotImplementedError

    def age_seconds(self, path: Any) -> float:
        """Seconds since the file was last written (FileNotFoundError when missing)."""
        raise NotImplementedError

    # -- defaults ------------------------------------------------------------------------------

    def is_dir(self, path: Any) -> bool:
        return bool(self.list_sizes(path, dirs=True))

    def listdir(self, path: Any) -> list[str]:
        """The names in a directory (files and sub-directories)."""
        return list(self.list_sizes(path, dirs=True))

    def open_read(self, path: Any) -> BinaryIO:
        """A binary file to read (and seek) from; FileNotFoundError when it is missing."""
        return _WholeReader(self, path)  # type: ignore[return-value]

    def open_member(self, member: Member) -> BinaryIO:
        """A file over a member of one of this store's packs (FileNotFoundError when the
        pack is missing): its first READ_AHEAD bytes fetched at once."""
        want = min(member.size, READ_AHEAD)
        first = self.read_range(member.pack, member.offset, want) if want else b""
        if len(first) < want or (want == 0 and not member.pack.is_file()):
            size = range_held(member.offset, member.size, self.stat(member.pack))
        else:
            size = member.size
        return MemberReader(self, member, first, size)  # type: ignore[return-value]

    def pack_cache_key(self, pack: Any) -> tuple | None:
        """The key of a pack in the pack cache; None: not cached (read by ranges)."""
        return None

    def load_whole(self, pack: Any, limit: int) -> bytes | None:
        """A file's bytes when it holds `limit` bytes or fewer, else None."""
        data = self.read_range(pack, 0, limit + 1)
        return data if len(data) <= limit else None

    def atomic_write_bytes(self, path: Any, data: bytes, *, durable: bool = True,
                           mode: int = 0o600) -> None:
        """Replace a file atomically: readers see the old content or the new."""
        self.put(path, data)

    def create_exclusive(self, path: Any, data: bytes, mode: int = 0o600) -> None:
        """Create a file that must not exist yet, durably; FileExistsError when it does."""
        self.put(path, data, if_absent=True)

    def replace_prefix_bytes(self, path: Any, keep: int, tail: bytes) -> None:
        """Make a file hold its first `keep` bytes followed by `tail`."""
        data = self.read_range(path, 0, keep) + tail if keep else bytes(tail)
        self.put(path, data)

    def rename_dir(self, src: Any, dst: Any, *, last: str | None = None) -> None:
        """Move a directory of files: each file copied, the one named `last` after all
        the others (a reader that goes by it sees the others complete), then the source
        is deleted."""
        names = sorted(self.list_sizes(src), key=lambda n: n == last)
        for name in names:
            self.put(dst / name, self.read_bytes(src / name))
        self.remove_tree(src)

    def break_file(self, path: Any) -> None:
        """Remove a file another process may remove at the same moment (a stale lock)."""
        self.unlink(path)

    def abort_uploads(self, prefix: Any) -> int:
        """Abort the uploads a killed writer left open under a prefix; how many."""
        return 0

    def make_dir(self, path: Any, mode: int = 0o700) -> None:
        """Create a directory (a prefix needs nothing)."""

    def prepare_dir(self, path: Any, mode: int = 0o700) -> None:
        """Make a directory and its parents exist (a prefix needs nothing)."""

    def sync_dir(self, path: Any) -> None:
        """Make a directory's entries durable (a prefix needs nothing)."""

    def sync_filesystem(self, path: Any) -> None:
        """Make everything this process wrote there durable."""
        UPLOADS.wait()

    def absolute(self, path: Any) -> Any:
        """The location as any process names it (a local path made absolute)."""
        return path


class _WholeReader(RangedReader):
    """A file over a whole file of a store, read by ranges of READ_AHEAD bytes."""

    def __init__(self, store: Store, path: Any):
        super().__init__()
        self._store = store
        self._path = path
        self._size = store.stat(path)

    def _range(self, offset: int, length: int) -> bytes:
        return self._store.read_range(self._path, offset, length)


__all__ = ["Store", "KeyPath", "Member", "NewFile", "StorageError", "RangedReader",
           "MemberReader", "PackCache", "PACKS", "Uploads", "UPLOADS", "range_held", "named",
           "file_size", "PART_BYTES", "READ_AHEAD", "PACK_CACHE_ONE", "PACK_CACHE_BYTES"]
