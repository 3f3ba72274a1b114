"""Documents made by counters, touch, a lock-holder's write and sub-document mutations
(xattrs included) are ordinary versions on DCP: a backup takes them and a restore puts
them back with their metadata."""
from __future__ import annotations

import struct

from docutil import node_documents, opts_for

from dcptool.pipeline.backup import run_backup
from dcptool.pipeline.restore import run_restore
from dcptool.protocol.constants import Opcode, Status

from node.mcbputil import connect

VBS = 16
ARITH = struct.Struct(">QQI")
U32 = struct.Struct(">I")


def test_counter_touch_and_locked_writes_survive_backup_and_restore(node_factory, spark,
                                                                     tmp_path):
    src = node_factory("src", vbuckets=VBS)
    dst = node_factory("dst", vbuckets=VBS)
    with connect(src) as c:
        def call(op, k, **kw):
            f = c.call(op, key=k, vbucket=c.vb(k), **kw)
            assert f.status == Status.SUCCESS, (op, k, f.status)
            return f

        for i in range(20):
            k = b"counter::%d" % i
            call(Opcode.INCREMENT, k, extras=ARITH.pack(1, 100 + i, 0))
            call(Opcode.INCREMENT, k, extras=ARITH.pack(i, 0, 0))
            call(Opcode.DECREMENT, k, extras=ARITH.pack(1, 0, 0))
        for i in range(10):
            k = b"touched::%d" % i
            assert c.set(k, b'{"i": %d}' % i, flags=7).status == Status.SUCCESS
            call(Opcode.TOUCH, k, extras=U32.pack(3600))
            call(Opcode.GAT, k, extras=U32.pack(7200))
        for i in range(10):
            k = b"subdoc::%d" % i
            path, value = b"txn.id", b'"t%d"' % i
            specs = struct.pack(">BBHI", Opcode.SUBDOC_DICT_UPSERT, 0x05, len(path),
                                len(value)) + path + value
            path, value = b"list", b"%d" % i
            specs += struct.pack(">BBHI", Opcode.SUBDOC_ARRAY_PUSH_LAST, 0x01, len(path),
                                 len(value)) + path + value
            call(Opcode.SUBDOC_MULTI_MUTATION, k, extras=b"\x01", value=specs)  # MKDOC
        k = b"locked::1"
        assert c.set(k, b"before").status == Status.SUCCESS
        lock_cas = call(Opcode.GET_LOCKED, k, extras=U32.pack(5)).cas
        assert c.set(k, b"after", cas=lock_cas).status == Status.SUCCESS

    before = node_documents(opts_for(src))
    assert before[b"counter::3"][1] == b"105"      # 103, +3, -1
    assert before[b"touched::4"][5] > 0            # the GAT's expiry
    assert before[b"locked::1"][1] == b"after"
    assert before[b"subdoc::3"][1] == b'{"list":[3]}'  # the body; xattrs below
    path = tmp_path / "archive"
    run_backup(opts_for(src), path, spark=spark, watermark=False)
    run_restore(str(path), opts_for(dst), spark=spark)
    after = node_documents(opts_for(dst))
    # value, cas, rev, flags and expiry of every document are the source's
    assert after == before
    # and the xattrs the sub-document mutations wrote came along
    with connect(dst) as c:
        for i in (0, 9):
            k = b"subdoc::%d" % i
            path = b"txn.id"
            f = c.call(Opcode.SUBDOC_GET, key=k, extras=struct.pack(">HB", len(path), 0x04),
                       value=path, vbucket=c.vb(k))
            assert (f.status, f.value) == (Status.SUCCESS, b'"t%d"' % i)
