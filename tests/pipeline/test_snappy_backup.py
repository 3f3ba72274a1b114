"""Snappy end to end with real node processes and Spark: documents written compressed are
backed up once with Snappy negotiated and force_value_compression (every value arrives
compressed) and once without; both archives hold the same decompressed values with the
SNAPPY bit cleared, a restore of the compressed run into a second node gives the same
documents (values, flags, cas, rev seqno, expiry, datatype), and verify --against and
examine read it back."""
from __future__ import annotations

import dataclasses
import re
import time
from pathlib import Path

import pytest
from client.nodeutil import write_docs
from docutil import delete, opts_for
from nodeprocutil import NodeProcess
from snappyutil import documents, write_compressed

from dcptool.archive import Archive
from dcptool.archive.reader import iter_vbucket_batches
from dcptool.client.events import DELETION, EXPIRATION, MUTATION
from dcptool.client.ops import get_vbucket_seqnos
from dcptool.client.position import ZERO
from dcptool.client.session import SessionConfig
from dcptool.pipeline.compare import run_verify_against
from dcptool.pipeline.backup import run_backup
from dcptool.pipeline.examine import examine_key
from dcptool.pipeline.restore import run_restore

VBS = 16


def node_items(opts) -> tuple[dict[bytes, tuple], int]:
    """({key: (kind, value, cas, rev, flags, expiry, datatype)}, values that arrived
    compressed) of everything the node holds, read over DCP with `opts`."""
    with opts.connect() as conn:
        seqnos = get_vbucket_seqnos(conn, state=1)
    out: dict[bytes, tuple] = {}
    consumer = opts.consumer(SessionConfig(name="test-snappy-reader"))
    try:
        consumer.add_streams({vb: (ZERO, hi) for vb, hi in seqnos.items()})
        for events in consumer.batches(tick=1.0):
            for ev in events:
                if ev[0] == MUTATION:
                    out[ev[8]] = ("live", bytes(ev[9]), ev[4], ev[3], ev[5], ev[6], ev[7])
                elif ev[0] in (DELETION, EXPIRATION):
                    out[ev[8]] = ("deleted", b"", ev[4], ev[3], 0, 0, ev[7])
        return out, consumer.session.values_decompressed
    finally:
        consumer.close()


def archive_items(path: Path) -> list[tuple]:
    """Every item record of every committed backup of the archive."""
    a = Archive.open(path)
    out = []
    for bid in a.committed_ids():
        for entry in a.manifest(bid)["vbuckets"]:
            for batch in iter_vbucket_batches(a.path / "backups" / bid, entry):
                out.extend(r for r in batch if r[0] in (3, 4, 5))
    return out


@pytest.fixture(scope="module")
def backed_up(tmp_path_factory, spark):
    """Node A with compressed and plain documents; one backup with Snappy, one without."""
    base = tmp_path_factory.mktemp("snappy")
    node = NodeProcess(base / "a", vbuckets=VBS).start()
    try:
        opts = opts_for(node)
        docs = documents(240, "doc::")
        keys = list(docs)
        compressed = {k: docs[k] for k in keys[:160]}
        write_compressed(opts, {k: v for k, v in compressed.items() if k < b"doc::0080"}, VBS,
                         flags=0x02000006)
        write_compressed(opts, {k: v for k, v in compressed.items() if k >= b"doc::0080"}, VBS,
                         flags=7, expiry=int(time.time()) + 7200)
        # the rest plain, and one binary value compressed
        write_docs(node, {k: docs[k] for k in keys[160:]})
        blob = bytes(range(256)) * 4
        write_compressed(opts, {b"bin::0": blob}, VBS, datatype=0)
        docs[b"bin::0"] = blob
        with opts.connect() as conn:
            delete(conn, [k.decode() for k in keys[200:210]], VBS)
        for k in keys[200:210]:
            del docs[k]
        with_snappy = run_backup(dataclasses.replace(opts, snappy=True), base / "arch-snappy",
                                 spark=spark, watermark=False)
        without = run_backup(opts, base / "arch-plain", spark=spark, watermark=False)
        yield {"node": node, "opts": opts, "docs": docs, "deleted": keys[200:210],
               "snappy": with_snappy, "plain": without, "base": base}
    finally:
        node.stop(timeout=15)


def test_values_arrive_compressed_with_snappy_and_plain_without(backed_up):
    opts = backed_up["opts"]
    plain, n_plain = node_items(opts)
    compressed, n_comp = node_items(dataclasses.replace(opts, snappy=True))
    assert n_plain == 0
    assert n_comp == len(backed_up["docs"])  # every live value came compressed
    assert compressed == plain  # and decompressed to the same documents
    # the backup's run log says what arrived compressed
    log = Path(backed_up["snappy"].log).read_text()
    m = re.search(r"snappy negotiated: (\d+) values arrived compressed, (\d+) bytes on the wire "
                  r"for (\d+) bytes decompressed", log)
    assert m, log[-2000:]
    n, wire, full = map(int, m.groups())
    assert n == len(backed_up["docs"]) and 0 < wire < full
    assert "values arrived compressed" not in Path(backed_up["plain"].log).read_text()


