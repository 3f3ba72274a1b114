"""End to end against a real node process: counters, touch, get-and-touch, locks, replica
reads and OBSERVE_SEQNO, with the statuses kv_engine answers (dcptool.node.commands.docops)."""
from __future__ import annotations

import itertools
import struct
import time

import pytest

from dcptool.protocol.constants import Feature, Opcode, Status

from .mcbputil import Client, connect

ARITH = struct.Struct(">QQI")
U32 = struct.Struct(">I")
U64 = struct.Struct(">Q")
LOCKED_CAS = 0xFFFFFFFFFFFFFFFF
_n = itertools.count()

NO_XERROR = (Feature.XATTR, Feature.JSON, Feature.SELECT_BUCKET, Feature.MUTATION_SEQNO)


def key() -> bytes:
    return b"docops-%d" % next(_n)


@pytest.fixture(scope="module")
def client(shared_node):
    c = connect(shared_node)
    yield c
    c.close()


def arith(c: Client, op: int, k: bytes, delta: int, initial: int = 0, expiry: int = 0, cas=0):
    return c.call(op, key=k, extras=ARITH.pack(delta, initial, expiry), cas=cas, vbucket=c.vb(k))


def call_key(c: Client, op: int, k: bytes, **kw):
    return c.call(op, key=k, vbucket=c.vb(k), **kw)


# -- counters ---------------------------------------------------------------------------


def test_increment_creates_with_the_initial_value_then_adds(client):
    k = key()
    f = arith(client, Opcode.INCREMENT, k, 5, initial=10)
    assert f.status == Status.SUCCESS
    assert U64.unpack(f.value)[0] == 10           # created: the initial value, not + delta
    assert len(f.extras) == 16                     # vbucket uuid + seqno (MutationSeqno)
    f2 = arith(client, Opcode.INCREMENT, k, 5)
    assert U64.unpack(f2.value)[0] == 15
    assert f2.cas != f.cas
    got = client.get(k)
    assert got.value == b"15" and U32.unpack(got.extras)[0] == 0


def test_decrement_stops_at_zero_and_increment_wraps_at_2_64(client):
    k = key()
    assert client.set(k, b"3").status == Status.SUCCESS
    assert U64.unpack(arith(client, Opcode.DECREMENT, k, 10).value)[0] == 0
    k2 = key()
    assert client.set(k2, b"18446744073709551615").status == Status.SUCCESS
    assert U64.unpack(arith(client, Opcode.INCREMENT, k2, 2).value)[0] == 1


def test_counter_on_a_missing_key_with_all_ones_expiry_is_key_enoent(client):
    assert arith(client, Opcode.INCREMENT, key(), 1, expiry=0xFFFFFFFF).status == Status.KEY_ENOENT


@pytest.mark.parametrize("body", [b"abc", b"12a", b" 12", b"-1", b"1" * 21,
                                  b"99999999999999999999", b'{"n": 1}'])
def test_counter_on_a_non_number_is_delta_badval(client, body):
    k = key()
    assert client.set(k, body).status == Status.SUCCESS
    assert arith(client, Opcode.INCREMENT, k, 1).status == Status.DELTA_BADVAL
    assert client.get(k).value == body            # left alone


def test_counter_keeps_flags_and_checks_cas(client):
    k = key()
    assert client.set(k, b"7", flags=0xBEEF).status == Status.SUCCESS
    cas = client.get(k).cas
    assert arith(client, Opcode.INCREMENT, k, 1, cas=cas + 1).status == Status.KEY_EEXISTS
    assert arith(client, Opcode.INCREMENT, k, 1, cas=cas).status == Status.SUCCESS
    got = client.get(k)
    assert got.value == b"8" and U32.unpack(got.extras)[0] == 0xBEEF


