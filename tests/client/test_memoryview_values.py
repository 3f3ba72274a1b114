"""Values handed out as memoryviews (copy_values=False) stay intact until the next poll."""
from __future__ import annotations

from docutil import load, opts_for

from dcptool.client.events import MUTATION
from dcptool.client.ops import get_vbucket_seqnos
from dcptool.client.position import ZERO
from dcptool.client.session import SessionConfig


def test_memoryview_values_survive_partial_frames(node_factory):
    node = node_factory(vbuckets=4)
    opts = opts_for(node)
    docs = {f"mv::{i:05d}": {"i": i, "pad": "y" * (i % 300)} for i in range(4000)}
    with opts.connect() as conn:
        load(conn, docs, 4)
        seqnos = get_vbucket_seqnos(conn, state=1)
    got = {}
    # a small receive buffer makes nearly every read end inside a frame
    consumer = opts.consumer(SessionConfig(name="mv-test", copy_values=False), recv_buffer=64 * 1024)
    try:
        consumer.add_streams({vb: (ZERO, hi) for vb, hi in seqnos.items()})
        for events in consumer.batches(tick=1.0):
            for ev in events:
                if ev[0] == MUTATION:
                    got[bytes(ev[8]).decode()] = bytes(ev[9])
    finally:
        consumer.close()
    import json

    assert len(got) == len(docs)
    bad = [k for k, v in got.items() if json.loads(v) != docs[k]]
    assert bad == []


def test_large_documents_arrive_whole_through_a_small_receive_buffer(node_factory):
    """Documents of several MiB, each read in many 64 KiB pieces (the consumer waits for
    the whole frame before it parses), interleaved with small ones, in both value modes,
    with the default flow-control buffer and with one smaller than a document (the node
    sends a message while the window is open, even one larger than what is left)."""
    import json

    node = node_factory(vbuckets=2)
    opts = opts_for(node)
    docs = {f"big::{i}": {"i": i, "pad": chr(97 + i) * ((3 << 20) + i)} for i in range(3)}
    docs.update({f"small::{i}": {"i": i} for i in range(50)})
    with opts.connect() as conn:
        load(conn, docs, 2)
        seqnos = get_vbucket_seqnos(conn, state=1)
    for copy, buffer_size in ((True, 8 << 20), (False, 8 << 20), (True, 1 << 20)):
        got = {}
        consumer = opts.consumer(SessionConfig(name="big-test", copy_values=copy,
                                               buffer_size=buffer_size),
                                 recv_buffer=64 * 1024)
        try:
            consumer.add_streams({vb: (ZERO, hi) for vb, hi in seqnos.items()})
            for events in consumer.batches(tick=1.0):
                for ev in events:
                    if ev[0] == MUTATION:
                        got[bytes(ev[8]).decode()] = json.loads(bytes(ev[9]))
        finally:
            consumer.close()
        assert got == docs, (copy, buffer_size)
