"""Where an archive's files live: a local directory or an S3 bucket prefix.

Every other module of `dcptool.archive` (and the pipeline tasks) reaches an archive's files
through this module, so every feature works on both backends:

- `location(x)` turns what a user typed (a path, or ``s3://BUCKET/PREFIX``) into a
  location: a `pathlib.Path` for a local directory, an `S3Path` for object storage. Both
  offer the same small part of pathlib's interface (``/``, ``name``, ``parent``,
  ``exists()``, ``is_dir()``, ``is_file()``, ``read_bytes()``, ``read_text()``).
- The functions below (`listdir`, `list_sizes`, `open_read`, `stat_size`, `write_new`,
  `atomic_write_bytes`, `create_exclusive`, `unlink`, `remove_tree`, `make_dir`,
  `sync_dir`, `replace_prefix_bytes`) do the rest, on either kind.
- A data file stored in a pack (archive/packing.py) is a `Member` location: `open_read`,
  `stat_size` and `file_size` take it, so it is read like the file it would have been.

Object storage has no directories: a "directory" is a key prefix, present while an object
lies under it. Objects are written whole: `write_new` streams a file as a multipart upload
(parts of `PART_BYTES`, so a writer holds at most one part in memory) that becomes visible
only when it completes; a writer killed before that leaves an open upload, which
`abort_uploads` removes when the backup resumes. `create_exclusive` is a conditional write
(If-None-Match: *): of two writers racing for one key, exactly one wins.

The S3 client is boto3's: it reads the usual AWS settings (``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``, ``AWS_PROFILE``, ``AWS_REGION``, the
shared config and credentials files), and `DCPTOOL_S3_ENDPOINT_URL`,
`DCPTOOL_S3_REGION`, `DCPTOOL_S3_PROFILE` and `DCPTOOL_S3_ADDRESSING` (``path`` or
``virtual``) override them for dcptool alone. Credentials are never part of a location:
a location pickled into a Spark task carries the endpoint, region, profile and addressing
only, and each executor finds credentials the way boto3 does there.
"""
from __future__ import annotations

import io
import os
import shutil
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO, Iterator

from dcptool.faults import fault_point

from .errors import ArchiveError

#: the size of one part of a multipart upload (S3's minimum is 5 MiB)
PART_BYTES = 8 << 20
#: what a reader of an object fetches with one ranged GET
READ_AHEAD = 8 << 20
#: uploads a process runs at once in the background (writes with sync=False)
UPLOAD_THREADS = 16
#: bytes those background uploads may hold in memory, together, before a writer waits
UPLOAD_BUFFER_BYTES = 128 << 20

SCHEME = "s3://"


class StorageError(ArchiveError):
    """Object storage refused or failed a request (one line: what, where, why)."""


@dataclass(frozen=True)
class S3Settings:
    """How to reach an S3 service; credentials are not among them (see module doc)."""

    endpoint_url: str | None = None
    region: str | None = None
    profile: str | None = None
    addressing: str | None = None  # "path" or "virtual"; None: path with an endpoint

    @classmethod
    def from_env(cls) -> "S3Settings":
        env = os.environ
        endpoint = env.get("DCPTOOL_S3_ENDPOINT_URL") or env.get("AWS_ENDPOINT_URL_S3") \
            or env.get("AWS_ENDPOINT_URL") or None
        region = env.get("DCPTOOL_S3_REGION") or env.get("AWS_REGION") \
            or env.get("AWS_DEFAULT_REGION") or None
        addressing = env.get("DCPTOOL_S3_ADDRESSING") or None
        if addressing not in (None, "path", "virtual"):
            raise StorageError(f"DCPTOOL_S3_ADDRESSING is {addressing!r}; use path or virtual")
        return cls(endpoint, region, env.get("DCPTOOL_S3_PROFILE") or None, addressing)


_clients: dict[S3Settings, Any] = {}
_clients_lock = threading.Lock()


def s3_client(settings: S3Settings) -> Any:
    """One boto3 client per process and settings (boto3 clients are thread-safe)."""
    client = _clients.get(settings)
    if client is not None:
        return client
    with _clients_lock:
        client = _clients.get(settings)
        if client is None:
            import boto3
            from botocore.config import Config

            session = boto3.session.Session(profile_name=settings.profile) \
                if settings.profile else boto3.session.Session()
            addressing = settings.addressing or ("path" if settings.endpoint_url else "auto")
            client = session.client(
                "s3", endpoint_url=settings.endpoint_url,
                region_name=settings.region or session.region_name or "us-east-1",
                config=Config(s3={"addressing_style": addressing},
                              retries={"max_attempts": 4, "mode": "standard"},
                              max_pool_connections=32, connect_timeout=5, read_timeout=60,
                              request_checksum_calculation="when_required",
                              response_checksum_validation="when_required"))
            _clients[settings] = client
    return client


