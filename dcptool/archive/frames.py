"""Reading data files: zstd frames found by their headers, records inside each frame.

A data file is a plain concatenation of zstd frames (RFC 8878). Each frame decompresses to
whole records (version 1: msgpack records one after the other; version 2: a columnar
block, see block.py): a record never spans two frames. So a reader can find frame
boundaries from the zstd block headers alone, decompress one frame at a time (memory bounded
by the frame size) and tell a torn last frame (a writer killed mid-write) from a complete one.

Everything here raises `CorruptFileError` naming the file and byte offset; nothing lets a
zstd or msgpack exception escape.
"""
from __future__ import annotations

import hashlib
import os
import threading
from typing import Any, BinaryIO, Iterator

import msgpack
import zstandard

from . import crypto, storage
from .block import BLOCK_MARK, BlockError, decode_block, encode_records
from .errors import CorruptFileError
from .format import (
    COLLECTIONS_VERSION,
    ITEM_TYPES,
    REC_DELETION,
    REC_SYSTEM_EVENT,
    END,
    REC_EXPIRATION,
    HEADER,
    MAX_FRAME_CONTENT,
    REC_MUTATION,
    RECORD_NAMES,
    ROLLBACK,
    SNAPSHOT,
    STREAM,
    sealed_name,
)

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_SKIPPABLE_LOW = 0x184D2A50
_READ_CHUNK = 1 << 20
_BLOCK_MARK = bytes((BLOCK_MARK,))
_MAX_BLOCK = 128 << 10
#: the most a sealed frame's body may claim (a zstd frame of MAX_FRAME_CONTENT and change)
_MAX_SEALED = MAX_FRAME_CONTENT + (1 << 20)


_N = type(None)
#: (record type, python type of each field...) of every well-formed record
_SHAPES = frozenset({
    (HEADER, int, str, int, int, str, int),
    (STREAM, int, int, int, int, int, tuple),
    (SNAPSHOT, int, int, int, int),
    (REC_MUTATION, int, int, int, int, int, int, int, bytes, bytes, _N),
    (REC_MUTATION, int, int, int, int, int, int, int, bytes, bytes, bytes),
    (REC_DELETION, int, int, int, int, bytes, int, int, bytes),
    (REC_EXPIRATION, int, int, int, int, bytes, int, int, bytes),
    (ROLLBACK, int, int, int),
    (END, int, int, int, int, int),
    # format 3: (8, seqno, event, manifest_uid, scope_id, collection_id|nil, name, max_ttl)
    (REC_SYSTEM_EVENT, int, int, int, int, int, int, str, int),
    (REC_SYSTEM_EVENT, int, int, int, int, int, _N, str, int),
})


def legacy_doc_keys(records: list[tuple]) -> list[tuple]:
    """The records of a format 1 or 2 data file with their item keys in the doc key form
    of format 3: every key gets the default collection's prefix (0x00), as those formats
    only ever held the default collection. Other records are kept as they are."""
    out = []
    app = out.append
    items = ITEM_TYPES
    for r in records:
        t = r[0] if type(r) is tuple and r else None
        if t in items:  # (a malformed record is left for the validation to report)
            if t == 3:
                if len(r) == 10 and type(r[7]) is bytes:
                    r = (3, r[1], r[2], r[3], r[4], r[5], r[6], b"\x00" + r[7], r[8], r[9])
            elif len(r) == 8 and type(r[4]) is bytes:
                r = (t, r[1], r[2], r[3], b"\x00" + r[4], r[5], r[6], r[7])
        app(r)
    return out


def record_ok(rec: object) -> bool:
    """Whether a decoded record has the field types of its record type (so code that
    indexes and compares its fields cannot fail on it)."""
    try:
        if type(rec) is not tuple or (rec[0], *map(type, rec)) not in _SHAPES:
            return False
    except (IndexError, TypeError):
        return False
    if rec[0] == STREAM:
        return all(type(e) is tuple and len(e) == 2 and type(e[0]) is int and type(e[1]) is int
                   for e in rec[5])
    return True


