"""The connection is cut mid-stream (from the node's side, at seeded random byte offsets,
several times per run): the backup task reconnects and resumes each stream from its last
complete snapshot, and the archive holds every seqno exactly once."""
from __future__ import annotations

from dataclasses import replace

from docutil import load, node_documents, opts_for
from faultutil import Proxy, assert_each_seqno_once, assert_verifies, docs
from nodeprocutil import NodeProcess

from dcptool.client.ops import get_vbucket_seqnos
from dcptool.pipeline.backup import run_backup
from dcptool.pipeline.restore import run_restore

VBS = 8


def test_backup_through_cut_connections_has_no_gap_and_no_duplicate(spark, tmp_path):
    archive = tmp_path / "archive"
    with NodeProcess(tmp_path / "src", vbuckets=VBS) as node:
        opts = opts_for(node)
        with opts.connect() as conn:
            load(conn, docs(6000, "a"), VBS)
        # the driver's own short connections carry far less than cut_min: only the tasks'
        # DCP streams are cut
        with Proxy(node.host, node.port, cuts=4, cut_min=20_000, cut_max=120_000,
                   seed=1234) as proxy:
            full = run_backup(replace(opts, host=proxy.host, port=proxy.port), archive,
                              spark=spark, partitions=2, watermark=False)
        assert len(proxy.cut_at) == 4, f"only {proxy.cut_at} cuts happened"
        assert proxy.connections > 4  # the tasks connected again after the cuts
        assert full.mutations == 6000 and not full.resumed

        with opts.connect() as conn:
            load(conn, docs(3000, "b"), VBS)
        with Proxy(node.host, node.port, cuts=3, cut_min=10_000, cut_max=60_000,
                   seed=99) as proxy:
            incr = run_backup(replace(opts, host=proxy.host, port=proxy.port), archive,
                              spark=spark, partitions=2, watermark=False)
        assert len(proxy.cut_at) == 3, f"only {proxy.cut_at} cuts happened"
        assert incr.type == "incremental" and incr.mutations == 3000

        with opts.connect() as conn:
            highs = get_vbucket_seqnos(conn, state=1)
        assert sum(highs.values()) == 9000
        assert_each_seqno_once(archive, highs)
        assert_verifies(archive)
        expected = node_documents(opts)
    with NodeProcess(tmp_path / "dst", vbuckets=VBS) as dst:
        run_restore(str(archive), opts_for(dst), spark=spark)
        assert node_documents(opts_for(dst)) == expected