class S3Path:
    """An object key (or key prefix) in a bucket, with pathlib's interface where the archive
    code uses it. Immutable and picklable (a Spark task carries it)."""

    __slots__ = ("bucket", "key", "settings")

    def __init__(self, bucket: str, key: str = "", settings: S3Settings | None = None):
        self.bucket = bucket
        self.key = key.strip("/")
        self.settings = settings if settings is not None else S3Settings.from_env()

    @classmethod
    def parse(cls, url: str) -> "S3Path":
        rest = url[len(SCHEME):]
        bucket, _, key = rest.partition("/")
        if not bucket:
            raise StorageError(f"{url!r} names no bucket (use s3://BUCKET/PREFIX)")
        if ".." in PurePosixPath(key).parts:
            raise StorageError(f"{url!r}: '..' is not allowed in an object key")
        return cls(bucket, key)

    def __getstate__(self) -> tuple:
        return (self.bucket, self.key, self.settings)

    def __setstate__(self, state: tuple) -> None:
        self.bucket, self.key, self.settings = state

    # -- pathlib's shape ---------------------------------------------------------------------

    def __truediv__(self, name: Any) -> "S3Path":
        name = str(name).strip("/")
        return S3Path(self.bucket, f"{self.key}/{name}" if self.key else name, self.settings)

    @property
    def name(self) -> str:
        return self.key.rsplit("/", 1)[-1]

    @property
    def parent(self) -> "S3Path":
        return S3Path(self.bucket, self.key.rsplit("/", 1)[0] if "/" in self.key else "",
                      self.settings)

    def with_name(self, name: str) -> "S3Path":
        return self.parent / name

    def absolute(self) -> "S3Path":
        return self

    def __str__(self) -> str:
        return f"{SCHEME}{self.bucket}/{self.key}" if self.key else f"{SCHEME}{self.bucket}"

    def __repr__(self) -> str:
        return f"S3Path({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, S3Path) and (self.bucket, self.key) == (other.bucket, other.key)

    def __hash__(self) -> int:
        return hash((self.bucket, self.key))

    def exists(self) -> bool:
        return self.is_file() or self.is_dir()

    def is_file(self) -> bool:
        try:
            stat_size(self)
            return True
        except FileNotFoundError:
            return False

    def is_dir(self) -> bool:
        client = s3_client(self.settings)
        prefix = f"{self.key}/" if self.key else ""
        r = _call(self, client.list_objects_v2, Bucket=self.bucket, Prefix=prefix, MaxKeys=1)
        return bool(r.get("KeyCount"))

    def iterdir(self) -> Iterator["S3Path"]:
        for name in listdir(self):
            yield self / name

    def read_bytes(self) -> bytes:
        return read_bytes(self)

    def read_text(self, encoding: str = "utf-8") -> str:
        return read_bytes(self).decode(encoding)


class Member:
    """One data file stored as a byte range of a pack (see `packing`): `pack` is the pack's
    location, the file its `size` bytes from `offset`. `name` and `parent` are the file's
    own (its name in the manifest, and the backup directory), so the file is read, checked
    and opened (in an encrypted archive) as if it lay there alone. Picklable."""

    __slots__ = ("pack", "offset", "size", "name")

    def __init__(self, pack: Path | S3Path, offset: int, size: int, name: str):
        self.pack = pack
        self.offset = int(offset)
        self.size = int(size)
        self.name = name

    def __getstate__(self) -> tuple:
        return (self.pack, self.offset, self.size, self.name)

    def __setstate__(self, state: tuple) -> None:
        self.pack, self.offset, self.size, self.name = state

    @property
    def parent(self) -> Path | S3Path:
        return self.pack.parent

    def __str__(self) -> str:
        return f"{self.pack.parent / self.name} (in {self.pack.name})"

    def __repr__(self) -> str:
        return f"Member({str(self.pack)!r}, {self.offset}, {self.size}, {self.name!r})"


def range_held(offset: int, size: int, total: int) -> int:
    """How many of the `size` bytes from `offset` a file of `total` bytes holds (a pack
    member's size when its pack holds it whole)."""
    return max(0, min(size, total - offset))


