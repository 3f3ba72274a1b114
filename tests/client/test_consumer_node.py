"""End to end against a real reference node process over TCP: login errors, streaming to the
high seqno, resuming from positions, flow control, NOOP, dead connections and rollback
after an unclean restart."""
from __future__ import annotations

import os
import signal
import time

import pytest

from dcptool.client import (
    DELETION, MUTATION, ROLLBACK, STREAM_END, STREAM_OPEN, ZERO,
    AuthenticationError, ClientTimeout, Connection, DcpConsumer, NotMyVbucketError,
    SessionConfig, UnknownBucketError, get_failover_logs, latest_positions,
)
from dcptool.protocol.messages import DcpMutation

from .nodeutil import connect, delete_docs, node_state, write_docs

VBS = 16


def stream_all(node, positions, ends=None, **cfg):
    """Stream each vbucket from positions[vb] to ends[vb] (default: the node's high seqno).
    Returns (events, final positions, rollback infos)."""
    rollbacks = []
    if ends is None:
        ends = node_state(node)[0]
    consumer = DcpConsumer.open(node.host, node.port, username=node.username,
                                password=node.password, bucket=node.bucket,
                                config=SessionConfig(**cfg), on_rollback=rollbacks.append)
    with consumer:
        consumer.add_streams({vb: (positions.get(vb, ZERO), ends[vb]) for vb in ends})
        events = []
        for batch in consumer.batches(tick=0.5):
            events.extend(batch)
        return events, consumer.positions(), rollbacks


def docs_by_vb(events):
    out = {}
    for ev in events:
        if ev[0] in (MUTATION, DELETION):
            out.setdefault(ev[1], []).append(ev)
    return out


def test_login_errors_name_the_problem(shared_node):
    n = shared_node
    with pytest.raises(AuthenticationError) as exc:
        Connection.open(n.host, n.port, username=n.username, password="wrong-pass-123")
    assert n.username in str(exc.value) and "wrong-pass-123" not in str(exc.value)
    with pytest.raises(UnknownBucketError, match="'nosuch'"):
        Connection.open(n.host, n.port, username=n.username, password=n.password, bucket="nosuch")
    with connect(n) as c:
        assert c.mechanism == "SCRAM-SHA512"
        with pytest.raises(NotMyVbucketError) as exc:
            get_failover_logs(c, [VBS + 3])
        assert exc.value.vbucket == VBS + 3


def test_stream_to_high_seqno_then_resume_gets_only_new(shared_node):
    n = shared_node
    first = {b"doc-%03d" % i: b'{"i": %d}' % i for i in range(200)}
    write_docs(n, first)
    write_docs(n, {b"doc-%03d" % i: b'{"i": %d, "v": 2}' % i for i in range(0, 200, 10)})
    delete_docs(n, [b"doc-%03d" % i for i in range(5, 200, 50)])
    seqnos, logs = node_state(n)

    events, positions, rollbacks = stream_all(n, {})
    assert rollbacks == []
    opened = {ev[1]: ev[2] for ev in events if ev[0] == STREAM_OPEN}
    assert opened == {vb: logs[vb] for vb in seqnos}
    ended = {ev[1]: ev[2] for ev in events if ev[0] == STREAM_END}
    assert ended == {vb: 0 for vb in seqnos}
    latest = {}
    for vb, recs in docs_by_vb(events).items():
        seqs = [r[2] for r in recs]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
        assert seqs[-1] <= seqnos[vb]
        for r in recs:
            latest[r[8]] = r
    for key in first:
        r = latest[key]
        i = int(key[4:])
        if i % 50 == 5:
            assert r[0] == DELETION
        else:
            assert r[0] == MUTATION
            assert r[9] == (b'{"i": %d, "v": 2}' % i if i % 10 == 0 else b'{"i": %d}' % i)
    for vb, p in positions.items():
        assert p.seqno == seqnos[vb] and p.complete and p.uuid == logs[vb][0][0]

    # resume: only what changed in between, nothing twice
    more = {b"new-%03d" % i: b"x%d" % i for i in range(40)}
    write_docs(n, more)
    events2, positions2, _ = stream_all(n, positions)
    keys = [ev[8] for ev in events2 if ev[0] == MUTATION]
    assert sorted(keys) == sorted(more)
    for vb, p in positions2.items():
        assert p.seqno == node_state(n)[0][vb]


def test_typed_and_memoryview_modes_see_the_same_records(shared_node):
    n = shared_node
    write_docs(n, {b"typed-%d" % i: b"v" * i for i in range(1, 30)})
    raw, _, _ = stream_all(n, {})
    mv, _, _ = stream_all(n, {}, copy_values=False)
    typed, _, _ = stream_all(n, {}, typed=True)
    as_tuple = [(e[1], e[2], e[8], bytes(e[9])) for e in raw if e[0] == MUTATION]
    assert [(e[1], e[2], e[8], bytes(e[9])) for e in mv if e[0] == MUTATION] == as_tuple
    assert [(e[1], e[2].by_seqno, e[2].key, e[2].value) for e in typed
            if e[0] == MUTATION and isinstance(e[2], DcpMutation)] == as_tuple


