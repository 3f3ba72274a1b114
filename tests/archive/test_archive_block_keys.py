"""The keys part of a version 2 block: equal-length keys XOR-coded, other keys msgpack."""
from __future__ import annotations

import random

import msgpack
import pytest
import zstandard

from dcptool.archive.block import (
    BLOCK_MARK,
    BlockError,
    block_compressor,
    compress_sections,
    decode_block,
    encode_records,
)


def _items(keys):
    return [(3, s, 1, 1000 + s, 0, 0, 1, k, b'{"v":%d}' % s, None)
            for s, k in enumerate(keys, 1)]


@pytest.mark.parametrize("n", [1, 2, 3, 7, 64, 1000])
def test_equal_length_keys_are_xor_coded_and_read_back(n):
    rnd = random.Random(n)
    keys = [b"order::%09d" % (i * 1024 + rnd.randrange(1024)) for i in range(n)]
    if n > 2:
        keys[-1] = b"\x00" * len(keys[0])  # zero bytes and runs survive the big-int coding
    recs = _items(keys)
    sections = encode_records(recs)
    part = sections[2]
    assert part[0] == BLOCK_MARK
    assert len(part) == 5 + n * len(keys[0])  # the mark, u32 length, then n x L bytes
    if n > 1:  # the second key's shared prefix with the first is zero bytes
        second = part[5 + len(keys[0]):5 + 2 * len(keys[0])]
        assert second.startswith(b"\x00" * len("order::"))
    assert decode_block(b"".join(sections)) == recs


def test_keys_of_different_lengths_stay_a_msgpack_array():
    keys = [b"a", b"bb", b"ccc", b"dd"]
    recs = _items(keys)
    sections = encode_records(recs)
    assert msgpack.unpackb(sections[2]) == keys
    assert decode_block(b"".join(sections)) == recs


def test_damaged_xor_keys_part_raises_block_error():
    content = bytearray(b"".join(encode_records(_items([b"k1", b"k2", b"k3"]))))
    assert decode_block(bytes(content))  # well formed
    # the head's keys_len stays, the keys part loses its last byte: the lengths disagree
    sections = encode_records(_items([b"k1", b"k2", b"k3"]))
    bad = sections[0] + sections[1] + sections[2][:-1] + sections[3]
    with pytest.raises(BlockError):
        decode_block(bad)


def test_block_compressor_frames_round_trip_with_checksum():
    cctx = block_compressor(3)
    recs = _items([b"doc::%010d" % i for i in range(500)])
    frame = compress_sections(cctx, encode_records(recs))
    params = zstandard.get_frame_parameters(frame)
    assert params.has_checksum
    assert params.content_size == len(b"".join(encode_records(recs)))
    content = zstandard.ZstdDecompressor().decompress(frame)
    assert decode_block(content) == recs
