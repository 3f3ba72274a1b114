"""The columnar block of format version 2: what one zstd frame of a data file holds.

Version 1 frames hold msgpack records one after the other, so every record's metadata
(seqno, CAS, key) sits between two values. zstd then codes the values' literals with one
Huffman table for the whole mixture and the CAS bytes (nearly random) spoil it: in the
benchmark's documents the records took ~14 % more than `zstd -3` of the bare values.

A version 2 block keeps the same records but stores them by column (see
docs/archive-format.md, "Blocks"):

    0xC1  u32le(len(head))  head  cas-planes  keys  values

* `head` is one msgpack array: `[kinds, others, seqno deltas, rev seqnos, a, b, datatypes,
  xattrs, len(keys)]`. `kinds` (bin) has one byte per record: its record type. `others`
  holds the records that are not items (header, stream, snapshot, rollback, end, and in
  format 3 system events) as plain record arrays, in order. The per-item columns follow, in item order: the seqno as the
  difference to the previous item's seqno (the first to 0), the rev seqno, `a` (a mutation's
  flags, a tombstone's delete time), `b` (a mutation's expiry, 0 for tombstones), the
  datatype, and `xattrs`: nil when no mutation of the block has a separate xattr section,
  else `[[item index, bin], ...]` for those that have one.
* `cas-planes`: the CAS of each item as the difference to the previous item's CAS
  (modulo 2^64), as 8-byte big-endian integers stored byte plane by byte plane (all first
  bytes, then all second bytes, ...): 8 x items bytes.
* `keys`: when every key of the block has the same length L (and there is at least one),
  `0xC1 u32le(L)` and then n x L bytes: the first key, then each key XOR the key before it
  (keys of one vbucket share long prefixes, which become runs of zero bytes); otherwise one
  msgpack array of bin, in item order.
* `values`: one msgpack array of bin, in item order.

The writer compresses the four parts as separate zstd blocks of one frame (a block flush
between them), so values get literal statistics of their own. The first byte 0xC1 is never
used by msgpack, so a reader tells a version 2 block from version 1 records by it.
"""
from __future__ import annotations

import struct
import threading
from array import array
from itertools import accumulate, chain, repeat
from operator import add, sub
from typing import Sequence

import msgpack
import zstandard

BLOCK_MARK = 0xC1
_MARK = b"\xc1"
_U32 = struct.Struct("<I")
_M64 = (1 << 64) - 1
_ITEM = (False, False, False, True, True, True, False, False, False)
#: per record type: 0 an item (in the columns), 1 another record (in `others`; 8, the
#: system event of format 3, too), 2 unknown
_MASK = bytes([1, 1, 1, 0, 0, 0, 1, 1, 1] + [2] * 247)
_FLUSH_BLOCK = zstandard.COMPRESSOBJ_FLUSH_BLOCK
#: fields per item in BlockBuilder.rows
ROW = 10
#: the size estimate of an item's key and metadata (BlockBuilder.size: 3 bytes a row field)
ITEM_COST = 3 * ROW


_local = threading.local()


def _packer() -> msgpack.Packer:
    """This thread's msgpack packer for block sections. A packer keeps its buffer between
    calls: a new one per block started at 256 KiB and grew (reallocated, fresh pages) to
    the size of the values section each time."""
    p = getattr(_local, "packer", None)
    if p is None:
        p = _local.packer = msgpack.Packer(use_bin_type=True)
    return p


class BlockError(ValueError):
    """The bytes are not a well-formed version 2 block."""


def _deltas(values: Sequence[int]) -> list[int]:
    """Each value minus the one before it (the first minus 0)."""
    return list(map(sub, values, chain((0,), values)))


def _cas_planes(cas: Sequence[int]) -> bytes:
    """The CAS column: differences to the CAS before (mod 2^64), as big-endian u64 stored
    byte plane by byte plane (numpy: one vectorised pass instead of a Python int per item)."""
    if not len(cas):
        return b""
    import numpy as np  # here, not at module level: 0.1 s of every CLI start

    try:
        # through array('Q'): twice as fast as numpy's conversion of a list of Python ints
        col = np.frombuffer(array("Q", cas), dtype=np.uint64)
    except (OverflowError, ValueError, TypeError):  # not u64s: the same bits modulo 2^64
        col = np.array([c & _M64 for c in cas], dtype=np.uint64)
    deltas = np.empty(len(col), dtype=">u8")
    deltas[0] = col[0]
    np.subtract(col[1:], col[:-1], out=deltas[1:])  # wraps modulo 2^64
    return deltas.view(np.uint8).reshape(-1, 8).T.tobytes()


