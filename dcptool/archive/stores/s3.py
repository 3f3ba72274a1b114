"""The S3 store: an archive under a bucket prefix of object storage (``s3://BUCKET/PREFIX``,
`S3Path` locations).

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

import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any, BinaryIO, Iterator

from dcptool.faults import fault_point

from .base import (PART_BYTES, READ_AHEAD, UPLOADS, KeyPath, NewFile, RangedReader,
                   StorageError, Store)

SCHEME = "s3://"

#: the bytes all object writers of a process hold in memory together, waiting to fill a
#: part: past it, a writer that holds SPILL_MIN_BYTES or more moves its bytes to a
#: temporary file (a task streams hundreds of vbuckets at once, each object a part of up
#: to PART_BYTES in the making)
UPLOAD_MEMORY_BYTES = int(os.environ.get("DCPTOOL_S3_UPLOAD_MEMORY", 0) or 256 << 20)
SPILL_MIN_BYTES = 256 << 10


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


#: one boto3 client per process and settings
CLIENTS: dict[S3Settings, Any] = {}
_clients_lock = threading.Lock()


def s3_client(settings: S3Settings) -> Any:
    """One boto3 client per process and settings (boto3 clients are thread-safe)."""
    client = CLIENTS.get(settings)
    if client is not None:
        return client
    with _clients_lock:
        client = CLIENTS.get(settings)
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
            CLIENTS[settings] = client
    return client


class S3Path(KeyPath):
    """An object key (or key prefix) in a bucket, with the S3 service's settings."""

    __slots__ = ("settings",)

    scheme = SCHEME

    def __init__(self, bucket: str, key: str = "", settings: S3Settings | None = None):
        super().__init__(bucket, key)
        self.settings = settings if settings is not None else S3Settings.from_env()

    def _child(self, key: str) -> "S3Path":
        return S3Path(self.bucket, key, self.settings)

    def __getstate__(self) -> tuple:
        return (self.bucket, self.key, self.settings)

    def __setstate__(self, state: tuple) -> None:
        self.bucket, self.key, self.settings = state


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


def put_bytes(path: S3Path, data: bytes, *, if_none_match: bool = False) -> None:
    client = s3_client(path.settings)
    kwargs: dict[str, Any] = {"Bucket": path.bucket, "Key": path.key, "Body": data}
    if if_none_match:
        kwargs["IfNoneMatch"] = "*"
    _call(path, client.put_object, **kwargs)


def read_range(path: S3Path, offset: int, length: int) -> bytes:
    if length <= 0:
        return b""
    client = s3_client(path.settings)
    return _call(path, client.get_object, Bucket=path.bucket, Key=path.key,
                 Range=f"bytes={offset}-{offset + length - 1}")["Body"].read()


class _ObjectReader(RangedReader):
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
            self._size = int(_head(path)["ContentLength"])
            if self._size:
                raise
            return
        self._buf = r["Body"].read()
        total = str(r.get("ContentRange") or "").rpartition("/")[2]
        self._size = int(total) if total.isdigit() else len(self._buf)

    def _range(self, offset: int, length: int) -> bytes:
        return read_range(self._path, offset, length)


# -- writing -------------------------------------------------------------------------------------

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
                UPLOADS.submit(lambda: put_bytes(self._path, data), len(data))
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
            UPLOADS.submit(complete, 0)

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


# -- the store -----------------------------------------------------------------------------------