def location(path: Any) -> Path | S3Path:
    """A location for what a user or a task names: s3://BUCKET/PREFIX or a local path."""
    if isinstance(path, (Path, S3Path, Member)):
        return path
    text = os.fspath(path)
    if isinstance(text, str) and text.startswith(SCHEME):
        return S3Path.parse(text)
    return Path(text)


def is_remote(path: Any) -> bool:
    return isinstance(path, S3Path) or (isinstance(path, str) and path.startswith(SCHEME))


def _code(exc: Exception) -> str:
    return str(getattr(exc, "response", {}).get("Error", {}).get("Code", ""))


def _call(where: S3Path, fn: Any, **kwargs: Any) -> Any:
    """A boto3 call whose failures become one-line errors (FileNotFoundError for a missing
    key, FileExistsError for a failed If-None-Match)."""
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

    try:
        return fn(**kwargs)
    except ClientError as exc:
        code = _code(exc)
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if code in ("NoSuchKey", "404", "NotFound"):
            raise FileNotFoundError(str(where)) from None
        if code in ("PreconditionFailed", "ConditionalRequestConflict") or status == 412:
            raise FileExistsError(str(where)) from None
        if code == "NoSuchBucket":
            raise StorageError(f"{where}: bucket {where.bucket!r} does not exist",
                               hint="create it first, or check the endpoint") from None
        if code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "403",
                    "InvalidToken", "ExpiredToken"):
            raise StorageError(f"{where}: access denied ({code}): check the S3 credentials",
                               hint="AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE")
        raise StorageError(f"{where}: {fn.__name__} failed: {code or exc}") from None
    except NoCredentialsError:
        raise StorageError(f"{where}: no S3 credentials found",
                           hint="set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or "
                                "AWS_PROFILE") from None
    except BotoCoreError as exc:
        raise StorageError(f"{where}: {exc}") from None


# -- reading -------------------------------------------------------------------------------------


def listdir(path: Path | S3Path) -> list[str]:
    """The names in a directory (objects and sub-prefixes of a prefix); FileNotFoundError
    for a local directory that does not exist (a prefix without objects is empty)."""
    if not isinstance(path, S3Path):
        return os.listdir(path)
    return list(list_sizes(path, dirs=True))


def list_sizes(path: Path | S3Path, *, dirs: bool = False) -> dict[str, int]:
    """{name: size} of the files in a directory (one listing on S3); with dirs=True
    sub-directories too (size -1)."""
    if not isinstance(path, S3Path):
        out: dict[str, int] = {}
        with os.scandir(path) as it:
            for e in it:
                if e.is_file():
                    out[e.name] = e.stat().st_size
                elif dirs and e.is_dir():
                    out[e.name] = -1
        return out
    prefix = f"{path.key}/" if path.key else ""
    out = {}
    for r in _list_pages(path, prefix, Delimiter="/"):
        for o in r.get("Contents", ()):
            name = o["Key"][len(prefix):]
            if name:  # (not the prefix's own folder marker)
                out[name] = int(o["Size"])
        if dirs:
            for p in r.get("CommonPrefixes", ()):
                out[p["Prefix"][len(prefix):].rstrip("/")] = -1
    return out


def _list_pages(path: S3Path, prefix: str, **kwargs: Any) -> Iterator[dict[str, Any]]:
    """The pages of a ListObjectsV2 of `prefix` in the path's bucket."""
    client = s3_client(path.settings)
    token = None
    while True:
        page = dict(kwargs, Bucket=path.bucket, Prefix=prefix)
        if token:
            page["ContinuationToken"] = token
        r = _call(path, client.list_objects_v2, **page)
        yield r
        if not r.get("IsTruncated"):
            return
        token = r["NextContinuationToken"]


def _head(path: S3Path) -> dict[str, Any]:
    """The object's HEAD (FileNotFoundError when it is missing)."""
    return _call(path, s3_client(path.settings).head_object, Bucket=path.bucket, Key=path.key)


def stat_size(path: Path | S3Path) -> int:
    if isinstance(path, Member):
        return range_held(path.offset, path.size, stat_size(path.pack))
    if not isinstance(path, S3Path):
        return os.stat(path).st_size
    return int(_head(path)["ContentLength"])


def read_bytes(path: Path | S3Path) -> bytes:
    if not isinstance(path, S3Path):
        with open(path, "rb") as f:
            return f.read()
    client = s3_client(path.settings)
    return _call(path, client.get_object, Bucket=path.bucket, Key=path.key)["Body"].read()