def test_quiet_counters_answer_only_failures(client):
    k = key()
    client.request(Opcode.INCREMENTQ, key=k, extras=ARITH.pack(1, 41, 0), vbucket=client.vb(k))
    client.request(Opcode.DECREMENTQ, key=k, extras=ARITH.pack(1, 0, 0), vbucket=client.vb(k))
    bad = key()
    client.set(bad, b"x")
    client.request(Opcode.INCREMENTQ, key=bad, extras=ARITH.pack(1, 0, 0), vbucket=client.vb(bad))
    assert client.call(Opcode.NOOP).status == Status.SUCCESS
    # the only answer before the NOOP's is the failure
    before = list(client.backlog)
    client.backlog.clear()
    assert [(f.opcode, f.status) for f in before] == [(Opcode.INCREMENTQ, Status.DELTA_BADVAL)]
    assert client.get(k).value == b"40"


def test_counter_with_wrong_extras_is_einval(client):
    k = key()
    assert client.call(Opcode.INCREMENT, key=k, extras=b"\x00" * 8,
                       vbucket=client.vb(k)).status == Status.EINVAL


# -- touch and get-and-touch ------------------------------------------------------------


def test_touch_sets_a_new_expiry_and_the_document_expires(client):
    k = key()
    assert client.set(k, b'{"a":1}', flags=3).status == Status.SUCCESS
    f = call_key(client, Opcode.TOUCH, k, extras=U32.pack(1))
    assert f.status == Status.SUCCESS and f.cas and not f.value
    time.sleep(2.1)
    assert client.get(k).status == Status.KEY_ENOENT


def test_gat_answers_the_value_and_can_clear_the_expiry(client):
    k = key()
    assert client.set(k, b"hello", flags=9, expiry=1).status == Status.SUCCESS
    f = call_key(client, Opcode.GAT, k, extras=U32.pack(0))
    assert f.status == Status.SUCCESS and f.value == b"hello"
    assert U32.unpack(f.extras)[0] == 9
    time.sleep(1.5)
    assert client.get(k).value == b"hello"          # the expiry was cleared


def test_touch_and_gat_on_a_missing_key(client):
    k = key()
    assert call_key(client, Opcode.TOUCH, k, extras=U32.pack(10)).status == Status.KEY_ENOENT
    assert call_key(client, Opcode.GAT, k, extras=U32.pack(10)).status == Status.KEY_ENOENT
    client.request(Opcode.GATQ, key=k, extras=U32.pack(10), vbucket=client.vb(k))
    assert client.call(Opcode.NOOP).status == Status.SUCCESS
    assert not client.backlog                         # GATQ said nothing on a miss


# -- locks ------------------------------------------------------------------------------


def test_get_locked_hides_the_cas_and_refuses_writes_without_the_lock_cas(client):
    k = key()
    assert client.set(k, b"v1").status == Status.SUCCESS
    f = call_key(client, Opcode.GET_LOCKED, k, extras=U32.pack(10))
    assert f.status == Status.SUCCESS and f.value == b"v1"
    lock_cas = f.cas
    assert client.get(k).cas == LOCKED_CAS
    assert client.set(k, b"v2").status == Status.LOCKED
    assert client.delete(k).status == Status.LOCKED
    assert call_key(client, Opcode.GET_LOCKED, k).status == Status.LOCKED
    assert call_key(client, Opcode.UNLOCK_KEY, k, cas=lock_cas + 1).status == Status.LOCKED
    # the lock's CAS writes, and the write ends the lock
    f = client.set(k, b"v3", cas=lock_cas)
    assert f.status == Status.SUCCESS
    got = client.get(k)
    assert got.value == b"v3" and got.cas == f.cas
    assert call_key(client, Opcode.UNLOCK_KEY, k, cas=got.cas).status == Status.NOT_LOCKED