def check_records(records: list, path: str, offset: int) -> None:
    """Raise CorruptFileError unless every record is well-formed (see record_ok)."""
    shapes = _SHAPES
    try:
        for rec in records:
            if type(rec) is not tuple or (rec[0], *map(type, rec)) not in shapes:
                break
            if rec[0] == STREAM and not record_ok(rec):
                break
        else:
            return
    except (IndexError, TypeError):
        pass
    for i, rec in enumerate(records):
        if not record_ok(rec):
            what = RECORD_NAMES.get(rec[0], "unknown") if type(rec) is tuple and rec \
                and type(rec[0]) is int else "malformed"
            raise CorruptFileError(path, f"record {i} of the zstd frame is not a well-formed "
                                         f"{what} record", offset=offset)


class TornFrame(Exception):
    """The file ends inside a frame (only raised internally by the scanner)."""


def frame_end(buf: bytes | bytearray | memoryview, pos: int) -> int | None:
    """Offset just past the zstd frame starting at `pos`, or None when `buf` ends first.

    Raises ValueError when the bytes at `pos` are not a zstd frame.
    """
    n = len(buf)
    if n - pos < 6:
        if n - pos >= 4 and bytes(buf[pos:pos + 4]) != ZSTD_MAGIC and not _is_skippable(buf, pos):
            raise ValueError("not a zstd frame (bad magic number)")
        return None
    if bytes(buf[pos:pos + 4]) != ZSTD_MAGIC:
        if _is_skippable(buf, pos):
            if n - pos < 8:
                return None
            size = int.from_bytes(buf[pos + 4:pos + 8], "little")
            end = pos + 8 + size
            return end if end <= n else None
        raise ValueError("not a zstd frame (bad magic number)")
    fhd = buf[pos + 4]
    if fhd & 0x08:
        raise ValueError("zstd frame header has its reserved bit set")
    fcs_flag = fhd >> 6
    single = (fhd >> 5) & 1
    has_checksum = (fhd >> 2) & 1
    dict_flag = fhd & 3
    off = pos + 5
    if not single:
        off += 1
    off += (0, 1, 2, 4)[dict_flag]
    off += (1 if single else 0, 2, 4, 8)[fcs_flag]
    while True:
        if off + 3 > n:
            return None
        bh = buf[off] | (buf[off + 1] << 8) | (buf[off + 2] << 16)
        last = bh & 1
        btype = (bh >> 1) & 3
        bsize = bh >> 3
        if btype == 3:
            raise ValueError("zstd block of reserved type")
        if bsize > _MAX_BLOCK:
            raise ValueError("zstd block larger than 128 KiB")
        off += 3 + (1 if btype == 1 else bsize)
        if off > n:
            return None
        if last:
            break
    if has_checksum:
        off += 4
        if off > n:
            return None
    return off


def _is_skippable(buf: bytes | bytearray | memoryview, pos: int) -> bool:
    magic = int.from_bytes(buf[pos:pos + 4], "little")
    return magic & 0xFFFFFFF0 == _SKIPPABLE_LOW


def scan_frames(f: BinaryIO, path: str, *, start: int = 0,
                key: Any = None) -> Iterator[tuple[int, bytes]]:
    """Yield (file offset, compressed frame bytes) for every complete frame.

    Raises TornFrame(offset) when the file ends inside a frame and CorruptFileError when
    the bytes at a frame boundary are not a frame. Skippable frames are passed over. In an
    encrypted archive every frame is sealed (see crypto.py): each is opened and checked as
    it is read under `key` (the archive's data key), and the zstd frame inside is yielded.
    """
    for offset, _stored, frame in scan_stored_frames(f, path, start=start, key=key):
        yield offset, frame