def test_archives_hold_decompressed_values_without_the_snappy_bit(backed_up):
    docs = backed_up["docs"]
    base = backed_up["base"]
    rs = archive_items(base / "arch-snappy")
    rp = archive_items(base / "arch-plain")
    assert sorted(rs) == sorted(rp)  # the same records whichever way they came
    # the archive holds doc keys: the default collection's prefix 0x00, then the key
    assert all(r[7 if r[0] == 3 else 4][:1] == b"\x00" for r in rs)
    muts = {r[7][1:]: r for r in rs if r[0] == 3}
    assert set(muts) == set(docs)
    for key, r in muts.items():
        _t, _seq, _rev, _cas, flags, expiry, dt, _k, value, xattrs = r
        assert value == docs[key] and xattrs is None
        assert dt == (0 if key.startswith(b"bin::") else 1), (key, dt)
    assert {r[4][1:] for r in rs if r[0] in (4, 5)} == set(backed_up["deleted"])
    assert all(r[6] & 0x02 == 0 for r in rs)
    assert muts[b"doc::0003"][4] == 0x02000006 and muts[b"doc::0100"][4] == 7
    assert muts[b"doc::0100"][5] > time.time()
    # the summaries count the decompressed bytes
    assert backed_up["snappy"].value_bytes == backed_up["plain"].value_bytes \
        == sum(map(len, docs.values()))


def test_restore_of_the_compressed_backup_gives_the_same_documents(backed_up, spark, tmp_path):
    want, _ = node_items(backed_up["opts"])
    with NodeProcess(tmp_path / "b", vbuckets=VBS) as dst:
        dopts = opts_for(dst)
        res = run_restore(str(backed_up["base"] / "arch-snappy"), dopts, spark=spark).as_dict()
        assert sum(res["failed"].values()) == 0, res
        got, _ = node_items(dopts)
        live = {k: v for k, v in got.items() if v[0] == "live"}
        assert live == {k: v for k, v in want.items() if v[0] == "live"}
        assert {k for k, v in got.items() if v[0] == "deleted"} == set(backed_up["deleted"])
        assert live[b"doc::0001"][6] == 0x01 and live[b"bin::0"][6] == 0x00


def test_verify_against_and_examine_read_the_compressed_backup(backed_up, spark):
    arch = backed_up["base"] / "arch-snappy"
    report = run_verify_against(arch, dataclasses.replace(backed_up["opts"], snappy=True),
                                spark=spark)
    assert report.ok, report.to_json()
    d = examine_key(arch, "doc::0042", values=True)
    (v,) = d["versions"]
    assert v["value"] == backed_up["docs"][b"doc::0042"].decode() and v["datatype"] == 1


def test_restore_and_examine_decompress_an_archive_value_stored_compressed(tmp_path):
    """An archive written by other means may hold a value with the SNAPPY bit: restore's
    records are decompressed with the bit cleared (the node is never sent a compressed
    value), examine shows the text; one that does not decompress is an error naming it."""
    from dcptool.archive import ArchivePosition
    from dcptool.errors import DcptoolError
    from dcptool.pipeline.restore import resolved_records
    from dcptool.protocol.snappy import compress
    from dcptool.protocol.vbucket import vbucket_of

    uuid = 0xABC
    key, bad = b"cz::1", b"cz::2"
    vb = vbucket_of(key, 4)
    doc = documents(1, "cz::")[b"cz::0000"]
    a = Archive.create(tmp_path / "arch", bucket="default", vbuckets=4)
    bw = a.begin_backup("full")
    w = bw.vbucket(vb, ArchivePosition.at(uuid, 0), [(uuid, 0)])
    w.marker(1, 2, 0)
    # format 3 records hold doc keys (0x00: the default collection)
    w.mutation(1, 3, 77, 5, 0, 0x03, b"\x00" + key, compress(doc))
    w.deletion(2, 4, 78, b"\x00cz::tomb", 9, 0x02, compress(b""))
    s = w.close(ArchivePosition.at(uuid, 2))
    bw.commit([s])
    recs = list(resolved_records(str(a.path), vb, None))
    assert recs == [("mutation", b"\x00" + key, doc, 5, 0, 3, 77, 0x01),
                    ("deletion", b"\x00cz::tomb", b"", 0, 9, 4, 78, 0x00)]
    v = examine_key(a.path, key, values=True, vbucket=vb)["versions"][0]
    assert v["value"] == doc.decode()

    bw = a.begin_backup("incremental")
    w = bw.vbucket(vb, ArchivePosition.at(uuid, 2), [(uuid, 0)])
    w.marker(3, 3, 0)
    w.mutation(3, 1, 79, 0, 0, 0x03, b"\x00" + bad, b"\xff\xff\xff\xff\x0fnot snappy")
    bw.commit([w.close(ArchivePosition.at(uuid, 3))])
    with pytest.raises(DcptoolError, match="cz::2.*does not decompress"):
        list(resolved_records(str(a.path), vb, None))
