"""`dcptool cluster move`: a controlled vbucket move over a takeover stream (issue 8).

Three real node processes, four vbuckets, `cluster create --replicas 1` (vbucket 0 on
A with its replica on B, vbucket 3 likewise). A writer keeps writing new keys into both
vbuckets while vbucket 0 moves to B (which holds a replica: it goes on from its
position) and vbucket 3 to C (which holds no copy: everything is streamed). Afterwards
every acknowledged write is on the new active, the failover logs are those of before
the move on every copy (no new entry: a controlled handover is not a history branch),
the replicas follow the new actives without a rollback, and a `tail --state` started
before the move reports no rollback and prints exactly the new actives' histories.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest
from client.nodeutil import REPO, json_lines, run_cli
from clusterutil import abc  # noqa: F401  (the fixture)
from clusterutil import (
    addr, failover_log, keys_in, make_cluster, seqnos, status, vbucket_stream, wait_until,
)
from docutil import load, opts_for
from node.dcputil import dcp_connect
from node.mcbputil import connect

from dcptool.client.topology import ClusterView, cluster_map
from dcptool.client.errors import ClientError
from dcptool.protocol import Set, vbucket_of
from dcptool.protocol.constants import (
    Opcode, SnapshotFlag, Status, StreamEndReason, StreamFlag, VBucketState,
)
from dcptool.protocol.messages import (
    DcpMutation, DcpSetVbucketState, DcpSnapshotMarker, DcpStreamEnd,
)

VBS = 4  # the vbuckets of clusterutil's `abc` nodes


class Writer(threading.Thread):
    """Writes new keys into `vbs` one at a time, each to the active the newest map names;
    on NOT_MY_VBUCKET (or a refused connection) it reads the map again and retries the
    same key. `acked` holds every write the cluster acknowledged."""

    def __init__(self, nodes, vbs: list[int]) -> None:
        super().__init__(daemon=True)
        self.nodes = {addr(n): n for n in nodes}
        self.keys = [k for pair in zip(*(keys_in(vb, VBS, 5000, "w") for vb in vbs))
                     for k in pair]
        self.stop = threading.Event()
        self.acked: dict[str, bytes] = {}
        self.refused = 0
        self.view: ClusterView | None = None
        self.conns: dict[str, object] = {}
        self.error: BaseException | None = None

    def refresh(self) -> None:
        best = self.view
        for n in self.nodes.values():
            try:
                with opts_for(n).connect() as c:
                    v = cluster_map(c)
            except (ClientError, OSError):
                continue
            if best is None or v.newer_than(best):
                best = v
        self.view = best

    def conn(self, node: str):
        c = self.conns.get(node)
        if c is None:
            c = self.conns[node] = opts_for(self.nodes[node]).connect()
        return c

    def run(self) -> None:
        try:
            self.refresh()
            i = 0
            while not self.stop.is_set() and i < len(self.keys):
                key = self.keys[i]
                value = json.dumps({"i": i}).encode()
                node = self.view.active_node(vbucket_of(key.encode(), VBS))
                rsp = self.conn(node).request(Set(key=key.encode(), value=value,
                                                  vbucket=vbucket_of(key.encode(), VBS)))
                if rsp.status == Status.SUCCESS:
                    self.acked[key] = value
                    i += 1
                    time.sleep(0.002)
                    continue
                assert rsp.status in (Status.NOT_MY_VBUCKET, Status.ETMPFAIL), rsp.status
                self.refused += 1
                time.sleep(0.02)
                self.refresh()
        except BaseException as exc:  # reported by the test
            self.error = exc
        finally:
            for c in self.conns.values():
                c.close()


def _tail(node, state, vbs: str) -> subprocess.Popen:
    env = dict(os.environ, NO_COLOR="1", COLUMNS="200",
               DCPTOOL_CLUSTER=f"couchbase://{node.host}:{node.port}",
               DCPTOOL_USERNAME=node.username, DCPTOOL_PASSWORD=node.password)
    return subprocess.Popen([sys.executable, "-m", "dcptool", "tail", "--from", "beginning",
                             "--vbuckets", vbs, "--state", str(state), "--until-idle", "8",
                             "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, cwd=REPO)


def _documented_json(title: str) -> dict:
    """The JSON example of `## title` in docs/json-output.md."""
    text = (REPO / "docs" / "json-output.md").read_text()
    section = text.split(f"\n## {title}\n", 1)[1]
    return json.loads(section.split("```json\n", 1)[1].split("```", 1)[0])


def _history(node, vb: int) -> list[tuple[int, str]]:
    docs, _ = vbucket_stream(node, vb)
    return sorted((v[2], k.decode()) for k, v in docs.items())


def test_move_under_writes_keeps_every_write_the_failover_log_and_a_tail(abc, tmp_path):
    a, b, c = abc["a"], abc["b"], abc["c"]
    r = run_cli("cluster", "create", "-c", addr(a), "-c", addr(b), "-c", addr(c),
                "--replicas", "1", "--json", node=a)
    assert r.returncode == 0, r.stderr
    vbmap = json.loads(r.stdout)["vbmap"]
    assert vbmap[0] == [0, 1] and vbmap[3] == [0, 1]   # A active, B replica, C nothing
    with opts_for(a).connect() as conn:
        load(conn, {k: {"n": i} for i, k in enumerate(keys_in(0, VBS, 300, "p"))}, VBS)
        load(conn, {k: {"n": i} for i, k in enumerate(keys_in(3, VBS, 300, "q"))}, VBS)
    wait_until(lambda: seqnos(b).get(0) == 300 and seqnos(b).get(3) == 300,
               what="B's replicas at 300")
    logs_before = {vb: failover_log(a, vb) for vb in (0, 3)}
    assert all(len(lg) == 1 for lg in logs_before.values())
    assert failover_log(b, 0) == logs_before[0] and failover_log(b, 3) == logs_before[3]

    state = tmp_path / "tail.state"
    tail = _tail(b, state, "0,3")   # through any member: B is not active for 0 or 3
    writer = Writer([a, b, c], [0, 3])
    writer.start()
    try:
        wait_until(lambda: len(writer.acked) >= 100 or writer.error, what="writes before")
        r = run_cli("cluster", "move", "-c", addr(c), "--vbuckets", "0", "--to", addr(b),
                    "--json", node=a, timeout=120)
        assert r.returncode == 0, r.stderr
        moved0 = json.loads(r.stdout)
        n_mid = len(writer.acked)
        r = run_cli("cluster", "move", "-c", addr(a), "--vbuckets", "3", "--to", addr(c),
                    node=a, timeout=120)
        assert r.returncode == 0, r.stderr
        assert "vbucket 3: active on" in r.stdout and "1 vbucket(s) moved" in r.stdout
        wait_until(lambda: len(writer.acked) >= n_mid + 200 or writer.error,
                   what="writes after the moves")
    finally:
        writer.stop.set()
        writer.join(30)
    assert writer.error is None, writer.error
    # the writer was refused while the vbuckets changed hands, and lost nothing
    assert writer.refused >= 1

    m = moved0["moved"][0]
    assert (m["vbucket"], m["from"], m["to"]) == (0, addr(a), addr(b))
    assert m["start_seqno"] >= 300      # B went on from its replica's position
    assert moved0["rev"] == 2
    documented = _documented_json("dcptool cluster move")
    assert set(moved0) == set(documented) and set(m) == set(documented["moved"][0])

    # every acknowledged write is on the new active (B for 0, C for 3), with its value
    for vb, new in ((0, b), (3, c)):
        docs, _ = vbucket_stream(new, vb)
        mine = {k: v for k, v in writer.acked.items() if vbucket_of(k.encode(), VBS) == vb}
        assert mine and all(docs[k.encode()][1] == v for k, v in mine.items())
        # no new failover entry anywhere: the history of before the move, on every copy
        assert failover_log(new, vb) == logs_before[vb]
    # the new map: A took B's place as replica of 0; A left 3's chain (C held no copy),
    # B streams 3 from C now
    with opts_for(c).connect() as conn:
        cv = cluster_map(conn)
    assert cv.vbmap[0] == (1, 0) and cv.vbmap[3] == (2, 1) and cv.map_rev == 3
    wait_until(lambda: seqnos(a).get(0) == seqnos(b)[0], what="A's replica of 0 caught up")
    wait_until(lambda: seqnos(b).get(3) == seqnos(c)[3], what="B's replica of 3 caught up")
    st_a, st_b = status(a)["vbuckets"], status(b)["vbuckets"]
    assert st_a["0"]["state"] == VBucketState.REPLICA and st_a["3"]["state"] == VBucketState.DEAD
    assert st_a["0"]["replication"]["source"] == 1 and st_a["0"]["replication"]["rollbacks"] == 0
    assert st_b["3"]["replication"]["source"] == 2 and st_b["3"]["replication"]["rollbacks"] == 0
    assert failover_log(a, 0) == logs_before[0] and failover_log(b, 3) == logs_before[3]
    assert vbucket_stream(a, 0)[0] == vbucket_stream(b, 0)[0]
    assert vbucket_stream(b, 3)[0] == vbucket_stream(c, 3)[0]

    # the tail followed both vbuckets across the moves: no rollback, no gap, no duplicate
    out, err = tail.communicate(timeout=120)
    assert tail.returncode == 0, err
    events = json_lines(out)
    assert not [e for e in events if e["type"] == "rollback"]
    for vb, new in ((0, b), (3, c)):
        got = [(e["seqno"], e["key"]) for e in events
               if e["type"] == "mutation" and e["vbucket"] == vb]
        assert got == _history(new, vb)


def test_takeover_stream_handshake_on_the_wire(node_factory):
    """The producer's order: everything, SET_VBUCKET_STATE(pending), (answer) the vbucket
    is dead here, the writes made meanwhile, SET_VBUCKET_STATE(active), (answer)
    STREAM_END(OK); the failover log is unchanged."""
    node = node_factory(vbuckets=4)
    kv = connect(node)
    keys = keys_in(1, 4, 20, "t")
    for k in keys[:10]:
        assert kv.set(k.encode(), b"v", vbucket=1).status == Status.SUCCESS
    log_before = failover_log(node, 1)
    c = dcp_connect(node, "takeover-test")
    assert c.stream_req(1, flags=StreamFlag.TAKEOVER).status == Status.SUCCESS
    got = []
    while True:
        msg = c.next_message(timeout=10)
        got.append(msg)
        if isinstance(msg, DcpSetVbucketState):
            break
    assert [m.by_seqno for m in got if isinstance(m, DcpMutation)] == list(range(1, 11))
    assert isinstance(got[0], DcpSnapshotMarker) and got[-1].state == VBucketState.PENDING
    # unanswered, the producer waits and the vbucket still takes writes
    assert kv.set(keys[10].encode(), b"late", vbucket=1).status == Status.SUCCESS
    with pytest.raises(Exception):
        c.next_message(timeout=1.0)
    c.send(_response(Opcode.DCP_SET_VBUCKET_STATE, got[-1].opaque))
    rest = []
    while True:
        msg = c.next_message(timeout=10)
        rest.append(msg)
        if isinstance(msg, DcpSetVbucketState):
            break
    # dead here from the answer on: writes are refused, the late write still comes
    assert kv.set(keys[11].encode(), b"x", vbucket=1).status == Status.NOT_MY_VBUCKET
    assert [m.by_seqno for m in rest if isinstance(m, DcpMutation)] == [11]
    assert rest[-1].state == VBucketState.ACTIVE
    c.send(_response(Opcode.DCP_SET_VBUCKET_STATE, rest[-1].opaque))
    end = c.next_message(timeout=10)
    assert isinstance(end, DcpStreamEnd) and end.reason == StreamEndReason.OK
    assert failover_log(node, 1) == log_before
    # a takeover stream needs an active vbucket
    assert c.stream_req(1, flags=StreamFlag.TAKEOVER,
                        opaque=77).status == Status.NOT_MY_VBUCKET
    assert not any(isinstance(m, DcpSnapshotMarker) and m.flags & SnapshotFlag.ACK
                   for m in got + rest)
    c.close()
    kv.close()


def _response(opcode: int, opaque: int) -> bytes:
    from dcptool.protocol import encode_frame
    from dcptool.protocol.constants import Magic

    return encode_frame(Magic.RESPONSE, opcode, 0, opaque)


def test_move_cli_errors(abc, node_factory):
    a, b, c = abc["a"], abc["b"], abc["c"]
    lone = node_factory("lone", vbuckets=VBS)
    r = run_cli("cluster", "move", "-c", addr(lone), "--vbuckets", "0", "--to", addr(a),
                node=lone)
    assert r.returncode == 2 and "not a member of a cluster" in r.stderr
    assert len(r.stderr.strip().splitlines()) <= 2 and "Traceback" not in r.stderr
    # vbucket 1 has no active (a map with -1 first)
    make_cluster([a, b, c], [[0, 1], [-1, 2], [2, 0], [0, 1]], replicas=1)

    def move(*args):
        r = run_cli("cluster", "move", "-c", addr(b), *args, node=a)
        assert "Traceback" not in r.stderr
        return r

    r = move("--vbuckets", "0", "--to", "127.0.0.1:1")
    assert r.returncode == 2 and "not a member of the cluster" in r.stderr
    r = move("--vbuckets", "0", "--to", addr(a))
    assert r.returncode == 2 and f"vbucket 0 is already active on {addr(a)}" in r.stderr
    r = move("--vbuckets", "1", "--to", addr(a))
    assert r.returncode == 1 and "vbucket 1 is not active on any node" in r.stderr
    r = move("--vbuckets", "9", "--to", addr(a))
    assert r.returncode == 2 and "vbucket 9 does not exist" in r.stderr
    # nothing moved: the map and the states are those of before
    assert status(a)["rev"] == 1 and status(a)["vbuckets"]["0"]["state"] == 1
    assert status(b)["vbuckets"]["0"]["state"] == VBucketState.REPLICA


def test_session_hands_out_set_vbucket_state_and_answers_when_told():
    """The consumer side, sans I/O: SET_VBUCKET_STATE becomes an event; by default the
    session answers at once, with ack_vbucket_state=False only when the caller says so
    (the takeover consumer answers once the state is applied)."""
    from dcptool.client.events import VBUCKET_STATE
    from dcptool.client.session import DcpSession, SessionConfig
    from dcptool.protocol import FrameDecoder

    def answers(session) -> list:
        dec = FrameDecoder()
        dec.feed(session.data_to_send())
        return [(f.opcode, f.opaque) for f in dec if not f.is_request]

    req = DcpSetVbucketState(vbucket=5, opaque=0x4242, state=VBucketState.PENDING).encode()
    auto = DcpSession(SessionConfig(name="t"))
    assert auto.feed(req) == [(VBUCKET_STATE, 5, VBucketState.PENDING, 0x4242)]
    assert answers(auto) == [(Opcode.DCP_SET_VBUCKET_STATE, 0x4242)]
    told = DcpSession(SessionConfig(name="t", ack_vbucket_state=False))
    assert told.feed(req) == [(VBUCKET_STATE, 5, VBucketState.PENDING, 0x4242)]
    assert answers(told) == []
    told.ack_vbucket_state(0x4242)
    assert answers(told) == [(Opcode.DCP_SET_VBUCKET_STATE, 0x4242)]


def test_a_failed_takeover_leaves_the_source_active_with_its_history(abc):
    """The destination cannot log in to the source (the map's replication credentials are
    wrong): the move fails with one line, nothing changed hands, no failover entry."""
    from dcptool.client.topology import set_map

    a, b, c = abc["a"], abc["b"], abc["c"]
    names = [addr(n) for n in (a, b, c)]
    for i, n in enumerate((a, b, c)):
        with opts_for(n).connect() as conn:
            set_map(conn, {"rev": 1, "nodes": names, "this": i, "replicas": 0,
                           "vbmap": [[0], [1], [2], [0]],
                           "auth": {"username": n.username, "password": "wrong"}})
    with opts_for(a).connect() as conn:
        load(conn, {k: {"n": i} for i, k in enumerate(keys_in(0, VBS, 50, "f"))}, VBS)
    log_before = failover_log(a, 0)
    r = run_cli("cluster", "move", "-c", addr(a), "--vbuckets", "0", "--to", addr(c), node=a,
                timeout=120)
    assert r.returncode == 1, r.stdout
    assert f"moving vbucket 0 to {addr(c)} failed" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) <= 2
    assert status(a)["vbuckets"]["0"]["state"] == VBucketState.ACTIVE
    assert status(c)["vbuckets"]["0"]["state"] == VBucketState.DEAD
    assert status(a)["rev"] == 1 and failover_log(a, 0) == log_before
    assert seqnos(a)[0] == 50
