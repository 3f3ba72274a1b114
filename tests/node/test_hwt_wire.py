"""HWT_REGISTER / HWT_LIST / HWT_REMOVE on the wire, against a real node process."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from dcptool.protocol import encode_frame
from dcptool.protocol.constants import Opcode, Status

from .hwtutil import (
    compact,
    entries,
    hwt,
    keys_for,
    listing,
    pipeline,
    register,
    set_frame,
)
from .mcbputil import Client, connect, wait_persisted


def test_register_list_remove(node_factory):
    node = node_factory(vbuckets=16)
    with connect(node) as c:
        a = register(c, "backup", "arch-1", {0: 5, 3: 9}, ttl=60, meta={"archive": "/b/x"})
        assert a["replaced"] is False and a["vbuckets"] == 2
        assert abs(a["expires_at"] - a["reported_at"] - 60) < 1e-6
        register(c, "backup", "arch-2", {0: 1})
        register(c, "xdcr", "r1", {15: 100})
        doc = listing(c)
        assert [(e["name"], e["instance"]) for e in doc["entries"]] == [
            ("backup", "arch-1"), ("backup", "arch-2"), ("xdcr", "r1")]
        e = doc["entries"][0]
        assert e["state"] == "ok" and e["meta"] == {"archive": "/b/x"}
        assert e["vbuckets"] == {"0": 5, "3": 9}
        assert (e["lowest_seqno"], e["highest_seqno"]) == (5, 9)
        assert doc["purge_seqnos"] == {"0": 0, "3": 0, "15": 0}
        assert doc["purge_age"] == 3 * 86400 and doc["max_hold"] == 30 * 86400
        assert doc["compaction_interval"] is None
        # filters
        assert [x["instance"] for x in listing(c, name="backup")["entries"]] == ["arch-1", "arch-2"]
        assert [x["instance"] for x in listing(c, name="backup", instance="arch-2")["entries"]] == ["arch-2"]
        # the same name and instance replaces the row
        b = register(c, "backup", "arch-1", {0: 50})
        assert b["replaced"] is True
        assert entries(c)[("backup", "arch-1")]["vbuckets"] == {"0": 50}
        # remove one instance, then every instance of a name
        st, doc = hwt(c, Opcode.HWT_REMOVE, {"name": "backup", "instance": "arch-2"})
        assert st == Status.SUCCESS and doc == {"removed": [{"name": "backup", "instance": "arch-2"}]}
        register(c, "backup", "arch-3", {1: 1})
        st, doc = hwt(c, Opcode.HWT_REMOVE, {"name": "backup"})
        assert st == Status.SUCCESS and len(doc["removed"]) == 2
        assert list(entries(c)) == [("xdcr", "r1")]
        st, doc = hwt(c, Opcode.HWT_REMOVE, {"name": "backup"})
        assert st == Status.KEY_ENOENT and "no high watermark" in doc["error"]["context"]
        st = c.stats("")
        assert (st["ep_hwt_entries"], st["ep_hwt_ok"], st["ep_hwt_lost"]) == ("1", "1", "0")
    # the table survives a kill too (each change is answered once it is on disk)
    node.kill()
    node.start()
    with connect(node) as c:
        assert list(entries(c)) == [("xdcr", "r1")]


def test_bad_requests_are_refused_with_a_reason(node_factory):
    node = node_factory(vbuckets=16)
    with connect(node) as c:
        cases = [
            ({"name": "a", "instance": "i", "vbuckets": {"16": 1}}, "vbucket '16'"),
            ({"name": "a", "instance": "i", "vbuckets": {}}, "vbuckets"),
            ({"name": "a", "vbuckets": {"0": 1}}, "instance"),
            ({"name": "a", "instance": "i", "vbuckets": {"0": 1}, "ttl": -5}, "ttl"),
        ]
        for doc, fragment in cases:
            st, ans = hwt(c, Opcode.HWT_REGISTER, doc)
            assert st == Status.EINVAL, doc
            assert fragment in ans["error"]["context"], ans
        # not JSON, not an object, a key or extras: EINVAL from the codec
        for kw in ({"value": b"{nope"}, {"value": b"[1]"}, {"key": b"k", "value": b"{}"},
                   {"extras": b"\x00" * 4}):
            f = c.call(Opcode.HWT_REGISTER, **kw)
            assert f.status == Status.EINVAL, kw
        st, ans = hwt(c, Opcode.HWT_REMOVE, None)
        assert st == Status.EINVAL and "name" in ans["error"]["context"]
        st, ans = hwt(c, Opcode.HWT_LIST, {"bogus": 1})
        assert st == Status.EINVAL
        assert listing(c)["entries"] == []


def test_only_authenticated_users_may_use_the_table(node_factory):
    node = node_factory(vbuckets=16)
    c = Client(node.host, node.port)
    c.hello(0x07)  # XERROR: the node answers instead of closing
    for op in (Opcode.HWT_REGISTER, Opcode.HWT_LIST, Opcode.HWT_REMOVE, Opcode.COMPACT_DB):
        f = c.call(op, value=b"{}" if op != Opcode.COMPACT_DB else b"",
                   extras=b"\x00" * 24 if op == Opcode.COMPACT_DB else b"")
        assert f.status == Status.EACCESS, hex(op)
    assert c.auth_plain("Administrator", "wrong").status == Status.AUTH_ERROR
    f = c.call(Opcode.HWT_LIST)
    assert f.status == Status.EACCESS
    c.close()
    # without XERROR the connection is closed instead (as kv_engine does for EACCESS)
    c = Client(node.host, node.port)
    c.request(Opcode.HWT_LIST)
    try:
        f = c.recv(timeout=5)
        assert False, f"expected the connection to close, got {f}"
    except ConnectionError:
        pass
    c.close()
    # a bucket must be selected
    c = Client(node.host, node.port)
    c.setup(bucket="")
    assert c.call(Opcode.HWT_LIST).status == Status.NO_BUCKET
    c.close()


def test_node_status_shows_purge_seqnos_and_the_table(node_factory):
    node = node_factory(vbuckets=16, extra_args=("--purge-age", "0"))
    keys = keys_for(4, 16, 3)
    with connect(node) as c:
        pipeline(c, [set_frame(k, 4) for k in keys])
        pipeline(c, [encode_frame(0x80, Opcode.DELETE, 4, 0, key=k) for k in keys])
        wait_persisted(c)
        assert compact(c, 4)["purge_seqno"] == 6
        register(c, "tail", "t1", {4: 6})
    env = dict(os.environ, DCPTOOL_PASSWORD=node.password, COLUMNS="200")
    for e in (env, {k: v for k, v in env.items() if k != "DCPTOOL_PASSWORD"}):
        out = subprocess.run([sys.executable, "-m", "dcptool", "node", "status", "--data",
                              str(node.data_dir), "--json"], capture_output=True, text=True,
                             env=e, timeout=60)
        assert out.returncode == 0, out.stderr
        info = json.loads(out.stdout)
        assert info["vbuckets_detail"]["4"]["purge_seqno"] == 6
        assert [(r["name"], r["instance"], r["state"]) for r in info["hwt"]] == [("tail", "t1", "ok")]
    out = subprocess.run([sys.executable, "-m", "dcptool", "node", "status", "--data",
                          str(node.data_dir)], capture_output=True, text=True, env=env,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert "purge seqno" in out.stdout and "high watermark table: 1 row (1 ok)" in out.stdout