def read_range(path: Path | S3Path, offset: int, length: int) -> bytes:
    if not isinstance(path, S3Path):
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(length)
    if length <= 0:
        return b""
    client = s3_client(path.settings)
    return _call(path, client.get_object, Bucket=path.bucket, Key=path.key,
                 Range=f"bytes={offset}-{offset + length - 1}")["Body"].read()


class _RangedReader(io.RawIOBase):
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


class _ObjectReader(_RangedReader):
    """A file over one object: ranged GETs of READ_AHEAD bytes."""

    def __init__(self, path: S3Path):
        """Opens with the first ranged GET (FileNotFoundError when the object is missing):
        it tells the object's size, so opening costs no request of its own."""
        super().__init__()
        self._path = path
        client = s3_client(path.settings)
        try:
            r = _call(path, client.get_object, Bucket=path.bucket, Key=path.key,
                      Range=f"bytes=0-{READ_AHEAD - 1}")
        except StorageError:
            # an empty object has no byte 0 to range over (416): ask for its size
            self._size = stat_size(path)
            if self._size:
                raise
            return
        self._buf = r["Body"].read()
        total = str(r.get("ContentRange") or "").rpartition("/")[2]
        self._size = int(total) if total.isdigit() else len(self._buf)

    def _range(self, offset: int, length: int) -> bytes:
        return read_range(self._path, offset, length)


def open_read(path: Path | S3Path) -> BinaryIO:
    """A binary file to read (and seek) from; FileNotFoundError when it is missing."""
    if isinstance(path, Member):
        return _MemberReader(path)  # type: ignore[return-value]
    if not isinstance(path, S3Path):
        return open(path, "rb", buffering=0)
    return _ObjectReader(path)  # type: ignore[return-value]


def file_size(f: Any) -> int:
    """The size of a file `open_read` returned."""
    if isinstance(f, (_ObjectReader, _MemberReader)):
        return f.size()
    return os.fstat(f.fileno()).st_size


class _MemberReader(_RangedReader):
    """A file over a member of a pack. It reads from the pack cache when a `pack_cache()`
    scope holds the pack, else by ranges of the pack (READ_AHEAD at a time on S3). Opening
    checks that the pack exists; a member the pack holds only part of reads as a file of
    the bytes it holds."""

    def __init__(self, member: Member):
        super().__init__()
        self._m = member
        data = _packs.load(member.pack)
        if data is not None:
            self._buf = memoryview(data)[member.offset:member.offset + member.size]
            self._size = len(self._buf)
            return
        if isinstance(member.pack, S3Path):
            want = min(member.size, READ_AHEAD)
            self._buf = read_range(member.pack, member.offset, want) if want else b""
            if len(self._buf) < want or (want == 0 and not member.pack.is_file()):
                self._size = stat_size(member)
            else:
                self._size = member.size
        else:
            self._ahead = 1 << 20
            self._size = stat_size(member)  # FileNotFoundError when the pack is missing

    def _range(self, offset: int, length: int) -> bytes:
        return read_range(self._m.pack, self._m.offset + offset, length)


#: the largest pack the pack cache loads whole (a pack written by dcptool holds about
#: packing.PACK_BYTES and at most twice that)
PACK_CACHE_ONE = 32 << 20
#: bytes of packs one process caches at most (while a `pack_cache()` scope is open)
PACK_CACHE_BYTES = 96 << 20


