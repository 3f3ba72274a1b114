"""Test helpers that load documents into a node and read back what it holds.

Everything goes over TCP to a real node process; nothing here stands in for a node.
"""
from __future__ import annotations

import json
from typing import Iterable

from dcptool.client.options import ConnOptions
from dcptool.client.connection import Connection
from dcptool.client.events import DELETION, EXPIRATION, MUTATION
from dcptool.client.ops import get_vbucket_seqnos
from dcptool.client.position import ZERO
from dcptool.client.session import SessionConfig
from dcptool.protocol import Delete, FrameDecoder, Set, vbucket_of
from dcptool.protocol.constants import Status


def opts_for(node, bucket: str | None = None) -> ConnOptions:
    return ConnOptions(node.host, node.port, node.username, node.password,
                       bucket or node.bucket)


def _pipeline(conn: Connection, msgs: list, ok=(Status.SUCCESS,)) -> list[int]:
    """Send all requests (opaque = index), return the statuses in order."""
    out = bytearray()
    for i, m in enumerate(msgs):
        f = m.to_frame()
        f.opaque = i
        out += f.encode()
    conn.send_bytes(out)
    statuses = [None] * len(msgs)
    got = 0
    while got < len(msgs):
        frame = conn.recv_frame(timeout=60)
        if frame.opaque < len(msgs) and statuses[frame.opaque] is None:
            statuses[frame.opaque] = frame.status
            got += 1
    bad = [(i, s) for i, s in enumerate(statuses) if s not in ok]
    assert not bad, f"requests failed: {bad[:5]}"
    return statuses


def load(conn: Connection, docs: dict[str, dict | bytes], vbuckets: int, *, flags: int = 0,
         expiry: int = 0, chunk: int = 2000) -> None:
    """SET every document (JSON dicts are serialised) in pipelined chunks."""
    items = list(docs.items())
    for i in range(0, len(items), chunk):
        msgs = []
        for key, val in items[i:i + chunk]:
            raw = val if isinstance(val, bytes) else json.dumps(val).encode()
            k = key.encode()
            msgs.append(Set(key=k, value=raw, flags=flags, expiry=expiry,
                            vbucket=vbucket_of(k, vbuckets), datatype=0 if isinstance(val, bytes) else 1))
        _pipeline(conn, msgs)


def delete(conn: Connection, keys: Iterable[str], vbuckets: int) -> None:
    msgs = [Delete(key=k.encode(), vbucket=vbucket_of(k.encode(), vbuckets)) for k in keys]
    if msgs:
        _pipeline(conn, msgs)


def node_documents(opts: ConnOptions, *, collections: bool = False) -> dict[bytes, tuple]:
    """Everything the node holds, read through DCP: {key: (kind, value, cas, rev, flags, expiry)}.

    kind is "live" or "deleted"; deleted documents carry no value, flags or expiry.
    `collections`: of every collection, keyed by the collection-prefixed key (else of the
    default collection, by the plain key).
    """
    with opts.connect() as conn:
        seqnos = get_vbucket_seqnos(conn, state=1)
    out: dict[bytes, tuple] = {}
    consumer = opts.consumer(SessionConfig(name="test-reader", consistent=True,
                                           collections=collections))
    try:
        consumer.add_streams({vb: (ZERO, hi) for vb, hi in seqnos.items()})
        for events in consumer.batches(tick=1.0):
            for ev in events:
                if ev[0] == MUTATION:
                    out[bytes(ev[8])] = ("live", bytes(ev[9]), ev[4], ev[3], ev[5], ev[6])
                elif ev[0] in (DELETION, EXPIRATION):
                    out[bytes(ev[8])] = ("deleted", b"", ev[4], ev[3], 0, 0)
    finally:
        consumer.close()
    return out


def wait_persisted(opts: ConnOptions, timeout: float = 20.0) -> None:
    """Wait until the node's flusher has persisted every vbucket up to its high seqno.

    Compaction only purges tombstones that are on disk, so tests compact after this.
    """
    import time

    from dcptool.client.watermark import get_stats

    deadline = time.monotonic() + timeout
    while True:
        with opts.connect() as conn:
            st = get_stats(conn, "vbucket-seqno")
        highs = [k for k in st if k.endswith(":high_seqno")]
        assert highs, "the node reported no vbucket seqnos"
        lagging = [k for k in highs if st[k] != st[k.replace(":high_seqno", ":last_persisted_seqno")]]
        if not lagging:
            return
        assert time.monotonic() < deadline, f"not persisted after {timeout}s: {lagging[:4]}"
        time.sleep(0.05)