class S3Store(Store):
    """Objects under a prefix of an S3 bucket."""

    scheme = SCHEME
    location_type = S3Path
    packs = True
    deferred_uploads = True
    needs_credentials = True
    lock_leases = True

    def parse(self, text: str) -> S3Path:
        return S3Path.parse(text)  # type: ignore[return-value]

    # -- reading -----------------------------------------------------------------------------

    def is_dir(self, path: Any) -> bool:
        client = s3_client(path.settings)
        prefix = f"{path.key}/" if path.key else ""
        r = _call(path, client.list_objects_v2, Bucket=path.bucket, Prefix=prefix, MaxKeys=1)
        return bool(r.get("KeyCount"))

    def list_sizes(self, path: Any, *, dirs: bool = False) -> dict[str, int]:
        """One listing (a prefix without objects is empty)."""
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

    def stat(self, path: Any) -> int:
        return int(_head(path)["ContentLength"])

    def read_bytes(self, path: Any) -> bytes:
        client = s3_client(path.settings)
        return _call(path, client.get_object, Bucket=path.bucket, Key=path.key)["Body"].read()

    def read_range(self, path: Any, offset: int, length: int) -> bytes:
        return read_range(path, offset, length)

    def open_read(self, path: Any) -> BinaryIO:
        return _ObjectReader(path)  # type: ignore[return-value]

    def pack_cache_key(self, pack: Any) -> tuple | None:
        return (pack.settings.endpoint_url, pack.bucket, pack.key)

    def load_whole(self, pack: Any, limit: int) -> bytes | None:
        """One ranged GET of `limit` bytes (FileNotFoundError when the pack is missing)."""
        try:
            client = s3_client(pack.settings)
            r = _call(pack, client.get_object, Bucket=pack.bucket, Key=pack.key,
                      Range=f"bytes=0-{limit - 1}")
            total = str(r.get("ContentRange") or "").rpartition("/")[2]
            body = r["Body"].read()
            return body if not total.isdigit() or int(total) == len(body) else None
        except StorageError:
            if self.stat(pack):  # (an empty object has no range: 416)
                raise
            return b""

    def identity(self, path: Any) -> tuple[Any, ...]:
        """Size and ETag."""
        head = _head(path)
        return (str(path), int(head["ContentLength"]), head.get("ETag"))

    def age_seconds(self, path: Any) -> float:
        return time.time() - _head(path)["LastModified"].timestamp()

    # -- writing -----------------------------------------------------------------------------

    def write_new(self, path: Any, mode: int = 0o600, *, hold: bool = False) -> NewFile:
        """A multipart upload (one PUT when small), visible once complete."""
        return _ObjectUpload(path)

    def put(self, path: Any, data: bytes, *, if_absent: bool = False) -> None:
        put_bytes(path, data, if_none_match=if_absent)

    def atomic_write_bytes(self, path: Any, data: bytes, *, durable: bool = True,
                           mode: int = 0o600) -> None:
        """One PUT (in the background unless durable)."""
        fault_point("rename", path=path)  # DCPTOOL_FAULT: kill-before-manifest-rename
        if durable:
            put_bytes(path, data)
        else:
            UPLOADS.submit(lambda: put_bytes(path, data), len(data))

    def unlink(self, path: Any, *, missing_ok: bool = True) -> None:
        client = s3_client(path.settings)
        _call(path, client.delete_object, Bucket=path.bucket, Key=path.key)

    def abort_uploads(self, prefix: Any) -> int:
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

    def remove_tree(self, path: Any) -> None:
        """Every object under the prefix, and the uploads left open there."""
        self.abort_uploads(path)
        client = s3_client(path.settings)
        for r in _list_pages(path, f"{path.key}/"):
            keys = [{"Key": o["Key"]} for o in r.get("Contents", ())]
            if keys:  # (a page holds 1,000 keys at most, as many as one request deletes)
                _call(path, client.delete_objects, Bucket=path.bucket,
                      Delete={"Objects": keys, "Quiet": True})
        # a store with folders (or a console that made a folder marker) keeps "PREFIX/": it
        # goes too, so the prefix is not listed as an empty directory
        _call(path, client.delete_object, Bucket=path.bucket, Key=f"{path.key}/")

    def rename_dir(self, src: Any, dst: Any, *, last: str | None = None) -> None:
        """A server-side copy of each object (`last` after the others), then the source
        deleted."""
        client = s3_client(src.settings)
        names = sorted(self.list_sizes(src), key=lambda n: n == last)
        for name in names:
            s, d = src / name, dst / name
            _call(s, client.copy_object, Bucket=d.bucket, Key=d.key,
                  CopySource={"Bucket": s.bucket, "Key": s.key})
        self.remove_tree(src)


S3 = S3Store()
S3Path.store = S3

__all__ = ["S3Store", "S3", "S3Path", "S3Settings", "s3_client", "CLIENTS", "put_bytes",
           "held_in_memory", "SCHEME", "UPLOAD_MEMORY_BYTES", "SPILL_MIN_BYTES"]