class _PackCache:
    """Whole packs of object storage, read once while a `pack_cache()` scope is open: a
    reader of a pack's members (a restore task, verify, restore's checks) then costs one GET
    per pack instead of one per member. Nothing is evicted: once PACK_CACHE_BYTES are held,
    further packs are read by ranges. Emptied when the last scope closes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._scopes = 0
        self._held = 0
        self._data: dict[tuple, bytes | None] = {}  # None: not cached (too large, no room)
        self._loading: dict[tuple, threading.Event] = {}

    @staticmethod
    def _key(pack: Any) -> tuple | None:
        if not isinstance(pack, S3Path):
            return None  # (a local pack is read through the page cache)
        return (pack.settings.endpoint_url, pack.bucket, pack.key)

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

    def load(self, pack: Any) -> bytes | None:
        """The pack's bytes when a scope is open and they fit (read now if not yet);
        None: read the member by ranges. FileNotFoundError when the pack is missing."""
        key = self._key(pack)
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
            client = s3_client(pack.settings)
            r = _call(pack, client.get_object, Bucket=pack.bucket, Key=pack.key,
                      Range=f"bytes=0-{PACK_CACHE_ONE - 1}")
            total = str(r.get("ContentRange") or "").rpartition("/")[2]
            body = r["Body"].read()
            if not total.isdigit() or int(total) == len(body):
                data = body
        except StorageError:
            if stat_size(pack):  # (an empty object has no range: 416)
                raise
            data = b""
        finally:
            with self._lock:
                del self._loading[key]
                if self._scopes and (data is None or self._held + len(data) <= PACK_CACHE_BYTES):
                    self._data[key] = data
                    self._held += len(data or b"")
                ev.set()
        return data


_packs = _PackCache()


class pack_cache:
    """A scope in which the members of packs on object storage are read from whole packs
    fetched once (see _PackCache); nestable, for every thread of the process."""

    def __enter__(self) -> "pack_cache":
        _packs.open()
        return self

    def __exit__(self, *exc: Any) -> None:
        _packs.close()


# -- writing -------------------------------------------------------------------------------------


class _Uploads:
    """Background PUTs of one process: writers that need no durability at once (a backup
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


_uploads = _Uploads()


def wait_uploads() -> None:
    """Wait for this process's background uploads; raise the first that failed."""
    _uploads.wait()


def _write_all(fd: int, data: bytes, path: Any = None) -> None:
    view = memoryview(data)
    try:
        while view:
            view = view[os.write(fd, view):]
    except OSError as exc:
        raise named(exc, path) from None


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


class _LocalNewFile(NewFile):
    def __init__(self, path: Path, mode: int):
        self.path = path
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)

    def write(self, data: bytes) -> None:
        _write_all(self.fd, data, self.path)

    def close(self, sync: bool = True) -> None:
        if self.fd < 0:
            return
        try:
            if sync:
                try:
                    os.fsync(self.fd)
                except OSError as exc:
                    raise named(exc, self.path) from None
        finally:
            os.close(self.fd)
            self.fd = -1

    def abort(self) -> None:
        self.close(sync=False)


#: the bytes all object writers of a process hold in memory together, waiting to fill a
#: part: past it, a writer that holds SPILL_MIN_BYTES or more moves its bytes to a
#: temporary file (a task streams hundreds of vbuckets at once, each object a part of up
#: to PART_BYTES in the making)
UPLOAD_MEMORY_BYTES = int(os.environ.get("DCPTOOL_S3_UPLOAD_MEMORY", 0) or 256 << 20)
SPILL_MIN_BYTES = 256 << 10

_held_lock = threading.Lock()
_held = [0]  # bytes the part buffers of this process hold in memory


_spill_dir: list[str] = []
_spill_count = [0]


def _spill_path() -> str:
    """A new file name in this process's directory of spilled parts (removed at exit)."""
    with _held_lock:
        if not _spill_dir:
            import atexit

            d = tempfile.mkdtemp(prefix="dcptool-parts-")
            _spill_dir.append(d)
            atexit.register(shutil.rmtree, d, True)
        _spill_count[0] += 1
        return os.path.join(_spill_dir[0], str(_spill_count[0]))


class _PartBuffer:
    """The bytes of one object (or of its next part) not sent yet: in memory, or in a
    temporary file once the process's part buffers hold UPLOAD_MEMORY_BYTES (opened for
    each append, so hundreds of spilled writers hold no file descriptors). Memory is then
    bounded by UPLOAD_MEMORY_BYTES + open writers x SPILL_MIN_BYTES."""

    __slots__ = ("_buf", "_file", "n")

    def __init__(self) -> None:
        self._buf: bytearray | None = bytearray()
        self._file: str | None = None
        self.n = 0

    def write(self, data: bytes) -> None:
        self.n += len(data)
        if self._file is not None:
            with open(self._file, "ab") as f:
                f.write(data)
            return
        self._buf += data  # type: ignore[operator]
        with _held_lock:
            _held[0] += len(data)
            over = _held[0] > UPLOAD_MEMORY_BYTES
        if over and len(self._buf) >= SPILL_MIN_BYTES:  # type: ignore[arg-type]
            self._spill()

    def _spill(self) -> None:
        buf, self._buf = self._buf, None
        self._file = _spill_path()
        with open(self._file, "xb") as f:
            f.write(buf)  # type: ignore[arg-type]
        with _held_lock:
            _held[0] -= len(buf)  # type: ignore[arg-type]

    def getvalue(self) -> bytes:
        if self._file is not None:
            with open(self._file, "rb") as f:
                return f.read()
        return bytes(self._buf)  # type: ignore[arg-type]

    def clear(self) -> None:
        if self._file is not None:
            try:
                os.unlink(self._file)
            except OSError:
                pass
            self._file = None
        elif self._buf:
            with _held_lock:
                _held[0] -= len(self._buf)
        self._buf = bytearray()
        self.n = 0

    def __del__(self) -> None:  # a writer dropped without close or abort
        try:
            self.clear()
        except Exception:
            pass


