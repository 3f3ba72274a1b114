"""Storage (SQLite WAL, flusher batches, consistent backfill reads) and the users file."""
from __future__ import annotations

import json

from dcptool.node.auth import MECHANISMS, SaslSession, Users
from dcptool.node.item import ITEM_DELETION, Item
from dcptool.node.storage import BackfillReader, Storage


def _meta(st: Storage, vbs=(0, 1)):
    st.write_vbucket_meta([(vb, 1, [[7, 0]], 0, 0, 0) for vb in vbs])


def test_flush_keeps_one_row_per_key_and_advances_persisted_seqno(tmp_path):
    st = Storage(tmp_path / "d.sqlite3")
    _meta(st)
    st.dirty.append((0, Item(b"a", b"1", 1, 1, 10, 0, 0, 0)))
    st.dirty.append((0, Item(b"b", b"2", 2, 1, 11, 0, 0, 0)))
    st.dirty.append((0, Item(b"a", b"", 3, 2, 12, 0, 0, 0, ITEM_DELETION, 1234)))
    st.dirty.append((1, Item(b"c", b"3", 1, 1, 2**64 - 1, 0xDEADBEEF, 0, 1)))
    st._flush_once()
    assert st.load_vbucket_meta()[0]["persisted_seqno"] == 3
    items = {(vb, it.key): it for vb, it in st.iter_items()}
    assert len(items) == 3
    a = items[(0, b"a")]
    assert (a.seqno, a.rev, a.op, a.delete_time) == (3, 2, ITEM_DELETION, 1234)
    c = items[(1, b"c")]
    assert (c.cas, c.flags, c.datatype) == (2**64 - 1, 0xDEADBEEF, 1)
    st.stop(clean=True)
    st2 = Storage(tmp_path / "d.sqlite3")
    assert st2.get_meta()["clean_shutdown"] == "1"
    assert st2.high_seqnos() == {0: 3, 1: 1}
    st2.stop(clean=False)


def test_backfill_reads_one_consistent_snapshot_while_the_flusher_writes(tmp_path):
    st = Storage(tmp_path / "d.sqlite3")
    _meta(st, vbs=(0,))
    for i in range(1, 61):
        st.dirty.append((0, Item(b"k%d" % i, b"v", i, 1, i, 0, 0, 0)))
    st._flush_once()
    bf = BackfillReader(st, 0, start=15)
    assert bf.end == 60
    first = bf.fetch(10)
    # the writer goes on: new seqnos and an update of a key not read yet
    st.dirty.append((0, Item(b"k30", b"new", 61, 2, 61, 0, 0, 0)))
    st.dirty.append((0, Item(b"k99", b"v", 62, 1, 62, 0, 0, 0)))
    st._flush_once()
    rest = bf.fetch(1000)
    seqnos = [r[0] & 0xFFFFFFFFFFFF for r in first + rest]
    assert seqnos == list(range(16, 61)), "the snapshot 15..60 as it was when the read began"
    assert bf.done
    st.stop(clean=True)


def test_users_file_holds_salted_scram_credentials_not_the_password(tmp_path):
    users = Users.load(tmp_path)
    assert not users
    users.set_password("Administrator", "s3cret-pw")
    users.save()
    text = (tmp_path / "users.json").read_text()
    assert "s3cret-pw" not in text
    doc = json.loads(text)
    cred = doc["users"]["Administrator"]["scram"]
    assert set(cred) == set(MECHANISMS)
    assert all({"salt", "iterations", "stored_key", "server_key"} <= set(c) for c in cred.values())
    assert (tmp_path / "users.json").stat().st_mode & 0o777 == 0o600
    again = Users.load(tmp_path)
    assert again.check_password("Administrator", "s3cret-pw")
    assert not again.check_password("Administrator", "wrong")
    assert not again.check_password("nobody", "s3cret-pw")


def test_scram_exchange_with_a_standard_client(tmp_path):
    from scramp import ScramClient

    users = Users(tmp_path / "users.json")
    users.set_password("u", "pw")
    for cb, iana in MECHANISMS.items():
        c = ScramClient([iana], "u", "pw")
        s = SaslSession(users)
        status, first, _ = s.start(cb, c.get_client_first().encode())
        assert status == "continue"
        c.set_server_first(first.decode())
        status, final, user = s.step(cb, c.get_client_final().encode())
        assert (status, user) == ("ok", "u")
        c.set_server_final(final.decode())
        bad = ScramClient([iana], "u", "nope")
        s = SaslSession(users)
        _, first, _ = s.start(cb, bad.get_client_first().encode())
        bad.set_server_first(first.decode())
        assert s.step(cb, bad.get_client_final().encode())[0] == "error"


def test_a_failed_flush_keeps_its_batch_for_the_next_try(tmp_path):
    st = Storage(tmp_path / "d.sqlite3")
    _meta(st, vbs=(0,))
    real = st._db

    class Failing:
        calls = 0

        def __getattr__(self, name):
            return getattr(real, name)

        def executemany(self, sql, rows):
            Failing.calls += 1
            if Failing.calls == 1:
                raise OSError("disk full")
            return real.executemany(sql, rows)

    st._db = Failing()
    for i in range(1, 4):
        st.dirty.append((0, Item(b"k%d" % i, b"v", i, 1, i, 0, 0, 0)))
    try:
        st._flush_once()
    except OSError:
        pass
    assert len(st.dirty) == 3, "the batch went back to the queue"
    st._flush_once()
    st._db = real
    assert st.load_vbucket_meta()[0]["persisted_seqno"] == 3
    assert sorted(it.seqno for _, it in st.iter_items()) == [1, 2, 3]
    st.stop(clean=True)