def scan_stored_frames(f: BinaryIO, path: str, *, start: int = 0,
                       key: Any = None) -> Iterator[tuple[int, int, bytes]]:
    """Like scan_frames, yielding (file offset, bytes the frame takes in the file, zstd
    frame)."""
    opener = crypto.frame_opener(key, sealed_name(path))
    f.seek(start)
    buf = bytearray()
    base = start  # file offset of buf[0]
    pos = 0
    eof = False
    while True:
        if pos >= len(buf) and eof:
            return
        try:
            end = frame_end(buf, pos) if pos < len(buf) else None
        except ValueError as exc:
            raise CorruptFileError(path, str(exc), offset=base + pos) from None
        if end is None:
            if eof:
                raise TornFrame(base + pos)
            if opener is not None and len(buf) - pos >= 8 \
                    and int.from_bytes(buf[pos + 4:pos + 8], "little") > _MAX_SEALED:
                raise CorruptFileError(path, "sealed frame claims more bytes than a frame "
                                             "holds: the file was tampered with",
                                       offset=base + pos)
            if pos:
                del buf[:pos]
                base += pos
                pos = 0
            chunk = f.read(_READ_CHUNK)
            if not chunk:
                eof = True
            else:
                buf += chunk
            continue
        magic = bytes(buf[pos:pos + 4])
        if opener is None:
            if magic == ZSTD_MAGIC:
                yield base + pos, end - pos, bytes(buf[pos:end])
            elif magic == crypto.ENVELOPE_MAGIC:  # (or the caller gave no key)
                raise crypto.SealedWithoutKeyError(path, "sealed (encrypted) frame in an "
                                                   "archive that is not encrypted",
                                                   offset=base + pos)
        elif magic == crypto.ENVELOPE_MAGIC:
            try:
                frame = opener.open(memoryview(buf)[pos + 8:end], base + pos)
            except crypto.TamperedError as exc:
                raise CorruptFileError(path, f"frame {exc}", offset=base + pos) from None
            yield base + pos, end - pos, frame
        else:
            raise CorruptFileError(path, "frame is not encrypted in an encrypted archive: the "
                                         "file was tampered with", offset=base + pos)
        pos = end


_local = threading.local()


def _dctx() -> zstandard.ZstdDecompressor:
    """A decompressor per thread (a ZstdDecompressor must not be used by two threads at once)."""
    d = getattr(_local, "dctx", None)
    if d is None:
        d = _local.dctx = zstandard.ZstdDecompressor()
    return d


def decompress_frame(frame: bytes, path: str, offset: int) -> bytes:
    """The uncompressed content of one frame, checked against its checksum when it has one."""
    try:
        size = zstandard.frame_content_size(frame)
    except zstandard.ZstdError as exc:
        raise CorruptFileError(path, f"bad zstd frame header: {exc}", offset=offset) from None
    if size > MAX_FRAME_CONTENT:
        raise CorruptFileError(path, f"zstd frame claims {size} uncompressed bytes", offset=offset)
    try:
        return _dctx().decompress(frame, max_output_size=MAX_FRAME_CONTENT)
    except zstandard.ZstdError as exc:
        raise CorruptFileError(path, f"zstd frame does not decompress: {exc}",
                               offset=offset) from None


def new_unpacker() -> msgpack.Unpacker:
    return msgpack.Unpacker(use_list=False, raw=False, strict_map_key=False,
                            max_buffer_size=MAX_FRAME_CONTENT)


def frame_records(content: bytes, path: str, offset: int, *,
                  validate: bool = True) -> list[tuple]:
    """All records of one frame's content; the content must end exactly after the last.
    With `validate`, every record must have its type's layout (check_records)."""
    if content[:1] == _BLOCK_MARK:
        records = _block_records(content, path, offset)
        if validate:
            check_records(records, path, offset)
        return records
    unpacker = new_unpacker()
    try:
        unpacker.feed(content)
        records = list(unpacker)
        used = unpacker.tell()
    except Exception as exc:  # msgpack raises several unrelated types on bad input
        raise CorruptFileError(path, f"records in the zstd frame do not decode: "
                                     f"{type(exc).__name__}: {exc}", offset=offset) from None
    if used != len(content):
        raise CorruptFileError(path, f"zstd frame ends inside a record "
                                     f"({len(content) - used} bytes left over)", offset=offset)
    if validate:
        check_records(records, path, offset)
    return records


def frame_records_with_ends(content: bytes, path: str, offset: int) -> list[tuple[tuple, int]]:
    """Like frame_records, with where each record ends: for version 1 records the byte
    offset (within the content) just past it, for a version 2 block (whose records have no
    byte offsets) the number of records up to and including it. Either way the last
    record's end is the content's full measure (see `content_prefix`)."""
    if content[:1] == _BLOCK_MARK:
        return [(rec, i) for i, rec in enumerate(_block_records(content, path, offset), 1)]
    unpacker = new_unpacker()
    out: list[tuple[tuple, int]] = []
    try:
        unpacker.feed(content)
        for rec in unpacker:
            out.append((rec, unpacker.tell()))
        used = unpacker.tell()
    except Exception as exc:
        raise CorruptFileError(path, f"records in the zstd frame do not decode: "
                                     f"{type(exc).__name__}: {exc}", offset=offset) from None
    if used != len(content):
        raise CorruptFileError(path, f"zstd frame ends inside a record "
                                     f"({len(content) - used} bytes left over)", offset=offset)
    return out