def held_in_memory() -> int:
    """Bytes this process's object writers hold in memory (their part buffers)."""
    return _held[0]


class _ObjectUpload(NewFile):
    """An object written in parts: nothing is visible until close() completes it; a small
    object is one PUT. At most one part (PART_BYTES) is held, in memory while the
    process's writers hold less than UPLOAD_MEMORY_BYTES together, else in a temporary file."""

    def __init__(self, path: S3Path):
        self._path = path
        self._client = s3_client(path.settings)
        self._buf = _PartBuffer()
        self._upload_id: str | None = None
        self._parts: list[dict[str, Any]] = []

    def write(self, data: bytes) -> None:
        self._buf.write(data)
        if self._buf.n >= PART_BYTES:
            self._send_part()

    def _send_part(self) -> None:
        p = self._path
        if self._upload_id is None:
            self._upload_id = _call(p, self._client.create_multipart_upload,
                                    Bucket=p.bucket, Key=p.key)["UploadId"]
        n = len(self._parts) + 1
        body = self._buf.getvalue()
        self._buf.clear()
        r = _call(p, self._client.upload_part, Bucket=p.bucket, Key=p.key,
                  UploadId=self._upload_id, PartNumber=n, Body=body)
        self._parts.append({"ETag": r["ETag"], "PartNumber": n})

    def close(self, sync: bool = True) -> None:
        """Complete the object (sync=False: in the background, see wait_uploads)."""
        if self._upload_id is None:
            data = self._buf.getvalue()
            self._buf.clear()
            if sync:
                put_bytes(self._path, data)
            else:
                _uploads.submit(lambda: put_bytes(self._path, data), len(data))
            return
        if self._buf.n:
            self._send_part()
        upload_id, self._upload_id = self._upload_id, None
        p = self._path

        def complete() -> None:
            _call(p, self._client.complete_multipart_upload, Bucket=p.bucket, Key=p.key,
                  UploadId=upload_id, MultipartUpload={"Parts": self._parts})

        if sync:
            complete()
        else:
            _uploads.submit(complete, 0)

    def take(self) -> bytes | None:
        if self._upload_id is not None:
            return None
        data = self._buf.getvalue()
        self._buf.clear()
        return data

    def abort(self) -> None:
        if self._upload_id is not None:
            try:
                self._client.abort_multipart_upload(Bucket=self._path.bucket,
                                                    Key=self._path.key,
                                                    UploadId=self._upload_id)
            except Exception:  # the next resume aborts what is left open
                pass
        self._buf.clear()
        self._upload_id = None


class _HeldLocalFile(NewFile):
    """A local file kept in memory until it passes PART_BYTES (as an object upload keeps
    its first part), so a small one can still be taken (`take`) instead of written."""

    def __init__(self, path: Path, mode: int):
        self._path = path
        self._mode = mode
        self._buf: bytearray | None = bytearray()
        self._file: _LocalNewFile | None = None

    def _spill(self) -> _LocalNewFile:
        if self._file is None:
            self._file = _LocalNewFile(self._path, self._mode)
            self.fd = self._file.fd
            buf, self._buf = self._buf, None
            if buf:
                self._file.write(bytes(buf))
        return self._file

    def write(self, data: bytes) -> None:
        if self._file is not None:
            self._file.write(data)
            return
        self._buf += data  # type: ignore[operator]
        if len(self._buf) >= PART_BYTES:  # type: ignore[arg-type]
            self._spill()

    def close(self, sync: bool = True) -> None:
        self._spill().close(sync)

    def abort(self) -> None:
        if self._file is not None:
            self._file.abort()
        self._buf = None

    def take(self) -> bytes | None:
        if self._file is not None or self._buf is None:
            return None
        data, self._buf = bytes(self._buf), None
        return data