def _cas_values(planes: bytes | memoryview, n: int) -> list[int]:
    if len(planes) != 8 * n:
        raise BlockError("CAS section has the wrong length")
    if not n:
        return []
    raw = bytearray(8 * n)
    for j in range(8):
        raw[j::8] = planes[j * n:(j + 1) * n]
    values = list(accumulate(struct.unpack(f">{n}q", raw), add))
    if min(values) < 0 or max(values) > _M64:
        values = [x & _M64 for x in values]
    return values


def _encode_keys(keys: Sequence[bytes], p: msgpack.Packer) -> bytes:
    """The keys part: equal-length keys XOR-coded against the key before (one vectorised
    XOR over the whole column), else a msgpack array of bin."""
    n = len(keys)
    if n:
        size = len(keys[0])
        joined = b"".join(keys)
        # the total and the longest equal to n x the first's length: all are that long
        if 0 < size and len(joined) == n * size and max(map(len, keys)) == size:
            import numpy as np
            col = np.frombuffer(joined, dtype=np.uint8).reshape(n, size)
            coded = col.copy()
            np.bitwise_xor(col[1:], col[:-1], out=coded[1:])
            return _MARK + _U32.pack(size) + coded.tobytes()
    return p.pack(list(keys))


def _decode_keys(part: memoryview, n: int) -> tuple:
    if len(part) and part[0] == BLOCK_MARK:
        if len(part) < 5:
            raise BlockError("keys section is too short")
        size = _U32.unpack_from(part, 1)[0]
        if size == 0 or len(part) - 5 != n * size:
            raise BlockError("keys section has the wrong length")
        coded = int.from_bytes(part[5:], "big")
        # undo the XOR with the key before: each step doubles the span of keys folded in
        shift = 8 * size
        while shift < 8 * n * size:
            coded ^= coded >> shift
            shift *= 2
        raw = coded.to_bytes(n * size, "big")
        return tuple([raw[i:i + size] for i in range(0, n * size, size)])
    return msgpack.unpackb(part, use_list=False, raw=False)


