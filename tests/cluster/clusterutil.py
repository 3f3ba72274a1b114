"""Helpers for cluster tests: several real node processes on 127.0.0.1.

    nodes = start_nodes(tmp_path, ["a", "b", "c"], vbuckets=4)
    make_cluster(nodes, [[0, 1, 2]] * 4, replicas=2)

Nothing here stands in for a node: maps go out with the admin opcodes, documents are
written with SET and read back over DCP.
"""
from __future__ import annotations

import base64
import json
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from dcptool.client.topology import hold_replication, node_status, set_map
from dcptool.client.events import DELETION, EXPIRATION, MUTATION, SNAPSHOT
from dcptool.client.ops import get_failover_logs, get_vbucket_seqnos
from dcptool.client.position import ZERO
from dcptool.client.session import SessionConfig
from dcptool.protocol import vbucket_of

from docutil import load, opts_for
from nodeprocutil import NodeProcess


def start_nodes(base: Path, names: list[str], *, vbuckets: int = 4,
                extra_args: tuple[str, ...] = ()) -> dict[str, NodeProcess]:
    nodes = {n: NodeProcess(Path(base) / n, vbuckets=vbuckets, extra_args=extra_args)
             for n in names}
    try:
        for n in nodes.values():
            n.start()
    except BaseException:
        stop_nodes(nodes)
        raise
    return nodes


def stop_nodes(nodes: dict[str, NodeProcess]) -> None:
    for n in nodes.values():
        if n.running():
            n.stop()


def rest(node: NodeProcess, path: str, method: str = "GET", form: dict | None = None,
         timeout: float = 30):
    """A REST request to the node as its administrator (a form body with `form`): the
    answer's JSON (None when empty). HTTP errors raise urllib.error.HTTPError."""
    data = None if form is None else urllib.parse.urlencode(form).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{node.rest_port}{path}", method=method,
                                 data=data)
    token = base64.b64encode(f"{node.username}:{node.password}".encode()).decode()
    req.add_header("Authorization", f"Basic {token}")
    with urllib.request.urlopen(req, timeout=timeout) as rsp:
        body = rsp.read()
        return json.loads(body) if body else None


def addr(node: NodeProcess) -> str:
    return f"{node.host}:{node.port}"


def make_cluster(members: list[NodeProcess], vbmap: list[list[int]], *, replicas: int,
                 rev: int = 1, topology: str = "star") -> None:
    """Send every member the map (member i is node i of the map)."""
    names = [addr(m) for m in members]
    for i, m in enumerate(members):
        doc = {"rev": rev, "nodes": names, "this": i, "replicas": replicas,
               "topology": topology, "vbmap": vbmap,
               "auth": {"username": m.username, "password": m.password}}
        with opts_for(m).connect() as c:
            set_map(c, doc)


def keys_in(vb: int, vbuckets: int, n: int, prefix: str = "doc") -> list[str]:
    out, i = [], 0
    while len(out) < n:
        k = f"{prefix}{i:05d}"
        if vbucket_of(k.encode(), vbuckets) == vb:
            out.append(k)
        i += 1
    return out


def seqnos(node: NodeProcess) -> dict[int, int]:
    """{vb: high seqno} of every active, replica or pending vbucket."""
    with opts_for(node).connect() as c:
        return get_vbucket_seqnos(c)


def failover_log(node: NodeProcess, vb: int) -> list[tuple[int, int]]:
    with opts_for(node).connect() as c:
        return [tuple(e) for e in get_failover_logs(c, [vb])[vb]]


def status(node: NodeProcess) -> dict:
    with opts_for(node).connect() as c:
        return node_status(c)