def write_new(path: Path | S3Path, mode: int = 0o600, *, hold: bool = False) -> NewFile:
    """Start writing a new file (FileExistsError locally when it exists). `hold`: a local
    file stays in memory while it is small, so that `take` can still have it."""
    if isinstance(path, S3Path):
        return _ObjectUpload(path)
    if hold:
        return _HeldLocalFile(path, mode)
    return _LocalNewFile(path, mode)


def abort_uploads(prefix: Path | S3Path) -> int:
    """Abort the multipart uploads left open under a prefix (a writer killed mid-upload);
    nothing to do locally. Returns how many were aborted."""
    if not isinstance(prefix, S3Path):
        return 0
    client = s3_client(prefix.settings)
    want = f"{prefix.key}/"
    n = 0
    kwargs: dict[str, Any] = {"Bucket": prefix.bucket}
    while True:  # (listed whole and filtered here: some servers sign a Prefix differently)
        r = _call(prefix, client.list_multipart_uploads, **kwargs)
        for u in r.get("Uploads", ()):
            if not u["Key"].startswith(want):
                continue
            try:
                client.abort_multipart_upload(Bucket=prefix.bucket, Key=u["Key"],
                                              UploadId=u["UploadId"])
                n += 1
            except Exception:
                pass
        if not r.get("IsTruncated"):
            return n
        kwargs["KeyMarker"] = r.get("NextKeyMarker", "")
        kwargs["UploadIdMarker"] = r.get("NextUploadIdMarker", "")


def put_bytes(path: S3Path, data: bytes, *, if_none_match: bool = False) -> None:
    client = s3_client(path.settings)
    kwargs: dict[str, Any] = {"Bucket": path.bucket, "Key": path.key, "Body": data}
    if if_none_match:
        kwargs["IfNoneMatch"] = "*"
    _call(path, client.put_object, **kwargs)


def unlink(path: Path | S3Path, *, missing_ok: bool = True) -> None:
    if not isinstance(path, S3Path):
        try:
            os.unlink(path)
        except FileNotFoundError:
            if not missing_ok:
                raise
        return
    client = s3_client(path.settings)
    _call(path, client.delete_object, Bucket=path.bucket, Key=path.key)


def remove_tree(path: Path | S3Path) -> None:
    """Delete a directory and everything in it (every object under the prefix)."""
    if not isinstance(path, S3Path):
        shutil.rmtree(path, ignore_errors=True)
        return
    abort_uploads(path)
    client = s3_client(path.settings)
    for r in _list_pages(path, f"{path.key}/"):
        keys = [{"Key": o["Key"]} for o in r.get("Contents", ())]
        if keys:  # (a page holds 1,000 keys at most, as many as one request deletes)
            _call(path, client.delete_objects, Bucket=path.bucket,
                  Delete={"Objects": keys, "Quiet": True})
    # a store with folders (or a console that made a folder marker) keeps "PREFIX/": it
    # goes too, so the prefix is not listed as an empty directory
    _call(path, client.delete_object, Bucket=path.bucket, Key=f"{path.key}/")


def sync_filesystem(path: Path | S3Path) -> None:
    """Make everything this process wrote durable: syncfs(2) of the filesystem holding a
    local path (os.sync() where there is none); the background uploads of object storage."""
    if isinstance(path, S3Path):
        wait_uploads()
        return
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        if _syncfs is not None and _syncfs(fd) == 0:
            return
        os.sync()
    finally:
        os.close(fd)


def _find_syncfs():
    try:
        import ctypes

        fn = ctypes.CDLL(None, use_errno=True).syncfs
        fn.argtypes = [ctypes.c_int]
        fn.restype = ctypes.c_int
        return fn
    except (OSError, AttributeError):
        return None


_syncfs = _find_syncfs() if sys.platform.startswith("linux") else None


def sync_dir(path: Path | S3Path) -> None:
    """Make a directory's entries durable (fsync); object storage needs nothing."""
    if isinstance(path, S3Path):
        return
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def prepare_dir(path: Path | S3Path, mode: int = 0o700) -> None:
    """Make a directory (and its parents) exist with `mode`; a prefix needs nothing."""
    if isinstance(path, S3Path):
        return
    if path.is_dir():
        os.chmod(path, mode)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    make_dir(path, mode)