class BlockBuilder:
    """Collects records for one block. The writer's hot path appends to `rows`, `kinds` and
    `vbytes` directly (see VBucketWriter.mutation_events); `sections()` encodes."""

    __slots__ = ("kinds", "others", "rows", "vbytes", "xattrs")

    def __init__(self) -> None:
        self.kinds = bytearray()   # one byte per record: its type
        self.others: list[tuple] = []  # the non-item records
        #: per item ROW fields, flat, in the layout of a DCP client mutation event (so the
        #: writer's hot path extends it with whole events): kind, vbucket (unused), seqno,
        #: rev_seqno, cas, a, b, datatype, key, value. Keys and values are bytes objects of
        #: their own (not views of a buffer that is reused); values are packed when the
        #: block is encoded.
        self.rows: list = []
        self.xattrs: list[list] = []  # [item index, xattrs] of mutations with separate xattrs
        self.vbytes = 0  # value bytes so far (for the size estimate)

    def __len__(self) -> int:
        return len(self.kinds)

    def items(self) -> int:
        return len(self.rows) // ROW

    def size(self) -> int:
        """Roughly the uncompressed size of the block so far: the values, ITEM_COST bytes
        per item for its key and metadata, 64 per other record."""
        return self.vbytes + 3 * len(self.rows) + (len(self.others) << 6)

    def add(self, rec: Sequence) -> None:
        """Append one record tuple in the format's layout (any record type)."""
        t = rec[0]
        if t == 3:
            x = rec[9] if len(rec) > 9 else None
            if x is not None:
                self.xattrs.append([len(self.rows) // ROW, bytes(x)])
            v = rec[8] if type(rec[8]) is bytes else bytes(rec[8])
            self.rows.extend((3, 0, rec[1], rec[2], rec[3], rec[4], rec[5], rec[6],
                              bytes(rec[7]), v))
            self.vbytes += len(v)
        elif t == 4 or t == 5:
            v = rec[7] if type(rec[7]) is bytes else bytes(rec[7])
            self.rows.extend((t, 0, rec[1], rec[2], rec[3], rec[5], 0, rec[6], bytes(rec[4]), v))
            self.vbytes += len(v)
        else:
            self.others.append(tuple(rec))
        self.kinds.append(t)

    def insert_first(self, rec: tuple) -> None:
        """Put a non-item record (a segment's header) before everything collected so far."""
        self.kinds[0:0] = bytes((rec[0],))
        self.others.insert(0, rec)

    def sections(self) -> list[bytes]:
        """The block's four parts (their concatenation is the frame's content)."""
        rows = self.rows
        seqs, revs, cas, a, b, dts, key_col, values = [rows[j::ROW] for j in range(2, ROW)]
        p = _packer()
        keys = _encode_keys(key_col, p)
        head = p.pack([bytes(self.kinds), self.others, _deltas(seqs), revs, a, b, dts,
                       self.xattrs or None, len(keys)])
        # the values: one msgpack array of bin, packed in one call (3x faster than a call
        # per value and a join)
        return [_MARK + _U32.pack(len(head)) + head, _cas_planes(cas), keys, p.pack(values)]


def encode_records(records: Sequence[Sequence]) -> list[bytes]:
    """The sections of a block holding `records` (in the format's record layout)."""
    b = BlockBuilder()
    for r in records:
        b.add(r)
    return b.sections()


def block_compressor(level: int) -> zstandard.ZstdCompressor:
    """The zstd compressor blocks are written with: `level`'s parameters for inputs of
    unknown size, with a minimum match of 7 bytes at the fast levels (1-9), and a checksum.

    The fixed parameters matter: given the content size, zstd picks parameters for small
    inputs, which coded the benchmark's 256 KiB value sections 4 % larger. Matches of 5-6
    bytes inside text (spurious repeats of short letter runs) cost more than the literals
    they replace; at 7 the values of the benchmark's documents took 0.5 % less."""
    params = zstandard.ZstdCompressionParameters.from_level
    mm = params(level).min_match
    return zstandard.ZstdCompressor(compression_params=params(
        level, min_match=max(7, mm) if level <= 9 else mm, write_checksum=1))


def compress_sections(cctx: zstandard.ZstdCompressor, sections: Sequence[bytes]) -> bytes:
    """One zstd frame (content size and checksum per cctx) holding the sections, each part
    starting a new zstd block."""
    obj = cctx.compressobj(size=sum(map(len, sections)))
    out = []
    last = len(sections) - 1
    for i, s in enumerate(sections):
        if s:
            out.append(obj.compress(s))
            if i < last:
                out.append(obj.flush(_FLUSH_BLOCK))
    out.append(obj.flush())
    return b"".join(out)


def decode_block(content: bytes | bytearray | memoryview) -> list[tuple]:
    """The records of a version 2 block; raises BlockError when it is malformed."""
    try:
        return _decode(memoryview(content))
    except BlockError:
        raise
    except Exception as exc:  # msgpack, struct and index errors on damaged input
        raise BlockError(f"{type(exc).__name__}: {exc}") from None


def _decode(mv: memoryview) -> list[tuple]:
    if len(mv) < 5 or mv[0] != BLOCK_MARK:
        raise BlockError("not a block")
    hlen = _U32.unpack_from(mv, 1)[0]
    pos = 5 + hlen
    if pos > len(mv):
        raise BlockError("block head runs past the content")
    head = msgpack.unpackb(mv[5:pos], use_list=False, raw=False, strict_map_key=False)
    if type(head) is not tuple or len(head) != 9:
        raise BlockError("block head is not a 9-element array")
    kinds, others, deltas, revs, a, b, dts, xattrs, klen = head
    if type(kinds) is not bytes or type(others) is not tuple or type(klen) is not int:
        raise BlockError("block head has fields of the wrong type")
    n = len(deltas)
    if not (len(revs) == len(a) == len(b) == len(dts) == n):
        raise BlockError("block columns differ in length")
    cas = _cas_values(mv[pos:pos + 8 * n], n)
    pos += 8 * n
    if klen < 0 or pos + klen > len(mv):
        raise BlockError("keys section runs past the content")
    keys = _decode_keys(mv[pos:pos + klen], n)
    vals = msgpack.unpackb(mv[pos + klen:], use_list=False, raw=False)
    if type(keys) is not tuple or type(vals) is not tuple or len(keys) != n or len(vals) != n:
        raise BlockError("keys or values do not match the item count")
    item = _ITEM
    mask = kinds.translate(_MASK)  # 0 an item, 1 another record, 2 an unknown type
    if 2 in mask:
        raise BlockError(f"unknown record type {kinds[mask.index(2)]}")
    if mask.count(0) != n or len(kinds) - n != len(others):
        raise BlockError("record kinds do not match the columns")
    seqs = list(accumulate(deltas, add))
    if n and kinds.count(3) == n and xattrs is None:
        items = list(zip(repeat(3), seqs, revs, cas, a, b, dts, keys, vals, repeat(None)))
    else:
        xat = {}
        if xattrs is not None:
            for i, x in xattrs:
                xat[i] = x
        ik = [k for k in kinds if item[k]]
        items = []
        app = items.append
        for i in range(n):
            k = ik[i]
            if k == 3:
                app((3, seqs[i], revs[i], cas[i], a[i], b[i], dts[i], keys[i], vals[i],
                     xat.get(i)))
            else:
                app((k, seqs[i], revs[i], cas[i], keys[i], a[i], dts[i], vals[i]))
    if not others:
        return items
    if not items:
        return list(others)
    # the items between the other records are runs: slice them in
    out: list[tuple] = []
    at = prev = 0
    find = mask.find
    for other in others:
        j = find(1, prev)
        run = j - prev
        if run:
            out += items[at:at + run]
            at += run
        out.append(other)
        prev = j + 1
    out += items[at:]
    return out