def wait_until(pred, *, timeout: float = 30.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


def wait_seqno(node: NodeProcess, vb: int, seqno: int, timeout: float = 30.0) -> None:
    wait_until(lambda: seqnos(node).get(vb) == seqno, timeout=timeout,
               what=f"vbucket {vb} on {node.data_dir.name} at seqno {seqno} "
                    f"(it is at {seqnos(node).get(vb)})")


def seed004_writes(a: NodeProcess, b: NodeProcess, c: NodeProcess, vbuckets: int, *,
                   doc=lambda i: {"n": i}) -> list[str]:
    """Seed 004's writes, vbucket 0 active on A with replicas B and C: 900 mutations that
    both replicas take, C held there, 100 more that only B takes. Returns the 1000 keys."""
    keys = seed004_first_900(a, b, c, vbuckets, doc=doc)
    seed004_last_100(a, keys, vbuckets, doc=doc)
    wait_seqno(b, 0, 1000)
    return keys


def seed004_first_900(a: NodeProcess, b: NodeProcess, c: NodeProcess, vbuckets: int, *,
                      doc=lambda i: {"n": i}) -> list[str]:
    """The first part of seed 004's writes: 900 mutations of vbucket 0 on A that both
    replicas take, then C's replica held at 900. Returns the 1000 keys of the seed."""
    keys = keys_in(0, vbuckets, 1000)
    with opts_for(a).connect() as conn:
        load(conn, {k: doc(i) for i, k in enumerate(keys[:900])}, vbuckets)
    wait_seqno(b, 0, 900)
    wait_seqno(c, 0, 900)
    with opts_for(c).connect() as conn:
        hold_replication(conn, 0, 900)
    return keys


def seed004_last_100(a: NodeProcess, keys: list[str], vbuckets: int, *,
                     doc=lambda i: {"n": i}) -> None:
    """The rest of seed 004's writes: mutations 901-1000 of vbucket 0 on A (only B takes
    them, C is held)."""
    with opts_for(a).connect() as conn:
        load(conn, {k: doc(900 + i) for i, k in enumerate(keys[900:])}, vbuckets)


def load_each_active(actives: dict[int, NodeProcess], vbuckets: int,
                     n: int = 20) -> dict[int, list[str]]:
    """`n` documents `{"vb": VB}` in each vbucket VB of `actives`, written on its active
    node. Returns each vbucket's keys."""
    keys = {vb: keys_in(vb, vbuckets, n, prefix=f"v{vb}-") for vb in actives}
    for vb, node in actives.items():
        with opts_for(node).connect() as conn:
            load(conn, {k: {"vb": vb} for k in keys[vb]}, vbuckets)
    return keys


def seed004_failover(a: NodeProcess, b: NodeProcess, c: NodeProcess, vbuckets: int) -> None:
    """A is gone: C (the seed's choice) becomes active for vbucket 0 with B its replica, B
    active for the others; the new map goes to C, then B."""
    names = [f"{n.host}:{n.port}" for n in (a, b, c)]
    vbmap = [[2, 1, -1]] + [[1, 2, -1]] * (vbuckets - 1)
    for i, n in ((2, c), (1, b)):
        with opts_for(n).connect() as conn:
            set_map(conn, {"rev": 2, "nodes": names, "this": i, "replicas": 2, "vbmap": vbmap,
                           "auth": {"username": n.username, "password": n.password}})


def vbucket_stream(node: NodeProcess, vb: int, end: int | None = None):
    """(documents, markers) of one vbucket read over DCP from 0 to `end` (default: its
    high seqno), whatever its state. documents: {key: (kind, value, seqno, rev, cas)}."""
    if end is None:
        end = seqnos(node)[vb]
    docs: dict[bytes, tuple] = {}
    markers: list[tuple[int, int]] = []
    if end == 0:
        return docs, markers
    consumer = opts_for(node).consumer(SessionConfig(name="cluster-test-reader"))
    try:
        consumer.add_stream(vb, ZERO, end_seqno=end)
        for events in consumer.batches(tick=1.0):
            for ev in events:
                if ev[0] == SNAPSHOT:
                    markers.append((ev[2], ev[3]))
                elif ev[0] == MUTATION:
                    docs[bytes(ev[8])] = ("live", bytes(ev[9]), ev[2], ev[3], ev[4])
                elif ev[0] in (DELETION, EXPIRATION):
                    docs[bytes(ev[8])] = ("deleted", b"", ev[2], ev[3], ev[4])
    finally:
        consumer.close()
    return docs, markers


#: vbuckets of the nodes `abc` starts
ABC_VBUCKETS = 4


@pytest.fixture
def abc(tmp_path):
    """Three node processes a, b and c (not yet a cluster). A test module uses it with
    `from clusterutil import abc` (a conftest.py here would shadow tests/conftest.py,
    which other tests import as `conftest`)."""
    nodes = start_nodes(tmp_path, ["a", "b", "c"], vbuckets=ABC_VBUCKETS)
    yield nodes
    stop_nodes(nodes)