def identity(path: Path | S3Path) -> tuple[Any, ...]:
    """What tells one version of a file from another without reading it: device, inode,
    size and mtime of a file; size and ETag of an object (FileNotFoundError when missing)."""
    if not isinstance(path, S3Path):
        st = os.stat(path)
        return (str(path.absolute()), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    head = _head(path)
    return (str(path), int(head["ContentLength"]), head.get("ETag"))


def age_seconds(path: Path | S3Path) -> float:
    """Seconds since the file was last written (FileNotFoundError when missing)."""
    import time

    if not isinstance(path, S3Path):
        return time.time() - os.stat(path).st_mtime
    return time.time() - _head(path)["LastModified"].timestamp()


def break_file(path: Path | S3Path) -> None:
    """Remove a file another process may remove at the same moment (a stale lock): locally
    renamed aside first, so of two such processes one removes it and the other finds it
    gone; an object is deleted."""
    if isinstance(path, S3Path):
        unlink(path)
        return
    import secrets

    aside = path.with_name(f"{path.name}.stale-{secrets.token_hex(4)}")
    try:
        os.rename(path, aside)
        os.unlink(aside)
    except FileNotFoundError:
        pass


def make_dir(path: Path | S3Path, mode: int = 0o700) -> None:
    """Create a directory with `mode` (and fsync its parent); a prefix needs nothing."""
    if isinstance(path, S3Path):
        return
    os.mkdir(path, mode)
    os.chmod(path, mode)
    sync_dir(Path(os.path.dirname(os.path.abspath(path))))


def atomic_write_bytes(path: Path | S3Path, data: bytes, *, durable: bool = True,
                       mode: int = 0o600) -> None:
    """Replace a file atomically: readers see the old content or the new, never a mix (a
    temporary file renamed over it, fsynced unless durable=False; one PUT on S3)."""
    if isinstance(path, S3Path):
        fault_point("rename", path=path)  # DCPTOOL_FAULT: kill-before-manifest-rename
        if durable:
            put_bytes(path, data)
        else:
            _uploads.submit(lambda: put_bytes(path, data), len(data))
        return
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, mode)
        _write_all(fd, data, path)
        if durable:
            try:
                os.fsync(fd)
            except OSError as exc:
                raise named(exc, path) from None
        os.close(fd)
        fd = -1
        fault_point("rename", path=path)  # DCPTOOL_FAULT: kill-before-manifest-rename
        os.replace(tmp, path)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    if durable:
        sync_dir(path.parent)


def create_exclusive(path: Path | S3Path, data: bytes, mode: int = 0o600) -> None:
    """Create a file that must not exist yet (O_EXCL; If-None-Match: * on S3), durably;
    FileExistsError when it does."""
    if isinstance(path, S3Path):
        put_bytes(path, data, if_none_match=True)
        return
    f = _LocalNewFile(path, mode)
    try:
        f.write(data)
        f.close(sync=True)
    except BaseException:
        f.abort()
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        raise
    sync_dir(path.parent)


def replace_prefix_bytes(path: Path | S3Path, keep: int, tail: bytes) -> None:
    """Make a file hold its first `keep` bytes followed by `tail` (recovery's cut of a
    partial backup's last segment). Locally the file is truncated and appended to; an
    object is written anew with that content."""
    if not isinstance(path, S3Path):
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.ftruncate(fd, keep)
            os.lseek(fd, keep, os.SEEK_SET)
            _write_all(fd, tail)
            os.fsync(fd)
        finally:
            os.close(fd)
        return
    data = read_range(path, 0, keep) + tail if keep else bytes(tail)
    put_bytes(path, data)


def rename_dir(src: Path | S3Path, dst: Path | S3Path, *, last: str | None = None) -> None:
    """Move a directory of files: one atomic rename locally; on S3 a server-side copy of
    each object, the one named `last` after all the others (so a reader that goes by it
    sees the others complete), then the source is deleted."""
    if not isinstance(src, S3Path):
        os.rename(src, dst)
        return
    assert isinstance(dst, S3Path)
    client = s3_client(src.settings)
    names = sorted(list_sizes(src), key=lambda n: n == last)
    for name in names:
        s, d = src / name, dst / name
        _call(s, client.copy_object, Bucket=d.bucket, Key=d.key,
              CopySource={"Bucket": s.bucket, "Key": s.key})
    remove_tree(src)


__all__ = ["S3Path", "S3Settings", "Member", "StorageError", "NewFile", "location", "is_remote",
           "pack_cache", "range_held", "held_in_memory", "listdir", "list_sizes", "stat_size", "read_bytes", "read_range", "open_read",
           "file_size", "write_new", "abort_uploads", "unlink", "remove_tree", "sync_dir",
           "make_dir", "atomic_write_bytes", "create_exclusive", "replace_prefix_bytes",
           "rename_dir", "s3_client", "PART_BYTES"]