def _block_records(content: bytes, path: str, offset: int) -> list[tuple]:
    try:
        return decode_block(content)
    except BlockError as exc:
        raise CorruptFileError(path, f"the block in the zstd frame does not decode: {exc}",
                               offset=offset) from None


def content_prefix(content: bytes, keep: int, path: str, offset: int) -> list[bytes]:
    """The sections of a frame content cut after the record whose end (as given by
    frame_records_with_ends) is `keep`: version 1 bytes are sliced, a version 2 block is
    encoded again from its first `keep` records. Compress with `compress_sections`."""
    if content[:1] == _BLOCK_MARK:
        return encode_records(_block_records(content, path, offset)[:keep])
    return [content[:keep]]


def iter_frame_batches(path: str | os.PathLike[str], *, expect_size: int | None = None,
                       expect_sha256: str | None = None, validate: bool = True,
                       doc_keys: bool = True, key: Any = None) -> Iterator[list[tuple]]:
    """Yield the records of a data file one frame (~1 MiB uncompressed) at a time (`key`:
    the data key of an encrypted archive, None for a plain one).

    Item keys come out as doc keys (collection-prefixed): a file whose header names format
    1 or 2 (keys without prefix, all in the default collection) has the 0x00 prefix given
    to each key as it is read (`doc_keys=False`: keys as stored). A format 3 file costs
    nothing extra.

    A torn or corrupt frame raises CorruptFileError naming the file; nothing is silently
    skipped. Every frame carries a content checksum, so a changed byte is caught in the frame
    that holds it. `expect_size` is checked before the first record; `expect_sha256` is
    checked once the whole file was read (after the last batch). `validate` checks every
    record's field types (~0.7 us a record); turn it off only for files already verified.
    """
    where = storage.location(path)
    path = str(where)
    try:
        f = storage.open_read(where)
    except FileNotFoundError:
        raise CorruptFileError(path, "file is missing") from None
    except OSError as exc:
        raise CorruptFileError(path, f"cannot read: {exc.strerror}") from None
    with f:
        if expect_size is not None:
            size = storage.file_size(f)
            if size != expect_size:
                raise CorruptFileError(path, f"size is {size} bytes, the manifest says "
                                             f"{expect_size}")
        src: BinaryIO = f
        hashing = None
        if expect_sha256 is not None:
            hashing = _HashingReader(f)
            src = hashing  # type: ignore[assignment]
        legacy = False
        first = True
        try:
            # (a pack member opens by its name)
            for offset, frame in scan_frames(src, where, key=key):
                batch = frame_records(decompress_frame(frame, path, offset), path, offset,
                                      validate=validate)
                if first:
                    first = False
                    head = batch[0] if batch else None
                    # the header names the file's format (a malformed one is the caller's
                    # to report: the records are handed out as they are)
                    legacy = doc_keys and type(head) is tuple and len(head) == 6 \
                        and head[0] == HEADER and type(head[2]) is int \
                        and head[2] < COLLECTIONS_VERSION
                if legacy:
                    batch = legacy_doc_keys(batch)
                yield batch
        except TornFrame as torn:
            raise CorruptFileError(path, "file ends inside a zstd frame (truncated)",
                                   offset=torn.args[0]) from None
        except OSError as exc:
            raise CorruptFileError(path, f"cannot read: {exc.strerror}") from None
        if hashing is not None and hashing.hexdigest() != expect_sha256:
            raise CorruptFileError(path, "SHA-256 does not match the manifest")


class _HashingReader:
    """A file wrapper that hashes what is read sequentially."""

    def __init__(self, f: BinaryIO):
        self._f = f
        self._h = hashlib.sha256()

    def seek(self, pos: int) -> None:
        if pos != 0:
            raise ValueError("hashing reader only reads from the start")
        self._f.seek(0)

    def read(self, n: int) -> bytes:
        data = self._f.read(n)
        self._h.update(data)
        return data

    def hexdigest(self) -> str:
        return self._h.hexdigest()


def iter_file_records(path: str | os.PathLike[str], *, validate: bool = True,
                      doc_keys: bool = True, key: Any = None) -> Iterator[tuple]:
    """Yield every record of one data file in order (header record included); keys as
    `iter_frame_batches` gives them."""
    for batch in iter_frame_batches(path, validate=validate, doc_keys=doc_keys, key=key):
        yield from batch