def test_unlock_ends_the_lock(client):
    k = key()
    client.set(k, b"v")
    lock_cas = call_key(client, Opcode.GET_LOCKED, k).cas
    assert call_key(client, Opcode.UNLOCK_KEY, k, cas=lock_cas).status == Status.SUCCESS
    assert client.get(k).cas != LOCKED_CAS
    assert client.set(k, b"w").status == Status.SUCCESS


def test_a_lock_ends_by_itself(client):
    k = key()
    client.set(k, b"v")
    assert call_key(client, Opcode.GET_LOCKED, k, extras=U32.pack(1)).status == Status.SUCCESS
    assert client.set(k, b"w").status == Status.LOCKED
    time.sleep(1.2)
    assert client.set(k, b"w").status == Status.SUCCESS


def test_locked_statuses_without_xerror(shared_node):
    """kv_engine's mapping for old clients: a write meets KEY_EEXISTS, GET_LOCKED and a
    wrong UNLOCK_KEY meet TMPFAIL, UNLOCK_KEY of an unlocked document TMPFAIL."""
    with connect(shared_node, features=NO_XERROR) as c:
        k = key()
        c.set(k, b"v")
        assert call_key(c, Opcode.UNLOCK_KEY, k, cas=1).status == Status.ETMPFAIL
        lock_cas = call_key(c, Opcode.GET_LOCKED, k).cas
        assert c.set(k, b"w").status == Status.KEY_EEXISTS
        assert call_key(c, Opcode.GET_LOCKED, k).status == Status.ETMPFAIL
        assert call_key(c, Opcode.UNLOCK_KEY, k, cas=lock_cas + 1).status == Status.ETMPFAIL
        assert call_key(c, Opcode.UNLOCK_KEY, k, cas=lock_cas).status == Status.SUCCESS


def test_locked_document_refuses_append_counter_and_touch(client):
    k = key()
    client.set(k, b"1")
    lock_cas = call_key(client, Opcode.GET_LOCKED, k).cas
    assert client.call(Opcode.APPEND, key=k, value=b"0", vbucket=client.vb(k)).status == Status.LOCKED
    assert arith(client, Opcode.INCREMENT, k, 1).status == Status.LOCKED
    assert call_key(client, Opcode.TOUCH, k, extras=U32.pack(5)).status == Status.LOCKED
    # with the lock's CAS an append goes through
    assert client.call(Opcode.APPEND, key=k, value=b"0", cas=lock_cas,
                       vbucket=client.vb(k)).status == Status.SUCCESS
    assert client.get(k).value == b"10"


def test_lock_of_a_missing_key_is_key_enoent(client):
    k = key()
    assert call_key(client, Opcode.GET_LOCKED, k).status == Status.KEY_ENOENT
    assert call_key(client, Opcode.UNLOCK_KEY, k, cas=1).status == Status.KEY_ENOENT


# -- replica reads, observe seqno -------------------------------------------------------


def test_get_replica_on_an_active_vbucket_is_not_my_vbucket(client):
    k = key()
    client.set(k, b"v")
    assert call_key(client, Opcode.GET_REPLICA, k).status == Status.NOT_MY_VBUCKET


def test_observe_seqno_reports_current_and_persisted_seqnos(client):
    k = key()
    f = client.set(k, b"v")
    uuid, seqno = struct.unpack(">QQ", f.extras)
    vb = client.vb(k)
    o = client.call(Opcode.OBSERVE_SEQNO, value=U64.pack(uuid), vbucket=vb)
    assert o.status == Status.SUCCESS
    fmt, vbid, got_uuid, persisted, current = struct.unpack(">BHQQQ", o.value)
    assert (fmt, vbid, got_uuid) == (0, vb, uuid)
    assert current >= seqno and persisted <= current
    assert client.call(Opcode.OBSERVE_SEQNO, value=U64.pack(uuid ^ 1),
                       vbucket=vb).status == Status.KEY_ENOENT
    assert client.call(Opcode.OBSERVE_SEQNO, value=b"\x00" * 4,
                       vbucket=vb).status == Status.EINVAL