def test_small_flow_control_window_is_acknowledged(shared_node):
    n = shared_node
    write_docs(n, {b"big-%03d" % i: b"z" * 2000 for i in range(150)})
    events, _, _ = stream_all(n, {}, buffer_size=8192, ack_ratio=0.5)
    got = {ev[8] for ev in events if ev[0] == MUTATION}
    assert {b"big-%03d" % i for i in range(150)} <= got


def test_idle_session_answers_noops_and_stays_connected(shared_node):
    n = shared_node
    with DcpConsumer.open(n.host, n.port, username=n.username, password=n.password,
                          config=SessionConfig(noop_interval=1.0, dead_timeout=2.5)) as c:
        c.add_streams(latest_positions(c.conn, [0, 1, 2]))
        t0 = time.monotonic()
        while time.monotonic() - t0 < 3.5:
            assert [e for e in c.poll(0.5) if e[0] in (MUTATION, DELETION)] == []
        assert c.session.noop_enabled
        assert c.session.noops_answered >= 2
        # still connected: a new document arrives
        key = next(k for k in (b"idle-%d" % i for i in range(1000))
                   if __import__("dcptool").protocol.vbucket_of(k, VBS) in (0, 1, 2))
        write_docs(n, {key: b"hello"})
        deadline = time.monotonic() + 10
        seen = []
        while not seen and time.monotonic() < deadline:
            seen = [e for e in c.poll(0.5) if e[0] == MUTATION and e[8] == key]
        assert seen


def test_dead_connection_is_detected(node_factory):
    node = node_factory("stopped")
    with DcpConsumer.open(node.host, node.port, username=node.username, password=node.password,
                          config=SessionConfig(noop_interval=0.5, dead_timeout=1.5)) as c:
        c.add_streams(latest_positions(c.conn, [0]))
        c.poll(0.5)
        os.kill(node.pid, signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            with pytest.raises(ClientTimeout, match="presumed dead"):
                while time.monotonic() - t0 < 10:
                    c.poll(0.3)
            assert time.monotonic() - t0 < 5
        finally:
            os.kill(node.pid, signal.SIGCONT)


def test_rollback_after_unclean_restart_then_no_gaps(node_factory):
    # a long flush interval keeps the second batch in memory only, so SIGKILL loses it
    node = node_factory("rb", vbuckets=4, extra_args=("--flush-interval", "60"))
    a = {b"a-%02d" % i: b"A%d" % i for i in range(40)}
    write_docs(node, a)
    node.restart()  # clean: everything persisted, no failover entry
    before_seqnos, before_logs = node_state(node)
    assert all(len(log) == 1 for log in before_logs.values())
    _, pos_a, _ = stream_all(node, {})
    write_docs(node, {b"b-%02d" % i: b"B%d" % i for i in range(40)})  # never persisted
    _, pos_b, _ = stream_all(node, pos_a)
    node.kill()
    node.start()
    after_seqnos, after_logs = node_state(node)
    assert all(len(log) == 2 for log in after_logs.values())
    c_docs = {b"c-%02d" % i: b"C%d" % i for i in range(40)}
    write_docs(node, c_docs)
    now_seqnos, now_logs = node_state(node)

    events, final, rollbacks = stream_all(node, pos_b)
    rolled = {ev[1]: ev for ev in events if ev[0] == ROLLBACK}
    assert set(rolled) == set(now_seqnos)
    for vb, ev in rolled.items():
        info = ev[3]
        assert ev[2] == before_seqnos[vb]  # the node asks for the persisted seqno
        assert info.before == pos_b[vb]
        assert info.after.seqno == pos_a[vb].seqno == before_seqnos[vb]
        assert info.after.failover_log == before_logs[vb]
    assert sorted(r.vbucket for r in rollbacks) == sorted(rolled)
    # after the rollback: exactly the node's history above the rollback point, no gaps
    got = {}
    for vb, recs in docs_by_vb(events).items():
        got[vb] = [r[2] for r in recs]
        assert {r[8] for r in recs} <= set(c_docs)
    assert {k for e in events if e[0] == MUTATION for k in [e[8]]} == set(c_docs)
    for vb in now_seqnos:
        assert got.get(vb, []) == list(range(before_seqnos[vb] + 1, now_seqnos[vb] + 1))
        assert final[vb].seqno == now_seqnos[vb]
        assert final[vb].failover_log == now_logs[vb]
